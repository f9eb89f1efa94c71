"""Run under ``mpiexec -n K``: the engine with NequIP (model=nequip, random weights) on K
domains, before and after 50 hot MD steps (migrations).

Usage: mpiexec -n K python tests/mpi/nequip_cases.py OUT_DIR case.extxyz[:grid][:plain] ...
For each structure rank 0 writes OUT_DIR/<stem>.npz with the gathered positions (in id
order, as used), forces, energy and virial at step 0 and at step 50 (float64).
tests/test_second_family.py compares them with nequip's own ASE calculator.  ``plain``: a
control, step 0 only, the same model with the bare message-passing preset (no JitAdapters for
nequip's TorchScript scatter), written to <stem>_plain.npz.
"""
from pathlib import Path

import numpy as np

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation

#: the model of every case: nequip's random model, two species (registry.nequip's defaults)
MODEL = ["model=nequip", "model.species=[Cu,Ni]", "model.r_max=4.0", "model.seed=7"]


def snapshot(sim):
    full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
    res = sim.results
    return full, float(res["energy"]), res["virial"].double().cpu().numpy()


def run(comm, argv):
    """``argv = [OUT_DIR, case, ...]`` on ``comm`` (tests/mpi/world.py runs it too)."""
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
            from shardmd.models.nequip import SPEC_NEQUIP, NequipModel

            model = NequipModel(species=("Cu", "Ni"), r_max=4.0, seed=7)
            model.distribution_spec = SPEC_NEQUIP.replace(distribution=SPEC_MPNN_HALO.distribution)
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
    from launch import main

    main(run)
