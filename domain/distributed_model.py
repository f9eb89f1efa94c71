"""The engine <-> model call under decomposition (frozen interface).

The engine calls ``DistributedModel(model).compute(ctx, positions, numbers, nl)`` on every
rank with the rank's ``[owned | ghost]`` points and a neighbour list whose query rows are
the owned points.  The model is an ordinary single-process model: it offers ``cutoff`` and
``compute(positions, cell, pbc, numbers, nl) -> dict``, and either

- ``output_kinds``, a map from output name to one of (the engine's original contract)

  - ``"per_system"``: a partial sum on each rank, summed over ranks (energy, virial);
  - ``"per_point"``: rows of the owned points, exact as computed (kernel-direct forces of
    a full, receiver-owned neighbour list);
  - ``"per_point_reverse"``: rows of all padded points whose ghost rows are partial and are
    added to their owners by a reverse halo exchange (scatter from owned senders);
  - ``"global"``: already identical on every rank;

- or a ``distribution_spec`` (:class:`~shardmd.domain.spec.MLIPSpec`, or ``spec=`` given
  here) and optionally a ``model_config`` (:class:`ModelConfig`: outputs, autograd
  outputs, neighbour configuration).  Then the positions are promoted to a
  :class:`~shardmd.domain.shard_tensor.ShardTensor` (halo or sharded storage per the
  spec), the spec's adapters are installed for the call, outputs named in
  ``autograd_outputs`` are computed as ``-d(source)/d(positions)`` through the ShardTensor
  ops (in halo storage the gradient on ghost rows is added to the owners by the reverse
  exchange, the adjoint of the forward exchange that made the ghost positions), and the
  outputs are consolidated by kind (see :mod:`shardmd.domain.spec`).

Every output comes back as a plain, detached tensor: per-system values global, per-point
rows of the owned points.  A single domain runs through the same call (the exchanges
are identities).
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import torch

from .adapters import AdapterScope
from .context import DomainContext
from .halo import halo_forward, halo_reverse
from .neighbors import NeighborList
from .runtime import Scope, use_scope
from .shard_tensor import GroupConfig, HaloMeta, ShardMeta, ShardTensor, plain
from .spec import FrozenMap, MLIPSpec, OutputKind

KINDS = ("per_system", "per_point", "per_point_reverse", "global")


@dataclass(frozen=True)
class NeighborConfig:
    """cutoff: the model's interaction radius (Å); full: the model expects a full list
    (both directions of every pair; the engine's lists are full and receiver-owned)."""

    cutoff: float
    full: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """What a model wrapper computes.

    outputs: names of the outputs ``compute`` returns;
    autograd_outputs: {output: source}: output = -d(sum of source)/d(positions), computed by
    DistributedModel (e.g. ``{"forces": "energy"}``);
    neighbors: :class:`NeighborConfig`."""

    outputs: tuple = ("energy", "forces")
    autograd_outputs: FrozenMap = field(default_factory=FrozenMap)
    neighbors: NeighborConfig = field(default_factory=lambda: NeighborConfig(0.0))

    def __post_init__(self):
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "autograd_outputs", FrozenMap(self.autograd_outputs))


@dataclass(frozen=True)
class StorageIdNeighborList(NeighborList):
    """The rank's neighbour list in sharded storage: ``centers()`` and ``neighbors`` are
    storage ids, ``shifts`` include the halo images (``x[id_j] + S @ cell - x[id_i]``)."""

    center_ids: torch.Tensor | None = None

    def centers(self) -> torch.Tensor:
        return self.center_ids[super().centers()]


def fill_autograd_outputs(raw: dict, leaf: torch.Tensor, autograd_outputs) -> dict:
    """Fill ``raw[out] = -d(sum raw[src])/d(leaf)`` for each ``out: src`` (no exchange)."""
    items = list(dict(autograd_outputs).items())
    for i, (out, src) in enumerate(items):
        (g,) = torch.autograd.grad(plain(raw[src]).sum(), leaf, retain_graph=i < len(items) - 1, allow_unused=True)
        raw[out] = -(g if g is not None else torch.zeros_like(leaf))
    return raw


