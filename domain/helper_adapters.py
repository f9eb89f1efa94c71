"""Adapters that swap a third-party helper for a distribution-aware one inside a scope.

- :class:`PythonAdapter`: a module attribute (a helper function);
- :class:`MethodAdapter`: a class attribute (a method);
- :class:`JitAdapter`: an opaque compiled helper (TorchScript function or module, a
  ``torch.compile``-d function), with a check that the replacement takes the original's
  arguments.

Each has ``install(scope) -> restore`` (called by
:class:`~shardmd.domain.adapters.AdapterScope`, which restores on exit, also on error) and
``to_dict`` (the spec's JSON; a replacement is stored as its ``'module:qualname'`` path).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch


def _import_path(path: str):
    """Object at ``'package.module:Qual.name'``."""
    mod, _, qual = path.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split(".") if qual else []:
        obj = getattr(obj, part)
    return obj


def _path_of(fn) -> str | None:
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not mod or not qual or "<" in qual or mod == "__main__":
        return None
    try:
        return f"{mod}:{qual}" if _import_path(f"{mod}:{qual}") is fn else None
    except Exception:  # noqa: BLE001
        return None


def _norm_replacement(obj, replacement):
    if callable(replacement) and not isinstance(replacement, str):
        path = _path_of(replacement)
        if path is not None:
            object.__setattr__(obj, "replacement", path)


def _resolve(replacement, factory: bool, scope):
    fn = _import_path(replacement) if isinstance(replacement, str) else replacement
    return fn(scope) if factory else fn


@dataclass(frozen=True)
class PythonAdapter:
    """Replace ``module_path.attr_name`` by ``replacement`` inside a scope.

    replacement: a callable or its ``'module:qualname'`` path (stored as the path when it is
    importable, so the spec can be saved); factory: call ``replacement(scope)`` on entry to
    build the actual replacement (for closures over runtime metadata)."""

    module_path: str
    attr_name: str
    replacement: Any
    factory: bool = False

    def __post_init__(self):
        _norm_replacement(self, self.replacement)

    def install(self, scope=None) -> Callable[[], None]:
        mod = importlib.import_module(self.module_path)
        old = getattr(mod, self.attr_name)
        setattr(mod, self.attr_name, _resolve(self.replacement, self.factory, scope))
        return lambda: setattr(mod, self.attr_name, old)

    def to_dict(self) -> dict:
        return {"type": "PythonAdapter", "module_path": self.module_path, "attr_name": self.attr_name,
                "replacement": _saveable(self.replacement, self), "factory": self.factory}


@dataclass(frozen=True)
class MethodAdapter:
    """Replace method ``method_name`` of the class at ``target`` ('module:Class')."""

    target: str
    method_name: str
    replacement: Any
    factory: bool = False

    def __post_init__(self):
        _norm_replacement(self, self.replacement)

    def install(self, scope=None) -> Callable[[], None]:
        cls = _import_path(self.target)
        had = self.method_name in vars(cls)
        old = vars(cls).get(self.method_name)
        setattr(cls, self.method_name, _resolve(self.replacement, self.factory, scope))

        def restore():
            if had:
                setattr(cls, self.method_name, old)
            else:
                delattr(cls, self.method_name)
        return restore

    def to_dict(self) -> dict:
        return {"type": "MethodAdapter", "target": self.target, "method_name": self.method_name,
                "replacement": _saveable(self.replacement, self), "factory": self.factory}


def is_opaque_compiled(obj) -> bool:
    """TorchScript function/module or a torch.compile-d callable (code that runs without
    Python-level ``__torch_function__`` dispatch of its inner ops)."""
    if isinstance(obj, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
        return True
    if getattr(obj, "_torchdynamo_orig_callable", None) is not None:
        return True
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, OptimizedModule)


def _param_names(obj) -> list[str] | None:
    """Positional parameter names of an opaque callable (None when unknown)."""
    import inspect

    if isinstance(obj, torch.jit.ScriptFunction):
        return [a.name for a in obj.schema.arguments if not a.kwarg_only]
    if isinstance(obj, torch.jit.ScriptModule):
        try:
            return [a.name for a in obj.forward.schema.arguments[1:] if not a.kwarg_only]
        except Exception:  # noqa: BLE001
            return None
    inner = getattr(obj, "_torchdynamo_orig_callable", None) or getattr(obj, "_orig_mod", None)
    if inner is not None:
        try:
            ps = inspect.signature(getattr(inner, "forward", inner)).parameters.values()
        except (TypeError, ValueError):
            return None
        return [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    return None


def _accepts(fn, names: list[str]) -> bool:
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True   # cannot tell (builtin, another ScriptFunction without a Python signature)
    try:
        sig.bind(*names)
        return True
    except TypeError:
        return False


@dataclass(frozen=True)
class JitAdapter:
    """Replace an opaque compiled helper at ``target`` ('module:attr' or
    'module:Owner.attr') by ``replacement`` inside a scope.

    The attribute must hold a TorchScript function/module or a ``torch.compile``-d callable
    (use :class:`PythonAdapter` for plain Python functions): such code runs its inner ops
    below Python dispatch, so ShardTensor handlers never see them and the helper computes a
    per-rank answer.  On install the replacement is checked to accept the original's
    positional arguments (``check_signature``).  factory: ``replacement(scope, original)``
    builds the actual replacement on entry (e.g. one that calls the original on owned rows
    and reduces over ranks).  Callers that look the helper up at call time see the
    replacement; TorchScript code that compiled a call to it earlier keeps the original
    (swap the outermost scripted entry point instead)."""

    target: str
    replacement: Any
    factory: bool = False
    check_signature: bool = True

    def __post_init__(self):
        if ":" not in self.target:
            raise ValueError(f"JitAdapter target {self.target!r}: use 'module:attr' or 'module:Owner.attr'")
        _norm_replacement(self, self.replacement)

    def _owner(self):
        mod, _, qual = self.target.partition(":")
        owner_path, _, attr = qual.rpartition(".")
        owner = _import_path(f"{mod}:{owner_path}" if owner_path else mod)
        return owner, attr

    def install(self, scope=None) -> Callable[[], None]:
        owner, attr = self._owner()
        old = getattr(owner, attr)
        if not is_opaque_compiled(old):
            raise TypeError(f"JitAdapter target {self.target} is a {type(old).__name__}, not TorchScript or "
                            "torch.compile-d code: use PythonAdapter/MethodAdapter")
        fn = _import_path(self.replacement) if isinstance(self.replacement, str) else self.replacement
        new = fn(scope, old) if self.factory else fn
        if self.check_signature:
            names = _param_names(old)
            if names is not None and not _accepts(new, names):
                raise TypeError(f"JitAdapter {self.target}: replacement {getattr(new, '__name__', new)!r} does not "
                                f"accept the original's arguments ({', '.join(names)})")
        had = isinstance(owner, type) and attr in vars(owner)
        setattr(owner, attr, new)

        def restore():
            if isinstance(owner, type) and not had:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
        return restore

    def to_dict(self) -> dict:
        return {"type": "JitAdapter", "target": self.target, "replacement": _saveable(self.replacement, self),
                "factory": self.factory, "check_signature": self.check_signature}


def _saveable(replacement, adapter) -> str:
    if isinstance(replacement, str):
        return replacement
    raise ValueError(f"{type(adapter).__name__} replacement {replacement!r} is not importable by path "
                     "(define it at module scope in an importable module to save the spec)")


HELPERS = {"PythonAdapter": PythonAdapter, "MethodAdapter": MethodAdapter, "JitAdapter": JitAdapter}


__all__ = ["HELPERS", "JitAdapter", "MethodAdapter", "PythonAdapter", "is_opaque_compiled"]
