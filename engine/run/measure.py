"""Computing the registered observables of one step on every rank (engine/observables/).

Each rank hands its own atoms to the ``sum`` / ``max`` / ``min`` observables and rank 0's
system-wide values of the ``none`` ones are broadcast inside the same sum (the other ranks add
zeros); then one all-reduce per kind of reduction (one in all for the built-ins: the kinetic
tensor, the potential energy and the volume), then the ``derived`` ones on every rank alike.
A function that raises on one rank is said on every rank (a flag in the same all-reduce), so
no rank is left waiting in the next collective.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch

from shardmd.domain.comm import Comm
from shardmd.engine.errors import CollectiveError, UserError
from shardmd.engine.observables import columns, registry
from shardmd.engine.observables.registry import Observable
from shardmd.engine.observables.view import PER_ATOM, StateView


def select(due: frozenset | set = frozenset(), names=None) -> list[Observable]:
    """What to compute: ``names`` (and their dependencies), else the cheap observables with a
    ``when`` and the expensive ones whose ``when`` is ``due``; dependencies first."""
    if names is not None:
        return registry.needed(names)
    return registry.needed([o.name for o in registry.registered()
                            if o.when and (o.cost == "cheap" or set(o.when) & set(due))])


def _label(o: Observable) -> str:
    return f"observable {o.name!r}" + ("" if o.origin == "built-in" else f" ({o.origin})")


def _flat(o: Observable, value, device) -> torch.Tensor:
    """A partial as a flat float64 tensor of ``o.shape``'s size; ValueError when it is none."""
    if value is None:
        raise ValueError(f"returned None (a {o.reduce} reduction needs a value: a number or an array of shape "
                         f"{o.shape})")
    t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value, dtype=np.float64))
    if tuple(t.shape) != o.shape:
        raise ValueError(f"returned shape {tuple(t.shape)}, declared {o.shape}")
    return t.to(device=device, dtype=torch.float64).reshape(-1)


def _plain(o: Observable, t: torch.Tensor):
    """A reduced value as the observables' dict holds it: a float or a float64 array."""
    return float(t[0]) if o.shape == () else t.numpy().reshape(o.shape)


def _check(o: Observable, value, step: int):
    """A derived value as a float / array of its shape (None: absent); one line when it is not."""
    if value is None:
        return None
    if o.origin == "built-in":   # their finiteness is the run's health (engine/run/health.py, exit 3)
        return value
    try:
        a = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CollectiveError(f"{_label(o)} returned a {type(value).__name__}, not a number") from None
    if a.shape != o.shape:
        raise CollectiveError(f"{_label(o)} returned shape {a.shape}, declared {o.shape}")
    _finite(o, a, step)
    return float(a) if o.shape == () else a


def _finite(o: Observable, a, step: int) -> None:
    if o.origin != "built-in" and not np.isfinite(a).all():
        bad = a if np.ndim(a) == 0 else a[~np.isfinite(a)].flat[0]
        raise CollectiveError(f"{_label(o)} is not finite at step {step} ({float(bad)}); fix its function "
                              "(docs/observables.md)")


