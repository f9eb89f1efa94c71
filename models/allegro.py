"""Allegro (the ``nequip-allegro`` package, unmodified, on ``nequip`` >= 0.18) behind the model
contract, through the specs.

Allegro is strictly local: every quantity lives on an edge ``(i, j)`` of the centre ``i``'s
neighbourhood (one cutoff), the two-body embedding, the tensor track (environment sums over the
centre's edges, scattered onto the centre and read back by the same centre) and the per-edge
energies, which are summed onto their centre.  With the engine's full, receiver-owned neighbour
list every owned centre has all its edges on its own rank, so the owned atoms' energies are
exact from one cutoff of ghosts **without any exchange**: nequip's sums allocate plain
``torch.zeros`` targets (no handler sees them, none needs to: ghost rows are never read).  What
decomposition needs is the total energy: nequip's ``AtomwiseReduce`` sums every row, ghosts
included (and the per-type shift makes ghost rows non-zero), so the wrapper stops before it and
sums the per-atom energies into ``positions.new_zeros(1)``, the per-system scatter the
``system_reduce`` handler sees (ghost rows dropped, summed over ranks).  Forces ``-dE/dx`` and
the virial ``-dE/d strain`` come from DistributedModel's autograd (``model_config``); nequip's
own ``ForceStressOutput`` is kept for the reference, nequip's ``NequIPCalculator`` on the same
model (:meth:`AllegroModel.ase_calculator`: its own neighbour list and autograd).

Graph from our neighbour list: ``edge_index = [centre i, neighbour j]`` and the edge vectors
``x_j - x_i + S @ cell`` given to nequip directly, in float64 as nequip's data always is (the
model casts to its own ``model_dtype``); edges past the cutoff (per edge type where the model
has per-edge-type cutoffs) are dropped, as nequip's neighbour-list transform does.  Shapes:
positions (n_padded, 3) Å, cell (3, 3) Å, numbers (n_padded,); energy () eV, energies
(n_padded,) eV (owned rows kept by the spec).  Units: those of the training data (eV, Å for
nequip's ASE calculator defaults).

Files (docs/models.md): a training checkpoint (``.ckpt``, written by ``nequip-train``) is read
as data: ``torch.load(weights_only=True)``, then the model is built by the Allegro builder its
configuration names, from an allow-list (every ``_target_`` in it is checked: a configuration
names code that nequip would import and call), and its weights (the EMA weights where training
kept them, as nequip's own loader does) are loaded.  A packaged model (``.nequip.zip``, from
``nequip-package``; how pretrained models are distributed) is a ``torch.package`` archive of
pickled code: its metadata and configuration are read as data (family and versions refused by
name), the model itself only with ``trust_code=true`` (by nequip's own loader), which also lets
nequip load a checkpoint the allow-list refuses.  A compiled model (``nequip-compile``:
TorchScript ``.nequip.pth`` or AOTInductor ``.nequip.pt2``) computes its own forces on the
whole system and cannot be decomposed: refused, naming the file to give instead.
"""
from __future__ import annotations

import contextlib
import importlib
import pickle
import random as _random
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, HaloStorage, ModelConfig, NeighborConfig, OutputKind

from .contract import refuse_unknown_species
from .edge_memory import edge_bytes
from .files import file_sha256, refused_global, weights_sha256

#: what the errors tell to install (nequip >= 0.18 needs e3nn >= 0.5; mace-torch pins 0.4.4)
INSTALL = "pip install 'shardmd[allegro]'"
ENVIRONMENT = "in its own environment: nequip >= 0.18 needs e3nn >= 0.5, which mace-torch excludes"
TRUST_FIX = "add model.trust_code=true if you trust its source (nequip's loader runs the code the file names)"
#: model builders a checkpoint may name (the other families' builders, refused by name)
BUILDERS = ("allegro.model.AllegroModel", "allegro.model.FullAllegroModel")
OTHER_FAMILIES = {"nequip.model.NequIPGNNModel": "a NequIP model", "nequip.model.FullNequIPGNNModel": "a NequIP model",
                  "nequip.model.NequIPGNNEnergyModel": "a NequIP model"}
