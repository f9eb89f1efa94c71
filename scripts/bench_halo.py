"""Halo exchange speed: ``halo_forward`` and ``halo_reverse`` of per-point features.

    mpirun -n 2 python scripts/bench_halo.py --points 2000000 --features 3 128 --device cuda
    mpirun -n 2 python scripts/bench_halo.py --points 100000 --features 3 32     # CPU, gloo

The box is periodic and cubic, filled with uniformly random points at the density of fcc Cu
(0.0847 Å^-3); each rank makes the points of its own domain (the engine's grid choice for
``--width``, cutoff + skin in Å). Prints, per feature width F: ghosts per rank, the bytes a
rank receives per exchange, and the median milliseconds of ``--reps`` forward and reverse
exchanges (each synchronised, all ranks in step), with the bandwidth that makes. The floor is
one copy of the ghost rows; everything above it is packing, bookkeeping and transport.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

DENSITY = 4 / 3.615**3   # points per Å^3 (fcc Cu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=200_000, help="points in the whole box")
    ap.add_argument("--features", type=int, nargs="+", default=[3, 128], help="feature widths F")
    ap.add_argument("--width", type=float, default=6.0, help="ghost width, Å")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args(argv)

    from shardmd.domain.comm import init_comm
    from shardmd.domain.decomposition import choose_grid
    from shardmd.domain.halo import build_halo, halo_forward, halo_reverse

    comm = init_comm(a.device)
    dev, dt = comm.device, getattr(torch, a.dtype)
    side = (a.points / DENSITY) ** (1 / 3)
    cell = torch.eye(3, dtype=dt) * side
    grid = choose_grid(comm.size, cell, [True] * 3, a.width)
    c = torch.tensor(grid.coords(comm.rank), dtype=dt)
    shape = torch.tensor(grid.shape, dtype=dt)
    n_own = a.points // comm.size
    g = torch.Generator().manual_seed(comm.rank)
    frac = (c + torch.rand(n_own, 3, generator=g, dtype=dt)) / shape   # inside this rank's domain
    pos = (frac * side).to(dev)
    ids = (torch.arange(n_own) + comm.rank * n_own).to(dev)[:, None]
    plan, _, _ = build_halo(comm, grid, cell.to(dev), [True] * 3, pos, ids, a.width)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(a.reps):
            sync()
            comm.barrier()
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    rows = []
    for f in a.features:
        x = torch.randn(n_own, f, dtype=dt, device=dev)
        y = torch.randn(plan.n_padded, f, dtype=dt, device=dev)
        fwd = timed(lambda x=x: halo_forward(comm, plan, x))
        rev = timed(lambda y=y: halo_reverse(comm, plan, y))
        nbytes = plan.n_ghost * f * x.element_size()
        rows.append((f, fwd, rev, nbytes))
    worst = comm.all_reduce(torch.tensor([r[1] for r in rows] + [r[2] for r in rows], dtype=torch.float64), "max")
    ghosts = int(comm.all_reduce(torch.tensor([plan.n_ghost]), "max")[0])
    if comm.is_root:
        print(f"halo exchange: {a.points} points, {comm.size} ranks (grid {'x'.join(map(str, grid.shape))}), "
              f"width {a.width} Å, {a.dtype}, {dev.type}; up to {ghosts} ghosts per rank; "
              f"median of {a.reps}, slowest rank")
        print(f"{'F':>5} {'MB in':>8} {'forward ms':>11} {'GB/s':>7} {'reverse ms':>11} {'GB/s':>7}")
        k = len(rows)
        for i, (f, _, _, nbytes) in enumerate(rows):
            fw, rv = float(worst[i]), float(worst[k + i])
            print(f"{f:>5} {nbytes / 1e6:>8.2f} {1e3 * fw:>11.3f} {nbytes / fw / 1e9:>7.2f} "
                  f"{1e3 * rv:>11.3f} {nbytes / rv / 1e9:>7.2f}")
    from shardmd.domain.comm import shutdown

    shutdown(comm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
