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

The model is called with the system's ``cell`` and ``pbc`` (``ctx.pbc``: every periodic
axis of the system, on every rank), as it would be on one process; the axes a rank's own
neighbour search treats as periodic (``ctx.local_pbc``: split axes are not) stay in the
context (``current_scope().ctx``) for a model that builds a list of its own over the
points it is given.

Further inputs are passed as ``compute(..., extras={name: tensor})``: per-point ones (e.g.
charges) with owned or padded rows, per-system ones (e.g. a total charge) with one row per
system, identical on every rank.  A model declaring them in ``ModelConfig.point_inputs`` /
``ModelConfig.system_inputs`` receives them as keyword arguments of its ``compute``: the
per-point ones halo-padded by the forward exchange (ghost rows copies of their owners) and
promoted like the positions, the per-system ones as given (no exchange).  Callers that pass
no extras are unchanged.  ``ModelConfig.strain_outputs`` asks for a virial (or stress) by
differentiating with respect to a strain (:mod:`shardmd.domain.derivatives`); the spec's
``compile_policy`` compiles and pads the forward (:mod:`shardmd.domain.compile_policy`).

Every output comes back as a plain, detached tensor: per-system values global, per-point
rows of the owned points.  A single domain runs through the same call (the exchanges
are identities).
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .adapters import AdapterScope
from .compile_policy import CompiledForward, pad_graph
from .context import DomainContext
from .derivatives import apply_strain, fill_autograd_outputs, fill_derivative_outputs, strain_leaf
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
    neighbors: :class:`NeighborConfig`;
    strain_outputs: {output: source}: output = -d(source)/d(strain), the virial (eV), summed
    over ranks; an output named ``stress`` gets ``-virial / volume`` (e.g. ``{"virial":
    "energy"}``);
    point_inputs: names of further per-point inputs ``compute`` takes as keyword arguments
    (e.g. ``("charges",)``: (n_padded, *F) tensors), supplied by the caller as ``extras``;
    system_inputs: names of per-system inputs ``compute`` takes as keyword arguments (e.g.
    ``("charge", "spin")``: (n_systems, *F) tensors, the same on every rank), also ``extras``;
    autograd_inputs: inputs the model differentiates itself (``"positions"`` or names of
    ``point_inputs``): their leaves require grad (see ``grad_leaf``/``autograd_target``);
    units: {output: unit} for outputs the model gives in units other than the caller's
    contract (unnamed outputs are in the contract's units): a caller refuses what it cannot
    convert, and a sum refuses terms whose units differ."""

    outputs: tuple = ("energy", "forces")
    autograd_outputs: FrozenMap = field(default_factory=FrozenMap)
    neighbors: NeighborConfig = field(default_factory=lambda: NeighborConfig(0.0))
    strain_outputs: FrozenMap = field(default_factory=FrozenMap)
    point_inputs: tuple = ()
    autograd_inputs: frozenset = frozenset()
    system_inputs: tuple = ()
    units: FrozenMap = field(default_factory=FrozenMap)

    def __post_init__(self):
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "autograd_outputs", FrozenMap(self.autograd_outputs))
        object.__setattr__(self, "strain_outputs", FrozenMap(self.strain_outputs))
        object.__setattr__(self, "point_inputs", tuple(self.point_inputs))
        object.__setattr__(self, "autograd_inputs", frozenset(self.autograd_inputs))
        object.__setattr__(self, "system_inputs", tuple(self.system_inputs))
        object.__setattr__(self, "units", FrozenMap({str(k): str(v) for k, v in dict(self.units).items()}))
        both = set(self.point_inputs) & set(self.system_inputs)
        if both:
            raise ValueError(f"inputs {sorted(both)} are declared both per point and per system")
        bad = self.autograd_inputs - {"positions", *self.point_inputs}
        if bad:
            raise ValueError(f"autograd_inputs {sorted(bad)} are neither 'positions' nor point_inputs")


class StorageIdNeighborList(NeighborList):
    """The rank's neighbour list in sharded storage: ``centers()`` and ``neighbors`` are
    storage ids, ``shifts`` include the halo images (``x[id_j] + S @ cell - x[id_i]``);
    center_ids: (n_query,) int64 storage id of each query point."""

    def __init__(self, *, center_ids: torch.Tensor, **fields):
        super().__init__(**fields)
        self.center_ids = center_ids

    def fields(self) -> dict:
        return {**super().fields(), "center_ids": self.center_ids}

    def centers(self) -> torch.Tensor:
        return self.center_ids[super().centers()]


class DistributedModel:
    def __init__(self, model, spec: MLIPSpec | None = None):
        self.model = model
        self.config: ModelConfig | None = getattr(model, "model_config", None)
        own_spec = spec is None
        spec = spec if spec is not None else getattr(model, "distribution_spec", None)
        self.spec = spec
        if spec is None:
            kinds = getattr(model, "output_kinds", None)
            if not kinds:
                raise TypeError(f"{type(model).__name__} declares no output_kinds; "
                                "see shardmd.domain.distributed_model")
            bad = {k: v for k, v in kinds.items() if v not in KINDS}
            if bad:
                raise ValueError(f"unknown output kinds {bad}; use one of {KINDS}")
            self.kinds = dict(kinds)
        else:
            self.kinds = {k: v.value for k, v in spec.output_kinds.items()}
        self.last_raw: dict | None = None
        self.last_padding = None
        self._meta_cache = None
        self._nl_cache = None
        self._warned: set = set()
        policy = spec.distribution.compile_policy if spec is not None else None
        self.compiled = CompiledForward(policy) if policy is not None and policy.enabled else None
        # the model's direct_call (see compute): with its own spec only, never a compiled one, and only the
        # model's own attribute: a wrapper that forwards attributes (__getattr__) has its compute called
        own = vars(model).get("direct_call") if hasattr(model, "__dict__") else None
        self.direct = own if own_spec and spec is not None and self.compiled is None else None
        if self.direct is not None and not (callable(getattr(own, "compute", None))
                                            and set(getattr(own, "output_kinds", {"?": "?"}).values()) <= set(KINDS)):
            raise TypeError(f"{type(model).__name__}.direct_call must offer compute() and output_kinds of {KINDS}")

    @property
    def cutoff(self) -> float:
        c = getattr(self.model, "cutoff", None)
        return float(c) if c is not None else float(self.config.neighbors.cutoff)

    def compute(self, ctx: DomainContext, positions: torch.Tensor, numbers: torch.Tensor, nl,
                extras: Mapping[str, torch.Tensor] | None = None) -> dict:
        """Outputs with global per-system values and owned per-point rows on every rank.

        extras: further per-point inputs (name -> (n_owned or n_padded, *F) tensor) for the
        names the model declares in ``ModelConfig.point_inputs``; omitted names are not
        passed (the model's default applies).

        A model with a spec may offer ``direct_call``: an object with ``output_kinds`` and the plain
        ``compute`` that gives, bit for bit, what its spec's call gives (an engine-owned kernel
        whose custom op only forwards to it). It is called instead, without the per-call
        promotion, adapters and op dispatch (~0.1-0.3 ms a call on a CPU: what a small system's
        step is made of); with a spec given here, or a compiled one, the spec path runs. It must be
        the model's own instance attribute: a wrapper forwarding attributes to such a model does
        not pass it on (the wrapper's ``compute`` is what it offers).
        ``skipped_outputs`` (on ``direct_call`` or a kinds model, optional): the outputs this call
        did not compute (NaN), which are not summed over ranks."""
        if self.direct is not None:
            return self._compute_kinds(self.direct, self.direct.output_kinds, ctx, positions, numbers, nl, extras)
        if self.spec is not None:
            return self._compute_spec(ctx, positions, numbers, nl, extras)
        return self._compute_kinds(self.model, self.kinds, ctx, positions, numbers, nl, extras)

    def _compute_kinds(self, model, kinds: Mapping, ctx: DomainContext, positions, numbers, nl, extras) -> dict:
        """The ``output_kinds`` contract: the model called on plain tensors, outputs by kind."""
        inputs = self._point_inputs(ctx, extras, False)
        raw = model.compute(positions, ctx.cell, ctx.pbc, numbers, nl, **inputs, **self._system_inputs(extras))
        skipped = getattr(model, "skipped_outputs", ())
        out = {}
        for key, value in raw.items():
            kind = kinds.get(key, "global")
            if kind == "per_system" and key in skipped:
                out[key] = value
            elif kind == "per_system":
                out[key] = ctx.all_reduce(value)
            elif kind == "per_point":   # a slice only where there are ghost rows (each torch call counts at small N)
                out[key] = value if value.shape[0] == ctx.n_owned else value[: ctx.n_owned]
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

    @property
    def point_inputs(self) -> tuple:
        """Names of the per-point inputs the model declares (``ModelConfig.point_inputs``)."""
        return tuple(self.config.point_inputs) if self.config is not None else ()

    @property
    def system_inputs(self) -> tuple:
        """Names of the per-system inputs the model declares (``ModelConfig.system_inputs``)."""
        return tuple(getattr(self.config, "system_inputs", ())) if self.config is not None else ()

    def _system_inputs(self, extras) -> dict:
        """The declared per-system inputs given in ``extras``: (n_systems, *F) tensors, passed
        as they are (the caller gives every rank the same values)."""
        out = {}
        if not extras:   # the common call: nothing given, nothing to check
            return out
        for name in self.system_inputs:
            x = extras.get(name)
            if x is None:
                continue
            x = plain(x)
            if x.dim() == 0 or x.shape[0] != 1:
                raise ValueError(f"extras[{name!r}] has shape {tuple(x.shape)}; a per-system input has one row "
                                 "per system, (1, *F)")
            out[name] = x
        return out

    def _point_inputs(self, ctx: DomainContext, extras, sharded: bool) -> dict:
        """The declared per-point inputs: halo storage (n_padded, *F) with ghost rows copied
        from their owners; sharded storage the owned rows."""
        if not extras:   # the common call: nothing given, nothing to check
            return {}
        declared = self.point_inputs
        extras = {k: v for k, v in dict(extras).items() if v is not None and k not in self.system_inputs}
        unknown = set(extras) - set(declared)
        if unknown:
            raise ValueError(f"extras {sorted(unknown)} are not per-point inputs of {type(self.model).__name__} "
                             f"(ModelConfig.point_inputs = {declared}) nor per-system ones "
                             f"(system_inputs = {self.system_inputs})")
        n = ctx.n_owned
        out = {}
        for name in declared:
            if name not in extras:
                continue
            x = plain(extras[name])
            rows = int(x.shape[0]) if x.dim() else -1
            if rows not in (n, ctx.n_padded):
                raise ValueError(f"extras[{name!r}] has {rows} rows; expected {n} owned or {ctx.n_padded} padded rows")
            out[name] = x[:n] if sharded else halo_forward(ctx.comm, ctx.plan, x[:n])
        return out

    def _warn_once(self, key: str, msg: str):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(msg, stacklevel=4)

    def _compute_spec(self, ctx: DomainContext, positions, numbers, nl, extras=None) -> dict:
        spec = self.spec
        cfg = self.config
        policy = spec.distribution.compile_policy
        if cfg is not None and cfg.neighbors.cutoff > nl.cutoff:
            raise ValueError(f"neighbour list radius {nl.cutoff} Å < the model's cutoff "
                             f"{cfg.neighbors.cutoff} Å (ModelConfig.neighbors)")
        auto = dict(cfg.autograd_outputs) if cfg is not None else {}
        strain = dict(cfg.strain_outputs) if cfg is not None else {}
        grad_inputs = set(cfg.autograd_inputs) if cfg is not None else set()
        if policy.enabled and policy.force_strategy == "kernel":
            auto = {}          # the model returns its forces itself
        sharded = spec.distribution.storage.kind == "sharded"
        group = GroupConfig(ctx.comm)
        n = ctx.n_owned
        inputs = self._point_inputs(ctx, extras, sharded)
        system = self._system_inputs(extras)
        plan = ctx.plan
        if sharded:
            shard = self._storage_meta(ctx)
            leaf = positions[:n].detach()
            numbers = numbers[:n]
            nl = self._sharded_nl(ctx, nl, shard)
        else:
            shard = None
            leaf = positions.detach()
        padding = None
        if policy.enabled and policy.padder is not None:
            if sharded:
                self._warn_once("_padder", "CompilePolicy.padder applies to halo storage only; sharded storage runs "
                                           "unpadded")
            else:
                padding = pad_graph(policy.padder, leaf, numbers, nl, inputs)
                leaf, numbers, nl, inputs = padding.positions, padding.numbers, padding.nl, padding.inputs
                if padding.n_filler:
                    plan = dataclasses.replace(ctx.plan, n_filler=padding.n_filler)
        self.last_padding = padding
        halo = None if sharded else HaloMeta(n, plan.n_padded, plan)
        if auto or strain or "positions" in grad_inputs:
            leaf = leaf.requires_grad_(True)
        leaves = {}
        for name in list(inputs):
            if name in grad_inputs:
                leaves[name] = inputs[name] = inputs[name].detach().requires_grad_(True)
        cell, pos_in, eps = ctx.cell, leaf, None
        if strain:
            eps = strain_leaf(leaf.dtype, leaf.device)
            pos_in, cell = apply_strain(leaf, ctx.cell, eps)
        meta = dict(spec=spec, halo=halo, shard=shard, group=group, n_systems=1)
        pos = ShardTensor.wrap(pos_in, **meta)
        promoted = {k: ShardTensor.wrap(v, **meta) for k, v in inputs.items()}
        scope = Scope(ctx, spec, halo, shard, group, 1, pos, leaf, promoted, leaves, padding)
        grad = leaf.requires_grad or bool(leaves)
        grad_mode = torch.enable_grad() if grad else contextlib.nullcontext()
        with use_scope(scope), AdapterScope(spec, scope), grad_mode:
            if self.compiled is not None:
                raw = dict(self.compiled(self.model.compute, pos, cell, ctx.pbc, numbers, nl, **promoted,
                                         **system))
            else:
                raw = dict(self.model.compute(pos, cell, ctx.pbc, numbers, nl, **promoted, **system))
            if auto or strain:
                fill_derivative_outputs(raw, leaf, auto, eps, strain, ctx.cell, ctx.comm,
                                        self._replicated(ctx, raw, set(auto.values()) | set(strain.values()), sharded))
                if not sharded:
                    for key in auto:
                        with torch.no_grad():
                            raw[key] = halo_reverse(ctx.comm, plan, raw[key])
        if padding is not None and padding.n_filler:
            cut = plan.n_padded
            raw = {k: (v[: ctx.n_padded] if isinstance(v, torch.Tensor) and k not in strain and v.dim()
                       and v.shape[0] == cut else v) for k, v in raw.items()}
        raw = {k: (plain(v).detach() if isinstance(v, torch.Tensor) else v) for k, v in raw.items()}
        self.last_raw = raw
        return self._consolidate(ctx, raw, sharded, set(strain))

    def _replicated(self, ctx: DomainContext, raw: dict, sources: set, sharded: bool) -> frozenset:
        """The derivative sources that are identical on every rank (seeded on one rank):
        per-system or global outputs the model reduced itself, i.e. not per-rank partials
        listed in ``all_reduce_outputs``."""
        out = set()
        for src in sources:
            v = raw.get(src)
            if not isinstance(v, torch.Tensor) or src in self.spec.all_reduce_outputs:
                continue
            if self._kind(src, v, ctx, sharded) in (OutputKind.PER_GRAPH, OutputKind.GLOBAL):
                out.add(src)
        return frozenset(out)

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

    def _consolidate(self, ctx: DomainContext, raw: dict, sharded: bool, reduced: set = frozenset()) -> dict:
        spec = self.spec
        out = {}
        for key, v in raw.items():
            if not isinstance(v, torch.Tensor) or key in reduced:   # strain outputs are summed already
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


__all__ = ["DistributedModel", "KINDS", "ModelConfig", "NeighborConfig", "StorageIdNeighborList",
           "fill_autograd_outputs"]
