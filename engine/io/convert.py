"""``python -m engine convert FILE OUT``: every frame of a trajectory, or the structure of a
restart checkpoint, in any format ASE writes. Errors as in engine/io/inspect_files.py: one
line; the output is written beside its place and renamed, so a failed write leaves an
existing file of that name untouched."""
from __future__ import annotations

from shardmd.engine.errors import UserError
from shardmd.engine.io.ase_io import iter_structures
from shardmd.engine.io.h5md_read import _reading
from shardmd.engine.io.inspect_files import _open_kind, _write_atomically
from shardmd.engine.io.safe_io import check_output_path


def convert(path: str, out: str) -> str:
    """Write every frame of an H5MD trajectory, or the one structure of a restart checkpoint,
    to ``out`` in any format ASE writes (ASE units; see :mod:`shardmd.engine.io.ase_io`)."""
    kind = _open_kind(path)
    from ase.io import write
    from ase.io.formats import filetype, ioformats

    check_output_path(out, "output")
    try:
        fmt = filetype(out, read=False)
    except Exception as exc:  # noqa: BLE001 - no extension ASE knows
        raise UserError(f"cannot tell the format of {out!r} ({' '.join(str(exc).split())}); "
                        "give an extension such as .extxyz or .traj") from None
    if fmt not in ioformats or not ioformats[fmt].can_write:
        raise UserError(f"ASE cannot write the format {fmt!r} of {out!r}; use e.g. .extxyz or .traj")
    with _reading(path):   # the checkpoint reader checks every field; a trajectory's frames count
        frames = list(iter_structures(path))
    if not frames:
        raise UserError(f"{path!r} holds no frames")
    _write_atomically(out, lambda tmp: write(tmp, frames, format=fmt, parallel=False), f"{fmt!r}")
    what = "the checkpoint's structure" if kind == "checkpoint" else f"{len(frames)} frames"
    return f"wrote {what} to {out}"
