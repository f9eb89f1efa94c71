"""UMA inference checkpoints (fairchem-core's ``MLIPInferenceCheckpoint``) read as data, checked
and built into fairchem's own ``HydraModel`` (models/uma.py runs it).

A checkpoint is a pickled dataclass of four fields: ``model_config`` (a dict naming the classes
fairchem's hydra would import and call: ``_target_``, the backbone's ``model``, each head's
``module`` and ``head_cls``), ``model_state_dict``, ``ema_state_dict`` (the evaluation weights,
keys prefixed ``module.`` as torch's ``AveragedModel`` writes them, plus ``n_averaged``) and
``tasks_config`` (per task: name, property, datasets, a normaliser (mean, rmsd) and, for
energies, per-element reference energies).  It is read with ``torch.load(weights_only=True)``
allowing that one dataclass (tensors and plain containers otherwise); every class the config
names is checked against an allow-list (UMA's backbone and its heads) and the model is built
from those classes directly, never through hydra's ``instantiate``; the tasks are read as
numbers.  ``model.trust_pickle=true`` opts in to unpickling the file freely (the allow-lists
still apply).  Pretrained names (``uma-s-1p1`` ...) resolve only to a file already in the
Hugging Face cache; nothing is downloaded.
"""
from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from .files import refused_global

INSTALL = "pip install 'shardmd[uma]'"
TRUST_FIX = "add model.trust_pickle=true if you made this file or trust its source (unpickling runs any code it holds)"
_UMA = "fairchem.core.models.uma."
#: the backbones a checkpoint may name (registry short names and class paths)
BACKBONES = ("escnmd_moe_backbone", _UMA + "escn_moe.eSCNMDMoeBackbone", "escnmd_backbone",
             _UMA + "escn_md.eSCNMDBackbone")
#: the per-task head wrappers and the energy head (forces and stress by autograd of its energy)
HEAD_WRAPPERS = ("dataset_specific_moe_wrapper", _UMA + "escn_moe.DatasetSpecificMoEWrapper",
                 "dataset_specific_single_head_wrapper", _UMA + "escn_moe.DatasetSpecificSingleHeadWrapper")
ENERGY_HEADS = ("MLP_EFS_Head", _UMA + "escn_md.MLP_EFS_Head")
MODEL = "fairchem.core.models.base.HydraModel"
TASK = "fairchem.core.units.mlip_unit.mlip_unit.Task"
NORMALIZER = "fairchem.core.modules.normalization.normalizer.Normalizer"
REFS = "fairchem.core.modules.normalization.element_references.ElementReferences"
#: checkpoints of fairchem's UMA release, by the name its pretrained loader knows
PRETRAINED = ("uma-s-1p1", "uma-s-1p2", "uma-m-1p1", "uma-s-1p2p1")


def import_fairchem():
    """fairchem's HydraModel and MLIPInferenceCheckpoint (quietly), or a one-line ValueError
    with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fairchem.core.models.base import HydraModel
            from fairchem.core.models.uma import escn_md, escn_moe  # noqa: F401 - registers UMA's classes
            from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint
    except ImportError as exc:
        raise ValueError(f"model=uma needs the fairchem-core package ({exc.name or 'fairchem'} is not importable): "
                         f"{INSTALL} (in its own environment: it needs e3nn >= 0.5 and torch 2.13)") from None
    return HydraModel, MLIPInferenceCheckpoint


def resolve(checkpoint: str) -> Path:
    """The file of ``checkpoint``: a path, or a pretrained name already in the Hugging Face cache."""
    p = Path(checkpoint).expanduser()
    if p.is_file():
        return p
    name = checkpoint.lower().removesuffix(".pt")
    if name in PRETRAINED:
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
        found = sorted(hub.expanduser().glob(f"models--facebook--UMA/snapshots/*/checkpoints/{name}.pt"))
        if found:
            return found[-1]
        raise ValueError(f"model.checkpoint={checkpoint}: not in the Hugging Face cache ({hub}); download it once "
                         "with fairchem (pretrained_mlip.get_predict_unit) or give the file: nothing is downloaded")
    raise ValueError(f"model.checkpoint={checkpoint}: no such file; give a UMA inference checkpoint (.pt) or a "
                     f"pretrained name already downloaded ({', '.join(PRETRAINED)})")


def read_checkpoint(path: Path, label: str, trust_pickle: bool = False):
    """The checkpoint object, read as data unless ``trust_pickle``; its model config checked."""
    _, Checkpoint = import_fairchem()
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([Checkpoint]):
            warnings.simplefilter("ignore")
            cp = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise ValueError(f"{label} is not a loadable UMA checkpoint (a corrupt pickle)") from None
        raise ValueError(f"{label} is not a plain UMA checkpoint: it needs {what} to load; {TRUST_FIX}") from None
    except Exception as exc:  # noqa: BLE001 - zip errors, truncated files, TorchScript archives
        raise ValueError(f"{label} is not a loadable UMA checkpoint ({type(exc).__name__}); give the inference "
                         "checkpoint (.pt) fairchem wrote") from None
    if not isinstance(cp, Checkpoint):
        what = "a bare state dict" if isinstance(cp, dict) else f"a {type(cp).__module__}.{type(cp).__name__}"
        raise ValueError(f"{label} is not a UMA inference checkpoint: it holds {what}, not fairchem's "
                         "MLIPInferenceCheckpoint")
    check_config(cp.model_config, label)
    return cp


def check_config(cfg, label: str) -> None:
    """Refuse (one line) a model config that is not UMA's backbone with a conservative energy head."""
    if not isinstance(cfg, Mapping) or cfg.get("_target_") != MODEL or not isinstance(cfg.get("backbone"), Mapping):
        raise ValueError(f"{label}: its model config is not fairchem's HydraModel with a backbone "
                         f"(_target_={cfg.get('_target_') if isinstance(cfg, Mapping) else None!r})")
    if cfg.get("finetune_config") is not None:
        raise ValueError(f"{label}: its model config loads another checkpoint (finetune_config); give the "
                         "inference checkpoint fine-tuning wrote")
    backbone = cfg["backbone"]
    if backbone.get("model") not in BACKBONES:
        raise ValueError(f"{label}: its backbone {backbone.get('model')!r} is not UMA's eSCN-MD "
                         f"({', '.join(BACKBONES[:2])}); another fairchem model is not supported")
    if backbone.get("direct_forces", True) or not backbone.get("regress_forces", True):
        raise ValueError(f"{label}: a direct-force model (backbone.direct_forces=true); only conservative UMA "
                         "models (forces as -dE/dx) can be decomposed")
    heads = cfg.get("heads")
    if not isinstance(heads, Mapping) or not heads:
        raise ValueError(f"{label}: its model config has no heads")
    for name, head in heads.items():
        module = head.get("module") if isinstance(head, Mapping) else None
        if module not in HEAD_WRAPPERS or head.get("head_cls") not in ENERGY_HEADS:
            raise ValueError(f"{label}: head {name} is {module}/{head.get('head_cls') if module else None}, not "
                             f"UMA's per-task energy head ({HEAD_WRAPPERS[1]} of MLP_EFS_Head); {TRUST_FIX}")


