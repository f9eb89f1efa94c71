"""Integrators: one class per file, each updating arrays of owned atoms in place.

Every integrator offers ``first_half(positions, velocities, forces, masses, ids, step)``
(everything before the force call), ``second_half(velocities, forces, masses)`` (after it),
``degrees_of_freedom(n)`` and ``state_dict()``; the stateful thermostats (nose-hoover) also
``load_state_dict(d)``.  Thermostats that need a global kinetic energy get ``sum_fn`` (a sum
over ranks of a small tensor) from the engine; they never talk to ranks themselves.  The
barostat (npt) also gets the cell and the virial from the engine (its ``cell`` and ``virial``
attributes) and returns the new cell in ``cell``.
"""
import importlib

#: name -> (module, class); imported on first use, so that ``shardmd.integrators.units`` (the
#: constants the observables and file readers need) does not import torch with the classes
_CLASSES = {"CSVR": ("csvr", "CSVR"), "Langevin": ("langevin", "Langevin"),
            "NoseHoover": ("nose_hoover", "NoseHoover"), "NPT": ("npt", "NPT"),
            "VelocityVerlet": ("velocity_verlet", "VelocityVerlet")}
_NAMES = {"verlet": "VelocityVerlet", "langevin": "Langevin", "nose-hoover": "NoseHoover", "csvr": "CSVR",
          "npt": "NPT"}
#: the config names of the integrators, without importing them (checkpoint checks, launchers)
INTEGRATOR_NAMES = tuple(_NAMES)


def __getattr__(name):
    if name in _CLASSES:
        module, cls = _CLASSES[name]
        return getattr(importlib.import_module(f".{module}", __name__), cls)
    if name == "INTEGRATORS":
        return {key: __getattr__(cls) for key, cls in _NAMES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CSVR", "INTEGRATORS", "INTEGRATOR_NAMES", "NPT", "Langevin", "NoseHoover", "VelocityVerlet"]