#: the parts an Allegro configuration may name as ``_target_`` (nequip instantiates them)
PARTS = ("allegro.nn.TwoBodyBesselScalarEmbed", "allegro.nn.TwoBodySplineScalarEmbed",
         "nequip.nn.pair_potential.ZBL", "nequip.nn.pair_potential.LennardJones")
#: training modules whose evaluation weights are the checkpoint's model weights (EMA: its EMA copy)
TRAINING_MODULES = ("NequIPLightningModule", "EMALightningModule", "ConFIGLightningModule",
                    "EMAConFIGLightningModule")
PREFIX = "model.sole_model."   # the single model's keys in a training module's state dict

SPEC_ALLEGRO = SPEC_MPNN_HALO.replace(
    name="allegro-local",
    description="Allegro: strictly local (one cutoff, edge sums onto their centres, no per-layer exchange); "
                "per-atom energies summed per system by the wrapper, autograd forces and virial",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_storage(HaloStorage("gather"))   # every sum is onto its centre: were one visible, gather is exact for it


def import_allegro():
    """``(nequip, allegro)``, imported quietly, or a one-line ValueError with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import allegro
            import allegro.model
            import nequip
            import nequip.integrations.ase
    except ImportError as exc:
        raise ValueError(f"model=allegro needs the nequip-allegro package ({exc.name or 'allegro'} is not "
                         f"importable): {INSTALL} ({ENVIRONMENT})") from None
    return nequip, allegro


@contextlib.contextmanager
def nequip_state():
    """nequip's global state (its builders require it) set once, as its own scripts do, with
    what it changes for the whole process put back: the default dtype (it sets float64) and the
    random streams (it seeds them)."""
    from nequip.utils.global_state import set_global_state

    dtype, py_state = torch.get_default_dtype(), _random.getstate()
    import numpy as np

    np_state = np.random.get_state()
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            set_global_state()
            yield
        finally:
            torch.set_default_dtype(dtype)
            _random.setstate(py_state)
            np.random.set_state(np_state)


# -- configurations -------------------------------------------------------------------------------
def random_config(species: Sequence[str] = ("Cu", "Ag"), r_max: float = 4.5, num_layers: int = 2, l_max: int = 1,
                  num_scalar_features: int = 16, num_tensor_features: int = 4, zbl: bool = True, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> dict:
    """A small Allegro configuration in nequip's own keys (as ``training_module.model`` of a
    ``nequip-train`` config), with what training would have filled in (neighbour count, shifts)."""
    species = list(species)
    return {"_target_": "allegro.model.AllegroModel", "seed": int(seed),
            "model_dtype": str(dtype).removeprefix("torch."), "type_names": species, "r_max": float(r_max),
            "radial_chemical_embed": {"_target_": "allegro.nn.TwoBodyBesselScalarEmbed", "num_bessels": 8},
            "radial_chemical_embed_dim": int(num_scalar_features),
            "scalar_embed_mlp_hidden_layers_width": int(num_scalar_features), "l_max": int(l_max),
            "num_layers": int(num_layers), "num_scalar_features": int(num_scalar_features),
            "num_tensor_features": int(num_tensor_features),
            "allegro_mlp_hidden_layers_width": int(num_scalar_features),
            "readout_mlp_hidden_layers_width": max(4, int(num_scalar_features) // 2), "avg_num_neighbors": 20.0,
            "per_type_energy_shifts": {s: -3.0 - 0.3 * k for k, s in enumerate(species)},
            "per_type_energy_scales": {s: 0.8 + 0.2 * k for k, s in enumerate(species)},
            **({"pair_potential": {"_target_": "nequip.nn.pair_potential.ZBL", "units": "metal",
                                   "chemical_species": species}} if zbl else {})}


def _targets(node, path: str = "model"):
    """(key path, ``_target_``) of every ``_target_`` in a configuration."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            if k == "_target_":
                yield path, v
            else:
                yield from _targets(v, f"{path}.{k}")
    elif isinstance(node, (list, tuple)):
        for k, v in enumerate(node):
            yield from _targets(v, f"{path}[{k}]")


def _setting(config, key: str):
    """The first integer ``key`` in a nested configuration (dicts and lists), or None."""
    if isinstance(config, Mapping):
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return int(config[key])
        config = list(config.values())
    if isinstance(config, (list, tuple)):
        return next((v for v in (_setting(c, key) for c in config) if v is not None), None)
    return None


