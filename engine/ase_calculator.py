"""An ASE calculator for the engine's models, decomposed over MPI ranks when run under mpiexec.

    from shardmd.engine.ase_calculator import ShardMDCalculator
    atoms.calc = ShardMDCalculator(model="lj")                    # defaults of configs/model/lj.yaml
    atoms.calc = ShardMDCalculator(model="mace", checkpoint="my.model", precision="float32")
    atoms.calc = ShardMDCalculator(model="lj", epsilon={"Ar": 0.0104}, cutoff=8.0)

Properties: energy and free_energy (eV), forces (eV/Å), stress (eV/Å^3, Voigt xx yy zz yz xz
xy, ASE's sign: positive = tensile), energies (per atom, eV).  ASE's caching applies: a
call with unchanged atoms returns the stored results; changes of positions, cell, pbc,
atom count or species trigger a new evaluation.

Under ``mpiexec -n K python script.py`` the calculator splits the system into K domains over
the engine's process group and returns the full, identical results on every rank.  Rank 0's
atoms are broadcast to all ranks before each evaluation, so every rank evaluates the same
positions even if the script's ranks drifted apart by rounding.

ASE's ``ase.parallel.world`` decides once, at first use, whether it is MPI; if it was first
used before mpi4py was imported it stays a serial stub and every rank writes the same logs
and trajectories.  Constructing this calculator imports mpi4py and repairs a stub world, so
the rule for users is: create the calculator (or ``import mpi4py``) before the dynamics,
optimisers and trajectory writers that should write once.
"""
from __future__ import annotations

import atexit
import sys

import numpy as np
import torch
from ase.calculators.calculator import Calculator, all_changes

from shardmd.domain.comm import Comm, init_comm, shutdown, under_launcher
from shardmd.domain.distributed_model import DistributedModel
from shardmd.models import build_model

from .config import compose_config, to_container
from .domains import Decomposition
from .errors import UserError
from .health import check_inputs
from .state import State

_COMM: Comm | None = None


def job_comm(device: str = "cpu") -> Comm:
    """The process group of this job (created once; a single-rank Comm without a launcher)."""
    global _COMM
    if _COMM is None:
        _COMM = init_comm(device) if under_launcher() else Comm(device=torch.device(device))
        if _COMM.size > 1:
            fix_ase_world()
            # a script never ends the group itself: tear it down (and join gloo's worker
            # threads) while the interpreter is still whole, see domain/comm.py shutdown
            atexit.register(_shutdown_at_exit, _COMM)
    return _COMM


def _shutdown_at_exit(comm: Comm) -> None:
    """After a clean run only: after an uncaught exception (sys.last_value is set) the barrier
    could wait for a rank that failed; the launcher ends the job then, as before."""
    if getattr(sys, "last_value", None) is None:
        shutdown(comm)


def fix_ase_world() -> bool:
    """Make ``ase.parallel.world`` the MPI world if it was frozen as a serial stub.
    Returns True if it had to be repaired."""
    import ase.parallel as ap

    comm = getattr(ap.world, "comm", None)
    if comm is None:  # not decided yet: mpi4py is imported now, so it will pick MPI
        return False
    if isinstance(comm, ap.DummyMPI):
        ap.world.comm = ap.MPI4PY()
        return True
    return False


def _model_overrides(model: str, checkpoint, kwargs: dict) -> list[str]:
    out = [f"model={model}"]
    if checkpoint is not None:
        out.append(f"model.checkpoint={checkpoint}")
    for k, v in kwargs.items():
        if isinstance(v, dict):
            out += [f"model.{k}.{kk}={vv}" for kk, vv in v.items()]
        else:
            out.append(f"model.{k}={v}")
    return out


class ShardMDCalculator(Calculator):
    implemented_properties = ["energy", "free_energy", "forces", "stress", "energies"]

    def __init__(self, model: str = "lj", checkpoint=None, precision: str = "float64", device: str = "cpu",
                 comm: Comm | None = None, **model_kwargs):
        super().__init__()
        cfg = compose_config([*_model_overrides(model, checkpoint, model_kwargs), f"precision={precision}",
                              f"device={device}"])
        self.dtype = torch.float64 if precision == "float64" else torch.float32
        self.comm = comm or job_comm(device)
        self.device = self.comm.device if self.comm.size > 1 else torch.device(device)
        self.model = build_model(to_container(cfg.model), self.dtype, self.device)
        self.dmodel = DistributedModel(self.model)
        self.model_config = to_container(cfg.model)

    def _shared_input(self, atoms):
        data = (np.asarray(atoms.positions, dtype=np.float64), np.asarray(atoms.cell.array, dtype=np.float64),
                np.asarray(atoms.pbc, dtype=bool), np.asarray(atoms.numbers), np.asarray(atoms.get_masses()))
        if self.comm.size > 1:
            data = self.comm.broadcast_object(data)
        return data

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        pos, cell, pbc, numbers, masses = self._shared_input(self.atoms)
        n = len(numbers)
        t = lambda a, dt=self.dtype: torch.as_tensor(a).to(dtype=dt, device=self.device).contiguous()  # noqa: E731
        state = State(positions=t(pos), velocities=torch.zeros(n, 3, dtype=self.dtype, device=self.device),
                      forces=torch.zeros(n, 3, dtype=self.dtype, device=self.device), masses=t(masses),
                      numbers=t(numbers, torch.int64), ids=torch.arange(n, device=self.device),
                      images=torch.zeros(n, 3, dtype=torch.int32, device=self.device), cell=t(cell),
                      pbc=torch.as_tensor(pbc, device=self.device))
        if n == 0:
            raise ValueError("ShardMDCalculator: the Atoms object holds no atoms")
        try:   # NaN positions would be left out of the forces silently; a singular cell breaks the frame
            check_inputs(state)
        except UserError as exc:
            raise ValueError(f"ShardMDCalculator: {exc.one_line()}") from None
        if hasattr(self.model, "check_species"):
            self.model.check_species(state.numbers)
        dec = Decomposition(self.comm, self.model.cutoff, 0.0)
        state = dec.distribute(state)
        dec.rebuild(state)
        out = self.dmodel.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)
        state.forces = out["forces"].to(self.dtype)
        state.extras["energies"] = out["energies"].to(self.dtype)
        full = dec.allgather(state, ("forces", "energies"))
        energy = float(out["energy"])
        virial = out["virial"].double().cpu().numpy()
        self.results["energy"] = self.results["free_energy"] = energy
        self.results["forces"] = full["forces"].astype(np.float64)
        self.results["energies"] = full["energies"].astype(np.float64)
        if np.all(pbc):
            stress = -virial / abs(np.linalg.det(cell))
            self.results["stress"] = np.array([stress[0, 0], stress[1, 1], stress[2, 2],
                                               stress[1, 2], stress[0, 2], stress[0, 1]])
