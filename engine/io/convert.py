"""``python -m engine convert FILE OUT [frames=START:STOP:STEP]``: frames of a trajectory, or the
structure of a restart checkpoint, in another format, read and written one frame at a time.

Formats by OUT's extension: LAMMPS dump (``.lammpstrj``, ``.dump``), LAMMPS data (``.data``,
``.lmp``: one frame), XTC and DCD (engine/io/convert_writers.py), else any format ASE writes
(``.extxyz``, ``.traj``, ``.xyz``, ``.pdb``, ...; ASE's names, energies and forces as its
writers keep them). ``frames=`` selects with Python's slice rules (``-1`` the last, ``::10``
every tenth). Errors as in engine/io/inspect_files.py: one line; the output is written beside
its place and renamed, so a failed write leaves an existing file of that name untouched.
"""
from __future__ import annotations

from pathlib import Path

from shardmd.engine.errors import UserError
from shardmd.engine.io.ase_io import iter_structures
from shardmd.engine.io.convert_writers import FORMATS, DumpWriter, MDAnalysisWriter, write_data
from shardmd.engine.io.h5md_read import _reading
from shardmd.engine.io.inspect_files import _open_kind, _write_atomically
from shardmd.engine.io.safe_io import check_output_path

#: ASE formats an extension would pick that read back as something else (``.data``: RuNNer, in Bohr)
MISREAD = {"runnerdata"}
SUPPORTED = ".lammpstrj/.dump (LAMMPS dump), .data/.lmp (LAMMPS data), .xtc, .dcd, .extxyz, .traj"


def parse_frames(text: str | None) -> slice:
    """``frames=`` as a slice: ``START:STOP:STEP`` (each part optional) or one index ``N``."""
    if text is None:
        return slice(None)
    value = text.split("=", 1)[1] if text.startswith("frames=") else text
    try:
        parts = [int(p) if p.strip() else None for p in value.split(":")]
        if len(parts) == 1 and parts[0] is not None:
            return slice(parts[0], parts[0] + 1 if parts[0] != -1 else None)
        if 2 <= len(parts) <= 3 and parts[2:] != [0]:
            return slice(*parts)
    except ValueError:
        pass
    raise UserError(f"frames={value!r} is not a frame selection: give N, START:STOP or START:STOP:STEP "
                    "(Python's slice rules, e.g. frames=-1 or frames=::10)")


def _format(out: str) -> str:
    ext = Path(out).suffix.lower()
    if ext in FORMATS:
        return FORMATS[ext][0]
    from ase.io.formats import filetype, ioformats

    try:
        fmt = filetype(out, read=False)
    except Exception as exc:  # noqa: BLE001 - no extension ASE knows
        raise UserError(f"cannot tell the format of {out!r} ({' '.join(str(exc).split())}); give one of "
                        f"{SUPPORTED} or another extension ASE writes") from None
    if fmt in MISREAD or fmt not in ioformats or not ioformats[fmt].can_write:
        raise UserError(f"cannot write the format of {out!r} ({fmt!r}); give one of {SUPPORTED} or another "
                        "extension ASE writes")
    return fmt


def convert(path: str, out: str, frames: str | None = None) -> str:
    """Write the selected frames of an H5MD trajectory, or the one structure of a restart
    checkpoint, to ``out`` (see the module docstring); the summary line."""
    kind = _open_kind(path)
    check_output_path(out, "output")
    fmt, selection = _format(out), parse_frames(frames)
    with _reading(path):   # the checkpoint reader checks every field; a trajectory's frames count
        n = 1 if kind == "checkpoint" else _count(path)
        chosen = range(n)[selection]
        if not chosen:
            raise UserError(f"frames={frames.split('=', 1)[-1] if frames else ':'} selects no frame of {path!r} "
                            f"(it has {n}: 0 to {n - 1}, or -{n} to -1)")
        one = FORMATS.get(Path(out).suffix.lower(), ("", False))[1]
        if one and len(chosen) > 1:
            raise UserError(f"a LAMMPS data file holds one structure and {path!r} has {len(chosen)} frames selected: "
                            "choose one with frames=N (frames=-1: the last)")
        _write_atomically(out, lambda tmp: _write(tmp, fmt, iter_structures(path, selection)), f"{fmt!r}")
    what = "the checkpoint's structure" if kind == "checkpoint" else f"{len(chosen)} frames"
    return f"wrote {what} to {out}"


def _count(path: str) -> int:
    from shardmd.engine.io.h5md_read import _Reader

    r = _Reader(path)
    try:
        return len(r)
    finally:
        r.close()


def _write(tmp: str, fmt: str, frames) -> None:
    """Stream ``frames`` into ``tmp`` in format ``fmt``."""
    if fmt == "lammps-data":
        write_data(tmp, next(iter(frames)))
        return
    if fmt == "lammps-dump":
        with open(tmp, "w") as fh:
            w = DumpWriter(fh)
            for atoms in frames:
                w.write(atoms)
        return
    if fmt in ("xtc", "dcd"):
        writer = None
        try:
            for atoms in frames:
                writer = writer or MDAnalysisWriter(tmp, fmt, len(atoms))
                writer.write(atoms)
        finally:
            if writer is not None:
                writer.close()
        return
    from ase.io import write

    if fmt == "traj":
        from ase.io.trajectory import Trajectory

        with Trajectory(tmp, "w") as t:
            for atoms in frames:
                t.write(atoms)
        return
    if fmt in ("extxyz", "xyz"):   # text, frame after frame
        with open(tmp, "w") as fh:
            for atoms in frames:
                write(fh, atoms, format=fmt, parallel=False)
        return
    write(tmp, list(frames), format=fmt, parallel=False)   # ASE's other writers: its own rules for several frames