def check_config(config, label: str) -> None:
    """Refuse (one line) a configuration that is not an Allegro model built from allowed parts."""
    if not isinstance(config, Mapping) or not isinstance(config.get("_target_"), str):
        raise ValueError(f"{label}: its model configuration names no builder (_target_); give a file written by "
                         "nequip-train for an Allegro model")
    builder = config["_target_"]
    if builder in OTHER_FAMILIES:
        raise ValueError(f"{label} is not an Allegro model: it holds {OTHER_FAMILIES[builder]} ({builder})")
    if builder not in BUILDERS:
        raise ValueError(f"{label}: its model is built by {builder}, not by Allegro's builders "
                         f"({', '.join(BUILDERS)}); {TRUST_FIX}")
    for path, target in _targets({k: v for k, v in config.items() if k != "_target_"}):
        if target not in PARTS:
            raise ValueError(f"{label}: {path}._target_={target} is not an Allegro part this loader builds "
                             f"({', '.join(PARTS)}); {TRUST_FIX}")


def build_graph_model(config: Mapping, label: str = "the Allegro configuration"):
    """nequip's ``GraphModel`` from an Allegro configuration (its builder, random weights drawn
    from ``config['seed']`` as nequip draws them), in eval mode."""
    import_allegro()
    check_config(config, label)
    module, _, name = config["_target_"].rpartition(".")
    builder = getattr(importlib.import_module(module), name)
    kwargs = {k: v for k, v in config.items() if k != "_target_"}
    with nequip_state():
        try:
            model = builder(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a configuration nequip cannot build, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ValueError(f"{label}: nequip cannot build an Allegro model from it ({type(exc).__name__}: "
                             f"{first})") from None
    return model.eval()


# -- files ------------------------------------------------------------------------------------------
def file_kind(path: Path) -> str:
    """``checkpoint`` (torch.save), ``package`` (nequip-package), ``torchscript``, ``aoti`` or ``other``."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return "other"
    tails = {n.split("/", 1)[-1] for n in names}
    if "model/package_metadata.txt" in tails or ".data/version" in tails:
        return "package"
    if "constants.pkl" in tails or any(t.startswith("code/") for t in tails):
        return "torchscript"
    if any("aotinductor" in n or n.endswith(".so") for n in names):
        return "aoti"
    return "checkpoint" if "data.pkl" in tails else "other"


class NewerFile(ValueError):
    """A file written by a newer nequip or nequip-allegro (refused also with trust_code)."""


def _newer(versions: Mapping, label: str) -> None:
    """Refuse a file written by a newer nequip or nequip-allegro than the installed ones."""
    from importlib.metadata import version

    from packaging.version import InvalidVersion, Version

    for code, dist in (("nequip", "nequip"), ("allegro", "nequip-allegro")):
        written = versions.get(code) if isinstance(versions, Mapping) else None
        try:
            if written and Version(str(written)) > Version(version(dist)):
                raise NewerFile(f"{label} was written by {dist} {written}, newer than the installed "
                                 f"{version(dist)}: its format may differ; pip install '{dist}>={written}'")
        except InvalidVersion:
            continue


def read_checkpoint(path: Path, label: str) -> dict:
    """A nequip-train checkpoint as data (``weights_only``), checked: what it holds, its versions."""
    try:
        cp = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc)) or "objects beyond tensors and containers"
        raise ValueError(f"{label} is not a nequip-train checkpoint: it needs {what} to load; {TRUST_FIX}") from None
    except Exception as exc:  # noqa: BLE001 - zip errors, truncated files
        raise ValueError(f"{label} is not a loadable nequip checkpoint ({type(exc).__name__}); give the .ckpt "
                         "nequip-train wrote or a .nequip.zip from nequip-package") from None
    hp = cp.get("hyper_parameters") if isinstance(cp, dict) else None
    if not isinstance(hp, dict) or not isinstance(cp.get("state_dict"), Mapping):
        what = "a bare state dict" if isinstance(cp, dict) else f"a {type(cp).__name__}"
        raise ValueError(f"{label} is not a nequip-train checkpoint: it holds {what}, without hyper_parameters and "
                         "state_dict")
    info = hp.get("info_dict") or {}
    _newer(info.get("versions") or {}, label)
    module = str((info.get("training_module") or {}).get("_target_", "nequip.train.NequIPLightningModule"))
    if not module.startswith("nequip.train.") or module.rsplit(".", 1)[-1] not in TRAINING_MODULES:
        raise ValueError(f"{label} was trained with {module}, whose evaluation weights this loader does not read; "
                         f"{TRUST_FIX}")
    check_config(hp.get("model"), label)
    return cp


def load_checkpoint(path: Path, label: str):
    """The checkpoint's model (the EMA weights where training kept them, as nequip's loader)."""
    cp = read_checkpoint(path, label)
    model = build_graph_model(cp["hyper_parameters"]["model"], label)
    state = {k[len(PREFIX):]: v for k, v in cp["state_dict"].items() if k.startswith(PREFIX)}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"{label}: its weights do not fit the model its configuration builds ({first})") from None
    ema = [cp["state_dict"][f"ema.ema_weight_{k}"] for k in range(len(cp["state_dict"]))
           if f"ema.ema_weight_{k}" in cp["state_dict"]]
    if ema:
        params = list(model.parameters())
        if len(ema) != len(params):
            raise ValueError(f"{label}: {len(ema)} EMA weights for {len(params)} parameters; a corrupt checkpoint")
        with torch.no_grad():
            for p, w in zip(params, ema):
                p.copy_(w)
    return model.eval()


def read_package(path: Path, label: str) -> dict:
    """A nequip-package file's metadata and training config, read as data (no code runs)."""
    import yaml

    with zipfile.ZipFile(path) as z:
        texts = {n.split("/", 1)[-1]: n for n in z.namelist()}
        meta = yaml.safe_load(z.read(texts["model/package_metadata.txt"]).decode())
        config = yaml.safe_load(z.read(texts["model/config.yaml"]).decode()) if "model/config.yaml" in texts else {}
    from nequip.scripts.package import _CURRENT_NEQUIP_PACKAGE_VERSION as CURRENT

    if int(meta.get("package_version_id", 0)) > CURRENT:
        raise NewerFile(f"{label} is a nequip package of format {meta['package_version_id']}, newer than the "
                         f"installed nequip reads ({CURRENT}); pip install -U nequip nequip-allegro")
    _newer(meta.get("versions") or {}, label)
    builder = str(((config or {}).get("training_module") or {}).get("model", {}).get("_target_", ""))
    if builder in OTHER_FAMILIES:
        raise ValueError(f"{label} is not an Allegro model: it holds {OTHER_FAMILIES[builder]} ({builder})")
    return meta


