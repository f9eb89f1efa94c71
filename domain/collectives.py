"""Differentiable collectives the ShardTensor handlers and transforms are built from.

The convention every backward here follows (docs/distributed.md, "Gradients through
collectives"): **a backward pass differentiates the sum over ranks of the scalars the ranks
seed**, ``E = sum_r E_r``.  A cotangent a rank holds for a tensor is the derivative of that
sum with respect to the rank's copy, and each collective's backward is the adjoint of its
forward, seen as a linear map on the concatenation of every rank's tensors:

- :func:`all_reduce_sum`: ``y = sum_r x_r`` on every rank.  Each rank's cotangent of ``y``
  is only its own share ``dE_r/dy`` (a value reused inside the rank's part of the energy),
  so the backward is again a sum over ranks: ``dE/dx_r = sum_s dE_s/dy``.  A replicated
  value that *is* the objective (the final energy) is therefore seeded on one rank only
  (:func:`seed_once`; DistributedModel does it for its autograd and strain outputs), not
  on every rank, which would count it once per rank.
- :func:`all_to_all_v`: rows ``send[offsets[p]:offsets[p+1]]`` go to rank ``p``; the rows
  received from rank ``q`` arrive in block ``q``, in the sender's order.  Uneven splits go
  through ``dist.all_to_all_single`` (works on gloo, NCCL and MPI backends; the list form
  ``dist.all_to_all`` does not exist on gloo).  The backward is the all-to-all with the
  splits swapped (a permutation's adjoint is its inverse); gathers built from it (the
  sharded ``index_select``, ``GatherInputsFull``) sum the cotangents of every copy on the
  owner, which is the same convention.
- halo exchanges (:mod:`shardmd.domain.halo`): forward and reverse, each the other's
  backward.

With ``comm.staged`` (gloo carrying CUDA data) buffers travel through host memory.
Every rank must call the same collectives in the same order, including ranks with
nothing to send: the handlers never skip a collective on local data, and a backward pass
runs the backward collectives of every rank's graph (a value seeded with zero still
takes part).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .comm import Comm

_COUNTS: list[dict] = []


@contextlib.contextmanager
def collective_counts():
    """Count the differentiable all-reduces called inside the block: yields a dict
    ``{"all_reduce_sum": calls}`` (the validator reads how many global sums a forward forms)."""
    c: dict = {"all_reduce_sum": 0}
    _COUNTS.append(c)
    try:
        yield c
    finally:
        _COUNTS.remove(c)


def _host(comm: Comm) -> bool:
    return comm.staged or comm.backend != "nccl"


def exchange_counts(comm: Comm, send_counts: torch.Tensor) -> torch.Tensor:
    """(size,) int64 rows each rank sends me, from my (size,) send counts."""
    if comm.size == 1:
        return send_counts.clone()
    dev = torch.device("cpu") if _host(comm) else comm.device
    s = send_counts.to(device=dev, dtype=torch.int64).contiguous()
    r = torch.empty_like(s)
    dist.all_to_all_single(r, s, group=comm.group)
    return r.to(send_counts.device)


def _a2a(comm: Comm, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    dev = x.device
    buf = x.detach()
    if _host(comm):
        buf = buf.cpu()
    buf = buf.contiguous()
    out = torch.empty((sum(recv), *x.shape[1:]), dtype=x.dtype, device=buf.device)
    dist.all_to_all_single(out, buf, output_split_sizes=list(recv), input_split_sizes=list(send),
                           group=comm.group)
    return out.to(dev)


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, send, recv):
        ctx.comm, ctx.send, ctx.recv = comm, send, recv
        return _a2a(comm, x, send, recv)

    @staticmethod
    def backward(ctx, g):
        return _AllToAllV.apply(g.contiguous(), ctx.comm, ctx.recv, ctx.send), None, None, None


def all_to_all_v(comm: Comm, x: torch.Tensor, send_counts, recv_counts) -> torch.Tensor:
    """Differentiable all-to-all with uneven splits along dim 0 (see module docstring)."""
    send = [int(c) for c in send_counts]
    recv = [int(c) for c in recv_counts]
    if sum(send) != int(x.shape[0]):
        raise ValueError(f"all_to_all_v: send counts sum to {sum(send)} but the tensor has {x.shape[0]} rows")
    if comm.size == 1:
        return x
    if x.requires_grad:
        return _AllToAllV.apply(x, comm, send, recv)
    return _a2a(comm, x, send, recv)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_reduce(x.detach())

    @staticmethod
    def backward(ctx, g):
        # the adjoint of "sum over ranks, result on every rank" is the same map
        return _AllReduceSum.apply(g.contiguous(), ctx.comm), None


def all_reduce_sum(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (new tensor); the backward sums the cotangents over ranks
    (see module docstring)."""
    for c in _COUNTS:
        c["all_reduce_sum"] += 1
    if comm.size == 1:
        return x.clone()
    if x.requires_grad:
        return _AllReduceSum.apply(x, comm)
    return comm.all_reduce(x)


class _SeedOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep):
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g if ctx.keep else torch.zeros_like(g)), None


def seed_once(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """``x`` (a value identical on every rank) counted once in the sum over ranks that a
    backward pass differentiates: the identity forward; the backward passes the cotangent
    on rank 0 and zero on the others (``shardmd.domain.runtime.seed_once`` is the form a
    model calls)."""
    if comm.size == 1 or not x.requires_grad:
        return x
    return _SeedOnce.apply(x, comm.rank == 0)


def seed_weight(comm: Comm, replicated: bool) -> float:
    """The cotangent a rank seeds a backward pass with: 1 for a per-rank partial (every
    rank's share counts), 1 on rank 0 and 0 elsewhere for a value identical on every rank."""
    return 1.0 if not replicated or comm is None or comm.size == 1 or comm.rank == 0 else 0.0


__all__ = ["all_reduce_sum", "all_to_all_v", "collective_counts", "exchange_counts", "seed_once", "seed_weight"]
