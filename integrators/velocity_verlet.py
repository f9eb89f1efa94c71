"""Velocity Verlet (NVE).

    v(t + dt/2) = v(t) + dt/2 * F(t)/m
    x(t + dt)   = x(t) + dt * v(t + dt/2)
    -- forces at x(t + dt) --
    v(t + dt)   = v(t + dt/2) + dt/2 * F(t + dt)/m

Units: positions Å, velocities Å/fs, forces eV/Å, masses amu, dt fs.  Works in place on
the arrays of owned atoms; knows nothing of domains or models.
Temperature degrees of freedom: 3N - 3 (total momentum is conserved and initially zero).  A
single atom has none (3N - 3 = 0: its only motion is the centre of mass's): its thermal
initial velocity is zero, the temperature reported is 0 K (dof 0, as LAMMPS's), and a velocity
given in the input is kept, conserved, and counted in the kinetic energy only.
"""
from __future__ import annotations

import torch

from . import fused
from .units import FORCE_TO_ACCEL


class VelocityVerlet:
    name = "verlet"
    conserves_momentum = True

    def __init__(self, dt: float):
        if not dt > 0:
            raise ValueError(f"dt must be > 0 fs, got {dt}")
        self.dt = float(dt)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        """3N - 3; 0 for a single atom (the module docstring)."""
        return max(3 * n_atoms - 3, 0)

    def first_half(self, positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor,
                   masses: torch.Tensor, ids: torch.Tensor, step: int) -> None:
        """Half kick and full drift, in place.  ``step`` is the step being started."""
        if fused.usable(positions, velocities, forces, masses):   # one pass, the same bits (fused.py)
            fused.scale_kick_drift(positions, velocities, forces, masses, 1.0, 0.5 * self.dt * FORCE_TO_ACCEL, self.dt)
            return
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
        positions.add_(velocities, alpha=self.dt)

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        """Half kick with the new forces, in place."""
        if fused.usable(velocities, forces, masses):
            fused.scale_kick_drift(velocities, velocities, forces, masses, 1.0, 0.5 * self.dt * FORCE_TO_ACCEL, 0.0,
                                   drift=False)
            return
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)

    def state_dict(self) -> dict:
        return {"name": self.name, "dt": self.dt}
