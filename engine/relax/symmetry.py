"""``minimize.symmetry=true``: ASE's ``FixSymmetry`` (ase/constraints/fix_symmetry.py, spglib) on
the quasi-Newton minimisers' ``ase.Atoms`` (engine/relax/quasi_newton.py, rank 0).

ASE's constraint finds the space group with spglib at ``symprec`` (Å), refines the structure to
it (``refine_symmetry``: cell and positions made exactly symmetric, moving atoms by less than
symprec), then symmetrises every force and stress it is given and every step the optimiser
takes (positions as rank-1 tensors, the cell's deformation as a rank-2 tensor), so the
relaxation keeps the group: the relaxed structure has at least the starting one's symmetry
operations.  Its state is the group's operations (rotations (k, 3, 3) and fractional
translations (k, 3)) and the atom each operation maps each atom onto (symm_map (k, n)):
stored in checkpoints as arrays and put back on a restart, not recomputed.

Refused in one line: a cell not periodic on all three axes (a space group needs a lattice),
fixed atoms (FixAtoms and FixSymmetry together move symmetry-equivalent atoms differently),
a structure spglib finds no group for, and one whose map would be too large: ASE builds it
atom by atom for each of the k operations (a supercell's pure translations count), so k * n
is bounded by :data:`MAX_MAP` (relax the primitive or conventional cell instead).
"""
from __future__ import annotations

import numpy as np

from shardmd.engine.errors import UserError

#: most (operations x atoms) of the symmetry map ASE's FixSymmetry builds (8 bytes each, and a
#: Python loop over them at set-up: 5e6 take about a minute)
MAX_MAP = 5_000_000


def check_applicable(sim) -> None:
    """One line when FixSymmetry cannot apply to ``sim``'s system (module docstring)."""
    s = sim.state
    if not bool(s.pbc.all()):
        axes = "".join("xyz"[k] for k in range(3) if not bool(s.pbc[k]))
        raise UserError(f"minimize.symmetry=true needs a cell periodic on all three axes (a space group); axis {axes} "
                        "is not: make it periodic or drop minimize.symmetry")
    if getattr(sim.integrator, "n_fixed", 0):
        raise UserError("minimize.symmetry=true cannot hold atoms fixed (FixAtoms and FixSymmetry would move "
                        "symmetry-equivalent atoms differently); drop fix.ids / the input's FixAtoms, or "
                        "minimize.symmetry")
    try:
        import spglib  # noqa: F401
    except ImportError:
        raise UserError("minimize.symmetry=true needs spglib (ASE's FixSymmetry uses it): pip install spglib "
                        "(or shardmd[symmetry])") from None


def space_group(atoms, symprec: float):
    """spglib's dataset of ``atoms`` at ``symprec`` Å; one line when there is none or ASE's map
    of it would be too large (:data:`MAX_MAP`).  Rank 0, before anything is written."""
    from ase.spacegroup.symmetrize import spglib_get_symmetry_dataset
    from ase.utils import atoms_to_spglib_cell

    try:
        data = spglib_get_symmetry_dataset(atoms_to_spglib_cell(atoms), symprec=symprec)
    except Exception:  # noqa: BLE001 - spglib's errors (overlapping atoms, a singular cell) become one line
        data = None
    if data is None:
        raise UserError(f"minimize.symmetry=true: spglib finds no space group for this structure at symprec "
                        f"{symprec:g} Å (overlapping atoms or a degenerate cell?); check the structure or drop "
                        "minimize.symmetry")
    k, n = len(data.rotations), len(atoms)
    if k * n > MAX_MAP:
        raise UserError(f"minimize.symmetry=true: space group {data.international} has {k} operations in this cell "
                        f"(its pure translations included) and ASE's FixSymmetry maps each of the {n} atoms under "
                        f"each: {k * n:.2e} > {MAX_MAP:.0e}; relax the primitive or conventional cell")
    return data


def fix_symmetry(atoms, symprec: float):
    """(ASE's FixSymmetry of ``atoms``, one log line): ``atoms`` refined to its space group in
    place (rank 0; collective callers wrap it so that a refusal ends every rank)."""
    from ase.constraints import FixSymmetry

    data = space_group(atoms, symprec)
    x0 = atoms.positions.copy()
    fs = FixSymmetry(atoms, symprec=symprec)   # refines atoms (cell and positions) to the group
    moved = float(np.abs(atoms.positions - x0).max()) if len(atoms) else 0.0
    return fs, (f"Symmetry: space group {data.international} ({data.number}), {len(data.rotations)} operations "
                f"(spglib, symprec {symprec:g} Å); structure refined to it (atoms moved by at most {moved:.2e} Å) "
                "and kept (ASE's FixSymmetry)")


def state(fs) -> dict:
    """The arrays of a FixSymmetry for a checkpoint."""
    return {"sym_rotations": np.asarray(fs.rotations, dtype=np.int32),
            "sym_translations": np.asarray(fs.translations, dtype=np.float64),
            "sym_map": np.asarray(fs.symm_map, dtype=np.int64)}


def saved_state(saved, unusable, n: int) -> tuple:
    """(rotations, translations, map) of a checkpoint's FixSymmetry for ``n`` atoms, checked
    (``saved(name, shape, kinds)`` reads and checks one array; ``unusable(problem)`` makes the
    one-line error)."""
    rot = saved("sym_rotations", (None, 3, 3), "iu")
    k = rot.shape[0]
    trans = saved("sym_translations", (k, 3))
    smap = saved("sym_map", (k, n), "iu")
    if k < 1 or smap.min(initial=0) < 0 or smap.max(initial=0) >= n:
        raise unusable("minimizer/sym_map names atoms outside the system (or no operation)")
    return rot, trans, smap


def restored(atoms, symprec: float, arrays: tuple):
    """A FixSymmetry with a checkpoint's operations and map (:func:`saved_state`), made by ASE's
    constructor on a copy of ``atoms`` (``atoms`` is not refined again: it is the checkpoint's,
    refined when the relaxation began)."""
    from ase.constraints import FixSymmetry

    rot, trans, smap = arrays
    fs = FixSymmetry(atoms.copy(), symprec=symprec)
    fs.rotations, fs.translations = rot.astype(np.int32), trans.astype(np.float64)
    fs.symm_map = [row.astype(np.int64) for row in smap]
    return fs
