"""ShardTensor: a per-point tensor that knows how it is partitioned across ranks.

A ``ShardTensor`` is an ordinary ``torch.Tensor`` (same storage, same autograd history)
that also carries

- ``spec``:      the distribution spec governing handler behaviour (or None: defaults);
- ``halo``:      :class:`HaloMeta` for halo storage: ``n_owned``, ``n_padded`` and the
                 routing (the rank's :class:`~shardmd.domain.halo.HaloPlan`);
- ``shard``:     :class:`ShardMeta` for sharded storage: the storage id of every local row,
                 the owner rank and owner row of every id, and the padding sentinel
                 ``n_global`` (an index equal to it is an empty slot);
- ``group``:     :class:`GroupConfig`, the process group (a :class:`~shardmd.domain.comm.Comm`);
- ``n_systems``: number of independent systems (rows of a per-system tensor).

Every torch call with a ShardTensor argument goes through
:meth:`ShardTensor.__torch_function__`, which consults an ordered registry of
``(ops, predicate, handler)`` entries: the first entry registered for the op whose
predicate accepts the call runs; otherwise the op runs as on plain tensors.

What keeps the subclass (with the same metadata):

- in-place ops on a ShardTensor (they return the same object);
- the allocators ``torch.{zeros,ones,empty,full,rand,randn}_like`` and
  ``Tensor.new_{zeros,ones,empty,full,tensor}``;
- the results of handled scatter ops (see :mod:`shardmd.domain.handlers`).

Everything else (indexing, slicing, arithmetic, ``linear``, ``detach``, ``clone``, views,
reductions) returns plain ``torch.Tensor`` objects that share autograd history with the
input.  Per-point features that need distribution-aware ops are re-wrapped with
:func:`shard_like`.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch._C import DisableTorchFunctionSubclass

from .comm import Comm
from .halo import HaloPlan


# -- metadata -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class HaloMeta:
    """Halo storage: rows ``[0, n_owned)`` are owned, ``[n_owned, n_padded)`` are copies of
    other ranks' rows; ``plan`` routes the forward and reverse exchanges."""

    n_owned: int
    n_padded: int
    plan: HaloPlan


@dataclass(frozen=True, eq=False)
class ShardMeta:
    """Sharded storage: every rank holds only its owned rows.

    global_ids: (n_owned,) int64 storage id of each local row;
    owner:      (n_global,) int64 rank holding each id;
    local_row:  (n_global,) int64 row of each id on its owner;
    n_global:   number of ids; an index equal to ``n_global`` is padding (empty contribution).
    """

    global_ids: torch.Tensor
    owner: torch.Tensor
    local_row: torch.Tensor
    n_global: int

    @property
    def n_owned(self) -> int:
        return int(self.global_ids.shape[0])

    @classmethod
    def from_ids(cls, comm: Comm, global_ids: torch.Tensor, n_global: int | None = None) -> "ShardMeta":
        """Tables from every rank's ids (one all-gather); ``global_ids`` (n_owned,) int64."""
        ids = global_ids.to(torch.int64)
        parts = comm.all_gather_object(ids.cpu())
        total = sum(int(p.numel()) for p in parts)
        n_global = total if n_global is None else int(n_global)
        owner = torch.full((n_global,), -1, dtype=torch.int64)
        local_row = torch.full((n_global,), -1, dtype=torch.int64)
        for r, p in enumerate(parts):
            owner[p] = r
            local_row[p] = torch.arange(p.numel(), dtype=torch.int64)
        if bool((owner < 0).any()) or total != n_global:
            raise ValueError(f"sharded storage: the ranks' ids do not cover 0..{n_global - 1} exactly once")
        dev = global_ids.device
        return cls(ids, owner.to(dev), local_row.to(dev), n_global)

    @classmethod
    def contiguous(cls, comm: Comm, n_owned: int, device=None) -> "ShardMeta":
        """Rank r owns the ids ``[offset_r, offset_r + n_owned_r)`` (storage order)."""
        counts = comm.all_gather_object(int(n_owned))
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        n_global = offsets[-1]
        owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts, dtype=torch.int64))
        local_row = torch.arange(n_global) - torch.tensor(offsets[:-1], dtype=torch.int64)[owner]
        base = offsets[comm.rank]
        ids = torch.arange(base, base + n_owned, dtype=torch.int64)
        return cls(ids.to(device), owner.to(device), local_row.to(device), n_global)


