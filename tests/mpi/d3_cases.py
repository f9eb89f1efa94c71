"""model=d3 through ShardMDCalculator on the K ranks of the world: energy, forces, stress and
per-atom energies of the test structures (tests/test_d3.py's), D3(BJ) with and without the ATM
term and D3(0), and the number of atoms each rank owns (proof that the system was split).

Usage: ``run(comm, [OUT_DIR, CASE...])`` inside tests/mpi/world.py (no CASE: all of MPI_CASES);
rank 0 writes OUT_DIR/d3_<case>.npz.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from d3_systems import MPI_CASES, structure  # noqa: E402


def evaluate(comm, case: str) -> dict | None:
    from shardmd.domain.api import HaloStorage
    from shardmd.domain.distributed_model import DistributedModel
    from shardmd.engine.ase_calculator import ShardMDCalculator
    from shardmd.models.d3 import SPEC_D3

    system, kwargs = MPI_CASES[case]
    atoms = structure(system)
    atoms.calc = calc = ShardMDCalculator(model="d3", comm=comm, **kwargs)
    if case.endswith("_local"):   # the model's spec with uncorrected halo scatters
        calc.dmodel = DistributedModel(calc.model, spec=SPEC_D3.with_storage(HaloStorage("local")))
    res = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(), "stress": atoms.get_stress(),
           "energies": atoms.get_potential_energies()}
    owned = comm.all_gather_object(int(calc._state.positions.shape[0]))   # this rank's atoms
    res["owned"] = np.array(owned)
    return res if comm.rank == 0 else None


def run(comm, argv):
    out = Path(argv[0])
    for case in argv[1:] or list(MPI_CASES):
        res = evaluate(comm, case)
        if res is not None:
            np.savez(out / f"d3_{case}.npz", **res)
