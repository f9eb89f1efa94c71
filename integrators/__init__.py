"""Integrators: one class per file, each updating arrays of owned atoms in place.

Every integrator offers ``first_half(positions, velocities, forces, masses, ids, step)``
(everything before the force call), ``second_half(velocities, forces, masses)`` (after it),
``degrees_of_freedom(n)`` and ``state_dict()``.
"""
from .langevin import Langevin
from .velocity_verlet import VelocityVerlet

INTEGRATORS = {"verlet": VelocityVerlet, "langevin": Langevin}

__all__ = ["INTEGRATORS", "Langevin", "VelocityVerlet"]
