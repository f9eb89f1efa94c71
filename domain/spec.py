"""Distribution specs: how a model's tensors are stored across ranks and how its outputs
are consolidated; presets; versioned JSON.

An :class:`MLIPSpec` holds

- ``distribution``: a :class:`DistributionSpec`: the storage policy
  (:class:`HaloStorage` with mode ``scatter`` / ``gather`` / ``local``, or
  :class:`ShardedStorage`), whether per-system reductions are handled, the op adapters
  (``custom_ops``), helper adapters (``third_party_helpers``: Python, method and jit
  adapters) and the :class:`~shardmd.domain.compile_policy.CompilePolicy`;
- ``output_kinds``: output name -> :class:`OutputKind`;
- ``owned_only_outputs``: per-point outputs whose owned rows are already complete (halo
  rows are dropped);
- ``reverse_outputs``: per-point outputs whose halo rows hold partial sums (a reverse
  exchange adds them to the owners);
- ``all_reduce_outputs``: per-system outputs that are per-rank partial sums (summed over
  ranks).  A per-system output not listed is taken as already reduced (the per-system
  handler or an ``AllReduceSum`` transform did it): listing it too sums it twice.

Per-point outputs in neither set keep their owned rows.  An output of kind ``UNKNOWN``
(or not named) warns once and is classified by shape: ``n_padded`` or ``n_owned`` rows ->
per-point; 0-d or ``n_systems`` rows -> per-system; anything else -> global.

JSON (``save``/``load``, ``version`` 1) stores every field (files written before
``compile_policy`` existed load with the default policy); an op is stored as
``"namespace::name"`` beside the module whose import registers it.

A spec file is data: ``load``/``from_json``/``from_dict`` check every field first, then
resolve the modules the spec names (each op's ``module``, each helper adapter's module,
target and replacement) without importing any: a module already imported (the model's
factory imported it) or one of ShardMD's own is used; any other is refused with a one-line
:class:`SpecImportRefused` naming it, unless ``allow_imports=True`` (the command line's
``allow_code=true``), which imports it.  :func:`spec_modules` lists what a spec names.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .adapters import HELPERS, JitAdapter, MethodAdapter, OpAdapter, PythonAdapter, transform_from_dict
from .compile_policy import CompilePolicy, GraphPadder
from .json_text import loads_bounded

SPEC_VERSION = 1


class SpecLoadError(ValueError):
    """A saved spec cannot be loaded (one-line message naming what is missing)."""


class SpecImportRefused(SpecLoadError):
    """A spec names a module that is not imported yet, and imports were not allowed."""


class OutputKind(str, enum.Enum):
    PER_NODE = "per_node"     # one row per point
    PER_GRAPH = "per_graph"   # one row per system (or a scalar)
    GLOBAL = "global"         # identical on every rank already
    UNKNOWN = "unknown"       # classified by shape, with a warning


class FrozenMap(Mapping):
    """An immutable, hashable, ordered mapping (sorted by key)."""

    __slots__ = ("_items",)

    def __init__(self, items=()):
        d = dict(items.items() if isinstance(items, Mapping) else items)
        object.__setattr__(self, "_items", tuple(sorted(d.items(), key=lambda kv: str(kv[0]))))

    def __getitem__(self, k):
        for kk, v in self._items:
            if kk == k:
                return v
        raise KeyError(k)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self):
        return f"FrozenMap({dict(self._items)!r})"

    def __reduce__(self):
        return (FrozenMap, (self._items,))


@dataclass(frozen=True)
class HaloStorage:
    """Every rank holds its owned rows then halo copies (``[owned | halo]``).

    mode: how scatters into halo-padded per-point ShardTensors are corrected:
    ``scatter`` (reverse then forward exchange), ``gather`` (forward refresh only;
    receiver-owned edges), ``local`` (no correction)."""

    mode: str = "scatter"

    def __post_init__(self):
        if self.mode not in ("scatter", "gather", "local"):
            raise ValueError(f"HaloStorage mode {self.mode!r}: use 'scatter', 'gather' or 'local'")

    kind = "halo"


@dataclass(frozen=True)
class ShardedStorage:
    """Every rank holds only its owned rows; rows are addressed by storage id and fetched
    from / shipped to their owners on demand (all-to-all-v).  The neighbour list a model
    sees indexes points by storage id (centres and neighbours alike) and its image shifts
    include the halo images."""

    kind = "sharded"


STORAGES = {"halo": HaloStorage, "sharded": ShardedStorage}


@dataclass(frozen=True)
class DistributionSpec:
    storage: HaloStorage | ShardedStorage = field(default_factory=HaloStorage)
    system_reductions: bool = True
    custom_ops: tuple = ()
    third_party_helpers: tuple = ()
    compile_policy: CompilePolicy = field(default_factory=CompilePolicy)

    def __post_init__(self):
        object.__setattr__(self, "custom_ops", tuple(self.custom_ops))
        object.__setattr__(self, "third_party_helpers", tuple(self.third_party_helpers))
        for a in self.custom_ops:
            if not isinstance(a, OpAdapter):
                raise TypeError(f"custom_ops takes OpAdapter objects, got {a!r}")
        for h in self.third_party_helpers:
            if not isinstance(h, (PythonAdapter, MethodAdapter, JitAdapter)):
                raise TypeError(f"third_party_helpers takes PythonAdapter/MethodAdapter/JitAdapter objects, got {h!r}")
        if not isinstance(self.compile_policy, CompilePolicy):
            raise TypeError(f"compile_policy takes a CompilePolicy, got {self.compile_policy!r}")


def _kinds(m) -> FrozenMap:
    return FrozenMap({str(k): OutputKind(v) for k, v in dict(m or {}).items()})


@dataclass(frozen=True)
class MLIPSpec:
    name: str = "custom"
    distribution: DistributionSpec = field(default_factory=DistributionSpec)
    output_kinds: FrozenMap = field(default_factory=FrozenMap)
    owned_only_outputs: frozenset = frozenset()
    reverse_outputs: frozenset = frozenset()
    all_reduce_outputs: frozenset = frozenset()
    description: str = ""

    def __post_init__(self):
        object.__setattr__(self, "output_kinds", _kinds(self.output_kinds))
        for f in ("owned_only_outputs", "reverse_outputs", "all_reduce_outputs"):
            object.__setattr__(self, f, frozenset(getattr(self, f)))
        both = self.owned_only_outputs & self.reverse_outputs
        if both:
            raise ValueError(f"outputs {sorted(both)} are both owned-only and reverse-exchanged")

    # -- convenience --------------------------------------------------------------------------
    def kind_of(self, key: str) -> OutputKind:
        return self.output_kinds.get(key, OutputKind.UNKNOWN)

    def replace(self, **changes) -> "MLIPSpec":
        return dataclasses.replace(self, **changes)

    def with_storage(self, storage) -> "MLIPSpec":
        return self.replace(distribution=dataclasses.replace(self.distribution, storage=storage))

    def with_custom_ops(self, *adapters: OpAdapter) -> "MLIPSpec":
        d = self.distribution
        return self.replace(distribution=dataclasses.replace(d, custom_ops=d.custom_ops + tuple(adapters)))

    def with_helpers(self, *helpers) -> "MLIPSpec":
        d = self.distribution
        helpers = d.third_party_helpers + tuple(helpers)
        return self.replace(distribution=dataclasses.replace(d, third_party_helpers=helpers))

    def with_compile(self, policy: CompilePolicy | None = None, **settings) -> "MLIPSpec":
        """This spec with ``policy`` (or ``CompilePolicy(enabled=True, **settings)``)."""
        policy = policy if policy is not None else CompilePolicy(**{"enabled": True, **settings})
        return self.replace(distribution=dataclasses.replace(self.distribution, compile_policy=policy))

    @classmethod
    def from_legacy_kinds(cls, kinds: Mapping[str, str], name: str = "legacy") -> "MLIPSpec":
        """The spec equivalent of the engine interface's ``output_kinds`` strings."""
        ok, owned, rev, red = {}, set(), set(), set()
        for k, v in kinds.items():
            if v == "per_system":
                ok[k] = OutputKind.PER_GRAPH
                red.add(k)
            elif v == "per_point":
                ok[k] = OutputKind.PER_NODE
                owned.add(k)
            elif v == "per_point_reverse":
                ok[k] = OutputKind.PER_NODE
                rev.add(k)
            elif v == "global":
                ok[k] = OutputKind.GLOBAL
            else:
                raise ValueError(f"unknown output kind {v!r} for {k!r}")
        return cls(name=name, output_kinds=ok, owned_only_outputs=owned, reverse_outputs=rev, all_reduce_outputs=red)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = self.distribution
        return {
            "format": "shardmd-spec",
            "version": SPEC_VERSION,
            "name": self.name,
            "description": self.description,
            "distribution": {
                "storage": {"kind": d.storage.kind, **dataclasses.asdict(d.storage)},
                "system_reductions": d.system_reductions,
                "custom_ops": [a.to_dict() for a in d.custom_ops],
                "third_party_helpers": [h.to_dict() for h in d.third_party_helpers],
                "compile_policy": d.compile_policy.to_dict(),
            },
            "output_kinds": {k: v.value for k, v in self.output_kinds.items()},
            "owned_only_outputs": sorted(self.owned_only_outputs),
            "reverse_outputs": sorted(self.reverse_outputs),
            "all_reduce_outputs": sorted(self.all_reduce_outputs),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def save(self, path) -> Path:
        p = Path(path)
        p.write_text(self.to_json() + "\n")
        return p

    @classmethod
    def from_dict(cls, d: dict, allow_imports: bool = False) -> "MLIPSpec":
        """The spec a :meth:`to_dict` mapping describes; every field is checked before any
        module is resolved; ``allow_imports``: import the modules it names that are not imported
        yet (else :class:`SpecImportRefused`)."""
        _check_fields(d)
        dd = d["distribution"]
        st = dict(dd["storage"])
        storage = STORAGES[st.pop("kind")](**st)
        missing = [(m, who) for m, who in _needed_modules(d) if not _importable_now(m)]
        if missing and not allow_imports:
            (m, who), more = missing[0], len({m for m, _ in missing}) - 1
            raise SpecImportRefused(f"{who} needs module {m!r}" + (f" (and {more} more)" if more else "")
                                    + ", which is not imported, and a spec file is data: it imports nothing; "
                                    "import it in the model's factory, or give allow_code=true on the command "
                                    "line (MLIPSpec.load(..., allow_imports=True))")
        for m in dict.fromkeys(m for m, _ in missing):
            _import(m)
        ops = tuple(_load_op(o) for o in dd.get("custom_ops", []))
        helpers = []
        for h in dd.get("third_party_helpers", []):
            h = dict(h)
            helpers.append(HELPERS[h.pop("type")](**h))
        policy = CompilePolicy.from_dict(dd.get("compile_policy") or {})
        dist = DistributionSpec(storage=storage, system_reductions=bool(dd["system_reductions"]), custom_ops=ops,
                                third_party_helpers=tuple(helpers), compile_policy=policy)
        return cls(name=d["name"], description=d.get("description", ""), distribution=dist,
                   output_kinds=d["output_kinds"], owned_only_outputs=d["owned_only_outputs"],
                   reverse_outputs=d["reverse_outputs"], all_reduce_outputs=d["all_reduce_outputs"])

    @classmethod
    def from_json(cls, text: str, allow_imports: bool = False) -> "MLIPSpec":
        try:
            d = loads_bounded(text)
        except ValueError as exc:
            raise SpecLoadError(f"not JSON ({exc})") from None
        return cls.from_dict(d, allow_imports=allow_imports)

    @classmethod
    def load(cls, path, allow_imports: bool = False) -> "MLIPSpec":
        return cls.from_json(Path(path).read_text(), allow_imports=allow_imports)


def _module_of(path) -> str | None:
    """The module of a ``'module:qualname'`` path (None for anything else)."""
    return path.partition(":")[0] or None if isinstance(path, str) else None


def spec_modules(d: dict) -> list[str]:
    """Every module a spec mapping names (ops' ``module``, helpers' module, target, replacement),
    in order, once each."""
    dd = d.get("distribution") or {}
    names = [o.get("module") for o in dd.get("custom_ops", [])]
    for h in dd.get("third_party_helpers", []):
        names += [h.get("module_path"), _module_of(h.get("target")), _module_of(h.get("replacement"))]
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n))


