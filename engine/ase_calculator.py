"""An ASE calculator for the engine's models, decomposed over MPI ranks when run under mpiexec.

    from shardmd.engine.ase_calculator import ShardMDCalculator
    atoms.calc = ShardMDCalculator(model="lj")                    # defaults of configs/model/lj.yaml
    atoms.calc = ShardMDCalculator(model="mace", checkpoint="my.model", precision="float32")
    atoms.calc = ShardMDCalculator(model="lj", epsilon={"Ar": 0.0104}, cutoff=8.0, skin=1.0)
    atoms.calc = ShardMDCalculator(model="py:mymodel:make", features=16)   # the CLI's routes (docs/byo.md)
    atoms.calc = ShardMDCalculator(model="nequip", species=["Cu", "Ni"], seed=7)

Properties: energy and free_energy (eV), forces (eV/Å), stress (eV/Å^3, Voigt xx yy zz yz xz
xy, ASE's sign: positive = tensile; only with all axes periodic), energies (per atom, eV).
ASE's caching applies: a call with unchanged atoms returns the stored results; changes of
positions, cell, pbc, atom count or species trigger a new evaluation.

Parameters (``calc.parameters``, ``calc.todict()``; what ``ase.io.Trajectory`` and ``ase.db``
store) record the model completely, so ``ShardMDCalculator(**calc.todict())`` makes the same
calculator: model (lj | mace, a registered name such as nequip, or ``py:module:factory`` as on
the command line: the keyword arguments are then the factory's), every model key of
configs/model/<model>.yaml after the keyword arguments were applied (a dict adds to the
default one, as ``model.epsilon.Kr=...`` does on the command line: ``epsilon={"Kr": ...}``
keeps Ar's), for MACE the model file as an absolute path and ``checkpoint_sha256`` (given
back, the file must have that hash) and the readout ``head`` used (a multi-head model's
choice: its only or default head when none was given), precision, device, skin (Å) and
domains (the rank count the results came from: a record only, ignored on input; the ranks
are the launcher's). ``calc.set(key=value)`` rebuilds the model and resets.

Neighbour lists: the decomposition, the atoms' ghosts and the neighbour list (cutoff + skin)
are kept between calls and rebuilt, as in the engine's MD loop, when an atom moved more than
skin/2 since the last build (decided by all ranks together), and built afresh when the
count, species, cell or pbc changed (exact comparison), the positions are not finite, or
after ``reset()``. Results equal a fresh build's to round-off. ``calc.stats`` counts fresh
builds, list rebuilds and calls that reused the list.

Under ``mpiexec -n K python script.py`` the calculator splits the system into K domains over
the engine's process group and returns the full, identical results on every rank; as the
engine does under MPI, each rank then runs torch on one thread (``torch.set_num_threads``
afterwards overrides it).  Rank 0's
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
import math
import sys
import threading

import numpy as np
import torch
from ase.calculators.calculator import Calculator, Parameters, all_changes, equal
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from shardmd.domain.comm import Comm, init_comm, shutdown, under_launcher
from shardmd.domain.distributed_model import DistributedModel
from shardmd.engine.config.compose import compose_config, to_container, validate
from shardmd.engine.config.expressions import stored_config
from shardmd.engine.errors import UserError
from shardmd.engine.run import model_inputs
from shardmd.engine.run.health import check_inputs
from shardmd.engine.run.rank_domain import RankDomain
from shardmd.engine.run.state import State
from shardmd.models import build_model

_COMM: Comm | None = None


def job_comm(device: str = "cpu") -> Comm:
    """The process group of this job (created once; a single-rank Comm without a launcher)."""
    global _COMM
    if _COMM is None:
        _COMM = init_comm(device) if under_launcher() else Comm(device=torch.device(device))
        if _COMM.size > 1:
            fix_ase_world()
            # the engine's rule for ranks (config `threads`: 1 under MPI): ranks x all cores
            # oversubscribe, and then each of the rebuild's 3x3 solves waits for MKL's threads
            # (tests/mpi/ase_cases.py on 2 ranks, 2 cores: 50 s, 16 s with one thread a rank)
            torch.set_num_threads(1)
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


#: parameters that record a calculation without choosing anything (accepted back, see the docstring)
RECORD_ONLY = ("domains", "checkpoint_sha256")
#: parameters that do not belong to one model
GENERAL = ("model", "precision", "device", "skin")


def _model_config(model: str, precision: str, device: str, checkpoint, model_kwargs: dict) -> tuple[dict, dict]:
    """The model's config node (configs/model/<model>.yaml) with the keyword arguments merged in
    (a dict adds to the default dict, as ``model.epsilon.Kr=...`` does on the command line):
    (resolved, as recorded).  A keyword's string written as an interpolation (``"${oc.env:VAR}"``)
    is resolved for the model and recorded as written, as the engine stores its config
    (engine/config/expressions.py); a factory's own arguments (``py:`` routes) are passed as given."""
    try:
        cfg = compose_config([f"model={model}", f"precision={precision}", f"device={device}"])
        given = dict(model_kwargs)
        if checkpoint is not None:
            given["checkpoint"] = str(checkpoint)
        if _open(cfg):   # the factory's own arguments (as model.<key>=... on the command line)
            return {**to_container(cfg.model), **given}, {**stored_config(cfg)["model"], **given}
        keys = [k for k in cfg.model.keys() if k != "name"]
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise TypeError(f"ShardMDCalculator: model {model!r} has no parameter {', '.join(unknown)}; its "
                            f"parameters: {', '.join(keys)}")
        with open_dict(cfg):
            cfg = OmegaConf.merge(cfg, {"model": given})
        validate(cfg)
    except UserError as exc:
        raise ValueError(f"ShardMDCalculator: {exc.one_line()}") from None
    except OmegaConfBaseException as exc:   # a value of the wrong type
        raise ValueError(f"ShardMDCalculator: {' '.join(str(exc).split())}") from None
    return to_container(cfg.model), stored_config(cfg)["model"]


