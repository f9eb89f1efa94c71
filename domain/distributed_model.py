"""The engine <-> model call under decomposition (frozen interface).

The engine calls ``DistributedModel(model).compute(ctx, positions, numbers, nl)`` on every
rank with the rank's ``[owned | ghost]`` points and a neighbour list whose query rows are
the owned points.  The model is an ordinary single-process model: it offers ``cutoff``,
``compute(positions, cell, pbc, numbers, nl) -> dict`` and ``output_kinds``, a map from
output name to one of

- ``"per_system"``: a partial sum on each rank, summed over ranks (energy, virial);
- ``"per_point"``: rows of the owned points, exact as computed (kernel-direct forces of
  a full, receiver-owned neighbour list);
- ``"per_point_reverse"``: rows of all padded points whose ghost rows are partial and are
  added to their owners by a reverse halo exchange (scatter from owned senders);
- ``"global"``: already identical on every rank.

A single domain runs through the same call (the exchanges are identities).  The ShardTensor
layer (specs, adapters, autograd models) plugs in behind this call.
"""
from __future__ import annotations

import torch

from .context import DomainContext

KINDS = ("per_system", "per_point", "per_point_reverse", "global")


class DistributedModel:
    def __init__(self, model):
        self.model = model
        kinds = getattr(model, "output_kinds", None)
        if not kinds:
            raise TypeError(f"{type(model).__name__} declares no output_kinds; see shardmd.domain.distributed_model")
        bad = {k: v for k, v in kinds.items() if v not in KINDS}
        if bad:
            raise ValueError(f"unknown output kinds {bad}; use one of {KINDS}")
        self.kinds = dict(kinds)

    @property
    def cutoff(self) -> float:
        return self.model.cutoff

    def compute(self, ctx: DomainContext, positions: torch.Tensor, numbers: torch.Tensor, nl) -> dict:
        """Outputs with global per-system values and owned per-point rows on every rank."""
        raw = self.model.compute(positions, ctx.cell, ctx.local_pbc, numbers, nl)
        out = {}
        for key, value in raw.items():
            kind = self.kinds.get(key, "global")
            if kind == "per_system":
                out[key] = ctx.all_reduce(value)
            elif kind == "per_point":
                out[key] = value[: ctx.n_owned]
            elif kind == "per_point_reverse":
                out[key] = ctx.reverse(value)
            else:
                out[key] = value
        return out
