"""Run under ``mpiexec -n K`` (or alone, K = 1): the engine with a SevenNet model on K domains,
before and after 50 hot MD steps (migrations).

Usage: mpiexec -n K python tests/sevennet_cases.py OUT_DIR case.extxyz[:grid][:plain] ...
For each structure rank 0 writes OUT_DIR/<stem>[_grid][_plain].npz with the gathered positions
(in id order), forces, energy and virial at step 0 and at step 50 (float64), the migrations and
the grid.  tests/test_sevennet.py compares them with sevenn's own ASE calculator and across
domain counts.  ``plain``: a control, step 0 only, the same model with the bare
message-passing preset (sevenn's message_gather and AtomReduce not swapped).
"""
import sys
from pathlib import Path

import numpy as np

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation

#: the model of every case: sevenn's architecture with random weights, two species
KWARGS = {"random": True, "species": ["Cu", "Ni"], "cutoff": 4.0, "channel": 8, "lmax": 2, "num_layers": 3,
          "seed": 7}
MODEL = ["model=py:shardmd.models.sevennet:factory", "model.random=true", "model.species=[Cu,Ni]",
         "model.cutoff=4.0", "model.channel=8", "model.lmax=2", "model.num_layers=3", "model.seed=7"]


def snapshot(sim):
    full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
    res = sim.results
    return full, float(res["energy"]), res["virial"].double().cpu().numpy()


def run(comm, argv):
    """``argv = [OUT_DIR, case, ...]`` on ``comm``."""
    out = Path(argv[0])
    for spec in argv[1:]:
        path, _, rest = spec.partition(":")
        grid, _, opts = rest.partition(":")
        plain = opts == "plain"
        stem = Path(path).stem + (f"_{grid}" if grid else "") + ("_plain" if plain else "")
        args = [*MODEL, f"system.file={path}", "precision=float64", f"domains={comm.size}", "steps=50",
                "dt=2.0", "temperature=900", "integrator=langevin", "trajectory.every=0", "thermo.every=0",
                "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4", f"output={out}/{stem}.h5"]
        if grid:
            args.append(f"grid=[{grid.replace('x', ',')}]")
        model = None
        if plain:
            from shardmd.domain.api import SPEC_MPNN_HALO
            from shardmd.models.sevennet import SPEC_SEVENNET, factory

            model = factory(**KWARGS)
            model.distribution_spec = SPEC_SEVENNET.replace(distribution=SPEC_MPNN_HALO.distribution)
        sim = Simulation(compose_config(args), comm=comm, model=model)
        sim.run(0)
        a, ea, wa = snapshot(sim)
        if plain:
            if comm.is_root:
                np.savez(out / f"{stem}.npz", pos0=a["positions"], f0=a["forces"], e0=ea, numbers=a["numbers"],
                         cell=sim.state.cell.double().cpu().numpy())
            continue
        sim.run(50)
        b, eb, wb = snapshot(sim)
        if comm.is_root:
            np.savez(out / f"{stem}.npz", pos0=a["positions"], f0=a["forces"], e0=ea, w0=wa,
                     pos1=b["positions"], f1=b["forces"], e1=eb, w1=wb, numbers=a["numbers"],
                     cell=sim.state.cell.double().cpu().numpy(), migrated=sim.summary["migrated"],
                     grid=np.array(sim.domain.grid.shape))


if __name__ == "__main__":
    from shardmd.domain.comm import init_comm, shutdown

    comm = init_comm("cpu")
    run(comm, sys.argv[1:])
    shutdown(comm)
