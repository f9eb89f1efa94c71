"""What every minimiser of ``python -m engine minimize`` shares: set-up (fresh or from a
checkpoint), the loop with ASE's convergence test, frames, log lines, checkpoints and the
relaxed structure.  The methods themselves: engine/relax/minimize.py (FIRE) and
engine/relax/quasi_newton.py (ASE's LBFGS and BFGS).

The loop is ASE's ``Optimizer.irun``: forces at the start; converged when the largest force
row is below ``fmax`` (strictly); else step, new forces, test, until ``steps`` steps were
taken (``state.step`` counts them, across restarts).  A subclass gives

    _start()    after the first forces: its own state, fresh or from ``self.restored``
    _measure()  the largest force row (eV/Å, the same on every rank) of the current forces
    step()      one step: move the atoms (and the cell), lists, forces, state.step += 1
    _state()    (scalars, arrays) of its state for a checkpoint (arrays on rank 0 at least)

Checkpoints (``checkpoint.every`` steps, and at the end) are the run's (engine/io/checkpoint.py)
plus a ``minimizer/`` group: the method's scalars as JSON (attribute ``state``) and its arrays
as datasets (never pickled).  A restart (``restart=auto`` or ``restart=PATH``) rebuilds the
lists from the checkpoint's positions of the last rebuild (and, relaxing the cell, that
rebuild's cell), as an MD restart does, so the relaxation continues bit for bit.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from shardmd.engine.errors import UnhealthyRun, UserError
from shardmd.engine.run import health, model_inputs

#: minimize keys a restart must keep: the optimiser's state depends on them
STATE_KEYS = ("method", "cell", "symmetry")
#: minimize keys a restart keeps unless restart.allow_changes=true (they change the path taken)
PATH_KEYS = ("pressure", "maxstep", "dt", "dtmax", "memory", "alpha", "symprec")


class Relaxation:
    """A minimiser on a :class:`~shardmd.engine.run.simulation.Simulation` that has not run yet
    (its state, model, decomposition, fixed atoms, writer and reporter; its checkpoint when it
    was made with ``restart=``).  cell: relax the cell too; pressure: its target, bar."""

    name = "?"      # the log's word for the method
    method = "?"    # minimize.method
    title = "?"     # the header's words for where the method comes from

    def __init__(self, sim, cell: bool = False, pressure: float = 0.0):
        if sim.started:
            raise UserError(f"{self.name} needs a Simulation that has not run yet; make a new one")
        if not isinstance(cell, bool):
            raise UserError(f"minimize.cell={cell!r}: use true or false")
        if not (isinstance(pressure, (int, float)) and math.isfinite(pressure)):
            raise UserError(f"minimize.pressure={pressure!r}: give a finite pressure in bar")
        if cell and not bool(sim.state.pbc.all()):
            axes = "".join("xyz"[k] for k in range(3) if not bool(sim.state.pbc[k]))
            raise UserError(f"minimize.cell=true needs a cell periodic on all three axes; axis {axes} is not: "
                            "make it periodic or drop minimize.cell")
        self.sim = sim
        self.cell = cell
        self.pressure = float(pressure)   # bar
        self.restored = _minimizer_of(sim.checkpoint_in, self.method)   # {"state", "arrays"} or None
        self.fmax_asked = float("nan")

    # -- the subclass's part ------------------------------------------------------------------
    def _start(self) -> None:
        raise NotImplementedError

    def _measure(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def _state(self) -> tuple[dict, dict | None]:
        raise NotImplementedError

    def _log_extra(self) -> str:
        return ""

    # -- the loop --------------------------------------------------------------------------------
    def run(self, fmax: float = 0.05, steps: int = 1000, structure: str | None = None) -> dict:
        """Relax until every force row is below fmax (eV/Å) or ``state.step`` reaches ``steps``;
        frames every ``trajectory.every`` steps and at the end; checkpoints every
        ``checkpoint.every`` steps and at the end; the relaxed structure to ``structure`` (any
        ASE format by its suffix; None: not written).  Returns {'converged', 'steps', 'energy'
        (eV), 'fmax' (eV/Å)} on every rank.  Collective.  The loop in pieces (:meth:`begin_lists`,
        :meth:`begin_forces`, :meth:`step`, :meth:`after_step`, :meth:`finish`) is what
        engine/batch/relax_lockstep.py drives for many systems, one model call per step."""
        try:
            self.begin_lists(fmax, steps)
            self.begin_forces()
            while not self.done:
                self.step()
                self.after_step()
            return self.finish(structure)
        finally:
            self.sim.close()

    def begin_lists(self, fmax: float, steps: int) -> None:
        """The set-up up to the first forces: the lists, the output file, the header."""
        if not (isinstance(fmax, (int, float)) and math.isfinite(fmax) and fmax > 0):
            raise UserError(f"fmax={fmax!r}: give a force > 0 in eV/Å")
        if not (isinstance(steps, int) and steps >= 0):
            raise UserError(f"steps={steps!r}: give a whole number >= 0")
        self.fmax_asked, self.steps_asked = float(fmax), int(steps)
        self.converged = False
        self._setup(fmax, steps)

    def begin_forces(self) -> None:
        """The first forces, the method's start, the first line and frame."""
        self._setup_forces()
        fm, e = self._measure(), self._energy()
        self._log(e, fm, force=True)
        if self.restored is None:   # a restart's file has this step's frame already
            self._frame(e, fm)
        self.fm, self.e, self.converged = fm, e, fm < self.fmax_asked

    @property
    def done(self) -> bool:
        return self.converged or self.sim.state.step >= self.steps_asked

    def after_step(self) -> None:
        """After a step's forces: the test, the line, the frame and the checkpoint that are due."""
        sim, s = self.sim, self.sim.state
        every, thermo = int(sim.cfg.trajectory.every), int(sim.cfg.thermo.every)
        ckpt = int(sim.cfg.checkpoint.every)
        fm, e = self._measure(), self._energy()
        self.fm, self.e, self.converged = fm, e, fm < self.fmax_asked
        last = self.done
        self._log(e, fm, force=last or (thermo > 0 and s.step % thermo == 0))
        if last or (every > 0 and s.step % every == 0):
            self._frame(e, fm)
        if ckpt > 0 and s.step % ckpt == 0 and not last:
            self.checkpoint()

    def finish(self, structure: str | None = None) -> dict:
        """The end: a checkpoint (raise minimize.steps and restart=auto to go on), the last line,
        the relaxed structure; the result."""
        sim, s = self.sim, self.sim.state
        self.checkpoint()
        s.velocities.zero_()
        word = "converged" if self.converged else f"NOT converged within {self.steps_asked} steps"
        sim.reporter.line(f"{self.name} {word}: {s.step} steps, energy {self.e:.10f} eV, fmax {self.fm:.3e} eV/Å "
                          f"(asked < {self.fmax_asked:g})")
        if structure is not None:
            self._write_structure(structure, self.e)
        return {"converged": bool(self.converged), "steps": s.step, "energy": self.e, "fmax": self.fm}

    def _setup(self, fmax: float, steps: int) -> None:
        sim = self.sim
        s = sim.state
        if self.restored is None:
            s.velocities.zero_()
        sim.neighbors.deferred = None   # the per-step skin check: relaxation steps are not replayed
        sim.started = True
        if self.cell:   # NPT's box check: the displacement less the cell's deformation (engine/run/rank_domain.py)
            sim.domain.nl.box_check = True
            sim.domain.shrink_fix = (f"the relaxed cell does not fit {sim.comm.size} domains: relax on fewer (or "
                                     "check minimize.pressure)")
        if self.restored is not None and sim.domain.restart_reference is not None:
            sim.domain.restore(s)   # the lists of the checkpoint's last rebuild: the run continues bit for bit
        else:
            sim.rebuild()
            if sim._min_distance > 0:
                health.close_contacts(sim.comm, sim.domain.close_pairs(s, sim._min_distance), sim._min_distance)
        sim.run_record.kind = "minimize"   # the trajectory says so: plot and info show a minimisation
        with sim._output_step():
            sim._open_writer()
        n_fixed = getattr(sim.integrator, "n_fixed", 0)
        sim.reporter.line(f"ShardMD {self.name} minimisation ({self.title}): {sim.n_global} atoms ({n_fixed} fixed), "
                          f"model {sim.run_record.origin_line()}, fmax {fmax:g} eV/Å, at most {steps} steps, "
                          f"maxstep {self.maxstep:g} Å, {sim.cfg.precision} on {sim.device}, domains {sim.comm.size}"
                          + (f"; the cell relaxes too (FrechetCellFilter, {self.pressure:g} bar)" if self.cell else ""))
        if self.restored is not None:
            sim.reporter.line(f"Restart from {sim.checkpoint_in['shown']} at step {s.step}")

    def _setup_forces(self) -> None:
        sim = self.sim
        sim.compute_forces()
        if self.cell and sim.results.get("virial") is None:
            raise UserError(f"minimize.cell=true needs the model's virial (the stress) and model "
                            f"{sim.run_record.origin_line()} returns none; use a model with a virial or drop "
                            "minimize.cell")
        self._start()

    def _energy(self) -> float:
        e = float(self.sim.results["energy"])
        if not math.isfinite(e):
            raise UnhealthyRun(f"{self.name} step {self.sim.state.step}: the energy is {e}; check the model and the "
                               "structure")
        return e

    def _log(self, e: float, fm: float, force: bool) -> None:
        if force:
            vol = f"  volume {abs(float(torch.linalg.det(self.sim.state.cell.double()))):.6f} Å^3" if self.cell else ""
            self.sim.reporter.line(f"{self.name} {self.sim.state.step:6d}  energy {e:.10f} eV  fmax {fm:.6e} eV/Å"
                                   f"{self._log_extra()}{vol}")

    def _moved(self, what: str = "positions") -> None:
        """After the atoms moved: the skin check (one all-reduce), a rebuild or a ghost refresh,
        the new forces; ``state.step`` += 1.  Non-finite positions end the run in one line."""
        self.moved_lists(what)
        self.moved_forces()

    def moved_lists(self, what: str = "positions") -> None:
        """:meth:`_moved` up to the forces."""
        sim = self.sim
        s = sim.state
        need, worst = sim.domain.check(s, 0.0)   # skin criterion; worst is inf for non-finite positions
        if not math.isfinite(worst):
            raise UnhealthyRun(f"{self.name} step {s.step + 1}: {what} became non-finite; check the model and the "
                               "structure (or lower minimize.maxstep)")
        if need:
            sim.rebuild()
        else:
            sim.domain.refresh(s)

    def moved_forces(self) -> None:
        """:meth:`_moved`'s forces; ``state.step`` += 1."""
        self.sim.compute_forces()
        self.sim.state.step += 1

    # -- output -------------------------------------------------------------------------------------
    def _frame(self, e: float, fm: float) -> None:
        """A frame and its observables: the energy (eV) and fmax (eV/Å) of this step."""
        sim = self.sim
        if sim.writer is None:
            return
        from shardmd.engine.io.trajectory_fields import model_outputs

        s = sim.state
        extra = model_outputs(sim.results, sim.cfg.trajectory.fields, sim.model)
        full = sim.domain.gather(s, ("positions", "images", "forces"), extra=extra)
        with sim._output_step():
            if full is not None:
                sim.writer.write_frame(s.step, 0.0, s.cell.detach().cpu().numpy(), positions=full["positions"],
                                       images=full["images"], velocities=np.zeros_like(full["positions"]),
                                       forces=full["forces"], **{k: full[k] for k in extra})
                sim.writer.write_observables(s.step, 0.0, {"potential_energy": e, "fmax": fm},
                                             {"fmax": "eV Angstrom-1"})

    def checkpoint(self):
        """A restart checkpoint of this step: the run's arrays and the method's state (collective;
        rank 0 writes).  Returns its path on rank 0."""
        from shardmd.engine import __version__
        from shardmd.engine.io.checkpoint import checkpoint_dir, write_checkpoint

        sim = self.sim
        s = sim.state
        scalars, arrays = self._state()
        full = sim.domain.gather(s, ("positions", "images", "velocities", "masses", "numbers"),
                                 extra={"reference_positions": sim.domain.reference_positions(),
                                        **model_inputs.gathered(s)})
        integrator = sim._integrator_state()
        if self.cell:   # the lists' cell and grid: a restart rebuilds them as they are (engine/run/stages.py)
            integrator["reference_cell"] = sim.domain.nl.build_cell.double().cpu().tolist()
            integrator["grid"] = list(sim.domain.grid.shape)
        path = None
        with sim._output_step():
            if full is not None:
                path = write_checkpoint(
                    checkpoint_dir(sim.output_path), s.step, 0.0, full, s.cell.detach().cpu().numpy(),
                    s.pbc.cpu().numpy(), sim.record(), sim.run_record.integrator_state(integrator),
                    sim.run_record.model_name, sim.run_record.identity(), __version__,
                    keep=int(sim.cfg.checkpoint.keep), inputs=model_inputs.for_checkpoint(full, s),
                    minimizer={"state": {"method": self.method, **scalars}, "arrays": arrays or {}})
        return path

    def _write_structure(self, path: str, e: float) -> None:
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.constraints import FixAtoms
        from ase.io import write

        from shardmd.engine.run.state import atoms_from_arrays

        sim = self.sim
        full = sim.domain.gather(sim.state, ("positions", "images", "velocities", "forces", "masses", "numbers"))
        with sim._output_step():   # every rank: rank 0's write failing ends all of them together
            if full is None:
                return
            atoms = atoms_from_arrays(full, sim.state.cell, sim.state.pbc)
            atoms.calc = SinglePointCalculator(atoms, energy=e, forces=atoms.calc.results["forces"])
            fixed = getattr(sim.integrator, "fixed_ids", None)
            if fixed is not None:
                atoms.set_constraint(FixAtoms(indices=np.searchsorted(np.sort(full["ids"]), fixed.numpy())))
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                write(str(path), atoms, parallel=False)   # rank 0 alone (ASE's default broadcasts over MPI)
            except Exception as exc:  # noqa: BLE001 - any writer failure becomes one line
                from shardmd.engine.errors import OutputError

                raise OutputError(f"minimize.structure={str(path)!r}: cannot write it "
                                  f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                                  ) from None

    # -- restored state -------------------------------------------------------------------------------
    def _saved(self, name: str, shape: tuple, kinds: str = "f") -> np.ndarray:
        """The checkpoint's ``minimizer/<name>`` of ``shape`` (None: any length on that axis) and
        dtype kind; one line naming the checkpoint otherwise."""
        a = self.restored["arrays"].get(name)
        ok = (a is not None and a.ndim == len(shape) and a.dtype.kind in kinds
              and all(w is None or w == n for w, n in zip(shape, a.shape)))
        if not ok:
            got = "missing" if a is None else f"of shape {a.shape} ({a.dtype})"
            want = ", ".join("n" if w is None else str(w) for w in shape)
            raise self._unusable(f"minimizer/{name} is {got}, expected shape ({want}{',' if len(shape) == 1 else ''})")
        return a

    def _scalar(self, name: str, kind=float):
        v = self.restored["state"].get(name)
        if kind is bool:
            ok = isinstance(v, bool)
        elif kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok:
            raise self._unusable(f"minimizer state {name} is {v!r}, expected {kind.__name__}")
        return kind(v)

    def _unusable(self, problem: str) -> UserError:
        return UserError(f"checkpoint {self.sim.checkpoint_in['shown']}: {problem}; restart from another checkpoint "
                         "or start afresh")