def _needed_modules(d: dict) -> list[tuple[str, str]]:
    """(module, what names it) for each module resolving the spec would import: the module of
    each op that is not registered yet, and every module of each helper adapter."""
    dd = d["distribution"]
    out = [(o["module"], f"spec op '{o['op']}'") for o in dd.get("custom_ops", [])
           if o.get("module") and _find_op(o["op"], o.get("overload", "default")) is None]
    for i, h in enumerate(dd.get("third_party_helpers", [])):
        for m in (h.get("module_path"), _module_of(h.get("target")), _module_of(h.get("replacement"))):
            if m:
                out.append((m, f"spec third_party_helpers[{i}] ({h['type']})"))
    return out


def _importable_now(module: str) -> bool:
    """Whether ``module`` is used without running any code it was not already running: imported
    already, or ShardMD's own (an installed package: never the working directory's)."""
    return module in sys.modules or module == "shardmd" or module.startswith("shardmd.")


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SpecLoadError(f"cannot import the spec's module '{module}' ({type(exc).__name__}: {first})") from None


_SPEC_FIELDS = {"format", "version", "name", "description", "distribution", "output_kinds", "owned_only_outputs",
                "reverse_outputs", "all_reduce_outputs"}
_HELPER_FIELDS = {"PythonAdapter": ({"module_path", "attr_name", "replacement"}, {"factory"}),
                  "MethodAdapter": ({"target", "method_name", "replacement"}, {"factory"}),
                  "JitAdapter": ({"target", "replacement"}, {"factory", "check_signature"})}


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise SpecLoadError(what)


