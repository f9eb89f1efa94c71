"""What an observable's function is handed: a read-only view of one rank's part of the state.

Per-atom arrays are this rank's own atoms (on one domain: all of them), as read-only numpy
copies made when first read (float64 for positions, velocities, forces and masses):

=================  ==========  ===========================================================
positions          (n, 3) Å    wrapped into the cell at neighbour rebuilds; with ``images``
                               the unwrapped position is ``positions + images @ cell``
images             (n, 3) int  image flags
velocities         (n, 3)      Å/fs
forces             (n, 3)      eV/Å
masses             (n,)        amu
numbers, ids       (n,) int    atomic numbers, global atom ids (0-based, the input's order)
=================  ==========  ===========================================================

System-wide (the same on every rank): ``cell`` (3, 3) Å (rows are the lattice vectors),
``pbc`` (3,) bool, ``volume`` Å^3, ``potential_energy`` eV (the system's: use it with
``reduce="none"``, never summed), ``virial`` (3, 3) eV or None (a model without one),
``step``, ``time`` fs, ``frame_interval`` fs (the time between trajectory frames,
trajectory.every x dt; 0 without frames), ``dof`` (the integrator's degrees of freedom),
``n_atoms`` (the system's), ``rank`` and ``n_ranks``, ``coupling_energy`` eV (the energy the
thermostat or barostat exchanged with the system, the integrator's; 0 for verlet), and
``group(name)``, which of this rank's atoms are in the group ``groups.<name>`` (a bool mask);
``values``: the reduced values of the observables
computed before this one (a ``derived`` observable reads its ``depends`` there).
``tensor(name)`` gives an array as the run's own torch tensor (no copy, on the run's device:
for GPU runs; never modify it).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

#: per-atom arrays converted to float64
_FLOAT = ("positions", "velocities", "forces", "masses")
PER_ATOM = ("positions", "images", "velocities", "forces", "masses", "numbers", "ids")


class StateView:
    """Read-only view of one rank's state at one step (see the module docstring)."""

    __slots__ = ("_tensors", "_arrays", "_values", "potential_energy", "step", "time", "dof", "n_atoms", "rank",
                 "n_ranks", "frame_interval", "coupling_energy", "_groups")

    def __init__(self, tensors: Mapping[str, Any], *, potential_energy: float, step: int, time: float, dof: int,
                 n_atoms: int, rank: int = 0, n_ranks: int = 1, values: Mapping[str, Any] | None = None,
                 frame_interval: float = 0.0, coupling_energy: float = 0.0,
                 groups: Mapping[str, Any] | None = None):
        self._tensors = dict(tensors)
        self._arrays: dict[str, np.ndarray] = {}
        self._values = values if values is not None else {}
        self.potential_energy = float(potential_energy)
        self.step, self.time, self.dof = int(step), float(time), int(dof)
        self.n_atoms, self.rank, self.n_ranks = int(n_atoms), int(rank), int(n_ranks)
        self.frame_interval = float(frame_interval)
        self.coupling_energy = float(coupling_energy)
        self._groups = dict(groups or {})

    def tensor(self, name: str):
        """The run's own tensor of ``name`` (a per-atom array, ``cell``, ``pbc`` or ``virial``); do not modify."""
        if name not in self._tensors:
            raise KeyError(f"the state view has no {name!r}; it has {', '.join(self._tensors)}")
        return self._tensors[name]

    def _array(self, name: str) -> np.ndarray | None:
        a = self._arrays.get(name)
        if a is None:
            t = self._tensors.get(name)
            if t is None:
                return None
            a = np.array(t.detach().cpu().numpy() if hasattr(t, "detach") else t,
                         dtype=np.float64 if name in _FLOAT or name in ("cell", "virial") else None, copy=True)
            a.setflags(write=False)
            self._arrays[name] = a
        return a

    positions = property(lambda self: self._array("positions"), doc="(n, 3) Å, this rank's atoms")
    images = property(lambda self: self._array("images"), doc="(n, 3) image flags")
    velocities = property(lambda self: self._array("velocities"), doc="(n, 3) Å/fs")
    forces = property(lambda self: self._array("forces"), doc="(n, 3) eV/Å")
    masses = property(lambda self: self._array("masses"), doc="(n,) amu")
    numbers = property(lambda self: self._array("numbers"), doc="(n,) atomic numbers")
    ids = property(lambda self: self._array("ids"), doc="(n,) global atom ids")
    cell = property(lambda self: self._array("cell"), doc="(3, 3) Å, rows are the lattice vectors")
    pbc = property(lambda self: self._array("pbc"), doc="(3,) periodic axes")
    virial = property(lambda self: self._array("virial"), doc="(3, 3) eV, the model's (None without one)")

    def group(self, name: str) -> np.ndarray:
        """(n,) bool: which of this rank's atoms are in the group ``name`` (``groups.<name>``)."""
        ids = self._groups.get(name)
        if ids is None:
            raise KeyError(f"no group {name!r}; the run's groups: {', '.join(self._groups) or 'none'} (groups.<name>)")
        return np.isin(self.ids, np.asarray(ids))

    @property
    def volume(self) -> float:
        return float(abs(np.linalg.det(self.cell)))

    @property
    def n_local(self) -> int:
        """Atoms of this rank."""
        return int(self._tensors["positions"].shape[0])

    @property
    def values(self) -> Mapping[str, Any]:
        """Reduced values of the observables computed so far (read-only)."""
        return MappingProxyType(self._values)

    def __setattr__(self, name, value):
        if name in StateView.__slots__ and not hasattr(self, name):
            object.__setattr__(self, name, value)   # set once, in __init__
        else:
            raise AttributeError(f"the state view is read-only (cannot set {name!r})")
