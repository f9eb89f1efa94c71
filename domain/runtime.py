"""The active distribution scope and the intent helpers a model may call inside it.

:class:`~shardmd.domain.distributed_model.DistributedModel` opens a :class:`Scope` around
every model call.  Code inside (a model, an adapter's replacement) reads it with
:func:`current_scope`; outside any scope the helpers behave as on one process, so a model
using them runs unchanged without decomposition.

Helpers (neutral names here; ``shardmd.domain.api`` also exports the model-vocabulary
aliases ``refresh_neighbors`` = :func:`refresh_halo`, ``autograd_target`` =
:func:`grad_leaf`, ``current_dd_context`` = :func:`current_scope`):

- :func:`to_local`: owned rows of a per-point tensor;
- :func:`system_sum`: per-system sums over owned rows, summed over ranks;
- :func:`scatter_to_owners`: halo partial sums added to their owners (reverse exchange);
- :func:`refresh_halo`: halo rows re-copied from their owners (forward exchange);
- :func:`grad_leaf`: the autograd leaf behind a promoted input (what
  ``torch.autograd.grad`` must differentiate with respect to);
- :func:`seed_once`: a value identical on every rank (a per-system sum) made the objective
  of a backward pass the model runs itself, counted once over the ranks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .collectives import all_reduce_sum
from .collectives import seed_once as _seed_once
from .halo import halo_forward, halo_reverse
from .shard_tensor import GroupConfig, HaloMeta, ShardMeta, ShardTensor, plain


@dataclass
class Scope:
    """ctx: the DomainContext; spec: the MLIPSpec; reference: the promoted positions;
    leaf: the autograd leaf behind them; inputs: the other promoted per-point inputs (name ->
    ShardTensor) and leaves their leaves; padding: the filler counts when the graph is padded."""

    ctx: object
    spec: object
    halo: HaloMeta | None
    shard: ShardMeta | None
    group: GroupConfig
    n_systems: int = 1
    reference: ShardTensor | None = None
    leaf: torch.Tensor | None = None
    inputs: dict = field(default_factory=dict)
    leaves: dict = field(default_factory=dict)
    padding: object = None

    @property
    def comm(self):
        return self.group.comm

    @property
    def n_owned(self) -> int:
        return self.halo.n_owned if self.halo is not None else self.shard.n_owned

    @property
    def n_padded(self) -> int:
        return self.halo.n_padded if self.halo is not None else self.shard.n_owned

    @property
    def storage(self):
        """The spec's storage policy (HaloStorage or ShardedStorage)."""
        return self.spec.distribution.storage

    @property
    def compile_policy(self):
        return self.spec.distribution.compile_policy


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
    ranks (differentiable), in the values' dtype.  Outside a scope: a plain ``index_add``.

    A float32 sum is accumulated in float64: an index_add adds its terms one by one, so a sum
    of ~10^4 site energies of a few eV each in float32 drifts by ~1e-4 eV per point (measured
    on ORB's and UMA's energies, docs/benchmarks.md), more than the forces' agreement."""
    s = current_scope()
    values, system_index = plain(values), plain(system_index)
    if s is not None and s.halo is not None and values.shape[0] == s.halo.n_padded:
        values, system_index = values[: s.halo.n_owned], system_index[: s.halo.n_owned]
    wide = values.dtype in (torch.float16, torch.bfloat16, torch.float32)
    acc = values.double() if wide else values
    out = torch.zeros((n_systems, *values.shape[1:]), dtype=acc.dtype, device=values.device)
    out = out.index_add(0, system_index, acc)
    out = all_reduce_sum(s.comm, out) if s is not None else out
    return out.to(values.dtype) if wide else out


def scatter_to_owners(x: torch.Tensor) -> torch.Tensor:
    """(n_padded, *F) -> (n_owned, *F): halo partial sums added to their owners."""
    s = current_scope()
    if s is None or s.halo is None:
        return x
    return halo_reverse(s.comm, s.halo.plan, plain(x))


def refresh_halo(x: torch.Tensor) -> torch.Tensor:
    """Halo rows of a per-point tensor re-copied from their owners: ``(n_owned or n_padded,
    *F) -> (n_padded, *F)`` by a forward exchange of the owned rows (differentiable: the
    backward adds halo-row gradients to the owners).  The result carries the scope's
    ShardTensor metadata.  Identity outside a scope and in sharded storage (no halo rows)."""
    s = current_scope()
    if s is None or s.halo is None:
        return x
    rows = int(x.shape[0]) if x.dim() else -1
    if rows not in (s.halo.n_owned, s.halo.n_padded):
        raise ValueError(f"refresh_halo: expected {s.halo.n_owned} owned or {s.halo.n_padded} padded rows, got {rows}")
    y = halo_forward(s.comm, s.halo.plan, plain(x)[: s.halo.n_owned])
    return ShardTensor.wrap_like(y, s.reference) if s.reference is not None else y


def grad_leaf(x: torch.Tensor | None = None) -> torch.Tensor:
    """The autograd leaf behind a promoted input: ``x`` None or the promoted positions ->
    the positions' leaf; a promoted extra input -> its leaf; anything else -> ``x``.

    The leaf exists (requires grad) when DistributedModel differentiates the positions
    itself (autograd or strain outputs) or when ``ModelConfig.autograd_inputs`` names the
    input.  The ShardTensor a model receives is an alias (possibly strained) of the leaf;
    ``torch.autograd.grad(energy, grad_leaf(positions))`` gives the derivative with respect
    to every padded row, halo rows included (partial sums: send them to their owners with
    :func:`scatter_to_owners`, or declare the output in ``reverse_outputs``)."""
    s = current_scope()
    if s is None:
        return x
    if x is None or x is s.reference:
        leaf = s.leaf
        name = "positions"
    else:
        name = next((k for k, v in s.inputs.items() if v is x), None)
        if name is None:
            return x
        leaf = s.leaves.get(name)
    if leaf is None or not leaf.requires_grad:
        raise RuntimeError(f"grad_leaf: {name} are not differentiated in this call; declare "
                           f"ModelConfig(autograd_inputs={{{name!r}}})")
    return leaf


def seed_once(x: torch.Tensor) -> torch.Tensor:
    """A value identical on every rank (``system_sum``, a scatter into
    ``positions.new_zeros(n_systems)``), as the objective of ``torch.autograd.grad`` inside a
    model: ``torch.autograd.grad(seed_once(energy), grad_leaf(positions))``.

    A backward pass differentiates the sum over ranks of what each rank seeds
    (:mod:`shardmd.domain.collectives`); seeding the replicated energy on every rank would
    differentiate ``size x energy``.  Identity forward; the backward keeps the cotangent on
    rank 0 only.  Identity outside a scope and on one rank.  DistributedModel does this
    itself for ``autograd_outputs`` and ``strain_outputs``."""
    s = current_scope()
    if s is None:
        return x
    return _seed_once(s.comm, x)


__all__ = ["Scope", "current_scope", "grad_leaf", "refresh_halo", "scatter_to_owners", "seed_once", "system_sum",
           "to_local", "use_scope"]
