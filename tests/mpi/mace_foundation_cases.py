"""The engine with a MACE foundation model given by name (and a head), on K domains, at step 0
and after STEPS hot Langevin steps.

Usage: mpiexec -n K python tests/mpi/mace_foundation_cases.py OUT.npz XDG NAME HEAD STEPS
(``XDG`` is the ``XDG_CACHE_HOME`` whose ``mace/`` holds NAME's file, beside the structure
``alnicu.extxyz``; tests/mpi/world.py runs ``run(comm, argv)`` beside other tests' work).
Rank 0 writes the gathered positions, forces and energy of both snapshots."""
import os
from pathlib import Path

import numpy as np

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation


def run(comm, argv):
    out, xdg, name, head, steps = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    os.environ["XDG_CACHE_HOME"] = xdg          # where mace-torch's resolver looks, on every rank
    system = Path(xdg) / "alnicu.extxyz"
    sim = Simulation(compose_config(["model=mace", f"model.checkpoint={name}", f"model.head={head}",
                                     f"system.file={system}", "precision=float64", f"domains={comm.size}",
                                     f"steps={steps}", "dt=2.0", "temperature=900", "integrator=langevin",
                                     "trajectory.every=0", "thermo.every=0", "checkpoint.every=0", "quiet=true",
                                     "neighbor.skin=0.4", f"output={out[:-4]}.h5"]), comm=comm)
    snaps = []
    for n in (0, steps):
        sim.run(n)
        full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
        snaps.append((full, float(sim.results["energy"])))
    if comm.is_root:
        (a, ea), (b, eb) = snaps
        np.savez(out, pos0=a["positions"], f0=a["forces"], e0=ea, pos1=b["positions"], f1=b["forces"], e1=eb,
                 numbers=a["numbers"], cell=sim.state.cell.double().numpy(), grid=np.array(sim.domain.grid.shape),
                 migrated=sim.summary["migrated"])


if __name__ == "__main__":
    from launch import main

    main(run)
