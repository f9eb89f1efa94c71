"""Velocity Verlet, Langevin (BAOAB) and Nosé-Hoover chains over many independent systems in one pass.

The equations are velocity_verlet.py's, langevin.py's and nose_hoover.py's (each system's chain
stays in its own ``NoseHoover``: a few scalars; the passes over the atoms are here, with the
kinetic energy of each system summed exactly as its own run sums it); every atom carries its own system's
constants, so one pass of a few operations steps any number of systems, and each atom gets the
bits its system's own integrator gives it (the same operations on the same values; Langevin's
noise from the same counter, keyed by the system's seed and step).

    positions, velocities, forces   (N, 3)  Å, Å/fs, eV/Å, all systems' atoms
    masses                          (N,)    amu
    ids                             (N,)    int64 global ids within each system
    system                          (N,)    int64 system of each atom; S systems
    steps                           (N,)    int64 the step each atom's system is starting
    seeds                           (N,)    int64 each atom's system's Langevin seed
    c1, scale                       (N, 1)  exp(-gamma dt) and c2 sqrt(kT/m) (:func:`langevin_constants`)

Units as in the single-system integrators: Å, fs, eV, amu; dt fs, shared by all systems.
"""
from __future__ import annotations

import math

import torch

from .nose_hoover import _HI, _LO
from .random import STREAM_LANGEVIN, gaussian_noise_keyed
from .units import FORCE_TO_ACCEL, KB, MVV_TO_EV


def half_kick(velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor, dt: float) -> None:
    """v += dt/2 F/m, in place (both integrators' B step)."""
    velocities.add_(forces / masses[:, None], alpha=0.5 * dt * FORCE_TO_ACCEL)


def verlet_first(positions, velocities, forces, masses, dt: float) -> None:
    """Half kick and full drift, in place."""
    half_kick(velocities, forces, masses, dt)
    positions.add_(velocities, alpha=dt)


def langevin_constants(dt: float, temperature: float, friction: float, masses: torch.Tensor,
                       dtype: torch.dtype) -> tuple[float, torch.Tensor]:
    """(c1, scale (n, 1) in ``dtype``) of one system with ``masses`` (n,) amu, as
    langevin.py's ``first_half`` computes them."""
    c1 = math.exp(-friction * dt)
    c2 = math.sqrt(max(1.0 - c1 * c1, 0.0))
    sigma = torch.sqrt(KB * temperature / (masses * MVV_TO_EV))
    return c1, (c2 * sigma)[:, None].to(dtype)


def langevin_first(positions, velocities, forces, masses, ids, dt: float, c1: torch.Tensor, scale: torch.Tensor,
                   seeds: torch.Tensor, steps: torch.Tensor, system: torch.Tensor, n_systems: int) -> torch.Tensor:
    """B, A, O, A in place; returns each system's energy change of the O step, (S,) float64 eV
    (langevin.py's conserved-quantity term, summed per system)."""
    half_kick(velocities, forces, masses, dt)
    positions.add_(velocities, alpha=0.5 * dt)
    xi = gaussian_noise_keyed(seeds, steps, STREAM_LANGEVIN, ids, dtype=velocities.dtype)
    m = masses.double()[:, None]
    before = (m * velocities.double() ** 2).sum(dim=1)
    velocities.mul_(c1).add_(xi * scale)
    after = (m * velocities.double() ** 2).sum(dim=1)
    change = torch.zeros(n_systems, dtype=torch.float64, device=velocities.device)
    change.index_add_(0, system, 0.5 * MVV_TO_EV * (after - before))
    positions.add_(velocities, alpha=0.5 * dt)
    return change


def mv2_per_system(velocities: torch.Tensor, masses: torch.Tensor, system: torch.Tensor, n_systems: int,
                   columns: bool) -> list[tuple[float, int]]:
    """(sum m v^2 in eV, atom count) of each system, the bits nose_hoover.py's ``exact_mv2_sum``
    gives each alone: every atom's m v^2 as the same two int64 fixed-point words (``columns``:
    v_x^2 + v_y^2 + v_z^2 as (a + b) + c, else torch's row sum, as the system's own run chose),
    summed per system in integers, where the order cannot change a bit."""
    vv = velocities.double() ** 2
    x = (vv[:, 0] + vv[:, 1]) + vv[:, 2] if columns else vv.sum(1)
    x = (masses.double() * x).mul_(MVV_TO_EV).mul_(_HI)
    hi = torch.floor(x)
    words = torch.stack([hi, (x - hi).mul_(_LO).round_()], dim=1).to(torch.int64)
    sums = torch.zeros(n_systems, 3, dtype=torch.int64, device=velocities.device)
    sums[:, :2].index_add_(0, system, words)
    sums[:, 2].index_add_(0, system, torch.ones_like(system))
    return [((hi + lo / _LO) / _HI, int(n)) for hi, lo, n in sums.cpu().tolist()]


def scale_per_system(velocities: torch.Tensor, factors: list[float], system: torch.Tensor) -> None:
    """v *= its system's factor, in place (each system's ``velocities.mul_(factor)``: the factor
    rounded to the velocities' dtype as torch rounds a Python scalar)."""
    f = torch.tensor(factors, dtype=torch.float64, device=velocities.device).to(velocities.dtype)
    velocities.mul_(f[system][:, None])
