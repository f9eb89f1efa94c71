"""Model registry: every model comes through one of two routes (docs/byo.md).

- ``model=<name>``: a factory registered under the entry-point group ``shardmd.models`` by an
  installed package (ShardMD's own ``lj`` and ``mace`` are registered the same way, in
  pyproject.toml);
- ``model=py:package.module:factory``: a factory importable from the working directory or
  ``sys.path``.

The factory is called with the ``model.<key>=...`` settings as keyword arguments, plus
``device=`` (torch.device) and ``precision=`` (torch dtype of the run) when its signature
names them.  It returns an object meeting :mod:`shardmd.models.contract`.  ``model.spec=FILE``
(a saved ``MLIPSpec`` JSON) becomes the model's ``distribution_spec``.
"""
from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from .contract import check_model
from .files import file_sha256

ENTRY_POINT_GROUP = "shardmd.models"
PY_PREFIX = "py:"
#: keys of the model node the registry reads itself (not passed to the factory)
RESERVED = ("name", "spec")


# -- ShardMD's own factories (registered as entry points in pyproject.toml) ---------------------
def lj(*, epsilon: Mapping, sigma: Mapping, cutoff: float, shift: bool = True,
       mixing: str = "lorentz-berthelot", pairs: Mapping | None = None):
    """Lennard-Jones (Warp kernel)."""
    from .lj import LennardJones
    from .lj_op import LennardJonesOp

    return LennardJonesOp(LennardJones(epsilon=epsilon, sigma=sigma, cutoff=cutoff, shift=shift, mixing=mixing,
                                       pairs=pairs or {}), direct=True)


def morse(*, D: float, a: float, r0: float, cutoff: float, shift: bool = True):
    """Morse pair potential in plain PyTorch (models/morse.py: the readable reference pair model)."""
    from .morse import Morse

    return Morse(D=D, a=a, r0=r0, cutoff=cutoff, shift=shift)


def d3(*, functional: str = "pbe", damping: str = "bj", cutoff: float = 31.75, cn_cutoff: float = 21.17,
       three_body: bool = False, three_body_cutoff: float = 21.17, cutoff_width: float = 0.0,
       precision: torch.dtype = torch.float64):
    """DFT-D3 dispersion (models/d3.py): tad-dftd3's tables, our sums over the neighbour list."""
    from .d3 import D3Dispersion

    return D3Dispersion(functional=functional, damping=damping, cutoff=cutoff, cn_cutoff=cn_cutoff,
                        three_body=three_body is True, three_body_cutoff=three_body_cutoff,
                        cutoff_width=cutoff_width, dtype=precision)


def coulomb(*, charges: Mapping, cutoff: float = 10.0, method: str = "ewald", accuracy: float = 1e-6):
    """Ewald or PME electrostatics of fixed charges per element (models/coulomb.py)."""
    from .coulomb import Coulomb

    return Coulomb(charges=charges, cutoff=cutoff, method=method, accuracy=accuracy)


def model_sum(*, terms, precision: torch.dtype = torch.float64, device="cpu"):
    """A sum of models, each term with its own keys, cutoff and spec (shardmd.domain.api's
    DistributedSum): ``model=sum 'model.terms=[{name: mace}, {name: d3, damping: zero}]'``."""
    from shardmd.domain.api import DistributedSum

    if not isinstance(terms, (list, tuple)) or not terms:
        raise ValueError("model=sum needs model.terms, a list of models, e.g. "
                         "'model.terms=[{name: lj}, {name: coulomb}]'")
    built = []
    for k, term in enumerate(terms):
        if not isinstance(term, Mapping) or not isinstance(term.get("name"), str):
            raise ValueError(f"model.terms[{k}] is {term!r}, not a model: give each term as "
                             "{name: <model>, <key>: <value>, ...}, e.g. {name: d3, functional: pbe}")
        if term["name"] == "sum":
            raise ValueError(f"model.terms[{k}] is a sum itself: list its terms in this one")
        try:
            built.append(build_model(dict(term), precision, device))
        except ValueError as exc:
            raise ValueError(f"model.terms[{k}] ({term['name']}): {exc}") from None
    from .contract import CONTRACT_UNITS

    return DistributedSum(built, units=CONTRACT_UNITS)