@dataclass(frozen=True, eq=False)
class GroupConfig:
    """The process group collectives of a ShardTensor use."""

    comm: Comm

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size


# -- dispatch registry --------------------------------------------------------------------
Predicate = Callable[[Any, tuple, dict], bool]
Handler = Callable[[Any, tuple, tuple, dict], Any]


@dataclass(frozen=True)
class _Entry:
    name: str
    ops: frozenset
    predicate: Predicate
    handler: Handler


_REGISTRY: list[_Entry] = []
_BY_OP: dict = {}
_TRACES: list[list] = []


def _reindex() -> None:
    _BY_OP.clear()
    for e in _REGISTRY:
        for op in e.ops:
            _BY_OP.setdefault(op, []).append(e)


def register_handler(ops, predicate: Predicate, handler: Handler, *, name: str,
                     position: int | None = None) -> str:
    """Add a handler for ``ops`` (one op or an iterable of ops; an op is the callable torch
    passes to ``__torch_function__``: ``torch.Tensor.index_add_``, ``torch.index_add``,
    ``torch.ops.ns.op.default``...).

    ``predicate(func, args, kwargs) -> bool`` decides whether the handler takes a call;
    ``handler(func, types, args, kwargs)`` returns the op's result.  Entries are consulted
    in registry order (``position`` inserts, default appends); the first match runs.
    Names are unique; returns the name (for :func:`unregister_handler`).  A dispatch trace
    records the name up to a ``#`` (so ``"op_adapter:ns::op#3"`` is traced as
    ``"op_adapter:ns::op"``).
    """
    if any(e.name == name for e in _REGISTRY):
        raise ValueError(f"a ShardTensor handler named {name!r} is already registered")
    op_set = frozenset(ops) if isinstance(ops, (list, tuple, set, frozenset)) else frozenset([ops])
    entry = _Entry(name, op_set, predicate, handler)
    if position is None:
        _REGISTRY.append(entry)
    else:
        _REGISTRY.insert(position, entry)
    _reindex()
    return name


def unregister_handler(name: str) -> bool:
    """Remove the handler ``name``; False if there was none."""
    for i, e in enumerate(_REGISTRY):
        if e.name == name:
            del _REGISTRY[i]
            _reindex()
            return True
    return False


def registered_handlers(op=None) -> list[str]:
    """Names of the registered handlers (for ``op`` only, if given), in dispatch order."""
    if op is None:
        return [e.name for e in _REGISTRY]
    return [e.name for e in _BY_OP.get(op, [])]


@contextlib.contextmanager
def dispatch_trace():
    """Record the handlers that fire inside the block: yields a list of
    ``{"handler": name, "op": op name}`` dicts, appended to as handlers run."""
    events: list = []
    _TRACES.append(events)
    try:
        yield events
    finally:
        _TRACES.remove(events)


def record(handler: str, op, **info) -> None:
    """Append an event to every active :func:`dispatch_trace` (handlers and adapters call it)."""
    if _TRACES:
        ev = {"handler": handler, "op": op_name(op), **info}
        for t in _TRACES:
            t.append(ev)


def op_name(op) -> str:
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None)
    if hasattr(op, "_schema"):
        return str(op._schema.name) + "." + (op._overloadname or "default")
    return str(name or op)


# -- the subclass -------------------------------------------------------------------------
_LIKE = frozenset([torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
                   torch.rand_like, torch.randn_like])
