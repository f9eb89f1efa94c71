"""Run under ``mpiexec -n K``: the engine with MACE on K domains, before and after 50 MD steps.

Usage: mpiexec -n K python tests/mpi/mace_cases.py OUT_DIR MODEL_FILE case.extxyz[:grid[:cueq]] ...
(``cueq``: the model converted to cuEquivariance, files named <stem>_cueq_<prec>.npz).
For each structure and precision, rank 0 writes OUT_DIR/<stem>_<prec>.npz with the gathered
positions (unwrapped frame as used), forces, energy and virial at step 0 and at step 50
(float64; float32 runs no steps: its "step 50" is step 0).
SHARDMD_TEST_DEVICE=cuda runs on the GPUs (one per rank over NCCL; ranks sharing a GPU go
through host memory; the deferred, pipelined skin check is then on) instead of the CPU (gloo).
"""
import os
import sys
from pathlib import Path

import numpy as np

from shardmd.domain.comm import init_comm, shutdown
from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation


def snapshot(sim):
    full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
    res = sim.results
    return full, float(res["energy"]), res["virial"].double().cpu().numpy()


def run(comm, argv):
    """``argv = [OUT_DIR, MODEL_FILE, case, ...]`` on ``comm`` (tests/mpi/world.py runs it too)."""
    out, model = Path(argv[0]), argv[1]
    device = os.environ.get("SHARDMD_TEST_DEVICE", "cpu")
    for spec in argv[2:]:
        path, _, rest = spec.partition(":")
        grid, _, opts = rest.partition(":")
        cueq = opts == "cueq"
        stem = Path(path).stem + ("_cueq" if cueq else "")
        for prec in ("float64", "float32"):
            args = ["model=mace", f"model.checkpoint={model}", f"model.cueq={str(cueq).lower()}",
                    f"system.file={path}", f"precision={prec}", f"device={device}",
                    f"domains={comm.size}", "steps=50", "dt=2.0", "temperature=900", "integrator=langevin",
                    "trajectory.every=0", "thermo.every=0", "checkpoint.every=0", "quiet=true",
                    "neighbor.skin=0.4", f"output={out}/{stem}_{prec}.h5"]
            if grid:
                args.append(f"grid=[{grid.replace('x', ',')}]")
            sim = Simulation(compose_config(args), comm=comm)
            sim.run(0)
            a, ea, wa = snapshot(sim)
            if prec == "float64":   # float32 is checked at step 0 only: its 50 steps were unused
                sim.run(50)
            b, eb, wb = snapshot(sim)
            if comm.is_root:
                np.savez(out / f"{stem}_{prec}.npz", pos0=a["positions"], f0=a["forces"], e0=ea, w0=wa,
                         pos1=b["positions"], f1=b["forces"], e1=eb, w1=wb, numbers=a["numbers"],
                         cell=sim.state.cell.double().cpu().numpy(), migrated=sim.summary["migrated"],
                         grid=np.array(sim.domain.grid.shape))


def main():
    comm = init_comm(os.environ.get("SHARDMD_TEST_DEVICE", "cpu"))
    run(comm, sys.argv[1:])
    shutdown(comm)


if __name__ == "__main__":
    main()
