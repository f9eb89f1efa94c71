"""Adapters that make opaque code distribution-aware for the duration of a scope.

- :class:`OpAdapter` declares how a ``torch.library.custom_op`` kernel (Warp, Triton, C++)
  behaves under decomposition: per-argument transforms before the kernel, per-output
  transforms after it.  Kernels read raw buffers and never see ShardTensor metadata; the
  adapter's handler (registered on the op handle for the scope) unwraps the arguments,
  applies the transforms, runs the kernel on plain tensors and re-promotes per-point
  outputs to ShardTensors.
- :class:`PythonAdapter` swaps a module attribute (a third-party helper function) and
  :class:`MethodAdapter` a class attribute (a method) for a distribution-aware
  replacement; :class:`JitAdapter` swaps an opaque compiled helper (a TorchScript
  function or module, a ``torch.compile``-d function) after checking that the replacement
  takes the same arguments.

:class:`AdapterScope` installs every adapter of a spec on entry and restores the previous
state on exit, also when the block raises.

Transforms (``ref`` is a ShardTensor argument of the call, giving the metadata):

==================  ===========================================================================
GatherInputs        input (n_owned, *F) -> (n_padded, *F) by a forward halo exchange
GatherInputsFull    sharded input (n_owned, *F) -> (n_global + 1, *F) in storage-id order, last
                    row zero (the padding sentinel's row)
SliceOwned          input (n_padded, *F) -> (n_owned, *F)
ScatterOutputs      output (n_padded, *F) of partial sums -> reverse + forward exchange
                    (owners complete, halo rows refreshed); sharded: (n_global [+1], *F)
                    partial sums -> (n_owned, *F) summed on the owners
ReverseOutputs      output (n_padded, *F) of partial sums -> (n_owned, *F) by the reverse
                    exchange only (kernel-direct forces: no refresh, half the traffic);
                    sharded: as ScatterOutputs
AllReduceSum        output -> sum over ranks (identity backward)
SliceOutputsOwned   output (n_global [+1], *F) -> (n_owned, *F) rows of this rank's ids;
                    halo storage: (n_padded, *F) -> (n_owned, *F)
==================  ===========================================================================

Shape checks are strict: a transform given rows it does not expect raises
:class:`TransformError` naming the op, the argument and the likely mistake (an extra
``GatherInputs`` on an already padded input is the common one).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._C import DisableTorchFunctionSubclass

from .collectives import all_reduce_sum, all_to_all_v
from .halo import halo_forward, halo_reverse
from .handlers import correct_halo
from .helper_adapters import HELPERS, JitAdapter, MethodAdapter, PythonAdapter, is_opaque_compiled  # noqa: F401
from .shard_tensor import ShardTensor, first_shard, plain_tree, register_handler, unregister_handler


class TransformError(RuntimeError):
    """A transform got a tensor whose rows do not fit its storage (one-line message)."""


# -- transforms -----------------------------------------------------------------------------
def _rows(x) -> int:
    return int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() else -1


@dataclass(frozen=True)
class Transform:
    """Base: ``apply(x, ref, where)`` returns the transformed plain tensor."""

    def apply(self, x: torch.Tensor, ref: ShardTensor, where: str) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict:
        return {"type": self.kind}

    def _fail(self, where: str, msg: str):
        raise TransformError(f"{self.kind} on {where}: {msg}")


@dataclass(frozen=True)
class GatherInputs(Transform):
    def apply(self, x, ref, where):
        if ref._halo is None:
            self._fail(where, "needs halo storage (use GatherInputsFull in sharded storage)")
        h = ref._halo
        if _rows(x) == h.n_padded and h.n_padded != h.n_owned:
            self._fail(where, f"input already has the {h.n_padded} halo-padded rows: drop the extra GatherInputs")
        if _rows(x) != h.n_owned:
            self._fail(where, f"expected {h.n_owned} owned rows, got {_rows(x)}")
        return halo_forward(ref._group.comm, h.plan, x)


def _full_gather(ref: ShardTensor, x: torch.Tensor) -> torch.Tensor:
    meta, comm = ref._shard, ref._group.comm
    n = meta.n_owned
    reps = comm.size
    counts = [int(c) for c in comm.all_gather_object(n)] if comm.size > 1 else [n]
    ids = all_to_all_v(comm, meta.global_ids.repeat(reps), [n] * reps, counts)
    rows = all_to_all_v(comm, x.repeat(reps, *([1] * (x.dim() - 1))), [n] * reps, counts)
    full = x.new_zeros((meta.n_global + 1, *x.shape[1:]))
    return full.index_copy(0, ids, rows)


@dataclass(frozen=True)
class GatherInputsFull(Transform):
    def apply(self, x, ref, where):
        if ref._shard is None:
            self._fail(where, "needs sharded storage (use GatherInputs in halo storage)")
        if _rows(x) != ref._shard.n_owned:
            self._fail(where, f"expected {ref._shard.n_owned} owned rows, got {_rows(x)}")
        return _full_gather(ref, x)


@dataclass(frozen=True)
class SliceOwned(Transform):
    def apply(self, x, ref, where):
        n = ref.n_owned
        if _rows(x) not in (n, ref.n_padded):
            self._fail(where, f"expected {ref.n_padded} padded rows, got {_rows(x)}")
        return x[:n]


def _reduce_to_owners(ref: ShardTensor, x: torch.Tensor, where: str, t: Transform) -> torch.Tensor:
    """Sharded: (n_global [+1], *F) partial sums -> (n_owned, *F) on the owners."""
    meta, comm = ref._shard, ref._group.comm
    if _rows(x) not in (meta.n_global, meta.n_global + 1):
        t._fail(where, f"expected {meta.n_global} (+1) full rows of partial sums, got {_rows(x)}")
    order = torch.argsort(meta.owner, stable=True)
    send = torch.bincount(meta.owner, minlength=comm.size).tolist()
    got = all_to_all_v(comm, x[order.to(x.device)], send, [meta.n_owned] * comm.size)
    rows = got.reshape(comm.size, meta.n_owned, *x.shape[1:]).sum(0)
    # rows arrive in my owner-sorted id order: ids sorted by owner, i.e. by local row
    mine = meta.local_row[order[meta.owner[order] == comm.rank]]
    out = torch.zeros_like(rows)
    return out.index_copy(0, mine.to(x.device), rows)


@dataclass(frozen=True)
class ScatterOutputs(Transform):
    def apply(self, x, ref, where):
        if ref._shard is not None:
            return _reduce_to_owners(ref, x, where, self)
        h = ref._halo
        if _rows(x) != h.n_padded:
            self._fail(where, f"expected {h.n_padded} halo-padded rows of partial sums, got {_rows(x)}")
        return correct_halo(ref, x, "scatter")


@dataclass(frozen=True)
class ReverseOutputs(Transform):
    def apply(self, x, ref, where):
        if ref._shard is not None:
            return _reduce_to_owners(ref, x, where, self)
        h = ref._halo
        if _rows(x) != h.n_padded:
            self._fail(where, f"expected {h.n_padded} halo-padded rows of partial sums, got {_rows(x)}")
        return halo_reverse(ref._group.comm, h.plan, x)


@dataclass(frozen=True)
class AllReduceSum(Transform):
    def apply(self, x, ref, where):
        return all_reduce_sum(ref._group.comm, x)


@dataclass(frozen=True)
class SliceOutputsOwned(Transform):
    def apply(self, x, ref, where):
        if ref._shard is not None:
            meta = ref._shard
            if _rows(x) not in (meta.n_global, meta.n_global + 1):
                self._fail(where, f"expected {meta.n_global} (+1) full rows, got {_rows(x)}")
            return x.index_select(0, meta.global_ids.to(x.device))
        if _rows(x) != ref.n_padded:
            self._fail(where, f"expected {ref.n_padded} padded rows, got {_rows(x)}")
        return x[: ref.n_owned]


TRANSFORMS = {c.__name__: c for c in (GatherInputs, GatherInputsFull, SliceOwned, ScatterOutputs, ReverseOutputs,
                                      AllReduceSum, SliceOutputsOwned)}


def transform_from_dict(d: dict) -> Transform:
    kind = d.get("type")
    if kind not in TRANSFORMS:
        raise ValueError(f"unknown transform {kind!r}; known: {', '.join(TRANSFORMS)}")
    return TRANSFORMS[kind](**{k: v for k, v in d.items() if k != "type"})


# -- op adapters -------------------------------------------------------------------------------
def _freeze_transforms(m) -> tuple:
    if m is None:
        return ()
    items = m.items() if isinstance(m, dict) else m
    out = []
    for k, v in items:
        if not isinstance(k, (int, str)):
            raise TypeError(f"transform keys are argument/output positions (int) or names (str), got {k!r}")
        if not isinstance(v, Transform):
            raise TypeError(f"{v!r} is not a transform (GatherInputs(), ScatterOutputs(), ...)")
        out.append((k, v))
    return tuple(sorted(out, key=lambda kv: (isinstance(kv[0], str), str(kv[0]))))


def _overload(op):
    """The OpOverload of a custom op given as CustomOpDef, OpOverloadPacket or OpOverload."""
    if hasattr(op, "_opoverload"):  # CustomOpDef
        return op._opoverload
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    return op


def op_qualname(op) -> str:
    """``namespace::name`` of an OpOverload."""
    return str(op._schema.name)


def _registering_module(op) -> str | None:
    try:
        from torch._library.custom_ops import OPDEFS

        d = OPDEFS.get(op_qualname(op))
        if d is not None:
            return d._init_fn.__module__
    except Exception:  # noqa: BLE001 - a best-effort lookup
        pass
    return None


@dataclass(frozen=True)
class OpAdapter:
    """Distribution semantics of one custom op.

    op: the op (``torch.ops.ns.name.default``, the ``custom_op`` object or the packet);
    arg_transforms: {position or name: Transform} applied to the arguments;
    output_transforms: {output position: Transform} applied to the outputs;
    module: the module whose import registers the op (inferred for ``custom_op`` ops
    defined in an importable module; stored in the spec's JSON).
    """

    op: Any
    arg_transforms: tuple = ()
    output_transforms: tuple = ()
    module: str | None = None

    def __post_init__(self):
        op = _overload(self.op)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "arg_transforms", _freeze_transforms(self.arg_transforms))
        object.__setattr__(self, "output_transforms", _freeze_transforms(self.output_transforms))
        if self.module is None:
            mod = _registering_module(op)
            if mod and mod != "__main__":
                object.__setattr__(self, "module", mod)

    @property
    def qualname(self) -> str:
        return op_qualname(self.op)

    def handler(self):
        args_t = dict(self.arg_transforms)
        outs_t = dict(self.output_transforms)
        name = self.qualname

        def run(func, types, args, kwargs):
            ref = first_shard(args, kwargs)
            with DisableTorchFunctionSubclass():
                a = list(plain_tree(tuple(args)))
                kw = plain_tree(dict(kwargs))
                for key, t in args_t.items():
                    if isinstance(key, int):
                        if key < len(a) and a[key] is not None:
                            a[key] = t.apply(a[key], ref, f"argument {key} of {name}")
                    elif kw.get(key) is not None:
                        kw[key] = t.apply(kw[key], ref, f"argument {key!r} of {name}")
                out = func(*a, **kw)
                many = isinstance(out, (tuple, list))
                outs = list(out) if many else [out]
                for key, t in outs_t.items():
                    if key >= len(outs):
                        raise TransformError(f"{t.kind} on output {key} of {name}: "
                                             f"the op returns {len(outs)} output(s)")
                    outs[key] = t.apply(outs[key], ref, f"output {key} of {name}")
                outs = [ShardTensor.wrap_like(o, ref) if _rows(o) == ref.n_padded and o.dim() > 0 else o
                        for o in outs]
            return tuple(outs) if many else outs[0]

        return run

    def to_dict(self) -> dict:
        ov = self.op._overloadname or "default"
        return {"op": self.qualname, "overload": ov, "module": self.module,
                "arg_transforms": [[k, t.to_dict()] for k, t in self.arg_transforms],
                "output_transforms": [[k, t.to_dict()] for k, t in self.output_transforms]}


# -- scope -----------------------------------------------------------------------------------------
_counter = itertools.count()


class AdapterScope:
    """Install a spec's op adapters and helper swaps on entry; restore them on exit
    (also on error).  ``scope`` is handed to helper factories."""

    def __init__(self, spec, scope=None):
        self.spec = spec
        self.scope = scope
        self._undo: list[Callable[[], None]] = []

    def __enter__(self):
        dist = self.spec.distribution if self.spec is not None else None
        try:
            if dist is not None:
                for ad in dist.custom_ops:
                    name = f"op_adapter:{ad.qualname}#{next(_counter)}"
                    register_handler(ad.op, lambda f, a, k: True, ad.handler(), name=name, position=0)
                    self._undo.append(lambda n=name: unregister_handler(n))
                for h in dist.third_party_helpers:
                    self._undo.append(h.install(self.scope))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        while self._undo:
            self._undo.pop()()
        return False


__all__ = ["AdapterScope", "AllReduceSum", "GatherInputs", "GatherInputsFull", "JitAdapter", "MethodAdapter",
           "OpAdapter",
           "PythonAdapter", "ReverseOutputs", "ScatterOutputs", "SliceOutputsOwned", "SliceOwned", "TRANSFORMS",
           "Transform", "TransformError", "op_qualname", "transform_from_dict"]
