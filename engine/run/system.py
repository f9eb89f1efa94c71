"""Initial states: the structure (engine/run/structure.py: a file or the lattice builder) as a
State, and its velocities.

Atom ids are the atoms' order in the file or builder (0-based).  Thermal velocities come from
the counter-based generator keyed by (seed, atom id): they never depend on memory order.
"""
from __future__ import annotations

import numpy as np
import torch

from shardmd.engine.errors import UserError
from shardmd.engine.run.builders import build_atoms
from shardmd.engine.run.state import State
from shardmd.integrators.random import STREAM_INIT_VELOCITY, gaussian_noise
from shardmd.integrators.units import KB, MVV_TO_EV


def thermal_velocities(state: State, temperature: float, seed: int, dof: int,
                       zero_momentum: bool = True, fixed: torch.Tensor | None = None) -> torch.Tensor:
    """(n, 3) Å/fs Maxwell-Boltzmann velocities at exactly ``temperature`` for ``dof`` degrees
    of freedom.  Noise keyed by (seed, atom id); the momentum removal and the rescaling sum in
    id order, so the result is independent of memory order.  fixed: (k,) global ids whose
    velocities are 0.0 (zeroed before the momentum removal and the rescaling)."""
    n = state.n_atoms
    if n == 0 or temperature <= 0 or dof <= 0:   # dof 0: one atom under verlet (its centre of mass only)
        return torch.zeros_like(state.positions)
    order = torch.argsort(state.ids)
    m = state.masses.double()[order]
    xi = gaussian_noise(seed, 0, STREAM_INIT_VELOCITY, state.ids[order], dtype=torch.float64)
    v = xi * torch.sqrt(KB * temperature / (m * MVV_TO_EV))[:, None]
    if fixed is not None and fixed.numel():
        v[torch.isin(state.ids[order].cpu(), fixed.cpu()).to(v.device)] = 0.0
    if zero_momentum and n > 1:
        v = v - (m[:, None] * v).sum(0) / m.sum()
    ke = 0.5 * float((m[:, None] * v * v).sum()) * MVV_TO_EV
    if ke > 0:
        v = v * np.sqrt(0.5 * dof * KB * temperature / ke)
    out = torch.empty_like(v)
    out[order] = v
    return out.to(state.dtype)


def initial_state(cfg, dtype: torch.dtype, device, dof_of, zero_momentum: bool, inputs=None) -> State:
    """State from the ``system`` config node, with velocities per ``system.velocities``.

    dof_of: callable n_atoms -> degrees of freedom (from the integrator); inputs: callable
    (state, atoms) -> state giving the state the model's inputs from the structure
    (engine/run/model_inputs.py), or None
    """
    atoms = build_atoms(cfg.system, int(cfg.seed))   # its size was checked before (engine/run/stages.py)
    state = State.from_atoms(atoms, dtype=dtype, device=device)
    if inputs is not None:
        state = inputs(state, atoms)
    has_v = bool(np.any(atoms.get_velocities() != 0)) if atoms.has("momenta") else False
    return set_velocities(cfg, state, has_v, dof_of, zero_momentum, "the structure")


def given_state_velocities(cfg, state: State, dof_of, zero_momentum: bool) -> State:
    """Velocities of a State given through the Python API (``Simulation(cfg, state=...)``), per
    ``system.velocities`` and ``temperature`` as for a structure file: auto (the default) keeps
    the state's velocities if any is non-zero, else draws thermal ones at ``temperature`` (the
    same seeded generator, keyed by atom id); thermal draws them anyway; zero zeroes them;
    file refuses a state without velocities."""
    has_v = bool(torch.any(state.velocities != 0)) if state.n_atoms else False
    return set_velocities(cfg, state, has_v, dof_of, zero_momentum, "the state given to Simulation")


def set_velocities(cfg, state: State, has_v: bool, dof_of, zero_momentum: bool, what: str) -> State:
    """``state`` with velocities per ``system.velocities`` (in place); fixed atoms (the input's
    FixAtoms and ``fix.ids``: engine/run/constraints.py) get 0.0 and their dof are not counted."""
    from shardmd.engine.run.constraints import fixed_dof, resolve_fixed
    from shardmd.engine.run.integrator_setup import run_seed

    mode = cfg.system.velocities
    if mode in ("file", "rescale") and not has_v:
        raise UserError(f"system.velocities={mode} but {what} has no velocities; use system.velocities=thermal "
                        "(or auto)")
    if mode == "zero":
        state.velocities.zero_()
    elif mode == "rescale":
        rescale_velocities(cfg, state, dof_of)
    elif mode == "thermal" or (mode == "auto" and not has_v):
        fixed = resolve_fixed(cfg, state, None)
        dof = fixed_dof(state.n_atoms, fixed.numel()) if fixed.numel() else dof_of(state.n_atoms)
        if dof == 0 and float(cfg.temperature) > 0:
            import warnings

            from shardmd.engine.errors import OneLineWarning

            warnings.warn(f"{what} holds 1 atom, which has no thermal degrees of freedom under "
                          f"integrator={cfg.integrator.name} (3N - 3 = 0: the total momentum is held): it starts "
                          "at rest and its temperature reads 0 K; use integrator=langevin to give it a "
                          "temperature", OneLineWarning, stacklevel=2)
        state.velocities = thermal_velocities(state, float(cfg.temperature), run_seed(cfg), dof,
                                              zero_momentum and not fixed.numel(), fixed=fixed
                                              ).to(state.positions.device)
    return state


def rescale_velocities(cfg, state: State, dof_of) -> None:
    """The state's velocities scaled by one factor to read ``temperature`` (K) with the run's
    degrees of freedom (3N - 3 or 3N by integrator, 3 (N - k) with k fixed atoms, whose velocities
    become 0.0 first); in place.  Directions and the ratios between atoms are the file's."""
    from shardmd.engine.run.constraints import fixed_dof, resolve_fixed

    fixed = resolve_fixed(cfg, state, None)
    v = state.velocities.double()
    if fixed.numel():
        v[torch.isin(state.ids.cpu(), fixed.cpu()).to(v.device)] = 0.0
    dof = fixed_dof(state.n_atoms, fixed.numel()) if fixed.numel() else dof_of(state.n_atoms)
    ke = 0.5 * float((state.masses.double()[:, None] * v * v).sum()) * MVV_TO_EV
    if ke <= 0 or dof <= 0:
        raise UserError("system.velocities=rescale but the given velocities carry no thermal motion (kinetic "
                        "energy 0 over the moving atoms); use system.velocities=thermal")
    target = float(cfg.temperature)
    state.velocities = (v * np.sqrt(target * 0.5 * dof * KB / ke)).to(state.dtype)
