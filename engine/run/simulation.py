"""The run loop: a thin, explicit driver the CLI and Python users share.

    sim = Simulation.from_args(["model=lj", "steps=100"])   # or Simulation(cfg)
    sim.run()

Each step: integrator first half -> neighbour list (refreshed, rebuilt, or rolled back:
engine/run/rebuild.py) -> forces -> integrator second half -> thermo / trajectory.  Atoms are
wrapped into the cell and put in the memory order ``neighbor.sort`` asks (spatial by default)
at every neighbour rebuild, and only then, so the positions the skin check measures are
continuous between rebuilds.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path

import torch
from omegaconf import DictConfig

from shardmd.domain.comm import Comm
from shardmd.engine.config import guard as config_guard
from shardmd.engine.config.compose import compose_config, echo_line, to_container
from shardmd.engine.config.expressions import stored_config
from shardmd.engine.errors import OutputError, UserError
from shardmd.engine.io.checkpoint import checkpoint_dir, model_identity_of, write_checkpoint
from shardmd.engine.launch.stop import EXIT_STOPPED, StopRequest
from shardmd.engine.run import compile_choice, health, measure, model_inputs, output, stages
from shardmd.engine.run import restart as restart_mod
from shardmd.engine.run.constraints import constrain
from shardmd.engine.run.heap import frozen_heap
from shardmd.engine.run.integrator_setup import make_integrator
from shardmd.engine.run.loop_summary import loop_summary
from shardmd.engine.run.rank_domain import RankDomain
from shardmd.engine.run.rebuild import Outcome, RebuildController
from shardmd.engine.run.record import RunRecord
from shardmd.engine.run.reporting import Reporter
from shardmd.engine.run.skin_check import DeferredSkinCheck
from shardmd.engine.run.state import State, atoms_from_arrays


class Simulation:
    """One MD run.  ``cfg`` is a composed config (see :func:`shardmd.engine.config.compose.compose_config`).

    state: optional initial :class:`State` (else built from ``cfg.system``);
    model: optional model object meeting :mod:`shardmd.models.contract`, bare or wrapped in a
    ``DistributedModel`` (else built from ``cfg.model``: a registered name or ``py:`` route);
    comm: the job's ranks; by default the launcher's (mpiexec, srun, torchrun: detected, the
    process group built on first use, see :func:`shardmd.engine.launch.parallel.job_comm`), else one rank.
    Under a launcher ``domains`` follows the rank count (``domains=1``, the default, is taken
    as "not given"; another count than the launcher's is refused).
    """

    def __init__(self, cfg: DictConfig, state: State | None = None, model=None,
                 reporter: Reporter | None = None, comm: Comm | None = None):
        # set-up in order, one stage each (engine/run/stages.py): ranks, outputs, device, model,
        # state, checks, domains, reporting; nothing is written before the first step's set-up
        self.cfg, self.comm = cfg, comm = stages.job_ranks(cfg, comm)
        stages.check_outputs_of(cfg, comm)
        self._lock = None   # rank 0's OutputLock, from the first output step
        self.dtype = stages.DTYPES[cfg.precision]
        self.device = stages.device_of(cfg, comm)
        self.integrator = make_integrator(cfg, comm=comm)
        self.observable_modules = measure.load_config(cfg)   # observables.modules (allow_code=true)
        built_here = model is None
        self.dmodel, self.model_origin = stages.the_model(cfg, model, self.dtype, self.device)
        self.model = model = self.dmodel.model
        self.run_record = RunRecord(cfg, self.model_origin)   # expressions never resolved in what is stored
        self.checkpoint_in = (restart_mod.resolve(cfg, identity=model_identity_of(self.model_origin),
                                                  label=self.run_record.model_name, record=self.record(stored=False))
                              if state is None else None)
        state, reference = stages.starting_state(cfg, state, self.checkpoint_in, self.integrator, self.dtype,
                                                self.device, self.dmodel)
        self.groups, self.thermo_columns = measure.setup(cfg, state)   # groups.<name>, thermo.columns
        # fixed atoms (input FixAtoms, fix.ids, fix.group, a checkpoint's set): engine/run/constraints.py
        self.integrator = constrain(self.integrator, cfg, state, self.checkpoint_in, lambda: self.state.ids)
        stages.check_state(cfg, comm, state, self.dmodel, self.device)
        # a barostat (npt) changes the cell every step: it gets the cell and the virial here
        self._barostat = bool(getattr(self.integrator, "barostat", False))
        if self._barostat and getattr(self.integrator, "inner", None) is not None:
            raise UserError("integrator=npt cannot hold atoms fixed yet (the barostat moves every atom with the "
                            "cell); drop fix.ids / the input's FixAtoms, or use integrator=nose-hoover")
        grid, ref_cell = stages.domain_grid(cfg, self.checkpoint_in, reference is not None, self._barostat, comm.size)
        self.domain = RankDomain(comm, self.dmodel.cutoff, float(cfg.neighbor.skin),
                                 sort=str(cfg.neighbor.sort), grid=grid, box_check=self._barostat)
        # a model that asks for a half list (LJ on the CPU: Newton's third law) gets one built,
        # not a full list it would filter at every rebuild (~40 % of a rebuild at 32k atoms)
        wants = getattr(self.dmodel.config, "neighbors", None)
        self.domain.nl.half = wants is not None and not wants.full and self.device.type == "cpu"
        self.state = self.domain.distribute(state, reference=reference, reference_cell=ref_cell)
        if self._barostat:
            try:
                self.integrator.check_cell(self.state.cell)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        self.n_global = self.domain.n_global
        # model.compile=auto: compiled before its first call where the run is long (a built model only)
        self._compile_words = (compile_choice.apply(cfg, self.dmodel, self.n_global, comm.size, self.device)
                               if built_here else "")
        self.reporter = reporter or Reporter(self.log_path if comm.is_root else None, quiet=cfg.quiet,
                                             progress=cfg.thermo.progress, enabled=comm.is_root,
                                             log_mode="a" if self.checkpoint_in else "w",
                                             config_line="\n".join(
                                                 [echo_line(cfg), *config_guard.log_notes(
                                                     to_container(cfg.model), shown=stored_config(cfg)["model"])]),
                                             columns=self.thermo_columns)
        self.stop = StopRequest()
        self.exit_code = 0
        # plain copies of the settings the step loop reads (OmegaConf access is slow)
        self._ckpt_every = int(cfg.checkpoint.every)
        self._traj_every, self._thermo_every = int(cfg.trajectory.every), int(cfg.thermo.every)
        self._obs_every = output.observables_every(cfg)   # observable rows besides the frames'
        self._max_step, self._min_distance = float(cfg.health.max_step), float(cfg.health.min_distance)
        self.timers: dict[str, float] = defaultdict(float)
        self.neighbors = RebuildController(self.domain, self.integrator.dt, int(cfg.neighbor.every),
                                           bool(cfg.neighbor.check), stages.skin_check(cfg, self.device, model),
                                           self._check_step, self.timers)
        self._last_step = int(cfg.steps)
        self._step0 = 0
        self.results: dict[str, torch.Tensor] = {}
        # inside run()'s loop a step with no output due asks a model that can skip them (LJ's
        # forces_only) for the forces alone, as LAMMPS sums energy and virial on thermo steps
        # only (under npt, whose pressure needs it every step, the virial too: virial_only);
        # observables() completes such a step's results when they are read after all
        self._lazy_energy = False
        self._energy_missing = False
        self._virial_missing_said = False
        self._model_notes_said: set[str] = set()
        self.writer, self.schedule = None, None   # schedule(integrator, step): engine/protocol/ ramps
        self.last_thermo: dict | None = None
        self.started = False

    def record(self, stored: bool = True) -> dict:
        """The configuration as the trajectory and checkpoint store it (``stored=False``: resolved,
        for comparisons only): :meth:`engine.run.record.RunRecord.config`."""
        return self.run_record.config(stored)

    @property
    def nl(self):
        return self.domain.nl

    @property
    def deferred(self) -> DeferredSkinCheck | None:
        """The deferred skin check (its counters: reads, posted, rollbacks), or None."""
        return self.neighbors.deferred

    @deferred.setter
    def deferred(self, chk: DeferredSkinCheck | None) -> None:   # tests plant a planner here
        self.neighbors.deferred = chk

    # -- construction helpers ---------------------------------------------------------
    @classmethod
    def from_args(cls, args: list[str], **kw) -> "Simulation":
        return cls(compose_config(args), **kw)

    @property
    def output_path(self) -> Path:
        return Path(self.cfg.output)

    @property
    def log_path(self) -> Path:
        return self.output_path.with_suffix(".log")

    # -- physics ---------------------------------------------------------------------
    def rebuild(self) -> None:
        """Wrap, migrate, canonical order (optional), ghosts, new neighbour list."""
        self.neighbors.rebuild(self.state)

    def _output_due(self, step: int) -> bool:
        return (step >= self._last_step
                or (self._thermo_every > 0 and step % self._thermo_every == 0)
                or (self.writer is not None and self._traj_every > 0 and step % self._traj_every == 0)
                or (self.writer is not None and self._obs_every > 0 and step % self._obs_every == 0)
                or (self._ckpt_every > 0 and step % self._ckpt_every == 0))

    def _check_step(self, worst: float, where: str) -> None:
        """The reduced step measure (engine/run/health.py) against health.max_step; collective."""
        if not worst <= self._max_step:   # also catches NaN
            health.raise_unhealthy(self.comm, self.state, self.integrator.dt, where, bound=self._max_step)

    def _checked_observables(self, due=()) -> dict:
        """Observables of the current step (the cheap ones and those ``due``), refused
        (collectively: they are reduced) when not finite: nothing is written from an unhealthy state."""
        obs = self.observables(due=due)
        if not health.finite_thermo(obs):
            health.raise_unhealthy(self.comm, self.state, self.integrator.dt, f"at step {self.state.step}",
                                   what=f"energy {obs['potential_energy']:.6g} eV, kinetic "
                                        f"{obs['kinetic_energy']:.6g} eV")
        return obs

    def compute_forces(self, energy: bool = True) -> None:
        """This step's model outputs; ``energy=False``: the forces alone where the model can
        skip the energy and virial (``forces_only``; the same forces), NaN in their place, or
        under a barostat, whose pressure needs the virial every step, the forces and the virial
        (``virial_only``; the same bits), NaN energies."""
        t = time.perf_counter()
        s, d = self.state, self.domain
        skip = None if energy else "virial_only" if self._barostat else "forces_only"
        if skip is not None and not hasattr(self.model, skip):
            skip = None
        if skip is not None:
            setattr(self.model, skip, True)
        try:
            out = self.dmodel.compute(d.ctx, d.padded_positions, d.padded_numbers, d.nl.current,
                                      extras=model_inputs.extras(s))
        finally:
            if skip is not None:
                setattr(self.model, skip, False)
        self._energy_missing = skip is not None
        if "forces" not in out or "energy" not in out:
            raise UserError(f"the model returned {sorted(out)}, without {'energy' if 'energy' not in out else 'forces'}"
                            "; return both, or declare model_config autograd_outputs={'forces': 'energy'} "
                            "(docs/byo.md)")
        f = out["forces"]
        s.forces = f if f.dtype == s.dtype else f.to(s.dtype)
        if self._barostat:   # npt's pressure: the global virial of these forces
            if out.get("virial") is None:
                raise UserError(f"integrator=npt needs the model's virial (the pressure) and model "
                                f"{self.run_record.origin_line()} returns none; use a model with a virial or "
                                "integrator=nose-hoover")
            self.integrator.virial = out["virial"]
        self.neighbors.observe_fill(out)
        self.results = out
        self.timers["model"] += time.perf_counter() - t

    def observables(self, names=None, due=("thermo", "trajectory")) -> dict:
        """Registered observables of the current step (engine/run/measure.py; collective): ``names``
        and their dependencies, else the cheap ones and the expensive ones ``due``; ``pressure``
        and ``stress`` are None when the model gives no virial."""
        if self._energy_missing:   # a forces-only step read after all (a stop): complete it (collective)
            self.compute_forces()
        if self.results.get("virial") is None and not self._virial_missing_said:
            self._virial_missing_said = True
            self.reporter.line("Note: the model gives no virial: no pressure or stress in this run "
                               "(shown as '-' in the thermo table, not written to the trajectory)")
        for note in getattr(self.model, "notes", None) or ():   # a model's own lines (docs/byo.md), once each
            if isinstance(note, str) and note and note not in self._model_notes_said:
                self._model_notes_said.add(note)
                self.reporter.line(note)
        return measure.of_run(self, names, due)

    def atoms(self, unwrapped: bool = False):
        """Every atom of the run as ``ase.Atoms`` in id order (velocities in ASE units, forces
        attached), on rank 0; None on the other ranks.  Collective: every rank calls it.
        (``sim.state.to_atoms()`` is this rank's atoms only.)"""
        full = self.domain.gather(self.state, ("positions", "images", "velocities", "forces", "masses", "numbers"))
        if full is None:
            return None
        return atoms_from_arrays(full, self.state.cell, self.state.pbc, unwrapped=unwrapped)

    # -- output ----------------------------------------------------------------------
    def _open_writer(self) -> None:
        output.open_writer(self)

    def _write(self, obs: dict, frame: bool = True) -> None:
        """The observables' row (rank 0) and, with ``frame``, the frame (collective: a gather)."""
        t = time.perf_counter()
        s = self.state
        if not frame:   # a row of the observables alone (observables.every)
            if self.comm.is_root:
                self.writer.write_observables(s.step, s.time, *measure.trajectory_row(obs, frame=False))
            self.timers["output"] += time.perf_counter() - t
            return
        from shardmd.engine.io.trajectory_fields import model_outputs  # per-atom model outputs asked for (energies)

        extra = model_outputs(self.results, self.cfg.trajectory.fields, self.model)
        full = self.domain.gather(s, extra=extra)
        if full is None:
            self.timers["output"] += time.perf_counter() - t
            return
        # observables first: a frame a reader sees committed has its observables too
        self.writer.write_observables(s.step, s.time, *measure.trajectory_row(obs))
        self.writer.write_frame(s.step, s.time, s.cell.detach().cpu().numpy(), positions=full["positions"],
                                images=full["images"], velocities=full["velocities"], forces=full["forces"],
                                **{k: full[k] for k in extra})
        self.timers["output"] += time.perf_counter() - t

    def _report(self, force_traj=False, force_thermo=False, traj=True) -> None:
        s = self.state
        traj_due = traj and self.writer is not None and (force_traj or s.step % self._traj_every == 0)
        rows_due = traj and self.writer is not None and self._obs_every > 0 and s.step % self._obs_every == 0
        thermo_due = force_thermo or (self._thermo_every > 0 and s.step % self._thermo_every == 0)
        if not (traj_due or rows_due or thermo_due):
            return
        obs = self._checked_observables({k for k, on in (("trajectory", traj_due or rows_due),
                                                         ("thermo", thermo_due)) if on})
        self.last_thermo = obs
        with self._output_step():
            if traj_due or rows_due:
                self._write(obs, frame=traj_due)
            if thermo_due:
                self.reporter.thermo(s.step, s.time, obs)

    @contextlib.contextmanager
    def _output_step(self):
        """Rank 0 writes; every rank learns at once whether that worked (one small all-reduce
        per output step), so a write error (exit 4) or a refused output file (exit 2) ends all
        ranks together, cleanly, with rank 0's one line (no MPI abort and its launcher noise)."""
        failed = None
        try:
            yield
        except UserError as exc:
            failed = exc
        code = failed.exit_code if failed else 0
        if self.comm.size > 1:
            code = int(self.comm.all_reduce(torch.tensor([code], dtype=torch.int64), "max")[0])
        if code:
            err = failed or OutputError("an output step failed on rank 0")
            err.exit_code, err.collective = code, True
            raise err

    # -- the loop --------------------------------------------------------------------
    def setup(self) -> None:
        """Neighbour list, first forces, output files, header; frame and thermo at the start."""
        self.setup_lists()
        self.setup_forces()

    def setup_lists(self) -> None:
        """The first half of :meth:`setup`: neighbour list, output files, header."""
        r = self.reporter
        s = self.state
        if self.checkpoint_in is not None and "minimizer" in self.checkpoint_in:   # its velocities are FIRE's
            raise UserError(f"checkpoint {self.checkpoint_in['shown']} is of a relaxation; continue it with "
                            "`python -m engine minimize ... restart=auto`, or run MD from its relaxed structure")
        restored = self.checkpoint_in is not None and self.domain.restart_reference is not None
        if restored:
            self.domain.restore(self.state)
        else:
            self.rebuild()
            if self._min_distance > 0:   # before the header: a refused start leaves no files
                health.close_contacts(self.comm, self.domain.close_pairs(s, self._min_distance), self._min_distance)
        with self._output_step():
            self._open_writer()   # before the header: an output of another system is refused untouched
        shown = self.run_record.shown   # a value written as an expression is named by it
        r.line(f"ShardMD: {self.n_global} atoms, model {self.run_record.origin_line()}, "
               f"integrator {self.integrator.name}, "
               f"dt {shown('dt', self.integrator.dt)} fs, {shown('precision', self.cfg.precision)} on {self.device}, "
               f"domains {self.comm.size} (grid {'x'.join(map(str, self.domain.grid.shape))})"
               f"{stages.parts_line(self.dmodel, self.state)}{self._compile_words}"
               f"{stages.threads_line(self.cfg, self.comm, self.device)}")
        if restored:
            r.line(f"Restart from {self.checkpoint_in['shown']} at step {self.state.step}")
        r.summary(measure.notes(self.observable_modules))
        self.neighbors.start(s)

    def setup_forces(self) -> None:
        """The second half of :meth:`setup`: the first forces, the frame and thermo at the start
        (engine/batch/lockstep.py runs the first halves of many systems, then one model call)."""
        try:
            self.compute_forces()
        except ValueError as exc:   # a model refusing its input at the first call (a sum's mixed precisions)
            raise UserError(str(exc).splitlines()[0]) from None
        if self.checkpoint_in is None:
            self._report(force_traj=True, force_thermo=True)
        else:
            self._report(force_thermo=True, traj=False)  # the file has this step's frame already

    def step(self) -> bool:
        """Drift, neighbour list, forces, kick. False when the list's check rolled the state
        back to an earlier step (its forces recomputed): the loop replays from there."""
        upd = self.drift()
        self._finish_step(upd.kick)
        return upd.outcome is not Outcome.ROLLED_BACK

    def drift(self):
        """A step up to its forces (first half, step count, neighbour list: rebuild.py's update);
        engine/batch/lockstep.py calls it, the forces of many systems at once, :meth:`_finish_step`."""
        s = self.state
        if self.schedule is not None:   # a protocol stage's ramp (engine/protocol/): targets of step s.step + 1
            self.schedule(self.integrator, s.step + 1)
        t = time.perf_counter()
        if self._barostat:
            self.integrator.cell = s.cell
        self.integrator.first_half(s.positions, s.velocities, s.forces, s.masses, s.ids, s.step)
        if self._barostat:   # the barostat's new cell (positions moved with it)
            s.cell = self.integrator.cell
        self.timers["integrate"] += time.perf_counter() - t
        s.step += 1
        s.time += self.integrator.dt
        return self.neighbors.update(s, self._output_due(s.step), self.stop.requested)

    def _finish_step(self, kick: bool = True) -> None:
        """This step's forces, then the integrator's second half."""
        s = self.state
        self.compute_forces(energy=not self._lazy_energy or self._output_due(s.step))
        if not kick:
            return
        t = time.perf_counter()
        self.integrator.second_half(s.velocities, s.forces, s.masses)
        self.timers["integrate"] += time.perf_counter() - t

    def run(self, steps: int | None = None) -> dict:
        """Run until step ``steps`` (default ``cfg.steps``); returns the final observables."""
        last = int(self.cfg.steps if steps is None else steps)
        r = self.reporter
        try:
            # before set-up: a SIGTERM while the first forces are computed (the output file may
            # already exist) stops the run at its first step with a checkpoint, not mid-write
            self.stop.install()
            if not self.started:
                self.setup()
                self.started = True
            s = self.state
            # the time split covers the loop only (set-up and the first build are excluded)
            self.timers.clear()
            self.domain.timers = {k: 0.0 for k in self.domain.timers}
            builds0 = self.nl.n_builds
            r.start(s.step)
            t_run = time.perf_counter()
            self._last_step, self._step0 = last, s.step
            self._lazy_energy = True
            with frozen_heap():   # the set-up's objects out of the collector's scans (engine/run/heap.py)
                stopping = self._loop(last)
            wall = time.perf_counter() - t_run  # the loop's rate excludes the final output
            timed = {**self.timers, **self.domain.timers}   # and so does its time split
            self._lazy_energy = False
            if not stopping:
                self.checkpoint()
            if self.writer is not None and s.step % self._traj_every != 0 and not stopping:
                obs = self._checked_observables({"trajectory"})
                with self._output_step():
                    self._write(obs)
            r.progress_update(s.step, last, self.integrator.dt, self.n_global, force=True)
            self._summary(wall, self.nl.n_builds - builds0, timed)
            return self.last_thermo or self.observables()
        finally:
            self._lazy_energy = False
            self.close()

    def _loop(self, last: int) -> bool:
        """Steps until ``last`` or an agreed stop (then checkpointed); True when stopped."""
        s, r = self.state, self.reporter
        while s.step < last:
            if not self.step():   # rolled back: the loop replays from the restored step
                continue
            stopping = self.neighbors.stop_agreed(self.stop.requested)
            self._report(force_traj=stopping, force_thermo=(s.step == last or stopping))
            r.progress_update(s.step, last, self.integrator.dt, self.n_global)
            if stopping:
                self.checkpoint()
                r.line(f"Stopped by {self.stop.signal_name or 'a signal on another rank'} at step "
                       f"{s.step}; checkpoint written; continue with restart=auto")
                self.exit_code = EXIT_STOPPED
                return True
            if self._ckpt_every and s.step % self._ckpt_every == 0 and s.step < last:
                self.checkpoint()
        return False

    def _summary(self, wall: float, builds: int, timed: dict) -> None:
        lines, self.summary = loop_summary(self, wall, builds, timed)
        self.reporter.summary(lines)

    def checkpoint(self):
        """Write a restart checkpoint of the current step (collective; rank 0 writes)."""
        t = time.perf_counter()
        s = self.state
        self._checked_observables()   # a checkpoint only from a healthy state
        full = self.domain.gather(s, ("positions", "images", "velocities", "masses", "numbers"),
                                  extra={"reference_positions": self.domain.reference_positions(),
                                         **model_inputs.gathered(s)})
        path = None
        with self._output_step():
            if full is not None:
                path = self._write_checkpoint(s, full)
        self.timers["checkpoint"] += time.perf_counter() - t
        return path

    def _write_checkpoint(self, s, full: dict):
        from shardmd.engine import __version__

        return write_checkpoint(checkpoint_dir(self.output_path), s.step, s.time, full,
                                s.cell.detach().cpu().numpy(), s.pbc.cpu().numpy(), self.record(),
                                self.run_record.integrator_state(self._integrator_state()), self.run_record.model_name,
                                self.run_record.identity(), __version__,
                                keep=int(self.cfg.checkpoint.keep), inputs=model_inputs.for_checkpoint(full, s))

    def _integrator_state(self) -> dict:
        """The integrator's state for a checkpoint; with a barostat also the cell of the last
        neighbour rebuild (a restart rebuilds the lists in it, as the uninterrupted run has them)
        and the domain grid (chosen for the first cell: the cell's shape changes since)."""
        d = self.integrator.state_dict()
        if self._barostat:
            d["reference_cell"] = self.domain.nl.build_cell.double().cpu().tolist()
            d["grid"] = list(self.domain.grid.shape)
        return d

    def close(self) -> None:
        try:
            self.stop.uninstall()
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            self.reporter.close()
        finally:
            if self._lock is not None:   # after every output is closed
                self._lock.release()
                self._lock = None