def _names(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _check_fields(d) -> None:
    """Every field of a spec mapping, before anything is resolved (one-line SpecLoadError)."""
    _need(isinstance(d, dict), "a spec is a JSON object")
    if d.get("format") != "shardmd-spec":
        raise SpecLoadError("not a ShardMD spec (missing \"format\": \"shardmd-spec\")")
    v = d.get("version")
    if v != SPEC_VERSION:
        raise SpecLoadError(f"spec version {v!r} is not supported (this ShardMD reads version {SPEC_VERSION})")
    extra = set(d) - _SPEC_FIELDS
    if extra:
        raise SpecLoadError(f"spec has unknown fields {sorted(extra)} (written by a newer ShardMD?)")
    _need(isinstance(d.get("name"), str), "spec name: give a string")
    _need(isinstance(d.get("description", ""), str), "spec description: give a string")
    kinds = d.get("output_kinds")
    _need(isinstance(kinds, dict) and all(x in {k.value for k in OutputKind} for x in kinds.values()),
          f"spec output_kinds: give {{output: kind}} with kinds {', '.join(k.value for k in OutputKind)}")
    for f in ("owned_only_outputs", "reverse_outputs", "all_reduce_outputs"):
        _need(_names(d.get(f)), f"spec {f}: give a list of output names")
    dd = d.get("distribution")
    _need(isinstance(dd, dict), "spec distribution: give an object")
    extra = set(dd) - {f.name for f in dataclasses.fields(DistributionSpec)}
    if extra:
        raise SpecLoadError(f"spec distribution has unknown fields {sorted(extra)} (written by a newer ShardMD?)")
    st = dd.get("storage")
    _need(isinstance(st, dict) and st.get("kind") in STORAGES,
          f"spec storage: unknown storage kind {st.get('kind') if isinstance(st, dict) else st!r}; "
          f"known: {', '.join(STORAGES)}")
    try:
        STORAGES[st["kind"]](**{k: x for k, x in st.items() if k != "kind"})
    except (TypeError, ValueError) as exc:
        raise SpecLoadError(f"spec storage: {exc}") from None
    _need(isinstance(dd.get("system_reductions"), bool), "spec system_reductions: give true or false")
    ops = dd.get("custom_ops", [])
    _need(isinstance(ops, list), "spec custom_ops: give a list")
    for i, o in enumerate(ops):
        _need(isinstance(o, dict) and isinstance(o.get("op"), str) and "::" in o["op"],
              f"spec custom_ops[{i}]: give {{\"op\": \"namespace::name\", ...}}")
        _need(o.get("module") is None or isinstance(o["module"], str), f"spec custom_ops[{i}].module: give a string")
        _need(isinstance(o.get("overload", "default"), str), f"spec custom_ops[{i}].overload: give a string")
        for t in ("arg_transforms", "output_transforms"):
            pairs = o.get(t, [])
            _need(isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], dict)
                                                  for p in pairs), f"spec custom_ops[{i}].{t}: give [[key, transform]]")
            for _, tr in pairs:
                try:
                    transform_from_dict(tr)
                except (KeyError, TypeError, ValueError) as exc:
                    raise SpecLoadError(f"spec custom_ops[{i}].{t}: {exc}") from None
    helpers = dd.get("third_party_helpers", [])
    _need(isinstance(helpers, list), "spec third_party_helpers: give a list")
    for i, h in enumerate(helpers):
        t = h.get("type") if isinstance(h, dict) else None
        _need(t in _HELPER_FIELDS, f"spec third_party_helpers[{i}]: unknown type {t!r}; known: {', '.join(HELPERS)}")
        need, opt = _HELPER_FIELDS[t]
        keys = set(h) - {"type"}
        _need(need <= keys <= need | opt, f"spec third_party_helpers[{i}] ({t}): give the fields "
              f"{', '.join(sorted(need))} (optional: {', '.join(sorted(opt))})")
        _need(all(isinstance(h[k], str) and h[k] for k in need), f"spec third_party_helpers[{i}] ({t}): "
              f"{', '.join(sorted(need))} are strings ('module:qualname' for targets and replacements)")
        _need(all(isinstance(h[k], bool) for k in opt & keys), f"spec third_party_helpers[{i}] ({t}): "
              f"{', '.join(sorted(opt))} take true or false")
    try:
        CompilePolicy.from_dict(dd.get("compile_policy") or {})
    except (TypeError, ValueError) as exc:
        raise SpecLoadError(f"spec compile_policy: {exc}") from None
    try:
        MLIPSpec(name=d["name"], output_kinds=kinds, owned_only_outputs=d["owned_only_outputs"],
                 reverse_outputs=d["reverse_outputs"], all_reduce_outputs=d["all_reduce_outputs"])
    except ValueError as exc:
        raise SpecLoadError(f"spec outputs: {exc}") from None


