"""What one small all-reduce costs per call, through the engine's Comm and through mpi4py.

The per-step collectives of the CPU loop are tiny (the skin check's [need, health], the stop
request): their cost is latency, not bandwidth. This times, on the ranks of one mpiexec job,
an all-reduce (max) of ``--values`` float64 values
    torch.distributed the process group (gloo on the CPU): the engine's path until host
                      reductions took MPI
    comm.all_reduce   the engine's path (domain/comm.py: MPI for host reductions where the
                      result is order-independent, with its NaN flags; else the group)
    comm.any          the stop request's path (one int64)
    mpi4py Allreduce  MPI directly on numpy buffers (MPICH: shared memory between local ranks)
    mpi4py allreduce  MPI's pickled object path (a Python float list)
(and on 2 ranks a halo refresh's point-to-point exchange, the group's batch of isend/irecv
against mpi4py's Isend/Irecv), and prints a table of medians per call (µs) over ``--rounds``
rounds of ``--calls`` calls each.

    .venv/bin/mpiexec -n 2 .venv/bin/python scripts/bench_collectives.py
    .venv/bin/python scripts/bench_collectives.py --ranks 2      # launches mpiexec itself
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _bench(fn, calls: int, rounds: int, barrier) -> list[float]:
    for _ in range(min(calls, 200)):  # warm-up
        fn()
    per_call = []
    for _ in range(rounds):
        barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t) / calls * 1e6)
    return per_call


def worker(args) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist

    from shardmd.domain.comm import init_comm, shutdown

    torch.set_num_threads(1)
    comm = init_comm("cpu")
    mpi = comm.mpi.COMM_WORLD
    MPI = comm.mpi
    n = args.values
    t = torch.rand(n, dtype=torch.float64)
    a = np.random.rand(n)
    b = np.empty_like(a)
    lst = a.tolist()
    def group_max():   # what Comm.all_reduce did before it took MPI for host reductions
        x = t.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=comm.group)
        return x.tolist()

    via = "MPI" if comm._over_mpi(t, "max") else comm.backend
    cases = {
        f"torch.distributed {comm.backend} all_reduce, {n} float64": group_max,
        f"comm.all_reduce (-> {via}), {n} float64": lambda: comm.all_reduce(t, "max").tolist(),
        f"comm.any (-> {via}), 1 int64": lambda: comm.any(False),
        f"mpi4py Allreduce (numpy), {n} float64": lambda: mpi.Allreduce(a, b, op=MPI.MAX),
        f"mpi4py allreduce (pickle), {n} floats": lambda: mpi.allreduce(lst, op=MPI.MAX),
    }
    if comm.size == 2 and args.halo:   # a halo refresh's size: both neighbours of a 2-rank slab split
        peer, m = 1 - comm.rank, args.halo
        send = [torch.rand(m, 3, dtype=torch.float64) for _ in range(2)]
        recv = [torch.empty(m, 3, dtype=torch.float64) for _ in range(2)]

        def group_swap():   # domain/exchange.py swap_into: one batch of isend/irecv per refresh
            ops = [dist.P2POp(dist.isend, send[k], peer, group=comm.group, tag=k) for k in range(2)]
            ops += [dist.P2POp(dist.irecv, recv[k], peer, group=comm.group, tag=1 - k) for k in range(2)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

        def mpi_swap():
            reqs = [mpi.Isend(send[k].numpy(), peer, tag=k) for k in range(2)]
            reqs += [mpi.Irecv(recv[k].numpy(), peer, tag=1 - k) for k in range(2)]
            MPI.Request.Waitall(reqs)

        cases[f"torch.distributed {comm.backend} isend/irecv, 2 x {m} x 3 float64 each way"] = group_swap
        cases[f"mpi4py Isend/Irecv, 2 x {m} x 3 float64 each way"] = mpi_swap
    rows = []
    for name, fn in cases.items():
        per = _bench(fn, args.calls, args.rounds, mpi.Barrier)
        rows.append((name, statistics.median(per), min(per), max(per)))
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.rounds} rounds x {args.calls} calls; "
              f"µs per call (median, min, max of the rounds' means)")
        w = max(len(r[0]) for r in rows)
        print(f"{'path':<{w}}  {'median':>8}  {'min':>8}  {'max':>8}")
        for name, med, lo, hi in rows:
            print(f"{name:<{w}}  {med:8.1f}  {lo:8.1f}  {hi:8.1f}")
        sys.stdout.flush()
    shutdown(comm)
    sys.stdout.flush()
    os._exit(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=0, help="launch mpiexec -n RANKS (0: already under a launcher)")
    ap.add_argument("--values", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--halo", type=int, default=2700,
                    help="2 ranks: also a halo-sized exchange, this many atoms' positions to each side "
                         "(2700: 32k atoms split in 2 along x; 0: none)")
    args = ap.parse_args(argv)
    if args.ranks:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--ranks")
        rest = rest[:i] + rest[i + 2:]
        cmd = [mpiexec, "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()), *rest]
        return subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
