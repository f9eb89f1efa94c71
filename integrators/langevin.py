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

Conserved quantity: B and A conserve the shadow energy as velocity Verlet does; the O step
alone exchanges energy with the bath, dK_O = 1/2 sum m (v'^2 - v^2).  Each rank adds its own
atoms' dK_O to a running tensor (no reduction, no read-back in the step); :meth:`conserved_energy`
(collective: every rank calls it) folds the ranks' sums into ``energy_change`` (eV, the same on
every rank) with ``sum_fn`` and returns -energy_change, to add to K + U.  Steps replayed after a
rollback of the deferred skin check (CUDA) count twice.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .random import STREAM_LANGEVIN, gaussian_noise
from .units import FORCE_TO_ACCEL, KB, MVV_TO_EV


class Langevin:
    name = "langevin"
    conserves_momentum = False

    def __init__(self, dt: float, temperature: float, friction: float, seed: int,
                 sum_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
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
        self.sum_fn = sum_fn or (lambda t: t)
        self.energy_change = 0.0     # eV the O steps put in, all ranks, up to the last fold
        self.local_change = None     # this rank's since then: a (1,) float64 tensor on the atoms' device

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
        m = masses.double()[:, None]
        before = (m * velocities.double() ** 2).sum()
        velocities.mul_(c1).add_(xi * (c2 * sigma)[:, None].to(velocities.dtype))
        self.add_change(0.5 * MVV_TO_EV * ((m * velocities.double() ** 2).sum() - before))
        positions.add_(velocities, alpha=0.5 * dt)

    def add_change(self, de: torch.Tensor) -> None:
        """Add ``de`` (a 0-d tensor, eV) to this rank's running energy change."""
        de = de.reshape(1).double()
        self.local_change = de if self.local_change is None else self.local_change + de

    def conserved_energy(self) -> float:
        """-(energy the O steps put in), eV, over every rank; collective (module docstring)."""
        local = self.local_change if self.local_change is not None else torch.zeros(1, dtype=torch.float64)
        self.energy_change += float(self.sum_fn(local.clone()).cpu()[0])
        self.local_change = None
        return -self.energy_change

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)

    def state_dict(self) -> dict:
        """Its energy change as of the last :meth:`conserved_energy` (the engine computes the
        observables, and so folds, right before a checkpoint)."""
        return {"name": self.name, "dt": self.dt, "temperature": self.temperature,
                "friction": self.friction, "seed": self.seed, "energy_change": self.energy_change}

    def load_state_dict(self, d: dict) -> None:
        if d.get("name") == self.name:
            self.energy_change = float(d.get("energy_change", 0.0))
            self.local_change = None