_NEW = frozenset([torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty,
                  torch.Tensor.new_full, torch.Tensor.new_tensor])
ALLOCATORS = _LIKE | _NEW

_META = ("_spec", "_halo", "_shard", "_group", "_n_systems")


class ShardTensor(torch.Tensor):
    """See the module docstring.  Build with :meth:`wrap`; never with the constructor."""

    _spec = None
    _halo: HaloMeta | None = None
    _shard: ShardMeta | None = None
    _group: GroupConfig | None = None
    _n_systems: int = 1

    @staticmethod
    def wrap(t: torch.Tensor, *, spec=None, halo: HaloMeta | None = None, shard: ShardMeta | None = None,
             group: GroupConfig | Comm | None = None, n_systems: int = 1) -> "ShardTensor":
        """Zero-copy view of ``t`` as a ShardTensor (shares storage and autograd history)."""
        if halo is not None and shard is not None:
            raise ValueError("a ShardTensor is in halo storage or in sharded storage, not both")
        if isinstance(group, Comm):
            group = GroupConfig(group)
        if group is None:
            raise ValueError("ShardTensor.wrap needs group= (the process group the rows are spread over)")
        if not _GUARDED and "torch._dynamo" in sys.modules:   # something may compile: graph-break first
            guard_for_compile()
        with DisableTorchFunctionSubclass():
            s = t.as_subclass(ShardTensor)
        s._spec, s._halo, s._shard, s._group, s._n_systems = spec, halo, shard, group, int(n_systems)
        return s

    @staticmethod
    def wrap_like(t: torch.Tensor, ref: "ShardTensor") -> "ShardTensor":
        """``t`` as a ShardTensor with ``ref``'s metadata."""
        return ShardTensor.wrap(t, spec=ref._spec, halo=ref._halo, shard=ref._shard, group=ref._group,
                                n_systems=ref._n_systems)

    # read-only views of the metadata
    @property
    def spec(self):
        return self._spec

    @property
    def halo(self) -> HaloMeta | None:
        return self._halo

    @property
    def shard(self) -> ShardMeta | None:
        return self._shard

    @property
    def group(self) -> GroupConfig | None:
        return self._group

    @property
    def n_systems(self) -> int:
        return self._n_systems

    @property
    def storage_kind(self) -> str:
        return "halo" if self._halo is not None else ("sharded" if self._shard is not None else "none")

    @property
    def n_owned(self) -> int:
        if self._halo is not None:
            return self._halo.n_owned
        if self._shard is not None:
            return self._shard.n_owned
        return int(plain(self).shape[0])

    @property
    def n_padded(self) -> int:
        """Rows of a full per-point tensor on this rank (``n_owned`` in sharded storage)."""
        return self._halo.n_padded if self._halo is not None else self.n_owned

    def to_plain(self) -> torch.Tensor:
        """Plain alias (same storage and autograd history)."""
        return plain(self)

    def __repr__(self, **kw):
        with DisableTorchFunctionSubclass():
            body = torch.Tensor.__repr__(self.as_subclass(torch.Tensor))
        return f"ShardTensor[{self.storage_kind}, n_owned={self.n_owned}]({body})"

    # Under torch.compile every op with a ShardTensor argument is a graph break: the dispatch,
    # the handlers and their collectives always run eagerly (domain/compile_policy.py).  The
    # torch.compiler.disable wrapper is put on by guard_for_compile(), not at import:
    # applying it imports torch._dynamo (about 1-3 s of CPU per process), which a run that
    # never compiles does not need.
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entries = _BY_OP.get(func)
        if entries:
            for e in entries:
                with DisableTorchFunctionSubclass():
                    hit = e.predicate(func, args, kwargs)
                if hit:
                    record(e.name.split("#")[0], func)
                    return e.handler(func, types, args, kwargs)
        with DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in ALLOCATORS and isinstance(out, torch.Tensor):
            ref = first_shard(args, kwargs)
            if ref is not None:
                out = ShardTensor.wrap_like(out, ref)
        return out