def mace(*, checkpoint: str | None = None, dtype: str | None = None, cueq="auto", cuda_graph="auto",
         trust_pickle: bool = False, precision: torch.dtype = torch.float64, device="cpu", head: str | None = None,
         compile=False):
    """MACE via mace-torch (the shipped Cu model without ``checkpoint``); ``compile``: the module
    compiled by torch.compile (its first call and its first new shape take ~10-60 s); 'auto':
    eager, compiled where the engine finds the run long enough (engine/run/compile_choice.py)."""
    from .mace import MaceModel

    if compile not in (True, False, "auto"):
        raise ValueError(f"model.compile={compile!r}: give auto, true or false")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    return MaceModel(checkpoint, dtype=dt, device=device, cueq=cueq, cuda_graph=cuda_graph,
                     trust_pickle=trust_pickle is True, head=head, compile=compile)   # only a real true opts in


def nequip(*, config: str | None = None, weights: str | None = None, species=("Cu", "Ni"), r_max: float = 4.0,
           num_layers: int = 2, l_max: int = 1, num_features: int = 8, seed: int = 0,
           precision: torch.dtype = torch.float64, device="cpu"):
    """NequIP via the nequip package (models/nequip.py): a nequip YAML ``config`` with its saved
    ``weights``, or a small model with random weights (``species``, ``r_max``, ... ``seed``)."""
    from .nequip import NequipModel

    if config is not None:
        return NequipModel(config, weights, dtype=precision, device=device)
    return NequipModel(None, weights, dtype=precision, device=device, species=tuple(species), r_max=r_max,
                       num_layers=num_layers, l_max=l_max, num_features=num_features, seed=seed)


class _Family:
    """A family's factory in its own module (``models/<module>.py``: ``factory``), imported when
    it is built or its parameters are read, never with this registry."""

    def __init__(self, module: str, doc: str):
        self.module, self.__doc__ = module, doc
        self.__qualname__ = self.__name__ = module

    def _factory(self) -> Callable:
        return importlib.import_module(f"shardmd.models.{self.module}").factory

    def __call__(self, **kwargs):
        return self._factory()(**kwargs)

    @property
    def __signature__(self):   # the factory's parameters, for build_model's checks
        return inspect.signature(self._factory())


metatomic = _Family("metatomic", "a metatomic (TorchScript) model file via metatomic-torch (models/metatomic.py; "
                                 "pip install 'shardmd[metatomic]'); model.trust_code=true opts in to its code")
allegro = _Family("allegro", "Allegro via nequip-allegro (models/allegro.py; pip install 'shardmd[allegro]' in its own "
                             "environment: nequip >= 0.18 needs e3nn >= 0.5, mace-torch pins 0.4)")
mattersim = _Family("mattersim", "MatterSim (M3GNet) via mattersim (models/mattersim.py; pip install "
                                 "'shardmd[mattersim]' in its own environment: e3nn >= 0.5, mace-torch pins 0.4)")
orb = _Family("orb", "ORB via orb-models (models/orb.py; pip install 'shardmd[orb]' in its own environment)")
uma = _Family("uma", "UMA via fairchem-core (models/uma.py; pip install 'shardmd[uma]' in its own environment: "
                     "fairchem-core needs e3nn >= 0.5 and torch 2.13, mace-torch pins e3nn 0.4)")
aimnet2 = _Family("aimnet2", "AIMNet2 via aimnet (models/aimnet2.py; pip install 'shardmd[aimnet2]' in its own "
                             "environment)")
sevennet = _Family("sevennet", "SevenNet via sevenn (models/sevennet.py; pip install 'shardmd[sevennet]' in its own "
                               "environment: sevenn needs e3nn >= 0.5, mace-torch pins 0.4)")

#: the shipped families (the entry points of pyproject.toml name these)
MODELS: dict[str, Callable] = {"lj": lj, "morse": morse, "coulomb": coulomb, "d3": d3, "mace": mace,
                               "nequip": nequip, "sevennet": sevennet, "metatomic": metatomic, "allegro": allegro,
                               "mattersim": mattersim, "orb": orb, "uma": uma, "aimnet2": aimnet2,
                               "sum": model_sum}