def _find_op(qualname: str, overload: str):
    ns, _, name = qualname.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None


def _load_op(o: dict) -> OpAdapter:
    """The adapter of a checked op entry; its module was imported already (or allowed)."""
    qual, overload, module = o["op"], o.get("overload", "default"), o.get("module")
    op = _find_op(qual, overload)
    if op is None:
        if not module:
            raise SpecLoadError(f"spec op '{qual}' is not registered and the spec names no module that registers it")
        if module not in sys.modules:
            _import(module)
        op = _find_op(qual, overload)
        if op is None:
            raise SpecLoadError(f"spec op '{qual}': module '{module}' was imported but does not register it")
    args = tuple((k, transform_from_dict(t)) for k, t in o.get("arg_transforms", []))
    outs = tuple((k, transform_from_dict(t)) for k, t in o.get("output_transforms", []))
    return OpAdapter(op=op, arg_transforms=args, output_transforms=outs, module=module)


# -- presets ---------------------------------------------------------------------------------------
SPEC_MPNN_HALO = MLIPSpec(
    name="mpnn-halo",
    description="message passing, autograd forces, halo storage with scatter correction",
    distribution=DistributionSpec(storage=HaloStorage("scatter")),
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE},
    owned_only_outputs={"energies", "forces"},
)

