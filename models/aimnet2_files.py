"""AIMNet2 model files (models/aimnet2.py): what a file is, read as data before anything runs.

- aimnet's v2 ``.pt`` (``aimnet export``, how its models are distributed): a ``torch.save``
  dict of tensors, the model's YAML and metadata.  Read with ``torch.load(weights_only=True)``
  (tensors and plain containers only: nothing is unpickled freely), then checked by aimnet's
  own validator, whose allow-list of constructors is what the YAML may name (the YAML names
  code aimnet would import and call), and built by aimnet's own assembler.
- a legacy TorchScript model (``.jpt``, aimnet < 0.1): a program; loading it runs code from
  the file, so only with ``model.trust_code=true``, and then converted by aimnet's own
  converter (``load_v1_model``) to the v2 module, with the architecture's YAML (``config``,
  default aimnet's ``models/aimnet2.yaml``).
- a registry name (``aimnet2``, ``aimnet2_wb97m_0``, ...): the file aimnet already downloaded
  to its cache (``$AIMNET_CACHE_DIR`` or ``~/.cache/aimnet``), checked against the registry's
  SHA-256; nothing is downloaded here.

Everything else (another family's checkpoint, a pickle needing code, a corrupt file) is refused
in one line naming the file.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import warnings
import zipfile
from pathlib import Path

import torch

from .files import refused_global

INSTALL = "pip install 'shardmd[aimnet2]'"
TRUST_FIX = ("it is a TorchScript program that runs with your rights: add model.trust_code=true if you trust "
             "its source")
GIVE = "give an AIMNet2 .pt file (aimnet export) or a legacy .jpt with model.trust_code=true"


def import_aimnet():
    """The ``aimnet`` package (quietly: warp prints its banner on import), or a one-line
    ValueError with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import aimnet
            import aimnet.models.base  # the loader and the model class
            import aimnet.modules
    except ImportError as exc:
        raise ValueError(f"model=aimnet2 needs the aimnet package ({exc.name or 'aimnet'} is not importable): "
                         f"{INSTALL}") from None
    return aimnet


def cache_dir() -> Path:
    """aimnet's model cache (not created here)."""
    return Path(os.environ.get("AIMNET_CACHE_DIR") or Path.home() / ".cache" / "aimnet")