#: pretrained models by name (``model.name=7net-0``): the family that loads them and the key
#: that names them there (``model=sevennet model.checkpoint=7net-0``)
PRETRAINED = {name: ("sevennet", "checkpoint") for name in
              ("7net-0", "sevennet-0", "7net-0_11jul2024", "7net-0_11july2024", "7net-0_22may2024", "7net-l3i5")}
# orb-models' released models (models/orb_files.py; the -omol ones need charge and spin: refused there)
PRETRAINED.update({name: ("orb", "checkpoint") for name in (
    "orb-v3-direct-20-omat", "orb-v3-direct-inf-omat", "orb-v3-conservative-20-omat", "orb-v3-conservative-inf-omat",
    "orb-v3-direct-20-mpa", "orb-v3-direct-inf-mpa", "orb-v3-conservative-20-mpa", "orb-v3-conservative-inf-mpa",
    "orb-v2", "orb-d3-v2", "orb-d3-sm-v2", "orb-d3-xs-v2", "orb-mptraj-only-v2")})
# aimnet's registry names, from aimnet's cache only (models/aimnet2_files.py)
PRETRAINED.update({name: ("aimnet2", "checkpoint") for name in
                   ("aimnet2-wb97m-d3_0", "aimnet2-b973c-d3_0", "aimnet2-b973c-2025-d3_0", "aimnet2-nse_0",
                    "aimnet2-pd_0", "aimnet2-rxn_0")})
# fairchem's released UMA checkpoints, from the Hugging Face cache only (models/uma_files.py)
PRETRAINED.update({name: ("uma", "checkpoint") for name in ("uma-s-1p1", "uma-s-1p2", "uma-m-1p1", "uma-s-1p2p1")})


def canonical(cfg: Mapping) -> dict:
    """The model node with a pretrained name (``model.name=7net-0``) as its family and key."""
    cfg = dict(cfg)
    name = cfg.get("name")
    if isinstance(name, str) and name.lower() in PRETRAINED and name not in registered():
        family, key = PRETRAINED[name.lower()]
        cfg["name"] = family
        cfg.setdefault(key, name)
    return cfg


