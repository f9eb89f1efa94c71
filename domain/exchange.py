"""Point-to-point exchange with the neighbouring domains over the shared process group.

Messages are matched by (peer, tag); a tag encodes the axis and the direction of travel, so
two messages between the same two ranks (a periodic axis split in two) never mix.  Every
receive lands in a buffer whose place in the result is fixed by the plan, never by arrival
order, so results are bit-reproducible.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import Comm, mpi_wait


def tag(axis: int, toward_upper: bool, kind: int = 0) -> int:
    """Tag of a message travelling along ``axis`` toward the upper (or lower) neighbour."""
    return (kind * 3 + axis) * 2 + int(toward_upper)


def swap_into(comm: Comm, sends: list[tuple[int, torch.Tensor, int]],
              recvs: list[tuple[int, torch.Tensor, int]]) -> None:
    """Post every send and receive, wait for all; each receive lands in its given tensor.

    sends: (peer rank, tensor, tag); recvs: (peer rank, destination, tag), where a destination
    may be a view into a larger buffer (a row slice: a receive straight into its final place,
    no copy).  Empty tensors are neither sent nor received (both sides know the counts).  With
    ``comm.staged`` the data travel through host memory. With ``comm.host_over_mpi`` host
    tensors go through MPI point-to-point instead of the group (:func:`_swap_into_mpi`).
    """
    if comm.host_over_mpi and comm.mpi is not None and not comm.staged and comm.backend != "nccl":
        _swap_into_mpi(comm, sends, recvs)
        return
    ops = []
    keep = []
    for peer, t, tg in sends:
        if t.numel() == 0:
            continue
        buf = t.detach().contiguous()
        if comm.staged:
            buf = buf.cpu()
        keep.append(buf)
        ops.append(dist.P2POp(dist.isend, buf, peer, group=comm.group, tag=tg))
    landing = []   # (receive buffer, destination) where they differ
    for peer, dest, tg in recvs:
        if dest.numel() == 0:
            continue
        buf = dest
        if comm.staged or not dest.is_contiguous():
            buf = torch.empty(dest.shape, dtype=dest.dtype, device="cpu" if comm.staged else dest.device)
            landing.append((buf, dest))
        ops.append(dist.P2POp(dist.irecv, buf, peer, group=comm.group, tag=tg))
    # One batch: NCCL runs a batch's sends and receives as one group, so two ranks that
    # both send first cannot deadlock (separate isend/irecv calls can, on NCCL).
    if ops:
        for r in dist.batch_isend_irecv(ops):
            r.wait()
    for buf, dest in landing:
        dest.copy_(buf)
    del keep


def _bytes(t: torch.Tensor):
    """A numpy uint8 view of contiguous ``t``'s memory (an MPI send or receive buffer)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _swap_into_mpi(comm: Comm, sends, recvs) -> None:
    """:func:`swap_into` through MPI point-to-point on host tensors: the same messages, peers
    and tags as the group's batch (MPI keeps the order of messages with one peer and tag, so
    two calls in a row never mix). A halo's positions on 2 local ranks take ~75 µs this way
    against 0.3-3.5 ms through gloo's batch (scripts/bench_collectives.py)."""
    world = comm.mpi.COMM_WORLD
    reqs, keep, landing = [], [], []
    for peer, dest, tg in recvs:      # receives first: a send finds its receive posted
        if dest.numel() == 0:
            continue
        buf = dest
        if not dest.is_contiguous():
            buf = torch.empty(dest.shape, dtype=dest.dtype)
            landing.append((buf, dest))
        reqs.append(world.Irecv(_bytes(buf), peer, tag=tg))
    for peer, t, tg in sends:
        if t.numel() == 0:
            continue
        buf = t.detach().contiguous()
        keep.append(buf)
        reqs.append(world.Isend(_bytes(buf), peer, tag=tg))
    with mpi_wait():
        comm.mpi.Request.Waitall(reqs)
    for buf, dest in landing:
        dest.copy_(buf)
    del keep


def swap(comm: Comm, sends: list[tuple[int, torch.Tensor, int]],
         recvs: list[tuple[int, tuple, torch.dtype, int]]) -> list[torch.Tensor]:
    """:func:`swap_into` with fresh receive buffers: recvs (peer rank, shape, dtype, tag);
    returns the received tensors in ``recvs`` order (on the comm's device)."""
    out = [torch.empty(shape, dtype=dtype, device=comm.device) for _, shape, dtype, _ in recvs]
    swap_into(comm, sends, [(peer, buf, tg) for (peer, _, _, tg), buf in zip(recvs, out)])
    return out


def swap_counts(comm: Comm, sends: list[tuple[int, int, int]], recv_from: list[tuple[int, int]]) -> list[int]:
    """Exchange integer counts: sends (peer, count, tag); recv_from (peer, tag)."""
    dev = torch.device("cpu") if (comm.staged or comm.backend != "nccl") else comm.device
    got = swap(comm, [(p, torch.tensor([c], dtype=torch.int64, device=dev), tg) for p, c, tg in sends],
               [(p, (1,), torch.int64, tg) for p, tg in recv_from])
    return [int(g[0]) for g in got]
