"""Unit strings of ShardMD's H5MD files, and the factors that bring a stored unit to the
engine's (Å, fs, Å/fs, eV/Å).

Files are written with the strings in :data:`FIELD_UNITS` and the observables' registry's:
the spelling MDAnalysis's H5MD reader translates (``MDAnalysis/coordinates/H5MD.py``,
``H5MDReader._unit_translation``), written in the unit grammar of the H5MD 1.1 units module
(space-separated symbols with signed integer powers, e.g. ``"Angstrom fs-1"``).  MDAnalysis
knows no eV-based force unit (its force units are kJ/(mol Å), kJ/(mol nm), kcal/(mol Å),
N, J/m), so forces are stored in kJ mol-1 Angstrom-1 and converted back to eV/Å by every
reader here; everything else is stored in the engine's units unchanged (per-atom energies,
field ``energy``, in eV: MDAnalysis does not read that element).

Files written before this change say ``"angstrom"``, ``"angstrom fs-1"`` and
``"eV angstrom-1"``; :func:`to_engine` reads both, so old trajectories stay readable and a
restart appends to an old file in the units that file already uses.
"""
from __future__ import annotations

import h5py
import numpy as np
from ase import units as _u

#: 1 kJ/mol and 1 kcal/mol in eV (from ase.units, like every conversion of the engine)
KJ_PER_MOL_IN_EV = _u.kJ / _u.mol
KCAL_PER_MOL_IN_EV = _u.kcal / _u.mol

#: ``unit`` attribute written on each field's ``value`` (None: dimensionless, no attribute)
FIELD_UNITS: dict[str, str | None] = {
    "position": "Angstrom",
    "image": None,
    "velocity": "Angstrom fs-1",
    "force": "kJ mol-1 Angstrom-1",
    "energy": "eV",
}
#: per-atom fields with one value per atom (shape (n,) per frame; the others are (n, 3))
SCALAR_FIELDS = ("energy",)
#: other names accepted for a field (``trajectory.fields=[energies]``: the models' output key)
FIELD_ALIASES = {"energies": "energy"}
TIME_UNIT = "fs"
LENGTH_UNIT = "Angstrom"
MASS_UNIT = "amu"
#: units of observables the writer knows by name besides the registered ones (the registry,
#: engine/observables/, declares each observable's own; these are names other writers use)
OBSERVABLE_UNITS: dict[str, str] = {
    "conserved_energy": "eV",
    "virial": "eV",
    "density": "amu Angstrom-3",
}

#: ``/h5md/modules/units``: module version 1.0 and the name of the unit system.  The H5MD
#: units module defines only "SI"; Å, eV and amu are not SI symbols, so the system is named
#: after the engine and its symbols are listed in docs/design.md ("Trajectories: units").
UNITS_MODULE_VERSION = (1, 0)
UNIT_SYSTEM = "ShardMD"

# factor that turns a value stored in the keyed unit into the engine's unit, per quantity;
# the first key of each table is what the writer uses today
_LENGTH = {"Angstrom": 1.0, "angstrom": 1.0, "A": 1.0, "nm": 10.0, "pm": 0.01}
_TIME = {"fs": 1.0, "ps": 1000.0, "ns": 1e6}
_VELOCITY = {"Angstrom fs-1": 1.0, "angstrom fs-1": 1.0, "A fs-1": 1.0,
             "Angstrom ps-1": 1e-3, "A ps-1": 1e-3, "nm ps-1": 1e-2, "pm ps-1": 1e-5}
_FORCE = {"kJ mol-1 Angstrom-1": KJ_PER_MOL_IN_EV, "kJ mol-1 A-1": KJ_PER_MOL_IN_EV,
          "eV angstrom-1": 1.0, "eV Angstrom-1": 1.0, "eV A-1": 1.0,
          "kJ mol-1 nm-1": KJ_PER_MOL_IN_EV / 10.0,
          "kcal mol-1 Angstrom-1": KCAL_PER_MOL_IN_EV, "kcal mol-1 A-1": KCAL_PER_MOL_IN_EV}
_ENERGY = {"eV": 1.0, "kJ mol-1": KJ_PER_MOL_IN_EV, "kcal mol-1": KCAL_PER_MOL_IN_EV}
#: quantity of each per-atom field and of box edges / time
QUANTITY = {"position": "length", "box": "length", "velocity": "velocity", "force": "force", "time": "time",
            "energy": "energy"}
_TABLES = {"length": _LENGTH, "time": _TIME, "velocity": _VELOCITY, "force": _FORCE, "energy": _ENERGY}


class UnknownUnitError(ValueError):
    """A ``unit`` attribute none of the readers here can convert."""


def unit_of(ds: h5py.Dataset) -> str | None:
    """The dataset's ``unit`` attribute as str (variable- or fixed-length), None if absent."""
    u = ds.attrs.get("unit")
    if u is None:
        return None
    if isinstance(u, np.ndarray):  # a (1,)-shaped attribute from other writers
        u = u.reshape(-1)[0]
    return u.decode() if isinstance(u, bytes) else str(u)


def to_engine(quantity: str, unit: str | None) -> float:
    """Factor that converts a value stored in ``unit`` to the engine's unit of ``quantity``
    ("length" Å, "time" fs, "velocity" Å/fs, "force" eV/Å, "energy" eV).  No attribute (None): the value
    is taken to be in the engine's unit already, as in files from writers that state none.
    Raises UnknownUnitError (one line, the known spellings) for anything else."""
    if unit is None:
        return 1.0
    table = _TABLES[quantity]
    try:
        return table[unit.strip()]
    except KeyError:
        raise UnknownUnitError(f"{quantity} unit {unit!r} is not one ShardMD converts (known: "
                               f"{', '.join(repr(k) for k in table)})") from None


def element_factor(group: h5py.Group, name: str) -> float:
    """to_engine factor of element ``group`` (a {step, time, value} group) of field/box ``name``;
    1.0 for dimensionless fields (image)."""
    q = QUANTITY.get(name)
    return 1.0 if q is None else to_engine(q, unit_of(group["value"]))


def write_units_module(h5md: h5py.Group) -> None:
    """Create ``h5md/modules/units`` as the H5MD 1.1 units module describes: attributes
    ``version`` (Integer[2]) and ``system`` (scalar, fixed-length ASCII string)."""
    g = h5md.require_group("modules").require_group("units")
    g.attrs["version"] = np.array(UNITS_MODULE_VERSION, dtype=np.int32)
    g.attrs["system"] = np.bytes_(UNIT_SYSTEM)


def model_stress(atoms, stress: np.ndarray) -> np.ndarray:
    """(6,) Voigt stress (eV/Å³, ASE's sign: positive = tensile) of the model alone, as an ASE
    calculator gives it, from the trajectory's ``stress`` (the system's, -(sum m v (x) v + W) / V)
    and the frame's velocities: the kinetic part (ASE's own ``include_ideal_gas`` term) is added
    back, so ``atoms.get_stress(include_ideal_gas=True)`` equals the stored value."""
    from ase.stress import full_3x3_to_voigt_6_stress

    p = atoms.get_momenta()
    return full_3x3_to_voigt_6_stress(stress + (p.T @ (p / atoms.get_masses()[:, None])) / atoms.get_volume())