# -- routes --------------------------------------------------------------------------------------
def registered() -> dict:
    """name -> entry point of every installed model (group ``shardmd.models``)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_names() -> list[str]:
    return sorted(set(registered()) | set(MODELS))


def is_route(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PY_PREFIX)


def _import_factory(route: str) -> Callable:
    target = route[len(PY_PREFIX):]
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"model={route}: write model=py:package.module:factory (a module and a callable in it)")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))   # the working directory is importable, as with `python -c`
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ValueError(f"model={route}: no module {module!r} in the working directory or on sys.path; "
                             f"run from the folder holding {module.replace('.', '/')}.py or install its "
                             "package") from None
        raise ValueError(f"model={route}: importing {module} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any error of the user's module becomes one line naming it
        raise ValueError(f"model={route}: importing {module} failed: {type(exc).__name__}: {exc}; "
                         f"fix {module}") from None
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"model={route}: {module} has no {attr!r}; give a factory defined in it") from None
    if not callable(obj):
        raise ValueError(f"model={route}: {module}.{attr} is a {type(obj).__name__}, not callable; give a "
                         "function (or class) that returns the model")
    return obj


def resolve(name: str) -> Callable:
    """The factory of a route or registered name; ``ValueError`` (one line) when there is none."""
    if is_route(name):
        return _import_factory(name)
    eps = registered()
    if name in eps:
        try:
            return eps[name].load()
        except Exception as exc:  # noqa: BLE001 - an installed package's import error, in one line
            raise ValueError(f"model={name}: loading entry point {eps[name].value} failed: "
                             f"{type(exc).__name__}: {exc}") from None
    if name in MODELS:   # the metadata of an editable install that predates the entry points
        return MODELS[name]
    raise ValueError(f"unknown model {name!r}; registered: {', '.join(registered_names())}; or give "
                     "model=py:module:factory (docs/byo.md)")


def factory_arguments(cfg: Mapping) -> dict:
    return {k: v for k, v in cfg.items() if k not in RESERVED}


def build_model(cfg: Mapping, dtype: torch.dtype = torch.float64, device="cpu", allow_imports: bool = False):
    """Model from a config mapping with a ``name`` key (the composed ``model`` node);
    ``allow_imports``: a ``spec`` file may import the modules it names (``allow_code=true``)."""
    cfg = canonical(cfg)
    name = cfg["name"]
    factory = resolve(name)
    kwargs = factory_arguments(cfg)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if "device" in params and "device" not in kwargs:
        kwargs["device"] = torch.device(device)
    if "precision" in params and "precision" not in kwargs:
        kwargs["precision"] = dtype
    label = f"model={name}"
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(kwargs) - set(params)) if params and not takes_any else []
    if unknown:
        known = ", ".join(k for k, p in params.items() if k not in ("device", "precision")
                          and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        raise ValueError(f"{label}: the factory has no parameter {', '.join(unknown)}; its parameters: {known}")
    if name in MODELS and not is_route(name):   # ours: their errors are one line already
        model = factory(**kwargs)
    else:
        try:
            model = factory(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a user's factory: its error in one line, naming it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ValueError(f"{label}: the factory raised {type(exc).__name__}: {first}; fix the factory or "
                             "its model.<key> arguments") from None
    model = check_model(model, label)
    heads = getattr(model, "heads", None)
    if isinstance(getattr(model, "head", None), str) and isinstance(heads, (list, tuple)) and len(heads) > 1:
        _RESOLVED_HEADS[_key(cfg)] = model.head   # model_origin records the head a multi-head model runs
    spec_file = cfg.get("spec")
    if spec_file:
        from shardmd.domain.api import MLIPSpec, SpecImportRefused, SpecLoadError

        try:
            text = Path(spec_file).read_text()
            spec = MLIPSpec.from_json(text, allow_imports=allow_imports)
        except SpecImportRefused as exc:
            raise ValueError(f"model.spec={spec_file}: {exc}") from None
        except (OSError, ValueError, SpecLoadError) as exc:
            raise ValueError(f"model.spec={spec_file}: cannot load the spec ({exc}); give a file written by "
                             "MLIPSpec.save / report.spec.save") from None
        model.distribution_spec = spec
    return model


#: config node (as JSON) -> the readout head its multi-head model resolved to (``model.head`` or,
#: without it, the model's only or default head): what ``model_origin`` records
_RESOLVED_HEADS: dict[str, str] = {}


def _key(cfg: Mapping) -> str:
    return json.dumps(dict(cfg), sort_keys=True, default=str)


def model_origin(cfg: Mapping) -> dict:
    """Where a model comes from, for the log, the trajectory and the checkpoint: its route, the
    factory (module:qualname and source file), its arguments, the SHA-256 of every file
    involved (the factory's source, the spec, any argument naming an existing file) and, for a
    multi-head model built from ``cfg`` by :func:`build_model`, the ``head`` it runs."""
    cfg = canonical(cfg)
    name = cfg["name"]
    out: dict = {"route": name, "arguments": factory_arguments(cfg)}
    files: dict[str, str] = {}
    try:
        factory = resolve(name)
    except ValueError:
        factory = None
    if factory is not None:
        out["factory"] = f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
        if is_route(name):   # the user's own code is part of the model
            src = inspect.getsourcefile(factory) if inspect.isfunction(factory) or inspect.isclass(factory) else None
            if src and Path(src).is_file():
                files[str(Path(src).resolve())] = file_sha256(Path(src))
    for v in [cfg.get("spec"), *out["arguments"].values()]:
        if isinstance(v, str) and v and Path(v).is_file():
            files[str(Path(v).resolve())] = file_sha256(Path(v))
    out["files"] = files
    head = _RESOLVED_HEADS.get(_key(cfg))
    if head is not None:   # a multi-head model: the head it runs is part of what it is
        out["head"] = head
    return out


def origin_text(origin: Mapping) -> str:
    """One line for the log header."""
    parts = [str(origin["route"])]
    if "factory" in origin and is_route(origin["route"]):
        parts.append(f"factory {origin['factory']}")
    if origin.get("arguments") and is_route(origin["route"]):
        parts.append("arguments " + json.dumps(origin["arguments"], sort_keys=True, default=str))
    if origin.get("head") is not None:
        parts.append(f"head {origin['head']}")
    parts += [f"{Path(p).name} sha256 {h[:12]}" for p, h in origin.get("files", {}).items()]
    return ", ".join(parts)
