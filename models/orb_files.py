"""ORB networks from users' files or with random weights (models/orb.py's loading half).

What users have: orb-models' own checkpoints (``orb-v3-direct-20-omat-20250404.ckpt``, ...)
are a bare state dict of a ``DirectForcefieldRegressor`` or ``ConservativeForcefieldRegressor``
(orb-models reads them itself with ``torch.load(weights_only=True)``).  The file records
neither the architecture's sizes nor the neighbour cap, so:

- the kind (orb-v3 direct, orb-v3 conservative, orb-v2 direct) and the sizes (latent width,
  layers, MLP widths and depths) are read from the weights' names and shapes;
- the neighbour cap (20 or 120 for the released models, which are otherwise identical) comes
  from ``max_neighbors=`` or from a released model's name at the start of the file name.

A file is read as data (``weights_only``, never unpickled freely without
``model.trust_pickle=true``); a file of another family, a whole pickled module, a TorchScript
archive or weights that do not fit are refused in one line.  A charge/spin-conditioned network
(orb-v3 ``-omol``, OrbMol: a ``model.conditioner`` in the weights) is built with orb-models'
conditioner and without a stress, as orb-models builds the released ones; it needs the total
charge and spin (models/orb.py).  A released model's name (``model.checkpoint=
orb-v3-direct-20-omat``) is resolved only from orb-models' download cache (cached_path's
folder): nothing is downloaded here.
"""
from __future__ import annotations

import inspect
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch

from .files import refused_global
from .orb_compat import build_architecture, import_calculator_module

INSTALL = "pip install 'shardmd[orb]'"
RADIUS = 6.0   # Å: every ORB system config (and the envelopes its modules hard-code)
TRUST_FIX = ("if you made this file yourself or trust its source, add model.trust_pickle=true (unpickling runs any "
             "code the file holds)")
#: released models: name -> (kind, neighbour cap); -omol models also take the total charge and spin
RELEASED = {**{f"orb-v3-{k}-{c}-{d}": (f"v3-{k}", 20 if c == "20" else 120)
               for k in ("direct", "conservative") for c in ("20", "inf") for d in ("omat", "mpa")},
            "orb-v2": ("v2", 20), "orb-d3-v2": ("v2", 20), "orb-d3-sm-v2": ("v2", 20), "orb-d3-xs-v2": ("v2", 20),
            "orb-mptraj-only-v2": ("v2", 20), "orb-v3-direct-omol": ("v3-direct", 120),
            "orb-v3-conservative-omol": ("v3-conservative", 120)}
#: architecture arguments of a charge/spin-conditioned orb-v3 (OrbMol), as orb-models builds the released
#: -omol models: its ChargeSpinConditioner, no stress (molecules)
CONDITIONED = MappingProxyType({"has_charge_spin_cond": True, "has_stress": False})


