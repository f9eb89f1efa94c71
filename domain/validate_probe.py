"""What a validator rank watches while the model runs (evidence for the diagnoses of
:mod:`shardmd.domain.validate_diagnose`).

:class:`Probe` is a torch-function mode active around one DistributedModel call on a
validation rank.  It records, without changing any result:

- ``plain_op_calls``: calls of an op the spec adapts (an ``OpAdapter``) in which no
  ShardTensor argument reached the op, so its adapter could not fire;
- ``halo_inconsistent``: ``(op, output index)`` of adapted ops whose per-point output leaves
  the op (after its transforms) with halo rows that are not copies of their owners' rows
  (partial sums or values from truncated neighbourhoods) while no ``ScatterOutputs`` /
  ``ReverseOutputs`` is declared on that output (one forward exchange per such output, on
  every rank, in the same order);
- ``plain_reductions``: scatters of per-point rows into a small plain target (fewer rows
  than the rank owns), made by model code: a per-system sum over this rank's rows that no
  handler sees, hence never summed over ranks (a helper such as a ``mol_sum`` allocating
  with ``torch.zeros``), with the name of the function that made it.

Calls made by the mechanism itself (modules of this package) are not recorded.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from .adapters import ReverseOutputs, ScatterOutputs
from .halo import halo_forward
from .shard_tensor import ShardTensor, plain

_HERE = str(Path(__file__).resolve().parent)
_TORCH = str(Path(torch.__file__).resolve().parent)
T = torch.Tensor
_SCATTERS = frozenset([T.scatter_add_, T.index_add_, torch.scatter_add, T.scatter_add, torch.index_add, T.index_add])


def op_key(func) -> str | None:
    """'ns::name' of a custom op overload or packet, None for anything else."""
    name = getattr(func, "_qualified_op_name", None)
    if name is None and hasattr(func, "_schema"):
        name = str(func._schema.name)
    if name is None or name.split("::")[0] in ("aten", "prim", "prims", "quantized"):
        return None
    return name


def _caller() -> tuple[str | None, bool]:
    """(function name, inside this package) of the first frame outside torch and this module."""
    f = sys._getframe(2)
    while f is not None:
        file = str(Path(f.f_code.co_filename).resolve()) if not f.f_code.co_filename.startswith("<") else ""
        if file and not file.startswith(_TORCH) and not file.endswith("validate_probe.py"):
            return f.f_code.co_name, file.startswith(_HERE)
        f = f.f_back
    return None, False


def _rows(x) -> int:
    return int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() else -1


def _has_shard(args, kwargs) -> bool:
    def walk(v):
        if isinstance(v, ShardTensor):
            return True
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        if isinstance(v, dict):
            return any(walk(x) for x in v.values())
        return False
    return walk(args) or walk(kwargs)


class Probe(TorchFunctionMode):
    """See the module docstring.  ``ctx``: the rank's DomainContext; ``spec``: the MLIPSpec."""

    def __init__(self, ctx, spec):
        super().__init__()
        self.ctx = ctx
        self.adapters = {}
        for ad in (spec.distribution.custom_ops if spec is not None else ()):
            self.adapters[ad.qualname] = ad
        self.plain_op_calls: dict = {}
        self.halo_inconsistent: list = []
        self.plain_reductions: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = op_key(func)
        if key is not None and key in self.adapters:
            shard = _has_shard(args, kwargs)
            if not shard:
                self.plain_op_calls[key] = self.plain_op_calls.get(key, 0) + 1
            out = func(*args, **kwargs)
            if shard:
                self._check_halo(key, out)
            return out
        if func in _SCATTERS and args:
            self._check_reduction(args, kwargs)
        return func(*args, **kwargs)

    def _check_reduction(self, args, kwargs):
        target = args[0]
        src = args[3] if len(args) > 3 else kwargs.get("source", kwargs.get("src"))
        if isinstance(target, ShardTensor) or not isinstance(src, torch.Tensor):
            return
        n_own, n_pad = self.ctx.n_owned, self.ctx.n_padded
        if 0 < _rows(target) < min(n_own, 64) and _rows(src) in (n_own, n_pad) and n_own > 1:
            name, internal = _caller()
            if not internal and name not in (r["function"] for r in self.plain_reductions):
                self.plain_reductions.append({"function": name, "rows": _rows(target),
                                              "ghost_rows_included": _rows(src) == n_pad != n_own})

    def _check_halo(self, key, out):
        ad = self.adapters[key]
        declared = {k for k, t in ad.output_transforms if isinstance(t, (ScatterOutputs, ReverseOutputs))}
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        plan = self.ctx.plan
        for k, o in enumerate(outs):
            if k in declared or _rows(o) != self.ctx.n_padded or self.ctx.comm.size == 1:
                continue
            with torch.no_grad():
                x = plain(o).detach()
                fresh = halo_forward(self.ctx.comm, plan, x[: self.ctx.n_owned].contiguous())
                bad = float((fresh[plan.n_owned:plan.n_owned + plan.n_ghost]
                             - x[plan.n_owned:plan.n_owned + plan.n_ghost]).abs().max())
            scale = float(x.abs().max()) if x.numel() else 0.0
            if bad > 1e-12 * max(scale, 1.0) and (key, k) not in self.halo_inconsistent:
                self.halo_inconsistent.append((key, k))

    def evidence(self) -> dict:
        return {"plain_op_calls": dict(self.plain_op_calls), "halo_inconsistent": list(self.halo_inconsistent),
                "plain_reductions": list(self.plain_reductions)}


__all__ = ["Probe", "op_key"]
