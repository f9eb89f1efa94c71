"""The active distribution scope and the intent helpers a model may call inside it.

:class:`~shardmd.domain.distributed_model.DistributedModel` opens a :class:`Scope` around
every model call.  Code inside (a model, an adapter's replacement) reads it with
:func:`current_scope`; outside any scope the helpers behave as on one process, so a model
using them runs unchanged without decomposition.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .collectives import all_reduce_sum
from .halo import halo_reverse
from .shard_tensor import GroupConfig, HaloMeta, ShardMeta, ShardTensor, plain


@dataclass
class Scope:
    """ctx: the DomainContext; spec: the MLIPSpec; reference: the promoted positions."""

    ctx: object
    spec: object
    halo: HaloMeta | None
    shard: ShardMeta | None
    group: GroupConfig
    n_systems: int = 1
    reference: ShardTensor | None = None

    @property
    def comm(self):
        return self.group.comm

    @property
    def n_owned(self) -> int:
        return self.halo.n_owned if self.halo is not None else self.shard.n_owned

    @property
    def n_padded(self) -> int:
        return self.halo.n_padded if self.halo is not None else self.shard.n_owned


_STACK: list[Scope] = []


def current_scope() -> Scope | None:
    """The innermost active scope, or None outside a distributed call."""
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def use_scope(scope: Scope):
    _STACK.append(scope)
    try:
        yield scope
    finally:
        _STACK.remove(scope)


def to_local(x: torch.Tensor) -> torch.Tensor:
    """Owned rows of a per-point tensor (all rows outside a scope)."""
    s = current_scope()
    if s is None or s.halo is None or x.shape[0] != s.halo.n_padded:
        return x
    return x[: s.halo.n_owned]


def system_sum(values: torch.Tensor, system_index: torch.Tensor, n_systems: int = 1) -> torch.Tensor:
    """(n_systems, *F) per-system sums of per-point ``values``: halo rows dropped, summed over
    ranks (differentiable).  Outside a scope: a plain ``index_add``."""
    s = current_scope()
    values, system_index = plain(values), plain(system_index)
    if s is not None and s.halo is not None and values.shape[0] == s.halo.n_padded:
        values, system_index = values[: s.halo.n_owned], system_index[: s.halo.n_owned]
    out = torch.zeros((n_systems, *values.shape[1:]), dtype=values.dtype, device=values.device)
    out = out.index_add(0, system_index, values)
    return all_reduce_sum(s.comm, out) if s is not None else out


def scatter_to_owners(x: torch.Tensor) -> torch.Tensor:
    """(n_padded, *F) -> (n_owned, *F): halo partial sums added to their owners."""
    s = current_scope()
    if s is None or s.halo is None:
        return x
    return halo_reverse(s.comm, s.halo.plan, plain(x))


__all__ = ["Scope", "current_scope", "scatter_to_owners", "system_sum", "to_local", "use_scope"]
