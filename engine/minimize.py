"""FIRE energy minimisation, as ASE's ``ase.optimize.FIRE`` defines it, under domain decomposition.

    python -m engine minimize model=mace system.file=slab.extxyz minimize.fmax=0.01 output=relax.h5

    sim = Simulation(cfg, state=State.from_atoms(atoms))      # Python: any Simulation not yet run
    result = FIRE(sim).run(fmax=0.01, steps=500)              # {'converged', 'steps', 'energy', 'fmax'}

The algorithm (Bitzek et al., PRL 97, 170201 (2006)) with ASE's parameters and update rule,
line for line as ase/optimize/fire.py (ASE 3.29) writes it, ``downhill_check=False``:
defaults dt = 0.1, maxstep = 0.2 Å, dtmax = 1.0, Nmin = 5, finc = 1.1, fdec = 0.5,
astart = a = 0.1, fa = 0.99.  One step, f the forces (eV/Å, fixed atoms' rows 0), v the FIRE
velocity (0 at the first step; ASE's units: eV/Å times its time unit):

    if not the first step:
        if f.v > 0:  v = (1 - a) v + a f / |f| |v|;  if Nsteps > Nmin: dt = min(dt finc, dtmax), a *= fa
                     Nsteps += 1
        else:        v = 0;  a = astart;  dt *= fdec;  Nsteps = 0
    v += dt f;  dr = dt v;  if |dr| > maxstep: dr *= maxstep / |dr|;  x += dr

where f.v, |f|, |v| and |dr| run over all 3N components of all atoms (global sums over the
ranks: one all-reduce of three numbers and one of one number per step).  ASE's loop: forces at
the start; converged when every atom's |f_i| < fmax (strict, ASE's ``gradient_norm``); else
step, new forces, check, until ``steps`` steps were taken.  Fixed atoms (engine/constraints.py:
FixAtoms of the input, ``fix.ids``) have f = 0 and v = 0, so dr = 0 for them, as ASE's FixAtoms
gives (its constrained forces and ``adjust_positions``).

Under decomposition v is stored in ``state.velocities`` (it migrates and is re-sorted with its
atom); the neighbour list is checked every step (skin/2 criterion, one all-reduce) and
rebuilt when needed; the deferred skin check is not used.  The trajectory (``output``, H5MD)
gets a frame every ``trajectory.every`` steps and at the end (its step is the FIRE step, time
0 fs, velocities 0.0: a relaxation has none); the potential energy is its observable.  The
relaxed structure goes to ``minimize.structure`` (extxyz by default; energy, forces and the
FixAtoms constraint attached).  Cell relaxation is not available (``minimize.cell=true`` is
refused); checkpoints are not written and ``restart`` is refused.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from . import health
from .errors import UnhealthyRun, UserError

#: ASE's FIRE defaults (ase/optimize/fire.py; maxstep from Optimizer.defaults)
ASE_DEFAULTS = {"dt": 0.1, "maxstep": 0.2, "dtmax": 1.0, "nmin": 5, "finc": 1.1, "fdec": 0.5, "astart": 0.1,
                "fa": 0.99, "a": 0.1}


class FIRE:
    """FIRE on a :class:`~shardmd.engine.simulation.Simulation` that has not run yet (its state,
    model, decomposition, fixed atoms, writer and reporter).  Keyword arguments: ASE's FIRE
    parameters (:data:`ASE_DEFAULTS`; ``nmin`` is ASE's ``Nmin``)."""

    def __init__(self, sim, **params):
        unknown = sorted(set(params) - set(ASE_DEFAULTS))
        if unknown:
            raise UserError(f"FIRE has no parameter {unknown[0]!r}; use {', '.join(ASE_DEFAULTS)}")
        p = {**ASE_DEFAULTS, **params}
        for k in ("dt", "maxstep", "dtmax", "finc", "fa"):
            if not (isinstance(p[k], (int, float)) and math.isfinite(p[k]) and p[k] > 0):
                raise UserError(f"FIRE {k}={p[k]!r}: give a number > 0")
        for k in ("fdec", "astart", "a"):
            if not (isinstance(p[k], (int, float)) and 0 <= p[k] <= 1):
                raise UserError(f"FIRE {k}={p[k]!r}: give a number in [0, 1]")
        if not (isinstance(p["nmin"], int) and p["nmin"] >= 0):
            raise UserError(f"FIRE nmin={p['nmin']!r}: give a whole number >= 0")
        if sim.started:
            raise UserError("FIRE needs a Simulation that has not run yet; make a new one")
        self.sim = sim
        self.p = p
        self.dt, self.a, self.nsteps_pos = float(p["dt"]), float(p["a"]), 0   # ASE's dt, a, Nsteps
        self._first = True

    # -- global reductions ---------------------------------------------------------------
    def _sum(self, t: torch.Tensor) -> list[float]:
        comm = self.sim.comm
        return (comm.all_reduce(t, "sum") if comm.size > 1 else t).tolist()

    def _forces(self) -> torch.Tensor:
        """(n, 3) float64 forces with the fixed atoms' rows 0 (what FIRE and fmax see)."""
        s = self.sim.state
        f = s.forces.double()
        zero = getattr(self.sim.integrator, "zero_fixed", None)
        return zero(f, s.ids) if zero is not None else f

    def fmax_now(self, f: torch.Tensor) -> float:
        """Largest |f_i| over all atoms (eV/Å; collective)."""
        local = (f * f).sum(1).max() if f.shape[0] else torch.zeros((), dtype=torch.float64, device=f.device)
        comm = self.sim.comm
        return math.sqrt(float((comm.all_reduce(local.reshape(1), "max") if comm.size > 1 else local.reshape(1))[0]))

    # -- one step ---------------------------------------------------------------------------
    def step(self, f: torch.Tensor) -> None:
        """ASE's FIRE.step with forces ``f`` (fixed rows 0): moves the atoms, then the list."""
        sim, p = self.sim, self.p
        s = sim.state
        v = s.velocities.double()
        if self._first:
            v = torch.zeros_like(v)
            self._first = False
        else:
            vf, grad2, vv = self._sum(torch.stack([(f * v).sum(), (f * f).sum(), (v * v).sum()]))
            if vf > 0.0:
                v = (1.0 - self.a) * v + self.a * f / math.sqrt(grad2) * math.sqrt(vv)
                if self.nsteps_pos > p["nmin"]:
                    self.dt = min(self.dt * p["finc"], p["dtmax"])
                    self.a *= p["fa"]
                self.nsteps_pos += 1
            else:
                v = v * 0.0
                self.a = p["astart"]
                self.dt *= p["fdec"]
                self.nsteps_pos = 0
        v = v + self.dt * f
        dr = self.dt * v
        normdr = math.sqrt(self._sum((dr * dr).sum().reshape(1))[0])
        if normdr > p["maxstep"]:
            dr = p["maxstep"] * dr / normdr
        s.positions.add_(dr.to(s.dtype))
        s.velocities.copy_(v.to(s.dtype))
        need, worst = sim.domain.check(s, 0.0)   # skin criterion; worst is inf for non-finite positions
        if not math.isfinite(worst):
            raise UnhealthyRun(f"FIRE step {s.step + 1}: positions became non-finite; check the model and the "
                               "structure (or lower minimize.maxstep)")
        if need:
            sim.rebuild()
        else:
            sim.domain.refresh(s)
        sim.compute_forces()
        s.step += 1

    # -- the loop ------------------------------------------------------------------------------
    def run(self, fmax: float = 0.05, steps: int = 1000, structure: str | None = None) -> dict:
        """Relax until every |f_i| < fmax (eV/Å) or ``steps`` steps; frames every
        ``trajectory.every`` steps and at the end; the relaxed structure to ``structure`` (any
        ASE format by its suffix; None: not written).  Returns {'converged', 'steps',
        'energy' (eV), 'fmax' (eV/Å)} on every rank.  Collective."""
        if not (isinstance(fmax, (int, float)) and math.isfinite(fmax) and fmax > 0):
            raise UserError(f"fmax={fmax!r}: give a force > 0 in eV/Å")
        if not (isinstance(steps, int) and steps >= 0):
            raise UserError(f"steps={steps!r}: give a whole number >= 0")
        sim = self.sim
        every = int(sim.cfg.trajectory.every)
        thermo = int(sim.cfg.thermo.every)
        try:
            self._setup(fmax, steps)
            s = sim.state
            f = self._forces()
            fm, e = self.fmax_now(f), self._energy()
            self._log(e, fm, force=True)
            self._frame(e)
            converged = fm < fmax
            while not converged and s.step < steps:
                self.step(f)
                f = self._forces()
                fm, e = self.fmax_now(f), self._energy()
                converged = fm < fmax
                last = converged or s.step >= steps
                self._log(e, fm, force=last or (thermo > 0 and s.step % thermo == 0))
                if last or (every > 0 and s.step % every == 0):
                    self._frame(e)
            s.velocities.zero_()
            word = "converged" if converged else f"NOT converged within {steps} steps"
            sim.reporter.line(f"FIRE {word}: {s.step} steps, energy {e:.10f} eV, fmax {fm:.3e} eV/Å "
                              f"(asked < {fmax:g})")
            if structure is not None:
                self._write_structure(structure, e)
            return {"converged": bool(converged), "steps": s.step, "energy": e, "fmax": fm}
        finally:
            sim.close()

    def _setup(self, fmax: float, steps: int) -> None:
        sim = self.sim
        s = sim.state
        s.velocities.zero_()
        sim.neighbors.deferred = None   # the per-step skin check: FIRE steps are not replayed
        sim.started = True
        sim.rebuild()
        if sim._min_distance > 0:
            health.close_contacts(sim.comm, sim.domain.close_pairs(s, sim._min_distance), sim._min_distance)
        with sim._output_step():
            sim._open_writer()
        from shardmd.models.registry import origin_text

        n_fixed = getattr(sim.integrator, "n_fixed", 0)
        sim.reporter.line(f"ShardMD FIRE minimisation (as ASE's): {sim.n_global} atoms ({n_fixed} fixed), model "
                          f"{origin_text(sim.model_origin)}, fmax {fmax:g} eV/Å, at most {steps} steps, maxstep "
                          f"{self.p['maxstep']:g} Å, {sim.cfg.precision} on {sim.device}, domains {sim.comm.size}")
        sim.compute_forces()

    def _energy(self) -> float:
        e = float(self.sim.results["energy"])
        if not math.isfinite(e):
            raise UnhealthyRun(f"FIRE step {self.sim.state.step}: the energy is {e}; check the model and the "
                               "structure")
        return e

    def _log(self, e: float, fm: float, force: bool) -> None:
        if force:
            self.sim.reporter.line(f"FIRE {self.sim.state.step:6d}  energy {e:.10f} eV  fmax {fm:.6e} eV/Å  "
                                   f"dt {self.dt:.4g}")

    def _frame(self, e: float) -> None:
        sim = self.sim
        if sim.writer is None:
            return
        from .trajectory_fields import model_outputs

        s = sim.state
        extra = model_outputs(sim.results, sim.cfg.trajectory.fields, sim.model)
        full = sim.domain.gather(s, ("positions", "images", "forces"), extra=extra)
        with sim._output_step():
            if full is not None:
                sim.writer.write_frame(s.step, 0.0, s.cell.detach().cpu().numpy(), positions=full["positions"],
                                       images=full["images"], velocities=np.zeros_like(full["positions"]),
                                       forces=full["forces"], **{k: full[k] for k in extra})
                sim.writer.write_observables(s.step, 0.0, {"potential_energy": e})

    def _write_structure(self, path: str, e: float) -> None:
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.constraints import FixAtoms
        from ase.io import write

        sim = self.sim
        from .state import atoms_from_arrays

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
                write(str(path), atoms)
            except Exception as exc:  # noqa: BLE001 - any writer failure becomes one line
                from .errors import OutputError

                raise OutputError(f"minimize.structure={str(path)!r}: cannot write it "
                                  f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                                  ) from None


def minimize_cfg(cfg):
    """The run configuration of ``python -m engine minimize``: no thermal velocities, no
    velocity field in frames, no checkpoints; refusals in one line."""
    import copy

    from omegaconf import open_dict

    m = cfg.minimize
    if m.cell:
        raise UserError("minimize.cell=true: cell relaxation is not available yet; relax the positions only "
                        "(drop minimize.cell)")
    if cfg.restart.file is not None:
        raise UserError("python -m engine minimize does not restart from checkpoints; drop restart= (start "
                        "from the structure: system.file=...)")
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.system.velocities = "zero"
        cfg.neighbor.deferred = False
        cfg.trajectory.fields = [f for f in cfg.trajectory.fields if f != "velocity"]
        cfg.checkpoint.every = 0
    return cfg


def minimize_run(cfg, comm=None) -> int:
    """``python -m engine minimize``: FIRE per the ``minimize`` keys on this rank; exit status 0
    (also when not converged within minimize.steps: the log says so)."""
    from .simulation import Simulation

    cfg = minimize_cfg(cfg)
    m = cfg.minimize
    structure = m.structure if m.structure is not None else str(Path(cfg.output).with_suffix(".extxyz"))
    sim = Simulation(cfg, comm=comm)
    FIRE(sim, dt=float(m.dt), maxstep=float(m.maxstep), dtmax=float(m.dtmax)).run(
        fmax=float(m.fmax), steps=int(m.steps), structure=structure)
    return 0
