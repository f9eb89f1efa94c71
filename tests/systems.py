"""Test systems shared by single-process references and multi-rank runs (deterministic)."""
import numpy as np

from shardmd.engine.run.structure import unit_cell  # ASE's bulk(cubic=True), bit for bit, without scipy


def make_system(name: str):
    rng = np.random.default_rng(42)
    if name == "ortho":
        atoms = unit_cell("fcc", "Ar", 5.3).repeat((5, 4, 6))
    elif name == "triclinic":
        atoms = unit_cell("fcc", "Ar", 5.3).repeat((5, 5, 5))
        atoms.set_cell(atoms.cell.array @ np.array([[1, 0, 0], [0.25, 1, 0], [0.15, -0.2, 1]]), scale_atoms=True)
    elif name == "slab":  # open z axis, vacuum above and below
        atoms = unit_cell("fcc", "Ar", 5.3).repeat((5, 5, 3))
        atoms.center(vacuum=6.0, axis=2)
        atoms.pbc = [True, True, False]
    elif name == "vacuum":  # atoms fill only the lower 40 % of a periodic box along z
        atoms = unit_cell("fcc", "Ar", 5.3).repeat((4, 4, 3))
        cell = atoms.cell.array.copy()
        cell[2] *= 2.5
        atoms.set_cell(cell, scale_atoms=False)
    else:
        raise KeyError(name)
    atoms.rattle(0.15, seed=int(rng.integers(1 << 30)))
    numbers = atoms.numbers.copy()
    numbers[rng.random(len(atoms)) < 0.3] = 36  # some krypton: two species, mixing rules
    atoms.numbers = numbers
    return atoms