def read_tasks(tasks_config, label: str) -> dict:
    """{dataset: (rmsd, mean eV, element references (n_z,) eV or None)} of the energy tasks,
    read as numbers (the normaliser of the forces and stress tasks must be the energy's)."""
    out, scales = {}, {}
    if not isinstance(tasks_config, (list, tuple)):
        raise ValueError(f"{label}: its tasks_config is not a list of tasks")
    for t in tasks_config:
        if not isinstance(t, Mapping) or t.get("_target_") != TASK:
            what = t.get("_target_") if isinstance(t, Mapping) else type(t).__name__
            raise ValueError(f"{label}: a task is not fairchem's Task ({what})")
        norm = t.get("normalizer") or {"_target_": NORMALIZER}
        refs = t.get("element_references")
        if norm.get("_target_") != NORMALIZER or (refs is not None and refs.get("_target_") != REFS):
            raise ValueError(f"{label}: task {t.get('name')} names a normaliser or references this loader does not "
                             f"read ({norm.get('_target_')}); {TRUST_FIX}")
        rmsd, mean = _number(norm.get("rmsd", 1.0)), _number(norm.get("mean", 0.0))
        for ds in t.get("datasets", ()):
            if t.get("property") == "energy":
                table = None if refs is None else torch.as_tensor(refs["element_references"], dtype=torch.float64)
                out[str(ds)] = (rmsd, mean, table)
            elif t.get("property") in ("forces", "stress"):
                scales.setdefault(str(ds), set()).add(rmsd)
    for ds, rs in scales.items():
        if ds in out and rs != {out[ds][0]}:
            raise ValueError(f"{label}: task {ds}'s forces or stress are scaled ({sorted(rs)}) unlike its energy "
                             f"({out[ds][0]}): not the derivatives of one energy")
    return out


def _number(v) -> float:
    """A normaliser's value as fairchem applies it (a Python float as it is, a tensor's value)."""
    return float(v) if isinstance(v, (int, float)) else float(torch.as_tensor(v).double())


def build(cp, label: str, dtype: torch.dtype):
    """fairchem's HydraModel of the checkpoint, its evaluation (EMA) weights loaded, in ``dtype``
    and eval mode.  Built with ``dtype`` as the default, as fairchem's predictor does, so the
    buffers computed at construction (SO3 grids, coefficient maps) are at that precision."""
    HydraModel, _ = import_fairchem()
    cfg = {k: v for k, v in cp.model_config.items() if k != "_target_"}
    # the graph comes from the engine; no activation checkpointing (inference), fairchem's general backend
    cfg["backbone"] = {**cfg["backbone"], "otf_graph": False, "always_use_pbc": False,
                       "activation_checkpointing": False, "execution_mode": "general"}
    ema = getattr(cp, "ema_state_dict", None) or {}
    weights = {k.removeprefix("module."): v for k, v in ema.items() if k != "n_averaged"} or cp.model_state_dict
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(), warnings.catch_warnings():   # construction draws numbers; keep the run's streams
        warnings.simplefilter("ignore")
        torch.set_default_dtype(dtype)
        try:
            model = HydraModel(**cfg)
            missing, unexpected = model.load_state_dict(weights, strict=False)
        except Exception as exc:  # noqa: BLE001 - arguments or weights fairchem cannot take, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ValueError(f"{label}: fairchem cannot build this model from it ({type(exc).__name__}: {first})"
                             ) from None
        finally:
            torch.set_default_dtype(previous)
    if missing or unexpected:   # every weight must come from the file: none left random
        names = ", ".join((missing or unexpected)[:3])
        raise ValueError(f"{label}: its weights do not fit the model its config builds ("
                         f"{'missing' if missing else 'unknown'}: {names}); a corrupt or another model's checkpoint")
    model.requires_grad_(False)
    return model.to(dtype).eval()


__all__ = ["BACKBONES", "INSTALL", "PRETRAINED", "build", "check_config", "import_fairchem", "read_checkpoint",
           "read_tasks", "resolve"]