def _expression(v) -> bool:
    return isinstance(v, str) and "${" in v


def _open(cfg) -> bool:
    """Whether the composed model is the open choice (``py:module:factory`` or a registered name
    beside ShardMD's own): its keyword arguments are the factory's, checked by the factory."""
    from shardmd.engine.config.schema import GROUPS

    return str(cfg.model.name) not in GROUPS["model"]


class ShardMDCalculator(Calculator):
    implemented_properties = ["energy", "free_energy", "forces", "stress", "energies"]
    #: none: ``todict()`` leaves out only defaults, and the record should be complete
    default_parameters: dict = {}
    nolabel = True

    def __init__(self, model: str = "lj", checkpoint=None, precision: str = "float64", device: str = "cpu",
                 skin: float = 1.0, comm: Comm | None = None, domains=None, checkpoint_sha256: str | None = None,
                 **model_kwargs):
        # one evaluation at a time: threads sharing a calculator take turns (its lists, state and
        # results are one set); reentrant, as get_property calls calculate
        self._lock = threading.RLock()
        super().__init__()
        self.comm = comm or job_comm(device)
        self.stats = {"builds": 0, "rebuilds": 0, "reuses": 0}
        self._forget()
        self._setup(model=model, checkpoint=checkpoint, precision=precision, device=device, skin=skin,
                    checkpoint_sha256=checkpoint_sha256, **model_kwargs)

    def _get_name(self) -> str:
        return "shardmd"

    def _setup(self, model, precision, device, skin, checkpoint=None, checkpoint_sha256=None, domains=None,
               **model_kwargs) -> None:
        """Build the model and the parameters that record it (domains: a record, ignored)."""
        if isinstance(skin, bool) or not isinstance(skin, (int, float)) or not (math.isfinite(skin) and skin >= 0):
            raise ValueError(f"ShardMDCalculator: skin={skin!r}: give a distance >= 0 in Å")
        mcfg, shown = _model_config(model, precision, device, checkpoint, model_kwargs)
        dtype = torch.float64 if precision == "float64" else torch.float32
        dev = self.comm.device if self.comm.size > 1 else torch.device(device)
        from shardmd.engine.config.terms import with_term_defaults

        built = build_model(with_term_defaults(mcfg), dtype, dev)
        record = {"model": mcfg["name"], **{k: v for k, v in shown.items() if k != "name"}}
        if hasattr(built, "identity") and hasattr(built, "path"):   # a model file: where it is and what it holds
            sha = built.identity()
            if checkpoint_sha256 is not None and checkpoint_sha256 != sha:
                raise ValueError(f"ShardMDCalculator: {built.path} has SHA-256 {sha}, not the "
                                 f"checkpoint_sha256={checkpoint_sha256} given; give the file that was used")
            if not _expression(shown.get("checkpoint")):   # an expression is recorded as written
                record["checkpoint"] = str(built.path.resolve())
            record["checkpoint_sha256"] = sha
        if isinstance(getattr(built, "head", None), str):   # the readout head used (a multi-head model's choice)
            record["head"] = built.head
        record.update(precision=precision, device=str(dev), skin=float(skin), domains=self.comm.size)
        # nothing is changed before everything above succeeded (a failed set() leaves the old model)
        from shardmd.engine.run.stages import (
            wrap_model,  # the engine's rule: a model's own spec, else the MPNN preset
        )

        dmodel = built if isinstance(built, DistributedModel) else wrap_model(built)
        self.dtype, self.device, self.model, self.model_config, self.skin = dtype, dev, dmodel.model, mcfg, float(skin)
        self.dmodel = dmodel
        self.parameters = Parameters(record)
        self.reset()

    # -- copies and threads ------------------------------------------------------------
    def __reduce__(self):
        """Pickle and deepcopy by the record (``todict()``): the copy builds the model afresh
        (a model file must still have its ``checkpoint_sha256``); atoms and results are not
        carried.  One process only: ranks of a decomposition cannot be copied."""
        if self.comm.size > 1:
            raise TypeError(f"ShardMDCalculator on {self.comm.size} ranks cannot be pickled or copied: make one "
                            "per process with ShardMDCalculator(**calc.todict())")
        return (_rebuild, (dict(self.parameters),))

    def get_property(self, name, atoms=None, allow_calculation=True):
        with self._lock:   # the check of the atoms, the evaluation and the read of the results together
            return super().get_property(name, atoms, allow_calculation)

    def set(self, **kwargs) -> dict:
        with self._lock:
            return self._set(**kwargs)

    def _set(self, **kwargs) -> dict:
        """ASE's ``set``: changed parameters rebuild the model and reset; returns the changed ones."""
        if not hasattr(self, "model"):   # Calculator.__init__'s own call, before the model exists
            return super().set(**kwargs)
        changed = {k: v for k, v in kwargs.items()
                   if k != "domains" and (k not in self.parameters or not equal(v, self.parameters[k]))}
        if changed:
            new = {k: v for k, v in self.parameters.items() if k not in RECORD_ONLY}
            if kwargs.get("model", new["model"]) != new["model"]:   # another model: its own defaults
                new = {k: new[k] for k in GENERAL}
            if "checkpoint" in kwargs and "checkpoint_sha256" not in kwargs:
                kwargs = {**kwargs, "checkpoint_sha256": None}
            self._setup(**{**new, **kwargs})
        return changed

    def reset(self) -> None:
        """Forget results, atoms and the decomposition: the next call builds everything afresh."""
        with self._lock:
            super().reset()
            self._forget()

    def _forget(self) -> None:
        self._dec = self._state = self._system = self._fold = None

    # -- evaluation ----------------------------------------------------------------------
    def _shared_input(self, atoms):
        try:   # the inputs the model declares (charges, total charge: engine/run/model_inputs.py)
            inputs = model_inputs.of_atoms(atoms, self.dmodel)
        except UserError as exc:
            raise ValueError(f"ShardMDCalculator: {exc.one_line()}") from None
        data = (np.asarray(atoms.positions, dtype=np.float64), np.asarray(atoms.cell.array, dtype=np.float64),
                np.asarray(atoms.pbc, dtype=bool), np.asarray(atoms.numbers), np.asarray(atoms.get_masses()), inputs)
        if self.comm.size > 1:
            data = self.comm.broadcast_object(data)
        return data

    def _same_system(self, cell, pbc, numbers, inputs) -> bool:
        """Exact comparison with the last fresh build (identical inputs on every rank: so is this)."""
        c0, p0, z0, q0 = self._system
        return (numbers.shape == z0.shape and np.array_equal(numbers, z0) and np.array_equal(cell, c0)
                and np.array_equal(pbc, p0) and q0.keys() == inputs.keys()
                and all(np.array_equal(v, q0[k]) for k, v in inputs.items()))

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        with self._lock:
            self._calculate(atoms, properties, system_changes)

    def _calculate(self, atoms, properties, system_changes) -> None:
        super().calculate(atoms, properties, system_changes)
        pos, cell, pbc, numbers, masses, inputs = self._shared_input(self.atoms)
        try:
            if self._state is None or not np.isfinite(pos).all() or not self._same_system(cell, pbc, numbers, inputs):
                self._build(pos, cell, pbc, numbers, masses, inputs)
            else:
                self._move(pos)
            self._evaluate(cell, pbc)
        except BaseException:   # a half-updated decomposition is never used again
            self._forget()
            raise

    def _tensor(self, a, dtype=None) -> torch.Tensor:
        """A private copy on the calculator's device (never a view of the caller's arrays)."""
        return torch.tensor(np.asarray(a), dtype=dtype or self.dtype, device=self.device)

    def _build(self, pos, cell, pbc, numbers, masses, inputs=None) -> None:
        """A fresh decomposition, ghosts and neighbour list (as the engine's start of a run)."""
        self._forget()
        n = len(numbers)
        if n == 0:
            raise ValueError("ShardMDCalculator: the Atoms object holds no atoms")
        zeros = torch.zeros(n, 3, dtype=self.dtype, device=self.device)
        state = State(positions=self._tensor(pos), velocities=zeros, forces=zeros.clone(), masses=self._tensor(masses),
                      numbers=self._tensor(numbers, torch.int64), ids=torch.arange(n, device=self.device),
                      images=torch.zeros(n, 3, dtype=torch.int32, device=self.device), cell=self._tensor(cell),
                      pbc=torch.as_tensor(np.array(pbc, dtype=bool), device=self.device))
        points = set(self.dmodel.point_inputs)
        state.inputs = {k: self._tensor(v) for k, v in (inputs or {}).items() if k in points}
        state.system_inputs = {k: self._tensor(v) for k, v in (inputs or {}).items() if k not in points}
        try:   # NaN positions would be left out of the forces silently; a singular cell breaks the frame
            check_inputs(state)
            model_inputs.check(state, "the Atoms object")
        except UserError as exc:
            raise ValueError(f"ShardMDCalculator: {exc.one_line()}") from None
        if hasattr(self.model, "check_species"):
            self.model.check_species(state.numbers)
        dec = RankDomain(self.comm, self.model.cutoff, self.skin)
        state = dec.distribute(state)
        dec.rebuild(state)
        self._dec, self._state = dec, state
        self._folded()
        self._system = (cell.copy(), np.array(pbc, dtype=bool), np.array(numbers), dict(inputs or {}))
        self.stats["builds"] += 1

    def _move(self, pos) -> None:
        """New positions for the kept decomposition: this rank's atoms (by id) at the image the
        last rebuild folded them into; the list is rebuilt if any atom moved more than skin/2."""
        s, dec = self._state, self._dec
        x = torch.from_numpy(pos).to(device=self.device, dtype=self.dtype)[s.ids]   # indexing copies
        s.positions = x - self._fold   # positions + images @ cell = x
        if dec.needs_rebuild(s):   # collective: one all-reduce of the skin flag
            dec.rebuild(s)
            self._folded()
            self.stats["rebuilds"] += 1
        else:
            dec.refresh(s)
            self.stats["reuses"] += 1

    def _folded(self) -> None:
        """``images @ cell`` of this rank's atoms after a (re)build: what the fold subtracted. A
        broadcast sum, not a matmul: MKL's threads for a (n, 3) @ (3, 3) product cost ms when
        the cores are busy (measured 3.7 ms mean per call on 2 loaded cores; this: 0.03 ms)."""
        s = self._state
        self._fold = (s.images.to(self.dtype).unsqueeze(2) * s.cell).sum(1)

    def _evaluate(self, cell, pbc) -> None:
        dec, state = self._dec, self._state
        out = self.dmodel.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current,
                                  extras=model_inputs.extras(state))
        # energies and virial are optional (models/contract.py): without them no per-atom
        # energies, and no stress (ASE then says the property is not available)
        local = {k: v.detach().cpu() for k, v in (("ids", state.ids), ("forces", out["forces"]),
                                                   ("energies", out.get("energies"))) if v is not None}
        parts = self.comm.all_gather_object(local) if self.comm.size > 1 else [local]
        ids = torch.cat([p["ids"] for p in parts]).numpy()
        forces = np.empty((dec.n_global, 3))
        forces[ids] = torch.cat([p["forces"] for p in parts]).double().numpy()     # ids = ASE's indices
        self.results["energy"] = self.results["free_energy"] = float(out["energy"])
        self.results["forces"] = forces
        if "energies" in local:
            energies = np.empty(dec.n_global)
            energies[ids] = torch.cat([p["energies"] for p in parts]).double().numpy()
            self.results["energies"] = energies
        if np.all(pbc) and out.get("virial") is not None:
            virial = out["virial"].double().cpu().numpy()
            stress = -virial / abs(np.linalg.det(cell))
            self.results["stress"] = np.array([stress[0, 0], stress[1, 1], stress[2, 2],
                                               stress[1, 2], stress[0, 2], stress[0, 1]])


def _rebuild(params: dict) -> ShardMDCalculator:
    """A calculator from its record (unpickling, deepcopy)."""
    return ShardMDCalculator(**params)
