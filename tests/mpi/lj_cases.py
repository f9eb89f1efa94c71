"""Run under ``mpiexec -n K``: LJ energy/forces/virial of several systems on K domains.

Usage: mpiexec -n K python tests/mpi/lj_cases.py OUT_DIR [case ...]
Each case is ``name:grid`` (grid like 1x1x2 or 'auto'); rank 0 writes OUT_DIR/<name>_<grid>.npz
with ids, positions (as given), forces, energy, virial, the grid used and the max ghost count.
SHARDMD_TEST_DEVICE=cuda runs on the GPUs (one per rank over NCCL; ranks sharing a GPU go
through host memory) instead of the CPU (gloo).
"""
import os
import sys
from pathlib import Path

import numpy as np
import torch

from shardmd.domain.comm import init_comm, shutdown
from shardmd.domain.distributed_model import DistributedModel
from shardmd.engine.run.rank_domain import RankDomain
from shardmd.engine.run.state import State
from shardmd.models.lj import LennardJones

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from systems import make_system


def run(comm, argv):
    """The cases ``argv = [OUT_DIR, case, ...]`` on ``comm`` (tests/mpi/world.py runs it too)."""
    out = Path(argv[0])
    torch.set_num_threads(1)
    lj = LennardJones({"Ar": 0.0104, "Kr": 0.014}, {"Ar": 3.40, "Kr": 3.65}, cutoff=7.0, shift=True)
    for spec in argv[1:]:
        name, grid = spec.split(":")
        for prec in ("float64", "float32"):
            atoms = make_system(name)
            dtype = torch.float64 if prec == "float64" else torch.float32
            state = State.from_atoms(atoms, dtype=dtype, device=comm.device)
            shape = None if grid == "auto" else tuple(int(g) for g in grid.split("x"))
            dec = RankDomain(comm, lj.cutoff, 0.7, grid=shape)
            state = dec.distribute(state)
            dec.rebuild(state)
            res = DistributedModel(lj).compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)
            state.forces = res["forces"]
            full = dec.gather(state, ("positions", "forces"))
            n_ghost = comm.all_reduce(torch.tensor([dec.plan.n_ghost], device=comm.device), "max").cpu()
            if comm.is_root:
                np.savez(out / f"{name}_{grid}_{prec}.npz", ids=full["ids"], forces=full["forces"],
                         energy=float(res["energy"]), virial=res["virial"].double().cpu().numpy(),
                         grid=np.array(dec.grid.shape), ghosts=int(n_ghost[0]))


def check_gloo_shutdown(comm):
    """Shut the world down; under gloo, exit non-zero unless its worker threads were joined."""
    if comm.backend != "gloo":
        shutdown(comm)
        return
    workers = _gloo_workers()
    shutdown(comm)
    # shutdown joins gloo's worker threads (left alive, one may abort the process at exit);
    # the count before shows the threads are recognised by name at all
    if workers == 0 or _gloo_workers():
        sys.exit(f"rank {comm.rank}: gloo worker threads {workers} before shutdown, {_gloo_workers()} after")


def main():
    comm = init_comm(os.environ.get("SHARDMD_TEST_DEVICE", "cpu"))
    run(comm, sys.argv[1:])
    check_gloo_shutdown(comm)


def _gloo_workers() -> int:
    """Live threads of this process that torch names pt_gloo* (Linux /proc)."""
    return sum((t / "comm").read_text().startswith("pt_gloo") for t in Path("/proc/self/task").iterdir())


if __name__ == "__main__":
    main()