def _times(x: torch.Tensor, a: np.ndarray) -> torch.Tensor:
    """x @ a for rows x (n, 3) and a (3, 3), by columns: each row's three products and two adds in a
    fixed order, so an atom's result does not depend on which rank holds it or how many rows there are
    (a BLAS product may block differently by size)."""
    a = a.tolist()
    return torch.stack([x[:, 0] * a[0][j] + x[:, 1] * a[1][j] + x[:, 2] * a[2][j] for j in range(3)], dim=1)


def _minimizer_of(ckpt: dict | None, method: str | None) -> dict | None:
    """The checkpoint's minimiser state for ``method`` (None without a checkpoint); a checkpoint
    of an MD run, or of another method (None: any), is refused in one line."""
    if ckpt is None:
        return None
    mini = ckpt.get("minimizer")
    if mini is None:
        raise UserError(f"checkpoint {ckpt['shown']} is of an MD run, not of a minimisation; restart a relaxation "
                        "from its own checkpoints (or start from a structure: system.file=...)")
    was = mini["state"].get("method")
    if method is not None and was != method:
        raise UserError(f"checkpoint {ckpt['shown']} is of a minimize.method={was} relaxation; restart it with "
                        f"minimize.method={was}, or start afresh")
    return mini


def check_restart_keys(cfg, ckpt: dict) -> None:
    """A restart keeps the ``minimize`` keys the optimiser's state depends on (:data:`STATE_KEYS`,
    always) and those that change its path (:data:`PATH_KEYS`, unless restart.allow_changes);
    an MD run's checkpoint is refused."""
    _minimizer_of(ckpt, None)
    was = (ckpt.get("config") or {}).get("minimize") or {}
    now = cfg.minimize
    keys = STATE_KEYS + (() if cfg.restart.allow_changes else PATH_KEYS)
    for k in keys:
        if k in was and k in now and was[k] != now[k]:
            tail = ("; it cannot change within a relaxation (start afresh)" if k in STATE_KEYS
                    else "; add restart.allow_changes=true to accept that")
            raise UserError(f"restart would change minimize.{k} from {was[k]!r} to {now[k]!r} (checkpoint "
                            f"{ckpt['shown']}){tail}")
