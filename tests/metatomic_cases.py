"""Run under ``mpiexec -n K``: the engine with a metatomic model file (metatrain's PET, random
weights) on K domains, at step 0 and after 50 hot Langevin steps (with migrations).

Usage: mpiexec -n K python tests/metatomic_cases.py OUT_DIR MODEL.pt case.extxyz[:grid][:range=R] ...
For each structure rank 0 writes OUT_DIR/<stem>[_<grid>][_range].npz with the gathered
positions (id order), forces, per-atom energies, energy and virial at steps 0 and 50 (float64),
the migrations and the grid.  ``range=R``: a control, step 0 only, with the halo sized by
``model.interaction_range=R`` (Å) instead of the model's receptive field.
tests/test_metatomic.py compares them with metatomic's own ASE calculator and with one domain.
"""
import sys
from pathlib import Path

import numpy as np

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation

ROUTE = "model=py:shardmd.models.metatomic:factory"
#: the MD settings of every case (tests/test_metatomic.py runs the same on one domain)
MD = ["precision=float64", "steps=50", "dt=2.0", "temperature=900", "integrator=langevin", "trajectory.every=0",
      "thermo.every=0", "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4"]


def arguments(model_file, structure, output, domains: int = 1, grid: str = "", extra=()) -> list[str]:
    args = [ROUTE, f"model.checkpoint={model_file}", "model.trust_code=true", *extra, f"system.file={structure}",
            *MD, f"domains={domains}", f"output={output}"]
    if grid:
        args.append(f"grid=[{grid.replace('x', ',')}]")
    return args


def snapshot(sim, tag: str) -> dict:
    """Rank 0: the gathered state of ``sim`` (id order) with suffix ``tag``; others: {}."""
    res = sim.results
    full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"), extra={"energies": res["energies"]})
    if full is None:
        return {}
    return {"pos" + tag: full["positions"], "f" + tag: full["forces"], "ea" + tag: full["energies"],
            "e" + tag: float(res["energy"]), "w" + tag: res["virial"].double().cpu().numpy(),
            "numbers": full["numbers"]}


def run_case(comm, model_file, structure, output, grid: str = "", extra=(), steps: int = 50) -> dict:
    """Step 0 and (steps > 0) step ``steps`` of one case on ``comm`` (None: one domain, this
    process); rank 0 gets the arrays, the others {}."""
    k = 1 if comm is None else comm.size
    sim = Simulation(compose_config(arguments(model_file, structure, output, k, grid, extra)), comm=comm)
    sim.run(0)
    out = snapshot(sim, "0")
    if steps:
        sim.run(steps)
        out.update(snapshot(sim, "1"))
    if out:
        out.update(cell=sim.state.cell.double().cpu().numpy(), migrated=sim.summary["migrated"],
                   grid=np.array(sim.domain.grid.shape))
    return out


def run(comm, argv):
    out, model_file = Path(argv[0]), argv[1]
    for case in argv[2:]:
        path, *opts = case.split(":")
        grid = next((o for o in opts if "x" in o), "")
        bound = next((o.split("=", 1)[1] for o in opts if o.startswith("range=")), None)
        extra = [f"model.interaction_range={bound}"] if bound else []
        stem = Path(path).stem + (f"_{grid}" if grid else "") + ("_range" if bound else "")
        res = run_case(comm, model_file, path, out / f"{stem}.h5", grid, extra, steps=0 if bound else 50)
        if comm.is_root:
            np.savez(out / f"{stem}.npz", **res)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi"))
    from launch import main

    main(run)
