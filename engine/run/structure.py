"""Structures: a structure file (anything ASE reads, or a frame of ShardMD's own H5MD
trajectory or a restart checkpoint) as ``ase.Atoms``, and the crystals' unit cells (the
builder, engine/run/builders.py, makes systems from them).

No torch here: the process that launches the ranks reads the structure to check the domain
count before it starts them (engine/run/preflight.py), and importing torch would double the
CPU of that check. engine/run/system.py turns a structure into a State.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from shardmd.engine.errors import UserError

#: scaled positions of the conventional cubic cells, in the order of ASE's
#: ``bulk(element, lattice, a=a, cubic=True)``; built here because importing ase.build imports
#: scipy (~0.3-0.5 s of CPU per process). tests/test_lattice_builder.py compares them with ASE's
#: bit for bit.
CUBIC_CELLS = {
    "sc": [(0.0, 0.0, 0.0)],
    "bcc": [(0.0, 0.0, 0.0), (0.5, 0.5, 0.5)],
    "fcc": [(0.0, 0.0, 0.0), (0.0, 0.5, 0.5), (0.5, 0.0, 0.5), (0.5, 0.5, 0.0)],
    "diamond": [(0.0, 0.0, 0.0), (0.25, 0.25, 0.25), (0.0, 0.5, 0.5), (0.25, 0.75, 0.75),
                (0.5, 0.0, 0.5), (0.75, 0.25, 0.75), (0.5, 0.5, 0.0), (0.75, 0.75, 0.25)],
}


def unit_cell(lattice: str, element: str, a: float):
    """The builder's unit cell as ``ase.Atoms``: cubic lattices conventional (a, Å), hcp
    orthorhombic (ASE's ideal c/a)."""
    if lattice in CUBIC_CELLS:
        from ase import Atoms

        scaled = CUBIC_CELLS[lattice]
        return Atoms([element] * len(scaled), cell=(a, a, a), scaled_positions=scaled, pbc=True)
    from ase.build import bulk

    return bulk(element, lattice, a=a, orthorhombic=True)


def read_own_file(path: str, index: int = -1):
    """Frame ``index`` of a ShardMD trajectory (committed frames; negative counts from the
    end), or the state of a restart checkpoint (index 0 or -1), as ``ase.Atoms`` in ASE units
    (:mod:`shardmd.engine.io.ase_io`).  One-line UserError for an index out of range, a file
    without frames, an HDF5 file that is not ours, a truncated or damaged file."""
    from shardmd.engine.io.ase_io import count_structures, iter_structures

    try:
        kind, n = count_structures(path)
    except UserError as exc:
        raise UserError(f"system.file: {exc.one_line()}") from None
    if n == 0:
        raise UserError(f"system.file={path!r} is a trajectory without frames (its run wrote none); "
                        "give a trajectory with frames, a checkpoint or a structure file")
    if not -n <= index < n:
        what = "one structure" if kind == "checkpoint" else f"{n} frame{'s' if n > 1 else ''}"
        raise UserError(f"system.index={index} is out of range: {path!r} holds {what}; give 0..{n - 1} "
                        f"or -{n}..-1 (-1: the last)")
    try:
        return next(iter_structures(path, slice(index % n, index % n + 1)))
    except UserError as exc:
        raise UserError(f"system.file: {exc.one_line()}") from None


def read_structure(path: str, index: int = -1):
    from ase.io import read

    from shardmd.engine.io.safe_io import input_file_problem

    p = Path(path)
    bad = input_file_problem(p)
    if bad:
        raise UserError(f"system.file={path!r}: {bad}; give the path of a structure file ASE can read")
    if _is_hdf5(p):   # our trajectories and checkpoints: read here, with our checks and messages
        return _checked(path, read_own_file(str(p), int(index)))
    try:
        # parallel=False: only rank 0 reads, and ASE's default would broadcast over MPI's world
        # (ase.parallel.world becomes MPI when mpi4py was imported first: the Python API under mpiexec)
        atoms = read(str(p), index=index, parallel=False)
    except Exception as exc:  # noqa: BLE001 - any failure becomes one line
        unknown = unknown_element(exc)
        if unknown is not None:
            raise UserError(f"system.file={path!r}: unknown element {unknown!r} (a species or element "
                            "name of the file); elements are their chemical symbols, H to Og (e.g. Ar, Cu, "
                            "Si): correct that name in the file") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"system.file={path!r}: ASE cannot read it ({first}); give a structure "
                        "file such as .extxyz, .cif or POSCAR") from None
    return _checked(path, atoms)


def unknown_element(exc: BaseException) -> str | None:
    """The name ASE's reader met that is no chemical symbol (its KeyError from
    ``ase.symbols.symbols2numbers``, e.g. ``Xx`` or ``Cuu`` in an extxyz species column, a
    POSCAR or a CIF), else None."""
    from ase.data import atomic_numbers

    if not isinstance(exc, KeyError) or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return None
    name = exc.args[0]
    return name if name not in atomic_numbers and 0 < len(name) <= 40 and name.isprintable() else None


def _is_hdf5(p: Path) -> bool:
    """HDF5's 8-byte signature at offset 0 (where ShardMD's files have it; HDF5 also allows a
    user block, whose files then go to ASE's readers as before)."""
    try:
        with open(p, "rb") as fh:
            return fh.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def _checked(path: str, atoms):
    """Refuse a structure without atoms or with a periodic axis that has no cell vector."""
    if len(atoms) == 0:
        raise UserError(f"system.file={path!r} holds no atoms")
    pbc = np.asarray(atoms.pbc)
    lengths = np.linalg.norm(atoms.cell.array, axis=1)
    bad = [k for k in range(3) if pbc[k] and lengths[k] < 1e-9]
    if bad:
        raise UserError(f"system.file={path!r}: axis {bad[0]} is periodic but has no cell vector; "
                        "give the cell or make that axis non-periodic")
    return atoms
