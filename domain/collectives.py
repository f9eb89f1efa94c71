"""Differentiable collectives the ShardTensor handlers and transforms are built from.

- :func:`all_reduce_sum`: sum over ranks.  Its backward is the identity: the result is
  replicated, and a loss computed from it identically on every rank seeds the same
  cotangent on every rank, so each rank's partial receives exactly that cotangent (an
  all-reduce in the backward would multiply gradients by the world size).
- :func:`all_to_all_v`: rows ``send[offsets[p]:offsets[p+1]]`` go to rank ``p``; the rows
  received from rank ``q`` arrive in block ``q``, in the sender's order.  Uneven splits go
  through ``dist.all_to_all_single`` (works on gloo, NCCL and MPI backends; the list form
  ``dist.all_to_all`` does not exist on gloo).  The backward is the all-to-all with the
  splits swapped.

With ``comm.staged`` (gloo carrying CUDA data) buffers travel through host memory.
Every rank must call the same collectives in the same order, including ranks with
nothing to send: the handlers never skip a collective on local data.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import Comm


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
        return comm.all_reduce(x.detach())

    @staticmethod
    def backward(ctx, g):
        return g, None


def all_reduce_sum(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (new tensor), identity backward (see module docstring)."""
    if comm.size == 1:
        return x.clone()
    if x.requires_grad:
        return _AllReduceSum.apply(x, comm)
    return comm.all_reduce(x)


__all__ = ["all_reduce_sum", "all_to_all_v", "exchange_counts"]