class DistributedModel:
    def __init__(self, model, spec: MLIPSpec | None = None):
        self.model = model
        self.config: ModelConfig | None = getattr(model, "model_config", None)
        spec = spec if spec is not None else getattr(model, "distribution_spec", None)
        self.spec = spec
        if spec is None:
            kinds = getattr(model, "output_kinds", None)
            if not kinds:
                raise TypeError(f"{type(model).__name__} declares no output_kinds; see shardmd.domain.distributed_model")
            bad = {k: v for k, v in kinds.items() if v not in KINDS}
            if bad:
                raise ValueError(f"unknown output kinds {bad}; use one of {KINDS}")
            self.kinds = dict(kinds)
        else:
            self.kinds = {k: v.value for k, v in spec.output_kinds.items()}
        self.last_raw: dict | None = None
        self._meta_cache = None
        self._nl_cache = None
        self._warned: set = set()

    @property
    def cutoff(self) -> float:
        c = getattr(self.model, "cutoff", None)
        return float(c) if c is not None else float(self.config.neighbors.cutoff)

    def compute(self, ctx: DomainContext, positions: torch.Tensor, numbers: torch.Tensor, nl) -> dict:
        """Outputs with global per-system values and owned per-point rows on every rank."""
        if self.spec is not None:
            return self._compute_spec(ctx, positions, numbers, nl)
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

    # -- the spec path ---------------------------------------------------------------------------
    def _storage_meta(self, ctx: DomainContext) -> ShardMeta:
        c = self._meta_cache
        if c is None or c[0] is not ctx.plan:
            meta = ShardMeta.contiguous(ctx.comm, ctx.n_owned, device=ctx.cell.device)
            self._meta_cache = c = (ctx.plan, meta)
        return c[1]

    def _sharded_nl(self, ctx: DomainContext, nl: NeighborList, meta: ShardMeta) -> StorageIdNeighborList:
        c = self._nl_cache
        if c is not None and c[0] is nl and c[1] is ctx.plan:
            return c[2]
        plan = ctx.plan
        with torch.no_grad():
            gid_pad = halo_forward(ctx.comm, plan, meta.global_ids)
            dev = nl.shifts.device
            gshift = torch.zeros(plan.n_padded, 3, dtype=torch.int32, device=dev)
            if plan.n_ghost:
                gshift[plan.n_owned:] = plan.ghost_shift.to(dev)
            j = nl.neighbors.long()
            snl = StorageIdNeighborList(offsets=nl.offsets, neighbors=gid_pad[j].to(torch.int32),
                                        shifts=(nl.shifts + gshift[j]).contiguous(), cutoff=nl.cutoff,
                                        n_points=meta.n_global, center_ids=meta.global_ids)
        self._nl_cache = (nl, plan, snl)
        return snl

    def _compute_spec(self, ctx: DomainContext, positions, numbers, nl) -> dict:
        spec = self.spec
        if self.config is not None and self.config.neighbors.cutoff > nl.cutoff:
            raise ValueError(f"neighbour list radius {nl.cutoff} Å < the model's cutoff "
                             f"{self.config.neighbors.cutoff} Å (ModelConfig.neighbors)")
        auto = dict(self.config.autograd_outputs) if self.config is not None else {}
        sharded = spec.distribution.storage.kind == "sharded"
        group = GroupConfig(ctx.comm)
        n = ctx.n_owned
        if sharded:
            shard, halo = self._storage_meta(ctx), None
            leaf = positions[:n].detach()
            numbers = numbers[:n]
            nl = self._sharded_nl(ctx, nl, shard)
        else:
            shard, halo = None, HaloMeta(n, ctx.n_padded, ctx.plan)
            leaf = positions.detach()
        if auto:
            leaf = leaf.requires_grad_(True)
        pos = ShardTensor.wrap(leaf, spec=spec, halo=halo, shard=shard, group=group, n_systems=1)
        scope = Scope(ctx, spec, halo, shard, group, 1, pos)
        grad_mode = torch.enable_grad() if auto else contextlib.nullcontext()
        with use_scope(scope), AdapterScope(spec, scope), grad_mode:
            raw = dict(self.model.compute(pos, ctx.cell, ctx.local_pbc, numbers, nl))
            if auto:
                fill_autograd_outputs(raw, leaf, auto)
                if not sharded:
                    for key in auto:
                        with torch.no_grad():
                            raw[key] = halo_reverse(ctx.comm, ctx.plan, raw[key])
        raw = {k: (plain(v).detach() if isinstance(v, torch.Tensor) else v) for k, v in raw.items()}
        self.last_raw = raw
        return self._consolidate(ctx, raw, sharded)

    def _kind(self, key: str, v, ctx, sharded: bool) -> OutputKind:
        kind = self.spec.kind_of(key)
        if kind != OutputKind.UNKNOWN:
            return kind
        rows = int(v.shape[0]) if isinstance(v, torch.Tensor) and v.dim() else None
        if rows is not None and rows in (ctx.n_owned, ctx.n_padded) and rows != 1:
            guess = OutputKind.PER_NODE
        elif rows is None or rows == 1:
            guess = OutputKind.PER_GRAPH
        else:
            guess = OutputKind.GLOBAL
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"output {key!r} has no declared kind: classified as {guess.name} by its shape; "
                          f"declare it in the spec's output_kinds", stacklevel=3)
        return guess

    def _consolidate(self, ctx: DomainContext, raw: dict, sharded: bool) -> dict:
        spec = self.spec
        out = {}
        for key, v in raw.items():
            if not isinstance(v, torch.Tensor):
                out[key] = v
                continue
            kind = self._kind(key, v, ctx, sharded)
            if kind == OutputKind.PER_NODE and not sharded and v.dim() and v.shape[0] == ctx.n_padded:
                if key in spec.reverse_outputs:
                    v = halo_reverse(ctx.comm, ctx.plan, v)
                else:
                    v = v[: ctx.n_owned]
            elif kind == OutputKind.PER_GRAPH and key in spec.all_reduce_outputs:
                v = ctx.all_reduce(v)
            out[key] = v
        return out


__all__ = ["DistributedModel", "KINDS", "ModelConfig", "NeighborConfig", "StorageIdNeighborList", "fill_autograd_outputs"]
