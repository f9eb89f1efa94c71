"""Model registry: one entry per model family, built from its config node (the ``model`` group's
dataclasses in engine/config_schema.py)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


def _build_lj(cfg: Mapping, dtype: torch.dtype, device: torch.device):
    from .lj import LennardJones
    from .lj_op import LennardJonesOp

    return LennardJonesOp(LennardJones(epsilon=cfg["epsilon"], sigma=cfg["sigma"], cutoff=cfg["cutoff"],
                        shift=cfg.get("shift", True), mixing=cfg.get("mixing", "lorentz-berthelot"),
                        pairs=cfg.get("pairs") or {}))


def _build_mace(cfg: Mapping, dtype: torch.dtype, device: torch.device):
    from .mace import MaceModel

    want = cfg.get("dtype")
    dt = {"float32": torch.float32, "float64": torch.float64}[want] if want else dtype
    return MaceModel(cfg.get("checkpoint"), dtype=dt, device=device, cueq=cfg.get("cueq", "auto"),
                     cuda_graph=cfg.get("cuda_graph", "auto"),
                     trust_pickle=cfg.get("trust_pickle", False) is True,  # only a real true opts in
                     head=cfg.get("head"))


MODELS: dict[str, Callable] = {"lj": _build_lj, "mace": _build_mace}


def build_model(cfg: Mapping, dtype: torch.dtype = torch.float64, device="cpu"):
    """Model from a config mapping with a ``name`` key (the composed ``model`` node)."""
    name = cfg["name"]
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name](cfg, dtype, torch.device(device))