def measure(comm: Comm, state, results: dict, dof: int, n_atoms: int, todo: list[Observable],
            frame_interval: float = 0.0, coupling_energy: float = 0.0, groups=None) -> dict:
    """The values of ``todo`` (from :func:`select`) at the state's step: ``{name: value}``,
    None for an absent one (a pressure without a virial). Collective: every rank calls it.
    frame_interval: fs between trajectory frames (the view's ``frame_interval``);
    coupling_energy: eV, the thermostat's / barostat's (the view's); groups: {name: ids}."""
    tensors = {k: getattr(state, k) for k in PER_ATOM}
    tensors.update(cell=state.cell, pbc=state.pbc, virial=results.get("virial"))
    values: dict = {}
    view = StateView(tensors, potential_energy=float(results["energy"]), step=state.step, time=state.time,
                     dof=dof, n_atoms=n_atoms, rank=comm.rank, n_ranks=comm.size, values=values,
                     frame_interval=frame_interval, coupling_energy=coupling_energy, groups=groups)
    device = state.positions.device
    parts: dict[str, list[tuple[Observable, torch.Tensor]]] = {"sum": [], "max": [], "min": []}
    failed: dict[str, str] = {}
    reduced = [o for o in todo if o.reduce != "derived"]
    for o in reduced:
        size = math.prod(o.shape)
        try:
            t = _flat(o, o.compute(view), device)
        except Exception as exc:  # noqa: BLE001 - a user's function: said in one line, on every rank
            failed[o.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            t = torch.zeros(size, dtype=torch.float64, device=device)
        if o.reduce == "none" and comm.rank != 0:   # rank 0's value, through the sum
            t = torch.zeros_like(t)
        parts["sum" if o.reduce == "none" else o.reduce].append((o, t))
    flags = torch.tensor([float(o.name in failed) for o in reduced], dtype=torch.float64, device=device)
    for op, items in parts.items():
        if not items and not (op == "sum" and reduced):   # the flags go with the sum on every rank alike
            continue
        local = torch.cat([t for _, t in items] + ([flags] if op == "sum" else []))
        out = (comm.all_reduce(local, op) if comm.size > 1 else local).cpu()
        i = 0
        for o, t in items:
            values[o.name] = _plain(o, out[i:i + t.numel()])
            i += t.numel()
        if op == "sum":
            flags = out[i:]
    if reduced and bool((flags > 0).any()):
        o = reduced[int(torch.nonzero(flags > 0)[0])]
        why = failed.get(o.name, "on another rank (run it on one domain to see its error)")
        raise CollectiveError(f"{_label(o)} failed at step {state.step}: {why}")
    for o in reduced:
        if values.get(o.name) is not None:
            _finite(o, values[o.name], state.step)
    for o in todo:
        if o.reduce == "derived":
            try:
                v = o.compute(view)
            except Exception as exc:  # noqa: BLE001 - the same on every rank: said in one line
                raise CollectiveError(f"{_label(o)} failed at step {state.step}: {type(exc).__name__}: "
                                      f"{' '.join(str(exc).split())}") from None
            values[o.name] = _check(o, v, state.step)
    return values


def of_run(sim, names=None, due=("thermo", "trajectory")) -> dict:
    """:func:`measure` of a Simulation's current step: the observables with a ``when`` (and
    those ``names`` or the thermo columns ask for), without the on-demand ones computed only as
    dependencies; a per-group column's value as ``<name>@<group>``."""
    cols = getattr(sim, "thermo_columns", None)
    system, per_group = columns.needs(cols) if cols and "thermo" in due else ([], {})
    todo = select(set(due), names)
    todo += [o for o in registry.needed(system) if o not in todo]
    every = int(sim.cfg.trajectory.every)
    if getattr(sim, "_barostat", False):   # npt's P (V - V0) of this step's cell (a restart's first has none yet)
        sim.integrator.cell = sim.state.cell
    coupling = getattr(sim.integrator, "conserved_energy", None)   # collective for langevin: on every rank
    kw = dict(coupling_energy=coupling() if coupling is not None else 0.0, groups=getattr(sim, "groups", None))
    obs = measure(sim.comm, sim.state, sim.results, sim.integrator.degrees_of_freedom(sim.n_global), sim.n_global,
                  todo, frame_interval=every * float(sim.integrator.dt) if every > 0 else 0.0, **kw)
    out = {o.name: obs[o.name] for o in todo if o.when or o.name in system or (names is not None and o.name in names)}
    for group, wanted in per_group.items():
        vals = of_group(sim, group, wanted, **kw)
        out.update({f"{n}@{group}": vals[n] for n in wanted})
    return out


def of_group(sim, group: str, names: list[str], **kw) -> dict:
    """:func:`measure` of ``names`` over the atoms of ``groups.<group>`` alone (collective): each
    rank hands over its own members; degrees of freedom 3 per mobile member (fixed atoms count
    in neither the kinetic energy, their velocities being 0, nor the dof)."""
    s, ids = sim.state, sim.groups[group]
    rows = torch.nonzero(torch.isin(s.ids, torch.as_tensor(ids, device=s.ids.device))).flatten()
    sub = SimpleNamespace(**{k: getattr(s, k).index_select(0, rows) for k in PER_ATOM}, cell=s.cell, pbc=s.pbc,
                          step=s.step, time=s.time)
    fixed = getattr(sim.integrator, "fixed_ids", None)
    n_fixed = int(np.isin(ids, fixed.cpu().numpy()).sum()) if fixed is not None else 0
    return measure(sim.comm, sub, sim.results, 3 * (len(ids) - n_fixed), len(ids), registry.needed(names), **kw)


#: observables written with the frames only: MDAnalysis takes its time step from the row of
#: ``dt`` with a frame's index
FRAMES_ONLY = ("dt",)


def trajectory_row(obs: dict, frame: bool = True) -> tuple[dict, dict]:
    """(values, units) of the trajectory's observables present in ``obs`` (absent ones left out);
    ``frame=False``: a row between frames (observables.every), without :data:`FRAMES_ONLY`."""
    rows = [o for o in registry.shown("trajectory") if obs.get(o.name) is not None
            and (frame or o.name not in FRAMES_ONLY)]
    return {o.name: obs[o.name] for o in rows}, {o.name: o.h5md_unit for o in rows}


def setup(cfg, state) -> tuple[dict, list | None]:
    """(groups: {name: sorted global ids} from the full initial ``state``, the thermo table's
    columns or None for the default ones); after ``observables.modules`` are loaded."""
    from shardmd.engine.observables import groups

    node = cfg.get("groups") if hasattr(cfg, "get") else None
    found = groups.resolve(node, state.ids.cpu().numpy(), state.numbers.cpu().numpy())
    specs = cfg.thermo.get("columns") if "thermo" in cfg else None
    return found, (columns.parse(list(specs), found) if specs is not None else None)


def load_config(cfg) -> list[tuple[str, list[str]]]:
    """Import ``observables.modules`` (refused without ``allow_code=true``): [(entry, names)]."""
    from shardmd.engine.config import guard
    from shardmd.engine.observables import modules

    node = cfg.get("observables") if hasattr(cfg, "get") else None
    try:
        return modules.load(list(node.modules) if node is not None else [], guard.allowed())
    except UserError as exc:   # the same on every rank (each imports the same modules)
        raise CollectiveError(str(exc)) from None


def notes(loaded: list[tuple[str, list[str]]]) -> list[str]:
    """The run's header line naming the observables its configuration's modules registered."""
    if not loaded:
        return []
    return ["Observables from observables.modules: " + "; ".join(f"{e} ({', '.join(n)})" for e, n in loaded)]
