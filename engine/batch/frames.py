"""The structures of a many-system run: ``system.frames`` of ``system.file``, each checked.

A frame is refused (or, with ``system.skip_bad=true``, left out and listed) before anything
runs when ASE cannot read it (an unknown element), when its positions or cell are not finite,
when a periodic cell has no volume, when the model has no parameters for one of its species,
or when two of its atoms are closer than ``health.min_distance``. The one-line error names the
frame by its index in the file, the index every output of that system carries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardmd.engine.config.checks import parse_frames
from shardmd.engine.errors import UserError


def many_systems(cfg) -> bool:
    """Whether the run holds many systems (``system.frames`` or ``system.files``)."""
    return cfg.system.get("frames") is not None or bool(cfg.system.get("files"))


def read_files(patterns) -> list:
    """Every frame of every file the paths or glob patterns name (each pattern's matches
    sorted), in order: a list of ``ase.Atoms``, or for a file ASE cannot read, the one-line
    reason in its place. A pattern that matches nothing is a one-line UserError."""
    import glob

    from ase.io import read

    from shardmd.engine.io.safe_io import input_file_problem
    from shardmd.engine.run.structure import unknown_element

    out = []
    for pattern in patterns:
        paths = sorted(glob.glob(str(pattern))) if glob.has_magic(str(pattern)) else [str(pattern)]
        if not paths:
            raise UserError(f"system.files: {pattern!r} matches no file; give existing paths or patterns")
        for path in paths:
            bad = input_file_problem(path)
            if bad:
                raise UserError(f"system.files: {path!r}: {bad}; give structure files ASE can read")
            try:
                out.extend(read(path, index=":", parallel=False))
            except Exception as exc:  # noqa: BLE001 - the file's failure is one line in its frame's place
                unknown = unknown_element(exc)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                out.append(f"{path}: " + (f"unknown element {unknown!r}" if unknown is not None
                                          else f"ASE cannot read it ({first})"))
    return out


@dataclass(frozen=True)
class BadFrame:
    """A frame left out: its index in the file and why (one line)."""

    index: int
    reason: str


def frame_count(path: str) -> int:
    """Frames in ``path`` without parsing them (extxyz/xyz: from the atom-count lines); a
    missing, empty or unreadable file is a one-line UserError."""
    from ase.io.formats import filetype

    from shardmd.engine.io.safe_io import input_file_problem

    bad = input_file_problem(path)
    if bad:
        raise UserError(f"system.file={path!r}: {bad}; give a structure file ASE can read (e.g. .extxyz)")
    try:
        kind = filetype(path, read=True)
    except Exception as exc:  # noqa: BLE001 - ASE's reason (an empty file, an unknown format) in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"system.file={path!r}: ASE cannot read it ({first}); give a structure file such as "
                        ".extxyz") from None
    if kind in ("extxyz", "xyz"):
        n = 0
        with open(path, "rb") as fh:
            while True:
                head = fh.readline()
                if not head:
                    break
                if not head.strip():
                    continue
                try:
                    natoms = int(head.split()[0])
                except ValueError:
                    where = f"the line after frame {n - 1}" if n else "its first line"
                    raise UserError(f"system.file={path!r}: {where} is not an atom count; "
                                    "fix the file (extxyz: a count, a comment line, then one line per atom)"
                                    ) from None
                for _ in range(natoms + 1):
                    fh.readline()
                n += 1
        return n
    from ase.io import read

    return len(read(path, index=":", parallel=False))


def selected(path: str, frames) -> list[int]:
    """Indices of the frames ``system.frames`` selects (one-line UserError when none, or when
    the selection reaches past the file's end)."""
    n = frame_count(path)
    sl = parse_frames(frames)
    for bound in (sl.start, sl.stop):
        if bound is not None and not -n <= bound <= n:
            raise UserError(f"system.frames={frames}: {path!r} holds {n} frame(s) (0..{n - 1}); give a "
                            f"selection inside it, e.g. 0:{n}")
    idx = list(range(n))[sl]
    if not idx:
        raise UserError(f"system.frames={frames} selects no frame of {path!r} ({n} frames); give e.g. 0:{n}")
    return idx


def read_frames(path: str, indices: list[int]):
    """Yield (index, ``ase.Atoms`` or the one-line reason that frame cannot be read) for
    ``indices`` (increasing, evenly spaced: a slice's), reading the file once; after a frame
    ASE fails on, reading resumes at the next one."""
    from ase.io import iread

    from shardmd.engine.run.structure import unknown_element

    want = list(indices)
    step = want[1] - want[0] if len(want) > 1 else 1
    at = 0
    while at < len(want):
        try:
            for atoms in iread(path, index=f"{want[at]}:{want[-1] + 1}:{step}", parallel=False):
                yield want[at], atoms
                at += 1
                if at == len(want):
                    return
        except Exception as exc:  # noqa: BLE001 - a frame's failure is one line naming it
            unknown = unknown_element(exc)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            yield want[at], (f"unknown element {unknown!r}" if unknown is not None
                             else f"ASE cannot read it ({first})")
            at += 1
            continue
        for k in want[at:]:   # the file ended early
            yield k, "the file ends before it"
        return


def frame_problem(atoms, model, min_distance: float) -> str | None:
    """Why ``atoms`` cannot run with ``model`` (one line), or None."""
    if len(atoms) == 0:
        return "it holds no atoms"
    if not np.isfinite(atoms.positions).all():
        return "its positions are not finite (NaN or inf)"
    cell = np.asarray(atoms.cell.array)
    if not np.isfinite(cell).all():
        return "its cell is not finite"
    if atoms.pbc.any() and abs(np.linalg.det(cell)) < 1e-9 and atoms.pbc.all():
        return "its cell has no volume though it is periodic"
    if atoms.constraints:
        return "it carries ASE constraints (FixAtoms, ...), which a many-system run does not hold yet"
    check = getattr(model, "check_species", None)
    if check is not None:
        try:
            check(np.asarray(atoms.numbers))
        except ValueError as exc:
            return str(exc).split("\n")[0]
    if min_distance > 0 and len(atoms) > 1:
        from ase.neighborlist import neighbor_list

        try:
            i, j, d = neighbor_list("ijd", atoms, min_distance)
        except Exception as exc:  # noqa: BLE001 - e.g. a degenerate open cell
            return f"its neighbours cannot be found ({exc})"
        if len(d):
            k = int(np.argmin(d))
            return (f"atoms {int(i[k])} and {int(j[k])} are {float(d[k]):.3f} Å apart, closer than "
                    f"health.min_distance={min_distance:g} Å")
    return None


def load_frames(path: str, frames, model, min_distance: float, skip_bad: bool):
    """([(index, atoms)], [BadFrame]): every selected frame of ``path`` that can run, in input
    order (:func:`checked`)."""
    return checked(read_frames(path, selected(path, frames)), f"system.file={path!r}", model, min_distance, skip_bad)


def checked(pairs, what: str, model, min_distance: float, skip_bad: bool):
    """([(index, atoms)], [BadFrame]) of ``pairs`` (index, atoms or the reason it could not be
    read). A structure that cannot run is a one-line UserError naming its index and the fix,
    unless ``skip_bad``; then it is left out and returned among the bad ones."""
    good, bad = [], []
    for k, atoms in pairs:
        why = atoms if isinstance(atoms, str) else frame_problem(atoms, model, min_distance)
        if why is None:
            good.append((k, atoms))
            continue
        if not skip_bad:
            raise UserError(f"{what} frame {k}: {why}; fix or remove that frame, or set "
                            "system.skip_bad=true to leave it out (listed in the summary)")
        bad.append(BadFrame(k, why))
    if not good:
        raise UserError(f"{what}: no selected frame can run ({len(bad)} left out; the first, "
                        f"frame {bad[0].index}: {bad[0].reason})")
    return good, bad