# -- helpers ------------------------------------------------------------------------------
_GUARDED = False


def guard_for_compile() -> None:
    """Make every ShardTensor op a graph break under torch.compile (idempotent).  Called by
    domain/compile_policy.py before it compiles, and by :meth:`ShardTensor.wrap` once
    ``torch._dynamo`` has been imported by anyone (a user's own ``torch.compile`` imports it
    before it traces, and the inputs it traces are wrapped first)."""
    global _GUARDED
    if _GUARDED:
        return
    fn = ShardTensor.__dict__["__torch_function__"].__func__
    ShardTensor.__torch_function__ = classmethod(torch.compiler.disable(fn))
    for impl in _DEFERRED:   # custom ops: torch's own lazy disable again (see defer_dynamo)
        impl.__dict__.pop("__dynamo_disable", None)
    # MPI calls read and write a numpy view of a tensor's memory: traced, that view is a copy
    # (dynamo traces numpy) and a receive lands outside the tensor (a compiled two-domain run
    # failed with 'setStorage ... out of bounds'); they run eagerly, between graphs
    from . import comm, exchange

    exchange._swap_into_mpi = torch.compiler.disable(exchange._swap_into_mpi)
    comm._reduce_over_mpi = torch.compiler.disable(comm._reduce_over_mpi)
    _GUARDED = True


_DEFERRED: list = []


def defer_dynamo(op) -> None:
    """Let a ``torch.library.custom_op`` run eagerly without importing ``torch._dynamo``.

    torch wraps each kernel of a custom op in a lazy ``torch._dynamo.disable``: its first call
    imports torch._dynamo (and sympy), ~1.5 s of CPU per process, though nothing compiles. This
    fills the wrapper's cache with the kernel itself, so calls go straight to it, and
    :func:`guard_for_compile` (run before anything compiles) empties the cache again, so the
    real disable is in place whenever torch.compile may trace. A torch without that wrapper,
    or a process that imported torch._dynamo already, is left as it is."""
    if _GUARDED or "torch._dynamo" in sys.modules:
        return
    for wrapper in getattr(op, "_backend_fns", {}).values():
        impl = getattr(wrapper, "__wrapped__", None)
        if impl is not None and "__dynamo_disable" not in impl.__dict__:
            impl.__dict__["__dynamo_disable"] = impl   # the cache torch/_compile.py reads
            _DEFERRED.append(impl)


def plain(t):
    """A ShardTensor as a plain tensor alias (autograd-connected); anything else unchanged."""
    if isinstance(t, ShardTensor):
        with DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def plain_tree(x):
    if isinstance(x, ShardTensor):
        return plain(x)
    if isinstance(x, (list, tuple)):
        return type(x)(plain_tree(v) for v in x)
    if isinstance(x, dict):
        return {k: plain_tree(v) for k, v in x.items()}
    return x


def first_shard(args: Iterable, kwargs: dict | None = None) -> ShardTensor | None:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, ShardTensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, ShardTensor):
                    return b
    return None


def shard_like(t: torch.Tensor, ref) -> torch.Tensor:
    """``t`` wrapped with ``ref``'s metadata when ``ref`` is a ShardTensor, else ``t`` itself
    (so model code using it runs unchanged on one process)."""
    if isinstance(ref, ShardTensor) and not isinstance(t, ShardTensor):
        return ShardTensor.wrap_like(t, ref)
    return t


__all__ = ["ALLOCATORS", "GroupConfig", "HaloMeta", "ShardMeta", "ShardTensor", "dispatch_trace",
           "first_shard", "op_name", "plain", "plain_tree", "record", "register_handler",
           "registered_handlers", "shard_like", "unregister_handler"]
