"""NVE molecular dynamics of the bring-your-own example models on K domains.

Usage: mpiexec -n K python tests/mpi/shard_md.py OUT_DIR STEPS model [model ...]
(models: mpnn, mpnn_sharded, warp).  The engine's pieces drive it: RankDomain
(migration, halo, neighbour list, forced rebuild every 10 steps and on the skin
criterion), velocity Verlet, and the model through DistributedModel.  Rank 0 writes
OUT_DIR/<model>.npz with ids, unwrapped positions, velocities, forces, energy per step,
the final wrapped positions (for a fresh reference), migrations and rebuild count.
``run_md(comm, model_name, steps)`` also runs in-process (one domain).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

from launch import main  # noqa: E402
from md_loop import nve  # noqa: E402

TEMPERATURE = 900.0
DT = 2.0


def make(name: str):
    import shard_models

    return {"mpnn": shard_models.mpnn, "mpnn_sharded": shard_models.mpnn_sharded,
            "warp": shard_models.warp_pair}[name]()


def initial_atoms():
    import byo_mpnn
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    atoms = byo_mpnn.sample_system((4, 4, 4), seed=7)
    MaxwellBoltzmannDistribution(atoms, temperature_K=TEMPERATURE, rng=np.random.default_rng(11))
    Stationary(atoms)
    return atoms


def run_md(comm, name: str, steps: int) -> dict | None:
    model = make(name)
    run, _ = nve(comm, model, initial_atoms(), model.cutoff, steps, DT)
    state, dec, energies, rebuilds = run.state, run.dec, run.energies, run.rebuilds
    unwrapped = state.unwrapped_positions()
    full = dec.gather(state, ("positions", "velocities", "forces", "images"))
    un = comm.gather_object((state.ids, unwrapped))
    migrated = dec.migrated()
    if full is None:
        return None
    ids = torch.cat([a for a, _ in un])
    unw = torch.cat([b for _,
                     b in un])[torch.argsort(ids)]
    return {"ids": full["ids"], "positions": full["positions"], "unwrapped": unw.numpy(),
            "velocities": full["velocities"],
            "forces": full["forces"], "energy": np.array(energies), "migrated": migrated, "rebuilds": rebuilds,
            "grid": np.array(dec.grid.shape), "cell": state.cell.numpy(), "pbc": state.pbc.numpy(),
            "numbers": initial_atoms().numbers}


def run(comm, argv):
    """``argv = [OUT_DIR, STEPS, model, ...]`` on ``comm`` (tests/mpi/world.py runs it too)."""
    out, steps, names = Path(argv[0]), int(argv[1]), argv[2:]
    for name in names:
        res = run_md(comm, name, steps)
        if res is not None:
            np.savez(out / f"{name}.npz", **res)


if __name__ == "__main__":
    main(run)
