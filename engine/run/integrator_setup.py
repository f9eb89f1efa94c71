"""The integrator a configuration asks for (``integrator=`` and its keys, engine/config/schema.py).

Integrators (integrators/) know nothing of configurations, domains or models; this is where
the engine turns the composed configuration into one.  Thermostats that need the global
kinetic energy (nose-hoover, csvr, npt; langevin for its conserved quantity) get :func:`sum_fn`:
a sum over the job's ranks of a small tensor (the identity on one rank).  A restart loads the
checkpoint's integrator state (engine/run/simulation.py), so a Nosé-Hoover chain (and npt's barostat) continues.  npt's
pressure is given in bar (as LAMMPS's metal units) and handed to the integrator in eV/Å^3.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from shardmd.engine.errors import UserError
from shardmd.integrators import INTEGRATORS
from shardmd.integrators.units import EV_PER_A3_TO_BAR


def _world_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over the job's process group (the WORLD group Comm uses); identity on one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return t
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    x = t.to(dev, copy=True)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x.to(t.device)


def sum_fn(comm=None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The reduction thermostats use: ``comm.all_reduce(t, "sum")`` when a Comm is given, else
    the job's process group (the one every Comm of this process uses); None for one rank (the
    integrators' own identity, which they recognise and skip)."""
    if comm is None:
        return _world_sum
    if comm.size == 1:
        return None
    return lambda t: comm.all_reduce(t, "sum")


def run_seed(cfg) -> int:
    """``seed`` for the structure this run holds: frame ``system.index`` of ``system.file`` draws
    with :func:`shardmd.integrators.random.frame_seed` (as the same frame does in a many-system
    run, engine/batch/), anything else with ``seed`` itself."""
    from shardmd.integrators.random import frame_seed

    index = int(cfg.system.index) if cfg.system.get("file") else 0
    return frame_seed(int(cfg.seed), index)


def make_integrator(cfg: DictConfig, comm=None):
    """cfg: the composed run configuration; comm: the job's Comm (None: the process group in
    place, or one rank); returns an integrator of integrators/."""
    icfg = cfg.integrator
    dt, temperature = float(cfg.dt), float(cfg.temperature)
    try:
        if icfg.name == "verlet":
            return INTEGRATORS["verlet"](dt=dt)
        if icfg.name == "langevin":
            return INTEGRATORS["langevin"](dt=dt, temperature=temperature, friction=float(icfg.friction),
                                           seed=run_seed(cfg), sum_fn=sum_fn(comm))
        if icfg.name == "nose-hoover":
            integrator = INTEGRATORS["nose-hoover"](dt=dt, temperature=temperature, tdamp=float(icfg.tdamp),
                                                     chain=int(icfg.chain), sum_fn=sum_fn(comm))
        elif icfg.name == "npt":
            integrator = INTEGRATORS["npt"](
                dt=dt, temperature=temperature, pressure=float(icfg.pressure) / EV_PER_A3_TO_BAR,
                tdamp=float(icfg.tdamp), pdamp=float(icfg.pdamp), couple=str(icfg.couple), chain=int(icfg.chain),
                pchain=int(icfg.pchain), sum_fn=sum_fn(comm))
        elif icfg.name == "csvr":
            integrator = INTEGRATORS["csvr"](dt=dt, temperature=temperature, tau=float(icfg.tau),
                                             seed=run_seed(cfg), sum_fn=sum_fn(comm))
        else:
            raise UserError(f"integrator={icfg.name!r} is not available; choose one of: {', '.join(INTEGRATORS)}")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _refuse_rollbacks(cfg, icfg.name)
    if str(cfg.device) == "cpu":
        # their per-atom passes run as Warp kernels on the CPU (integrators/fused.py): Warp
        # started here the engine's way (quietly, without the "no CUDA driver" line)
        from shardmd.domain.api import init_warp

        init_warp()
    return integrator


def _refuse_rollbacks(cfg: DictConfig, name: str) -> None:
    """The deferred skin check may roll the state back and replay steps; its snapshots do not
    hold a thermostat's state (nose-hoover's chain, csvr's step draws are fine but its energy
    counter is not), so a thermostat run asks for the per-step check instead."""
    n = cfg.neighbor
    deferred = n.deferred is True or (n.deferred == "auto" and str(cfg.device).startswith("cuda"))
    if name in ("nose-hoover", "npt") and deferred and int(n.every) == 1 and bool(n.check):
        raise UserError(f"integrator={name} cannot yet run with the deferred skin check (its rollbacks do not "
                        "restore the chain or the cell); add neighbor.deferred=false")