def load_model_file(path: Path, label: str, trust_code: bool = False):
    """nequip's ``GraphModel`` from a checkpoint or package file (module docstring)."""
    kind = file_kind(path)
    if kind in ("torchscript", "aoti"):
        raise ValueError(f"{label} is a compiled model (nequip-compile, {kind}), which computes its own forces on the "
                         "whole system; give the .ckpt or .nequip.zip it was compiled from")
    if kind == "other":
        raise ValueError(f"{label} is not a nequip model file; give the .ckpt nequip-train wrote or a .nequip.zip "
                         "from nequip-package")
    if kind == "package":
        read_package(path, label)
        if not path.name.endswith(".nequip.zip"):   # nequip picks its loader by this suffix
            raise ValueError(f"{label} is a nequip package: name it *.nequip.zip, as nequip's loader requires")
        if not trust_code:
            raise ValueError(f"{label}: a nequip package holds pickled code; {TRUST_FIX}")
    elif not trust_code:
        return load_checkpoint(path, label)
    else:
        try:   # the checks still apply; the allow-list is what trust_code opts out of
            read_checkpoint(path, label)
        except NewerFile:
            raise
        except ValueError:
            pass
    from nequip.model.saved_models.load_utils import load_saved_model

    with nequip_state():
        try:
            return load_saved_model(str(path)).eval()
        except Exception as exc:  # noqa: BLE001 - nequip's own loader failing, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ValueError(f"{label}: nequip cannot load it ({type(exc).__name__}: {first})") from None