def import_orb():
    """``orb_models.forcefield.pretrained`` (quietly), or a one-line ValueError with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_calculator_module()   # the reference calculator, in either layout (models/orb_compat.py)
            import orb_models.forcefield.pretrained as pretrained
    except ImportError as exc:
        raise ValueError(f"model=orb needs the orb-models package ({exc.name or 'orb_models'} is not importable): "
                         f"{INSTALL} (in its own environment)") from None
    return pretrained


def released_name(text: str) -> str | None:
    """The released model a name or file name starts with (longest match), else None."""
    low = Path(str(text)).name.lower()
    hits = [n for n in RELEASED if low == n or low.startswith(n + "-") or low.startswith(n + ".")]
    return max(hits, key=len) if hits else None


def cached_release(name: str) -> Path | None:
    """The file orb-models downloaded for a released model (cached_path's cache), if any."""
    pretrained = import_orb()
    fn = pretrained.ORB_PRETRAINED_MODELS.get(name)
    url = inspect.signature(fn).parameters["weights_path"].default if fn is not None else None
    if not url:
        return None
    from cached_path.util import find_latest_cached

    hit = find_latest_cached(url)
    return Path(hit) if hit is not None and Path(hit).is_file() else None


# -- reading a file ----------------------------------------------------------------------------------
_OTHERS = (("mace.", "a mace-torch model: use model=mace"), ("nequip.", "a NequIP model: use model=nequip"),
           ("sevenn.", "a SevenNet model: use model=sevennet"), ("mattersim.", "a MatterSim object"),
           ("orb_models.", "a pickled orb-models object (not its state dict)"),
           ("torch.nn.", "a whole pickled torch module"))


def _other_dict(cp: dict) -> str:
    if "config" in cp and "model_state_dict" in cp:
        return "a SevenNet checkpoint: use model=sevennet"
    if "hyper_parameters" in cp and "state_dict" in cp:
        return "a nequip-train checkpoint: use model=allegro or model=nequip"
    if "model" in cp and "model_args" in cp:
        return "a MatterSim checkpoint: use model=mattersim"
    return "a dict without ORB's weights (model.atom_emb..., heads.energy...)"


def read_state_dict(path: Path, label: str, trust_pickle: bool = False) -> dict:
    """The state dict in an ORB checkpoint, loaded as data and checked for ORB's weights."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cp = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise ValueError(f"{label} is not a loadable ORB checkpoint (a corrupt pickle)") from None
        kind = next((k for p, k in _OTHERS if what.startswith(p)), None)
        if kind:
            raise ValueError(f"{label} is not an ORB checkpoint: it holds {what} ({kind})") from None
        raise ValueError(f"{label} needs {what}, which the safe loader does not allow; it is not a plain ORB "
                         f"checkpoint. {TRUST_FIX}") from None
    except Exception as exc:  # noqa: BLE001 - zip errors, truncated files, TorchScript archives
        if "TorchScript" in str(exc) or "constants.pkl" in str(exc):
            raise ValueError(f"{label} is a TorchScript archive, not an ORB checkpoint; give the .ckpt state dict "
                             "orb-models releases") from None
        raise ValueError(f"{label} is not a loadable ORB checkpoint ({type(exc).__name__}); give the .ckpt state "
                         "dict orb-models releases") from None
    if isinstance(cp, torch.nn.Module):
        raise ValueError(f"{label} is not an ORB checkpoint: it holds a whole {type(cp).__module__}."
                         f"{type(cp).__name__} module; save its state_dict()")
    if not isinstance(cp, dict) or not any(str(k).startswith(("model.atom_emb", "heads.energy")) for k in cp):
        what = _other_dict(cp) if isinstance(cp, dict) else f"a {type(cp).__name__}"
        raise ValueError(f"{label} is not an ORB checkpoint: it is {what}")
    if not all(torch.is_tensor(v) for v in cp.values()):
        raise ValueError(f"{label} is not an ORB state dict: some entries are not tensors")
    return cp


@dataclass(frozen=True)
class Architecture:
    """An ORB network's description: ``kind`` (``v3-direct``, ``v3-conservative``, ``v2``: which
    of orb-models' architecture functions builds it) and ``args``, that function's keyword
    arguments (widths, depths, layers; read-only)."""

    kind: str
    args: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))


def _mlp_shape(sd: dict, prefix: str) -> tuple[int, int]:
    """(hidden width, hidden layers) of orb-models' ``build_mlp`` weights under prefix."""
    layers = sorted(int(m.group(1)) for k in sd if (m := re.fullmatch(re.escape(prefix) + r"NN-(\d+)\.weight", k)))
    return int(sd[f"{prefix}NN-0.weight"].shape[0]), len(layers) - 1


def architecture(sd: dict, label: str) -> Architecture:
    """The kind and sizes of the network a state dict holds (module docstring)."""
    conditioned = any(k.startswith("model.conditioner.") for k in sd)
    try:
        layers = len({int(k.split(".")[2]) for k in sd if k.startswith("model.gnn_stacks.")})
        latent = int(sd["model.atom_emb.embeddings.weight"].shape[1])
        base = _mlp_shape(sd, "model._encoder._node_fn.mlp.")
        head = _mlp_shape(sd, "heads.energy.mlp.")
        edge_in = int(sd["model._encoder._edge_fn.mlp.NN-0.weight"].shape[1])
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"{label} lacks weights every ORB network has (atom embedding, encoder, energy head); a "
                         "truncated or another model's state dict") from None
    direct = any(k.startswith("heads.forces.") for k in sd)
    if edge_in == 23:   # orb-v2: 20 Gaussians + the unit vector; fixed widths, only the depth varies
        if not direct:
            raise ValueError(f"{label}: an orb-v2 network without a forces head is not a forcefield")
        if conditioned:
            raise ValueError(f"{label}: an orb-v2 network with a charge/spin conditioner is not one orb-models "
                             "builds; a charge/spin-conditioned model is an orb-v3 -omol")
        return Architecture("v2", {"num_message_passing_steps": layers})
    kind = "v3-direct" if direct else "v3-conservative"
    args = {"latent_dim": latent, "base_mlp_hidden_dim": base[0], "base_mlp_depth": base[1],
            "head_mlp_hidden_dim": head[0], "head_mlp_depth": head[1], "num_message_passing_steps": layers}
    if kind == "v3-direct":
        args["has_stress"] = any(k.startswith("heads.stress.") for k in sd)
    if conditioned:
        args.update(CONDITIONED)
    return Architecture(kind, args)


def build_network(arch: Architecture, max_neighbors: int, state: dict | None = None, label: str = "",
                  seed: int = 0, dtype: torch.dtype = torch.float64):
    """orb-models' regressor ``arch`` from its own architecture function, its weights from
    ``state`` (strictly: every weight must fit) or random (from ``seed`` on a forked RNG).
    Built under float32 as orb-models' loaders build it (its reference energies and ZBL
    constants are made in the default dtype), then cast to ``dtype``."""
    pretrained = import_orb()
    default = torch.get_default_dtype()
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        torch.set_default_dtype(torch.float32)
        torch.manual_seed(int(seed))
        try:
            net = build_architecture(pretrained, arch.kind, RADIUS, max_neighbors, dict(arch.args))
            if state is not None:
                own = net.state_dict()
                bad = next((k for k, v in state.items() if k in own and own[k].shape != v.shape), None)
                if bad is not None:   # torch's own message on this is several lines
                    raise RuntimeError(f"{bad} has shape {tuple(state[bad].shape)}, the network built from the "
                                       f"other weights' sizes {tuple(own[bad].shape)}")
                net.load_state_dict(state, strict=True)
                missing = sorted(k for k in set(net.state_dict()) - set(state) if not k.startswith("heads.confidence."))
                if missing:   # orb-models' strict load forgives missing heads; a forcefield needs them all
                    raise RuntimeError(f"Missing key in state_dict: {missing[0]}")
        except Exception as exc:  # noqa: BLE001 - weights of another shape or name, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ValueError(f"{label}: its weights do not fit orb-models' {arch.kind} network ({first})") from None
        finally:
            torch.set_default_dtype(default)
    for p in net.parameters():
        p.requires_grad_(False)
    return net.to(dtype=dtype).eval()


__all__ = ["CONDITIONED", "INSTALL", "RADIUS", "RELEASED", "Architecture", "architecture", "build_network",
           "cached_release", "import_orb", "read_state_dict", "released_name"]
