"""The MD system state: per-atom arrays of the atoms a rank owns, plus the global cell.

Units: positions Å (wrapped into the cell on periodic axes at every neighbour rebuild, never
between), images int (so ``positions + images @ cell`` is the unwrapped position, always
valid), velocities Å/fs, forces eV/Å, masses amu, numbers = atomic numbers, ids = global atom
ids (0-based, unique, stable for the whole run), time fs.

A model's declared inputs travel with the atoms too (engine/run/model_inputs.py): ``inputs``,
per-atom arrays by name ((n,) or (n, F), e.g. ``charges`` in e), moved, sorted, gathered and
checkpointed with the atoms; ``system_inputs``, per-system values by name ((1, *F), e.g. the
total ``charge`` in e, the ``spin`` multiplicity), the same on every rank.

Constraints of the input travel with the State as a whole (not per atom): ``fixed_ids``, the
global ids ASE ``FixAtoms`` hold fixed, and ``other_constraints``, the class names of any other
ASE constraint (refused by the Simulation, engine/run/constraints.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from shardmd.domain.cell import unwrap, volume, wrap
from shardmd.integrators.units import ASE_VEL_TO_A_PER_FS

#: names of the per-atom arrays; everything that moves with an atom (migration, sorting,
#: checkpoints) iterates over this tuple.
PER_ATOM = ("positions", "velocities", "forces", "masses", "numbers", "ids", "images")
#: prefix of a model input's name among the per-atom arrays (migration, gathers, checkpoints)
INPUT = "input:"


@dataclass
class State:
    positions: torch.Tensor    # (n, 3) Å
    velocities: torch.Tensor   # (n, 3) Å/fs
    forces: torch.Tensor       # (n, 3) eV/Å
    masses: torch.Tensor       # (n,) amu
    numbers: torch.Tensor      # (n,) int64 atomic numbers
    ids: torch.Tensor          # (n,) int64 global ids
    images: torch.Tensor       # (n, 3) int32 image flags
    cell: torch.Tensor         # (3, 3) Å, rows are lattice vectors
    pbc: torch.Tensor          # (3,) bool
    step: int = 0
    time: float = 0.0          # fs
    fixed_ids: torch.Tensor | None = None   # (k,) int64 global ids held fixed by the input's FixAtoms
    other_constraints: tuple = ()           # class names of the input's other ASE constraints
    inputs: dict = field(default_factory=dict)          # name -> (n, *F) per-atom model inputs
    system_inputs: dict = field(default_factory=dict)   # name -> (1, *F) per-system model inputs

    @property
    def n_atoms(self) -> int:
        return int(self.positions.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.positions.dtype

    @property
    def device(self) -> torch.device:
        return self.positions.device

    def volume(self) -> float:
        return float(volume(self.cell))

    def to(self, device) -> "State":
        """This state on ``device`` (itself where it is there already): a state given through the
        API or built from ``ase.Atoms`` on the CPU runs where the configuration says."""
        device = torch.device(device)
        if self.device == device:
            return self
        move = lambda t: t.to(device) if torch.is_tensor(t) else t  # noqa: E731
        return replace(self, **{k: move(getattr(self, k)) for k in (*PER_ATOM, "cell", "pbc", "fixed_ids")},
                       inputs={k: move(v) for k, v in self.inputs.items()},
                       system_inputs={k: move(v) for k, v in self.system_inputs.items()})

    def unwrapped_positions(self) -> torch.Tensor:
        """(n, 3) Å, continuous trajectories across periodic boundaries."""
        return unwrap(self.positions, self.cell, self.images)

    def wrap(self) -> None:
        """Fold positions into the cell on periodic axes, updating image flags."""
        self.positions, self.images = wrap(self.positions, self.cell, self.pbc, self.images)

    def permute(self, order: torch.Tensor) -> None:
        """Reorder every per-atom array by index tensor ``order`` (n,) (int64 or int32).
        ``index_select``, not ``x[order]``: the same rows, 2-4x faster on the CPU at thousands
        of atoms (a small system's rebuilds)."""
        for name in PER_ATOM:
            setattr(self, name, torch.index_select(getattr(self, name), 0, order))
        self.inputs = {k: torch.index_select(v, 0, order) for k, v in self.inputs.items()}

    def per_atom(self) -> dict:
        """Every per-atom array by name: :data:`PER_ATOM`, then the model's inputs as
        ``input:<name>`` (what migration moves)."""
        return {**{k: getattr(self, k) for k in PER_ATOM}, **{INPUT + k: v for k, v in self.inputs.items()}}

    def set_per_atom(self, arrays: dict) -> None:
        """The arrays of :meth:`per_atom` (after a migration) back into this State."""
        for k in PER_ATOM:
            setattr(self, k, arrays[k])
        self.inputs = {k[len(INPUT):]: v for k, v in arrays.items() if k.startswith(INPUT)}

    # -- ASE interop ------------------------------------------------------------------
    @classmethod
    def from_atoms(cls, atoms, dtype=torch.float64, device="cpu", ids=None) -> "State":
        """State from ``ase.Atoms`` (ASE velocities are converted to Å/fs).  Its ``FixAtoms`` become
        ``fixed_ids`` (ids of the indexed atoms); other constraints are named in
        ``other_constraints`` (a Simulation refuses them)."""
        from shardmd.engine.run.constraints import ase_constraints

        n = len(atoms)
        fixed, other = ase_constraints(atoms)
        id_arr = np.arange(n) if ids is None else np.asarray(ids)
        t = lambda a, dt=dtype: torch.as_tensor(np.asarray(a), dtype=dt, device=device).contiguous()  # noqa: E731
        cell = np.asarray(atoms.cell.array, dtype=np.float64)
        return cls(
            positions=t(atoms.positions),
            velocities=t(atoms.get_velocities() * ASE_VEL_TO_A_PER_FS),
            forces=torch.zeros(n, 3, dtype=dtype, device=device),
            masses=t(atoms.get_masses()),
            numbers=t(atoms.numbers, torch.int64),
            ids=t(id_arr, torch.int64),
            images=torch.zeros(n, 3, dtype=torch.int32, device=device),
            cell=t(cell),
            pbc=torch.as_tensor(np.asarray(atoms.pbc, dtype=bool), device=device),
            fixed_ids=torch.as_tensor(id_arr[fixed], dtype=torch.int64) if fixed.size else None,
            other_constraints=other,
        )

    def to_atoms(self, unwrapped: bool = False):
        """``ase.Atoms`` of the atoms this State holds, in id order, with velocities in ASE units
        and forces attached.  Rank-local: under MPI a run's ``sim.state`` holds this rank's own
        atoms only; ``Simulation.atoms()`` gathers every atom (on rank 0)."""
        arrays = {k: getattr(self, k).detach().cpu().numpy()
                  for k in ("positions", "images", "velocities", "forces", "masses", "numbers", "ids")}
        return atoms_from_arrays(arrays, self.cell, self.pbc, unwrapped=unwrapped)


def atoms_from_arrays(a: dict, cell, pbc, unwrapped: bool = False):
    """``ase.Atoms`` in id order from per-atom numpy arrays (positions, images, velocities,
    forces, masses, numbers, ids; any order) and the cell (Å) and pbc."""
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator

    order = np.argsort(a["ids"], kind="stable")
    cellnp = np.asarray(cell.detach().cpu().numpy() if torch.is_tensor(cell) else cell, dtype=np.float64)
    pos = np.asarray(a["positions"], dtype=np.float64)
    if unwrapped:
        pos = pos + np.asarray(a["images"], dtype=np.float64) @ cellnp
    atoms = Atoms(numbers=np.asarray(a["numbers"])[order], positions=pos[order], cell=cellnp,
                  pbc=np.asarray(pbc.cpu().numpy() if torch.is_tensor(pbc) else pbc, dtype=bool),
                  masses=np.asarray(a["masses"], dtype=np.float64)[order])
    atoms.set_velocities(np.asarray(a["velocities"], dtype=np.float64)[order] / ASE_VEL_TO_A_PER_FS)
    atoms.arrays["image"] = np.asarray(a["images"])[order]
    atoms.calc = SinglePointCalculator(atoms, forces=np.asarray(a["forces"], dtype=np.float64)[order])
    return atoms