# -- the model ----------------------------------------------------------------------------------------
class AllegroModel:
    """An Allegro model on the local scheme, through ``SPEC_ALLEGRO``.

    checkpoint: a nequip-train checkpoint (``.ckpt``) or a packaged model (``.nequip.zip``, with
    ``trust_code``); random: :func:`random_config` keywords for a model with random weights;
    type_map: element -> the model's type name, where its type names are not element symbols;
    device: where it runs.  The model runs in its own ``model_dtype`` (float64 data, as nequip)."""

    name = "allegro"
    distribution_spec = SPEC_ALLEGRO

    def __init__(self, checkpoint: str | Path | None = None, trust_code: bool = False, device="cpu",
                 random: dict | None = None, type_map: Mapping[str, str] | None = None):
        import_allegro()
        self.device = torch.device(device)
        if random is not None:   # no ``path``: the engine records a model file's path and SHA-256 by it
            self.config = random_config(**random)
            self.label = "the random Allegro model"
            self.graph_model = build_graph_model(self.config, self.label)
        else:
            self.path = Path(str(checkpoint)).expanduser()
            self.label = f"model.checkpoint={str(checkpoint)!r}"
            if not self.path.is_file():
                raise ValueError(f"{self.label}: no such file; give the .ckpt nequip-train wrote or a .nequip.zip "
                                 "from nequip-package")
            self.graph_model = load_model_file(self.path, self.label, trust_code=trust_code is True)
            self.config = None
        self.graph_model.to(self.device)
        for p in self.graph_model.parameters():
            p.requires_grad_(False)
        #: the energy network: nequip's modules up to the per-atom energies (AtomwiseReduce's sum
        #: over every row is replaced by the per-system scatter in :meth:`compute`)
        self.modules = [m for m in self.graph_model.model.func if type(m).__name__ != "AtomwiseReduce"]
        meta = self.graph_model.metadata
        self.cutoff = float(meta["r_max"])
        #: device bytes per list edge for the memory check (models/edge_memory.py): by the tensor
        #: track (features x (l_max + 1)^2 x layers) where the configuration says it
        dtype = next((p.dtype for p in self.graph_model.parameters()), torch.float64)
        size = [_setting(self.config, k) for k in ("num_tensor_features", "l_max", "num_layers")]
        self.bytes_per_edge = (edge_bytes(62_600, size[0] * (size[1] + 1) ** 2 * size[2], 32 * 9 * 2, dtype)
                               if None not in size else edge_bytes(62_600, dtype=dtype))
        self.type_names = str(meta["type_names"]).split(" ")
        self._types_from(type_map)
        norm = next((m for m in self.modules if hasattr(m, "_rmax_recip")), None)
        #: (n_types * n_types,) 1/cutoff per (centre type, neighbour type), or one value
        self._rmax_recip = (norm._rmax_recip if norm is not None else torch.tensor(1 / self.cutoff)).double()
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))
        #: strictly local (a site energy sees one cutoff), and the energy counts ``nl.n_counted``
        #: rows where a list has them: a call can be made in parts (subdomains) with a halo of
        #: one cutoff + skin
        self.layers = 1
        self.counts_rows = True

    def _types_from(self, type_map: Mapping[str, str] | None) -> None:
        """The atomic number -> type index table (``type_map``: element -> type name)."""
        from ase.data import atomic_numbers

        if type_map is None:
            unknown = [t for t in self.type_names if t not in atomic_numbers]
            if unknown:
                raise ValueError(f"{self.label}: its type names {', '.join(unknown)} are not elements; give "
                                 f"model.type_map={{<element>: <type name>, ...}} for {', '.join(self.type_names)}")
            type_map = {t: t for t in self.type_names}
        bad = sorted(set(type_map) - set(atomic_numbers)) + sorted(set(type_map.values()) - set(self.type_names))
        if bad:
            raise ValueError(f"model.type_map: {', '.join(map(str, bad))} is not an element or not one of the model's "
                             f"types ({', '.join(self.type_names)})")
        self.species = dict(type_map)
        self.atomic_numbers = sorted(atomic_numbers[s] for s in type_map)
        lut = torch.full((max(self.atomic_numbers) + 1,), -1, dtype=torch.int64)
        for s, t in type_map.items():
            lut[atomic_numbers[s]] = self.type_names.index(t)
        self._lut = lut.to(self.device)

    def identity(self) -> str:
        """SHA-256 of the model file, or of the random model's configuration and weights."""
        return file_sha256(self.path) if hasattr(self, "path") else weights_sha256(self.config, self.graph_model)

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.atomic_numbers, self.label,
                               "use an Allegro model trained on those elements")

    def ase_calculator(self):
        """nequip's own ``NequIPCalculator`` on the same model object (its neighbour list, its
        ForceStressOutput): the independent single-process reference.  Its data is built in
        float64, as under nequip's global state (which makes float64 the process default; this
        module puts the default back, and ``from_ase`` follows it)."""
        import_allegro()
        from nequip.integrations.ase import NequIPCalculator
        from nequip.integrations.utils import basic_transforms
        from nequip.utils import torch_default_dtype

        class _Calculator(NequIPCalculator):
            def atoms_to_data(self, atoms):
                with torch_default_dtype(torch.float64):
                    return super().atoms_to_data(atoms)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transforms = basic_transforms(self.graph_model.metadata, self.cutoff, self.type_names, self.species)
            return _Calculator(model=self.graph_model, device=self.device, transforms=transforms)

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows = the
        owned atoms.  Returns energy () eV (the per-system scatter: summed over ranks, ghost rows
        dropped) and energies (n_padded,) eV (owned rows kept by the spec)."""
        from nequip.data import AtomicDataDict as K

        x = positions.as_subclass(torch.Tensor)
        i, j = nl.centers(), nl.neighbors.long()
        types = self._lut[numbers.as_subclass(torch.Tensor).long()]
        shift = nl.shifts.to(x.dtype) @ cell.as_subclass(torch.Tensor)
        with torch.no_grad():   # the list reaches cutoff + skin: keep the edges nequip's list would hold
            r = torch.linalg.vector_norm(x[j] - x[i] + shift, dim=1).double()
            recip = self._rmax_recip if self._rmax_recip.numel() == 1 else \
                self._rmax_recip[types[i] * len(self.type_names) + types[j]]
            keep = torch.nonzero(r * recip < 1).squeeze(1)
        i, j = i[keep], j[keep]
        n = int(positions.shape[0])
        data = {K.EDGE_INDEX_KEY: torch.stack([i, j]), K.ATOM_TYPE_KEY: types,
                K.EDGE_VECTORS_KEY: (positions[j] - positions[i] + shift[keep]).to(torch.float64)}
        for module in self.modules:
            data = module(data)
        energies = data[K.PER_ATOM_ENERGY_KEY].reshape(n).to(x.dtype)
        counted = getattr(nl, "n_counted", None)   # a part (domain/subdomains.py): its own rows alone
        if counted is not None:
            return {"energy": energies[:counted].sum(), "energies": energies}
        system = torch.zeros(n, dtype=torch.int64, device=x.device)
        energy = positions.new_zeros(1).index_add_(0, system, energies)   # the system_reduce handler sees it
        return {"energy": energy.reshape(()), "energies": energies}


def factory(*, checkpoint: str | None = None, trust_code: bool = False, type_map: Mapping | None = None,
            random: bool = False, species=("Cu", "Ag"), r_max: float = 4.5, num_layers: int = 2, l_max: int = 1,
            num_scalar_features: int = 16, num_tensor_features: int = 4, zbl: bool = True, seed: int = 0,
            precision: torch.dtype = torch.float64, device="cpu"):
    """Allegro via nequip-allegro (models/allegro.py): ``checkpoint`` a nequip-train ``.ckpt``
    (read as data) or a ``.nequip.zip`` package (``trust_code=true``); ``random=true``: Allegro's
    architecture with random weights (``species``, ``r_max``, ``num_layers``, ``l_max``,
    ``num_scalar_features``, ``num_tensor_features``, ``zbl``, ``seed``; in the run's precision)."""
    if random:
        if isinstance(species, str):
            species = [species]
        return AllegroModel(None, device=device, type_map=type_map,
                            random=dict(species=tuple(species), r_max=r_max, num_layers=num_layers, l_max=l_max,
                                        num_scalar_features=num_scalar_features,
                                        num_tensor_features=num_tensor_features, zbl=zbl is True, seed=seed,
                                        dtype=precision))
    if checkpoint is None:
        raise ValueError("model=allegro needs model.checkpoint=FILE (a nequip-train .ckpt or a .nequip.zip), or "
                         "model.random=true for a model with random weights")
    return AllegroModel(checkpoint, trust_code=trust_code is True, device=device, type_map=type_map)
