"""Langevin dynamics, BAOAB splitting (Leimkuhler & Matthews 2013).

    B: v += dt/2 * F/m
    A: x += dt/2 * v
    O: v  = c1 v + c2 sqrt(kT/m) xi,   c1 = exp(-gamma dt), c2 = sqrt(1 - c1^2)
    A: x += dt/2 * v
    -- forces --
    B: v += dt/2 * F/m

``xi`` comes from the counter-based generator keyed by (seed, step, stream, atom id), so an
atom's noise is independent of memory order and of the decomposition.  Units: Å, Å/fs,
eV/Å, amu, fs; ``friction`` gamma in 1/fs; temperature in K.
Temperature degrees of freedom: 3N (the thermostat does not conserve momentum).
"""
from __future__ import annotations

import math

import torch

from .random import STREAM_LANGEVIN, gaussian_noise
from .units import FORCE_TO_ACCEL, KB, MVV_TO_EV


class Langevin:
    name = "langevin"
    conserves_momentum = False

    def __init__(self, dt: float, temperature: float, friction: float, seed: int):
        if not dt > 0:
            raise ValueError(f"dt must be > 0 fs, got {dt}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 K, got {temperature}")
        if not friction >= 0:
            raise ValueError(f"integrator.friction must be >= 0 (1/fs), got {friction}")
        self.dt = float(dt)
        self.temperature = float(temperature)
        self.friction = float(friction)
        self.seed = int(seed)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        return max(3 * n_atoms, 1)

    def first_half(self, positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor,
                   masses: torch.Tensor, ids: torch.Tensor, step: int) -> None:
        """B, A, O, A in place; ``step`` (the step being started) keys the noise."""
        dt = self.dt
        velocities.add_(forces / masses[:, None], alpha=0.5 * dt * FORCE_TO_ACCEL)
        positions.add_(velocities, alpha=0.5 * dt)
        c1 = math.exp(-self.friction * dt)
        c2 = math.sqrt(max(1.0 - c1 * c1, 0.0))
        # thermal velocity sqrt(kT/m) in Å/fs: kT [eV] / (m [amu] * MVV_TO_EV)
        sigma = torch.sqrt(KB * self.temperature / (masses * MVV_TO_EV))
        xi = gaussian_noise(self.seed, step, STREAM_LANGEVIN, ids, dtype=velocities.dtype)
        velocities.mul_(c1).add_(xi * (c2 * sigma)[:, None].to(velocities.dtype))
        positions.add_(velocities, alpha=0.5 * dt)

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)

    def state_dict(self) -> dict:
        return {"name": self.name, "dt": self.dt, "temperature": self.temperature,
                "friction": self.friction, "seed": self.seed}
