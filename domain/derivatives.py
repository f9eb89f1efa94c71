"""Outputs obtained by differentiating a model's output: forces (with respect to the
positions) and the virial (with respect to a homogeneous strain).

Strain: positions and cell are deformed by ``F = I + sym(eps)`` at ``eps = 0``,
``x' = x @ F`` and ``cell' = cell @ F`` (rows are vectors).  The virial is
``W = -d(source)/d(eps)`` (eV; ``W = sum over pairs r_ij (x) f_ij`` for pair forces, the
engine's convention) and the stress ``-W / V`` (eV/Å³, the ASE sign).  Under decomposition
the rank's padded positions are strained as a whole: a ghost row is ``owner + S @ cell``, so
``ghost @ F = owner @ F + S @ (cell @ F)``, the owner strained plus its image in the
strained cell, consistent with the strained cell that image shifts of the neighbour list
use.  Every rank differentiates its own copy of ``eps``; the exchanges' backward routes
cross-rank contributions, so the sum over ranks of the per-rank derivatives is the
derivative of the global source.

Seeds (the convention of :mod:`shardmd.domain.collectives`: a backward pass differentiates
the sum over ranks of what the ranks seed): a source that is a per-rank partial is seeded
with 1 on every rank; a source named in ``replicated`` (identical on every rank, e.g. an
energy the model summed over ranks itself) is seeded with 1 on rank 0 and 0 elsewhere, so it
is counted once; the all-reduce that formed it sums the seeds back to 1 on every rank.
"""
from __future__ import annotations

import torch

from .collectives import seed_weight
from .shard_tensor import plain


def strain_leaf(dtype, device) -> torch.Tensor:
    """A (3, 3) zero strain that requires grad."""
    return torch.zeros(3, 3, dtype=dtype, device=device, requires_grad=True)


def apply_strain(positions: torch.Tensor, cell: torch.Tensor, eps: torch.Tensor):
    """(positions @ F, cell @ F) with ``F = I + (eps + eps^T) / 2``."""
    f = torch.eye(3, dtype=eps.dtype, device=eps.device) + 0.5 * (eps + eps.T)
    return positions @ f.to(positions.dtype), cell @ f.to(cell.dtype)


def fill_derivative_outputs(raw: dict, leaf: torch.Tensor | None, autograd_outputs=None,
                            eps: torch.Tensor | None = None, strain_outputs=None, cell: torch.Tensor | None = None,
                            comm=None, replicated=frozenset()) -> dict:
    """Fill ``raw[out] = -d(sum raw[src])/d(leaf)`` for ``autograd_outputs`` (no exchange)
    and the virial ``-d(sum raw[src])/d(eps)`` for ``strain_outputs`` (summed over ranks
    when ``comm`` is given; an output named ``stress`` gets ``-W / |det cell|``).  One
    backward pass per source; sources in ``replicated`` are seeded on one rank (module
    docstring)."""
    auto = dict(autograd_outputs or {})
    strain = dict(strain_outputs or {})
    sources = list(dict.fromkeys(list(auto.values()) + list(strain.values())))
    for k, src in enumerate(sources):
        want_x = [o for o, s in auto.items() if s == src]
        want_e = [o for o, s in strain.items() if s == src]
        inputs = ([leaf] if want_x else []) + ([eps] if want_e else [])
        total = plain(raw[src]).sum()
        seed = torch.full_like(total, seed_weight(comm, src in replicated))
        grads = torch.autograd.grad(total, inputs, grad_outputs=seed, retain_graph=k < len(sources) - 1,
                                    allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, inputs)]
        if want_x:
            gx = grads.pop(0)
            for o in want_x:
                raw[o] = -gx
        if want_e:
            w = -grads.pop(0)
            if comm is not None and comm.size > 1:
                w = comm.all_reduce(w.detach())
            for o in want_e:
                raw[o] = -w / torch.linalg.det(cell).abs() if o == "stress" else w
    return raw


def fill_autograd_outputs(raw: dict, leaf: torch.Tensor, autograd_outputs) -> dict:
    """Fill ``raw[out] = -d(sum raw[src])/d(leaf)`` for each ``out: src`` (no exchange)."""
    return fill_derivative_outputs(raw, leaf, autograd_outputs)


__all__ = ["apply_strain", "fill_autograd_outputs", "fill_derivative_outputs", "strain_leaf"]