def resolve(checkpoint: str) -> tuple[Path, bool]:
    """(path, from the registry) of ``model.checkpoint``: a local file, or a registry name whose
    file aimnet has downloaded already (checked against the registry's SHA-256)."""
    path = Path(str(checkpoint)).expanduser()
    label = f"model.checkpoint={checkpoint}"
    if path.is_file():
        return path, False
    from aimnet.calculators.model_registry import load_model_registry, try_resolve_registry_model_name

    name = try_resolve_registry_model_name(str(checkpoint))
    if name is None:
        raise ValueError(f"{label}: no such file; {GIVE}, or the name of an AIMNet2 model aimnet has downloaded")
    entry = load_model_registry()["models"][name]
    local = cache_dir() / entry["file"]
    if not local.is_file():
        raise ValueError(f"{label} is aimnet's {name!r}, not in its cache ({local}); nothing is downloaded here: "
                         f"run `aimnet download {name}` where the network is reachable, or give the file")
    h = hashlib.sha256()
    with open(local, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != entry.get("sha256"):
        raise ValueError(f"{label}: the cached {local} does not match the registry's SHA-256; download it again "
                         f"(`aimnet download {name}`)")
    return local, True


def file_kind(path: Path) -> str:
    """``torchscript``, ``checkpoint`` (a torch.save zip) or ``other``, from the zip directory."""
    try:
        with zipfile.ZipFile(path) as z:
            tails = {n.split("/", 1)[-1] for n in z.namelist()}
    except (zipfile.BadZipFile, OSError):
        return "other"
    if "constants.pkl" in tails or any(t.startswith("code/") for t in tails):
        return "torchscript"
    return "checkpoint" if "data.pkl" in tails else "other"


def _what(data) -> str:
    """What a loaded dict that is not an aimnet v2 file is, for the refusal."""
    if not isinstance(data, dict):
        return f"a {type(data).__name__}"
    if "config" in data and "model_state_dict" in data:
        return "a SevenNet checkpoint (use model=sevennet)"
    if "hyper_parameters" in data and "state_dict" in data:
        return "a nequip-train checkpoint (use model=allegro or model=nequip)"
    if "model_args" in data and "model" in data:
        return "a MatterSim checkpoint (use model=mattersim)"
    if data and all(torch.is_tensor(v) for v in data.values()):
        return "a bare state dict, without aimnet's model_yaml and metadata (export it with `aimnet export`)"
    return "a dict without aimnet's model_yaml and state_dict"


def read_v2(path: Path, label: str) -> dict:
    """An aimnet v2 file as data (``weights_only``), checked to be one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise ValueError(f"{label} is not a loadable AIMNet2 model file (a corrupt pickle); {GIVE}") from None
        raise ValueError(f"{label} is not an AIMNet2 model file: it needs {what} to load (a pickle of code, never "
                         f"unpickled here); {GIVE}") from None
    except Exception as exc:  # noqa: BLE001 - zip errors, truncated files
        raise ValueError(f"{label} is not a loadable AIMNet2 model file ({type(exc).__name__}); {GIVE}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_yaml"), str) or "state_dict" not in data:
        raise ValueError(f"{label} is not an AIMNet2 model file: it is {_what(data)}")
    return data


def load(path: Path, label: str, trust_code: bool = False, config: str | None = None, registry: bool = False):
    """(module, metadata) of an AIMNet2 file (module docstring), in eval mode, on the CPU."""
    kind = file_kind(path)
    if kind == "torchscript":
        if not trust_code:
            raise ValueError(f"{label} is a legacy AIMNet2 TorchScript model (.jpt): {TRUST_FIX}")
        return _load_legacy(path, label, config)
    if kind == "other":
        raise ValueError(f"{label} is not an AIMNet2 model file (not a torch.save archive); {GIVE}")
    data = read_v2(path, label)
    from aimnet.models.artifact_validation import (
        REGISTRY_IMPORT_POLICY,
        resolve_model_import_policy,
        validate_v2_artifact_with_policy,
    )
    from aimnet.models.base import _load_v2_model

    policy = REGISTRY_IMPORT_POLICY if registry else resolve_model_import_policy(None, "extend")
    try:
        validate_v2_artifact_with_policy(data, policy)
    except ValueError as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{label} is not a valid AIMNet2 v2 file ({first})") from None
    try:   # aimnet's own loader: the same restricted load, validation and assembly as its calculator
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, meta = _load_v2_model(str(path), "cpu", policy, unexpected="error")
    except Exception as exc:  # noqa: BLE001 - weights that do not fit, a YAML aimnet cannot build
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{label}: aimnet cannot build the model it describes ({type(exc).__name__}: {first})"
                         ) from None
    return model.eval(), dict(meta)


def _load_legacy(path: Path, label: str, config: str | None):
    """A trusted legacy ``.jpt`` converted by aimnet's ``load_v1_model`` to the v2 module."""
    from aimnet.models.utils import load_v1_model

    if config is None:
        import aimnet

        config = str(Path(aimnet.__file__).parent / "models" / "aimnet2.yaml")
    elif not Path(config).is_file():
        raise ValueError(f"model.config={config}: no such file; give the YAML of the model's architecture")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, meta = load_v1_model(str(path), str(config), verbose=False)
    except Exception as exc:  # noqa: BLE001 - aimnet's converter failing, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{label}: aimnet cannot convert this TorchScript model with {Path(config).name} "
                         f"({type(exc).__name__}: {first}); give its architecture's YAML as model.config") from None
    return model.eval(), dict(meta)


__all__ = ["INSTALL", "cache_dir", "file_kind", "import_aimnet", "load", "read_v2", "resolve"]