SPEC_PAIR_HALO = MLIPSpec(
    name="pair-halo",
    description="pair potential on a receiver-owned full list, kernel-direct forces, halo storage",
    distribution=DistributionSpec(storage=HaloStorage("gather")),
    output_kinds={"energy": OutputKind.PER_GRAPH, "virial": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE,
                  "energies": OutputKind.PER_NODE},
    owned_only_outputs={"forces", "energies"},
    all_reduce_outputs={"energy", "virial"},
)

SPEC_MPNN_SHARDED = MLIPSpec(
    name="mpnn-sharded",
    description="message passing, autograd forces, sharded (node-partition) storage",
    distribution=DistributionSpec(storage=ShardedStorage()),
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE},
    owned_only_outputs={"energies", "forces"},
)

SPEC_WIDE_HALO = MLIPSpec(
    name="wide-halo",
    description="the model builds its own graph over owned and halo points (the halo as deep as its whole "
                "receptive field: its cutoff) and returns the owned points' share of the energy; autograd forces "
                "(halo rows added to their owners), halo storage without correction",
    distribution=DistributionSpec(storage=HaloStorage("local")),
    output_kinds={"energy": OutputKind.PER_GRAPH, "virial": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE,
                  "energies": OutputKind.PER_NODE},
    owned_only_outputs={"forces", "energies"},
    all_reduce_outputs={"energy"},
)

PRESETS = {s.name: s for s in (SPEC_MPNN_HALO, SPEC_PAIR_HALO, SPEC_MPNN_SHARDED, SPEC_WIDE_HALO)}

__all__ = ["CompilePolicy", "DistributionSpec", "FrozenMap", "GraphPadder", "HaloStorage", "MLIPSpec",
           "OutputKind", "PRESETS", "SPEC_MPNN_HALO",
           "SPEC_MPNN_SHARDED", "SPEC_PAIR_HALO", "SPEC_VERSION", "SPEC_WIDE_HALO", "STORAGES", "ShardedStorage",
           "SpecImportRefused", "SpecLoadError", "spec_modules"]
