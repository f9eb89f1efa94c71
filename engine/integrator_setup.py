"""The integrator a configuration asks for (``integrator=`` and its keys, engine/config_schema.py).

Integrators (integrators/) know nothing of configurations, domains or models; this is where
the engine turns the composed configuration into one.
"""
from __future__ import annotations

from omegaconf import DictConfig

from shardmd.integrators import INTEGRATORS

from .errors import UserError


def make_integrator(cfg: DictConfig):
    """cfg: the composed run configuration; returns an integrator of integrators/."""
    icfg = cfg.integrator
    if icfg.name == "verlet":
        return INTEGRATORS["verlet"](dt=float(cfg.dt))
    if icfg.name == "langevin":
        return INTEGRATORS["langevin"](dt=float(cfg.dt), temperature=float(cfg.temperature),
                                       friction=float(icfg.friction), seed=int(cfg.seed))
    raise UserError(f"integrator={icfg.name!r} is not available; choose one of: {', '.join(INTEGRATORS)}")
