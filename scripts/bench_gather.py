"""Gathering per-atom arrays on rank 0 (what checkpoints and trajectory frames do):
torch.distributed's object gather against mpi4py's, which ``Comm.gather_object`` uses.

    mpirun -n 2 python scripts/bench_gather.py --atoms 1000000 4000000
    mpirun -n 2 python scripts/bench_gather.py --atoms 8000000 --device cuda   # NCCL group

Each rank holds ``atoms / ranks`` rows of the checkpoint's fields (positions, velocities,
reference positions float64; images int32; ids, numbers int64; masses float64) as CPU
tensors, as ``RankDomain.gather`` sends them. Prints the median of ``--reps`` gathers.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atoms", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)

    from shardmd.domain.comm import init_comm, shutdown

    comm = init_comm(a.device)
    if comm.is_root:
        print(f"gather on rank 0: {comm.size} ranks, {comm.backend} group; median of {a.reps}")
        print(f"{'atoms':>10} {'MB':>8} {'torch gather_object s':>22} {'mpi4py gather s':>16}")
    for n in a.atoms:
        m = n // comm.size
        local = {"ids": torch.arange(m, dtype=torch.int64) + comm.rank * m,
                 **{k: torch.randn(m, 3, dtype=torch.float64) for k in ("positions", "velocities", "reference")},
                 "images": torch.zeros(m, 3, dtype=torch.int32), "numbers": torch.full((m,), 18),
                 "masses": torch.full((m,), 39.948, dtype=torch.float64)}
        mb = comm.size * sum(t.numel() * t.element_size() for t in local.values()) / 1e6

        def via_torch(local=local):
            out = [None] * comm.size if comm.is_root else None
            dist.gather_object(local, out, dst=0, group=comm.group)

        def via_mpi(local=local):
            comm.mpi.COMM_WORLD.gather(local, root=0)

        res = []
        for fn in (via_torch, via_mpi):
            fn()
            times = []
            for _ in range(a.reps):
                comm.barrier()
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            res.append(statistics.median(times))
        worst = comm.all_reduce(torch.tensor(res, dtype=torch.float64), "max")
        if comm.is_root:
            print(f"{n:>10} {mb:>8.0f} {float(worst[0]):>22.3f} {float(worst[1]):>16.3f}", flush=True)
    shutdown(comm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
