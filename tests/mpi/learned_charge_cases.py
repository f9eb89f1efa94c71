"""The learned-charge example (examples/learned_charges.py) on K domains: NVE steps with the
predicted charges, or an engine run of ``model=py:learned_charges:make``.

Usage: mpiexec -n K python tests/mpi/learned_charge_cases.py OUT_DIR STEPS METHOD ...
       mpiexec -n K python tests/mpi/learned_charge_cases.py engine key=value ...
(``run(comm, argv)`` also runs in-process on one domain).  The first form: rank 0 writes
OUT_DIR/<METHOD>.npz with, every step, the wrapped positions, forces, charges and per-atom
energies in id order, the energy and the virial; migrations, rebuilds and the domain grid.
The second: tests/mpi/engine_runs.py's run with examples/ importable.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

import learned_charges as L  # noqa: E402
from coulomb_systems import rattled  # noqa: E402

from shardmd.domain.distributed_model import DistributedModel  # noqa: E402
from shardmd.engine.run.rank_domain import RankDomain  # noqa: E402
from shardmd.engine.run.state import State  # noqa: E402
from shardmd.integrators import VelocityVerlet  # noqa: E402

F64 = torch.float64
CUTOFF, SKIN = 6.0, 0.5          # Coulomb's real-space cutoff (the list's), Å
TOTAL_CHARGE = 0.5               # e
TEMPERATURE, DT = 1500.0, 2.0    # K, fs


def initial_atoms():
    """Rattled, sheared NaCl (216 ions, 16.9 Å) with Maxwell-Boltzmann velocities.  ASE's own
    communicator is kept out (``DummyMPI``): under MPI it broadcasts from rank 0, and a broadcast
    one rank makes alone would be taken by the next ASE call of another rank (a structure read)."""
    from ase.md.velocitydistribution import Stationary, thermalize_momenta
    from ase.parallel import DummyMPI

    atoms = rattled((3, 3, 3))
    thermalize_momenta(atoms, TEMPERATURE, comm=DummyMPI(), rng=np.random.default_rng(3))
    Stationary(atoms)
    return atoms


def model(method: str = "ewald", accuracy: float = 1e-6):
    return L.make(cutoff=CUTOFF, method=method, accuracy=accuracy)


def run_md(comm, method: str, steps: int, accuracy: float = 1e-6) -> dict | None:
    """``steps`` velocity-Verlet steps on comm's ranks; every step's outputs on rank 0, None elsewhere."""
    torch.set_num_threads(1)
    dm = DistributedModel(model(method, accuracy))
    dec = RankDomain(comm, CUTOFF, SKIN)
    atoms = initial_atoms()
    state = dec.distribute(State.from_atoms(atoms))
    dec.rebuild(state)
    extras = {"charge": torch.tensor([TOTAL_CHARGE], dtype=F64)}
    frames, rebuilds = [], 0

    def evaluate():
        out = dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current, extras)
        state.forces = out["forces"]
        full = dec.gather(state, ("positions", "forces"), extra={"charges": out["charges"],
                                                                 "energies": out["energies"]})
        if full is not None:
            frames.append({**{k: np.asarray(full[k]) for k in ("positions", "forces", "charges", "energies")},
                           "energy": float(out["energy"]), "virial": out["virial"].detach().numpy()})

    evaluate()
    vv = VelocityVerlet(DT)
    for step in range(1, steps + 1):
        vv.first_half(state.positions, state.velocities, state.forces, state.masses, state.ids, step - 1)
        if step % 5 == 0 or dec.needs_rebuild(state):
            dec.rebuild(state)
            rebuilds += 1
        else:
            dec.refresh(state)
        evaluate()
        vv.second_half(state.velocities, state.forces, state.masses)
    migrated = dec.migrated()
    if comm.rank != 0:
        return None
    res = {key: np.stack([f[key] for f in frames]) for key in frames[0]}
    res.update(migrated=migrated, rebuilds=rebuilds, grid=np.array(dec.grid.shape), cell=state.cell.numpy(),
               numbers=atoms.numbers)
    return res


def run(comm, argv):
    if argv[0] == "engine":
        import engine_runs

        engine_runs.run(comm, argv[1:])
        return
    out, steps = Path(argv[0]), int(argv[1])
    for method in argv[2:]:
        res = run_md(comm, method, steps)
        if res is not None:
            np.savez(out / f"{method}.npz", **res)


if __name__ == "__main__":
    from launch import main

    main(run)
