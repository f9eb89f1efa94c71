"""Integrators: one class per file, each updating arrays of owned atoms in place.

Every integrator offers ``first_half(positions, velocities, forces, masses, ids, step)``
(everything before the force call), ``second_half(velocities, forces, masses)`` (after it),
``degrees_of_freedom(n)`` and ``state_dict()``; the stateful thermostats (nose-hoover) also
``load_state_dict(d)``.  Thermostats that need a global kinetic energy get ``sum_fn`` (a sum
over ranks of a small tensor) from the engine; they never talk to ranks themselves.  The
barostat (npt) also gets the cell and the virial from the engine (its ``cell`` and ``virial``
attributes) and returns the new cell in ``cell``.
"""
from .csvr import CSVR
from .langevin import Langevin
from .nose_hoover import NoseHoover
from .npt import NPT
from .velocity_verlet import VelocityVerlet

INTEGRATORS = {"verlet": VelocityVerlet, "langevin": Langevin, "nose-hoover": NoseHoover, "csvr": CSVR,
               "npt": NPT}

__all__ = ["CSVR", "INTEGRATORS", "NPT", "Langevin", "NoseHoover", "VelocityVerlet"]
