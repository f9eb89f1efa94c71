"""CPU halo transport: one swap of 2 x 130 KB (5,500 ghosts x 3 float64, both directions)
between two ranks, through the engine's gloo path and through MPI Isend/Irecv.

    mpiexec -n 2 python scripts/bench_halo_transport.py
"""
import time

import numpy as np
import torch
from mpi4py import MPI

from shardmd.domain.comm import init_comm
from shardmd.domain.exchange import swap

comm = init_comm("cpu")
peer = 1 - comm.rank
x = torch.randn(5500, 3, dtype=torch.float64)
SENDS = [(peer, x, 0), (peer, x, 1)]
RECVS = [(peer, (5500, 3), torch.float64, 1), (peer, (5500, 3), torch.float64, 0)]
W = MPI.COMM_WORLD
a = x.numpy()
b = np.empty_like(a)


def gloo():
    swap(comm, SENDS, RECVS)


def mpi():
    reqs = [W.Isend(a, peer, 0), W.Irecv(b, peer, 0), W.Isend(a, peer, 1), W.Irecv(np.empty_like(a), peer, 1)]
    MPI.Request.Waitall(reqs)


for name, fn in (("gloo batch_isend_irecv", gloo), ("MPI Isend/Irecv", mpi)):
    for _ in range(5):
        fn()
    t = time.perf_counter()
    for _ in range(200):
        fn()
    dt = (time.perf_counter() - t) / 200
    if comm.rank == 0:
        print(name, f"{dt * 1e3:.3f} ms per 2x130 KB swap")
