"""model=coulomb (models/coulomb.py) on K domains: energy, per-atom energies, forces and virial of
a few structures, gathered in id order for tests/test_coulomb.py to compare with independent
references.

Usage: mpiexec -n K python tests/mpi/coulomb_cases.py OUT_DIR
(``run(comm, argv)`` also runs in-process on one domain).  Rank 0 writes OUT_DIR/<case>.npz
for every case of ``CASES`` (structure x method): energy (eV), energies (n,) eV, forces (n, 3)
eV/Å, virial (3, 3) eV, positions, cell and numbers, and the domain grid.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from coulomb_systems import CUTOFF, SKIN, charged, nacl, rattled  # noqa: E402

from shardmd.domain.distributed_model import DistributedModel  # noqa: E402
from shardmd.engine.run.rank_domain import RankDomain  # noqa: E402
from shardmd.engine.run.state import State  # noqa: E402
from shardmd.models.coulomb import Coulomb  # noqa: E402

CHARGES = {"Na": 1.0, "Cl": -1.0}
CASES = {f"{name}_{method}": (make, method) for name, make in (("nacl", nacl), ("rattled", rattled),
                                                                 ("charged", charged))
         for method in ("ewald", "pme")}


def evaluate(comm, atoms, method: str) -> dict | None:
    """Outputs of model=coulomb on comm's ranks; the full arrays on rank 0, None elsewhere."""
    torch.set_num_threads(1)
    dm = DistributedModel(Coulomb(CHARGES, cutoff=CUTOFF, method=method))
    state = State.from_atoms(atoms)
    dec = RankDomain(comm, CUTOFF, SKIN)
    state = dec.distribute(state)
    dec.rebuild(state)
    out = dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)
    state.forces = out["forces"]
    full = dec.gather(state, ("positions", "forces", "numbers"), extra={"energies": out["energies"]})
    if full is None:
        return None
    return {"energy": float(out["energy"]), "virial": out["virial"].detach().numpy(), "cell": state.cell.numpy(),
            "grid": np.array(dec.grid.shape), **{k: np.asarray(full[k]) for k in ("positions", "forces", "numbers",
                                                                                   "energies")}}


def run(comm, argv):
    out = Path(argv[0])
    names = argv[1:] or list(CASES)
    for name in names:
        make, method = CASES[name]
        res = evaluate(comm, make(), method)
        if res is not None:
            np.savez(out / f"{name}.npz", **res)


if __name__ == "__main__":
    from launch import main

    main(run)
