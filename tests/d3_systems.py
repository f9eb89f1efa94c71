"""The structures of the D3 tests (tests/test_d3.py, tests/mpi/d3_cases.py): a small periodic
molecular crystal in a triclinic cell and a Cu(111) slab, slightly rattled, and the model
settings each case runs with (Å; the same cutoffs are given to dftd3 in Bohr)."""
from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.build import fcc111, molecule

#: two-body, coordination-number and three-body cutoffs (Å) of the tests: shorter than s-dftd3's
#: defaults so that a 4-domain run stays small; dftd3 gets the same ones
CUTOFFS = {"cutoff": 12.0, "cn_cutoff": 10.0, "three_body_cutoff": 7.0}
#: the multi-domain cases: domains must be at least a ghost width (list radius + skin) thick, so
#: shorter cutoffs keep a 2 x 2 x 1 grid within ~100-200 atoms
CUTOFFS_MPI = {"cutoff": 8.0, "cn_cutoff": 6.0, "three_body_cutoff": 5.0, "skin": 0.5}


def molecular_crystal() -> Atoms:
    """Water, ammonia, methane and benzene in one triclinic cell (24 atoms), doubled along a and
    b (96 atoms, 18.4 x 17.4 x 8.9 Å, so that a 2 x 2 grid of domains splits it)."""
    cell = np.array([[9.2, 0.0, 0.0], [1.1, 8.7, 0.0], [-0.6, 0.9, 8.9]])
    atoms = Atoms(cell=cell, pbc=True)
    for name, frac in (("H2O", (0.15, 0.2, 0.2)), ("NH3", (0.65, 0.25, 0.7)), ("CH4", (0.2, 0.7, 0.65)),
                       ("C6H6", (0.6, 0.7, 0.2))):
        m = molecule(name)
        m.rotate(37.0 * len(m), "x")
        m.rotate(23.0 * len(m), "z")
        m.translate(np.asarray(frac) @ cell - m.positions.mean(0))
        atoms += m
    atoms = atoms.repeat((2, 2, 1))
    atoms.rattle(0.03, seed=11)
    return atoms


def copper_slab(size=(3, 3, 3)) -> Atoms:
    """Cu(111), 3x3x3 atoms (or ``size``), 6 Å of vacuum on each side, periodic in all three directions."""
    atoms = fcc111("Cu", size=size, vacuum=6.0, periodic=True)
    atoms.rattle(0.05, seed=3)
    return atoms


def structure(name: str) -> Atoms:
    """crystal (96 atoms), slab (27 atoms) or wide_slab (8 x 8 x 3 = 192 atoms, for 4 domains)."""
    return {"crystal": molecular_crystal, "slab": copper_slab, "wide_slab": lambda: copper_slab((8, 8, 3))}[name]()


#: the multi-domain cases: case -> (structure, ShardMDCalculator keywords)
MPI_CASES = {
    "crystal_bj": ("crystal", {"functional": "pbe", "damping": "bj", **CUTOFFS_MPI}),
    "crystal_bj_atm": ("crystal", {"functional": "pbe", "damping": "bj", "three_body": True, **CUTOFFS_MPI}),
    # the spec's halo storage set to "local" (no halo correction of scatters): the ghosts' CNs then
    # come from the model's own refresh_neighbors alone (without that call this case's energy was
    # 0.072 eV of 1.86 eV off on 4 domains, while the "scatter" cases still matched)
    "crystal_bj_atm_local": ("crystal", {"functional": "pbe", "damping": "bj", "three_body": True, **CUTOFFS_MPI}),
    "wide_slab_zero_atm": ("wide_slab", {"functional": "pbe", "damping": "zero", "three_body": True,
                                         **CUTOFFS_MPI}),
}
