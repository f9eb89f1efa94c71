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
step, new forces, check, until ``steps`` steps were taken.  Fixed atoms (engine/run/constraints.py:
FixAtoms of the input, ``fix.ids``) have f = 0 and v = 0, so dr = 0 for them, as ASE's FixAtoms
gives (its constrained forces and ``adjust_positions``).

Under decomposition v is stored in ``state.velocities`` (it migrates and is re-sorted with its
atom); the neighbour list is checked every step (skin/2 criterion, one all-reduce) and
rebuilt when needed; the deferred skin check is not used.  The trajectory (``output``, H5MD)
gets a frame every ``trajectory.every`` steps and at the end (its step is the FIRE step, time
0 fs, velocities 0.0: a relaxation has none); the potential energy is its observable.  The
relaxed structure goes to ``minimize.structure`` (extxyz by default; energy, forces and the
FixAtoms constraint attached).  Checkpoints are not written and ``restart`` is refused.

Cell relaxation (``minimize.cell=true``, ``FIRE(sim, cell=True, pressure=bar)``): FIRE on the
atoms and the cell together as ASE's FIRE on ``FrechetCellFilter(atoms, scalar_pressure=p)``
(engine/relax/cell_filter.py: why that filter, and its algebra).  The cell adds three rows to the
3N components: its coordinates (the log of the deformation gradient, times N), its velocity and
its generalized forces (the virial less p V, through the Frechet derivative, over N), so f.v,
|f|, |v| and |dr| run over them too, and ``fmax`` applies to the atoms' filter forces (f F)
and to the cell's rows, as ASE's convergence test on the filter.  Each rank holds the same cell
(the same global virial and sums); the atoms move as x' = (x F^-T + dx) (I + (F' - I)^T), so
fixed atoms (f = 0, v = 0) follow the cell with their fractional coordinates, as ASE's FixAtoms
under the filter.  The neighbour list takes the box check of NPT (engine/run/rank_domain.py: the
displacement less the cell's deformation), and a rebuild rechecks the domain grid against the new
cell: a cell that shrinks below the grid ends the run with one line.  Needs a model with a virial
and a cell periodic on all three axes (refused in one line otherwise).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from shardmd.engine.errors import UnhealthyRun, UserError
from shardmd.engine.relax.cell_filter import FrechetCell
from shardmd.engine.run import health
from shardmd.integrators.units import EV_PER_A3_TO_BAR

#: ASE's FIRE defaults (ase/optimize/fire.py; maxstep from Optimizer.defaults)
ASE_DEFAULTS = {"dt": 0.1, "maxstep": 0.2, "dtmax": 1.0, "nmin": 5, "finc": 1.1, "fdec": 0.5, "astart": 0.1,
                "fa": 0.99, "a": 0.1}


class FIRE:
    """FIRE on a :class:`~shardmd.engine.run.simulation.Simulation` that has not run yet (its state,
    model, decomposition, fixed atoms, writer and reporter).  Keyword arguments: ASE's FIRE
    parameters (:data:`ASE_DEFAULTS`; ``nmin`` is ASE's ``Nmin``)."""

    def __init__(self, sim, cell: bool = False, pressure: float = 0.0, **params):
        """cell: relax the cell too (FrechetCellFilter); pressure: its target, bar (as
        ``integrator.pressure``; ASE's scalar_pressure in eV/Å^3 times EV_PER_A3_TO_BAR)."""
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
        if not isinstance(cell, bool):
            raise UserError(f"minimize.cell={cell!r}: use true or false")
        if not (isinstance(pressure, (int, float)) and math.isfinite(pressure)):
            raise UserError(f"minimize.pressure={pressure!r}: give a finite pressure in bar")
        if cell and not bool(sim.state.pbc.all()):
            axes = "".join("xyz"[k] for k in range(3) if not bool(sim.state.pbc[k]))
            raise UserError(f"minimize.cell=true needs a cell periodic on all three axes; axis {axes} is not: "
                            "make it periodic or drop minimize.cell")
        self.sim = sim
        self.p = p
        self.dt, self.a, self.nsteps_pos = float(p["dt"]), float(p["a"]), 0   # ASE's dt, a, Nsteps
        self._first = True
        self.cell = cell
        self.pressure = float(pressure)   # bar
        self.filter: FrechetCell | None = None   # the cell's part (set up in run)
        self.vc = np.zeros((3, 3))                # the cell's FIRE velocity (the same on every rank)

    # -- global reductions ---------------------------------------------------------------
    def _sum(self, t: torch.Tensor) -> list[float]:
        comm = self.sim.comm
        return (comm.all_reduce(t, "sum") if comm.size > 1 else t).tolist()

    def _forces(self) -> tuple[torch.Tensor, np.ndarray | None]:
        """(the atoms' (n, 3) float64 forces, fixed atoms' rows 0, as FIRE and fmax see them; None).
        With the cell, the filter's: the atoms' f F and the cell's (3, 3) generalized forces (eV/Å)."""
        s = self.sim.state
        f = s.forces.double()
        zero = getattr(self.sim.integrator, "zero_fixed", None)
        f = zero(f, s.ids) if zero is not None else f
        if self.filter is None:
            return f, None
        cell = s.cell.double().cpu().numpy()
        virial = self.sim.results["virial"].detach().double().cpu().numpy()
        return _times(f, self.filter.deform_grad(cell)), self.filter.forces(virial, cell)

    def fmax_now(self, f: torch.Tensor, fc: np.ndarray | None = None) -> float:
        """Largest |f_i| over all atoms (eV/Å; collective), and over the cell's rows ``fc``."""
        local = (f * f).sum(1).max() if f.shape[0] else torch.zeros((), dtype=torch.float64, device=f.device)
        comm = self.sim.comm
        fm = math.sqrt(float((comm.all_reduce(local.reshape(1), "max") if comm.size > 1 else local.reshape(1))[0]))
        return fm if fc is None else max(fm, math.sqrt(float((fc * fc).sum(1).max())))

    # -- one step ---------------------------------------------------------------------------
    def step(self, f: torch.Tensor, fc: np.ndarray | None = None) -> None:
        """ASE's FIRE.step with forces ``f`` (fixed rows 0) and, relaxing the cell, the cell's
        ``fc``: moves the atoms (and the cell), then the list."""
        sim, p = self.sim, self.p
        s = sim.state
        v = s.velocities.double()
        vc = self.vc
        if self._first:
            v = torch.zeros_like(v)
            vc = np.zeros((3, 3))
            self._first = False
        else:
            vf, grad2, vv = self._sum(torch.stack([(f * v).sum(), (f * f).sum(), (v * v).sum()]))
            if fc is not None:   # the cell's three rows (the same on every rank: added after the reduction)
                vf, grad2, vv = vf + np.vdot(fc, vc), grad2 + np.vdot(fc, fc), vv + np.vdot(vc, vc)
            if vf > 0.0:
                v = (1.0 - self.a) * v + self.a * f / math.sqrt(grad2) * math.sqrt(vv)
                if fc is not None:
                    vc = (1.0 - self.a) * vc + self.a * fc / math.sqrt(grad2) * math.sqrt(vv)
                if self.nsteps_pos > p["nmin"]:
                    self.dt = min(self.dt * p["finc"], p["dtmax"])
                    self.a *= p["fa"]
                self.nsteps_pos += 1
            else:
                v = v * 0.0
                vc = vc * 0.0
                self.a = p["astart"]
                self.dt *= p["fdec"]
                self.nsteps_pos = 0
        v = v + self.dt * f
        dr = self.dt * v
        dr2 = self._sum((dr * dr).sum().reshape(1))[0]
        if fc is not None:
            vc = vc + self.dt * fc
            drc = self.dt * vc
            dr2 += float(np.vdot(drc, drc))
        normdr = math.sqrt(dr2)
        if normdr > p["maxstep"]:
            dr = p["maxstep"] * dr / normdr
            if fc is not None:
                drc = p["maxstep"] * drc / normdr
        if fc is None:
            s.positions.add_(dr.to(s.dtype))
        else:
            self._move_with_cell(dr, drc)
        self.vc = vc
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

    def _move_with_cell(self, dr: torch.Tensor, drc: np.ndarray) -> None:
        """The filter's move: cell coordinates + drc, atoms x' = (x F^-T + dr) (I + (F' - I)^T)."""
        s = self.sim.state
        cell = s.cell.double().cpu().numpy()
        new_cell, a, b = self.filter.step(cell, drc)
        if not np.all(np.isfinite(new_cell)):
            raise UnhealthyRun(f"FIRE step {s.step + 1}: the cell became non-finite; check the model's virial "
                               "(or lower minimize.maxstep)")
        x = _times(_times(s.positions.double(), a) + dr, b)
        s.positions.copy_(x.to(s.dtype))
        s.cell = torch.tensor(new_cell, dtype=s.cell.dtype, device=s.cell.device)

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
            f, fc = self._forces()
            fm, e = self.fmax_now(f, fc), self._energy()
            self._log(e, fm, force=True)
            self._frame(e, fm)
            converged = fm < fmax
            while not converged and s.step < steps:
                self.step(f, fc)
                f, fc = self._forces()
                fm, e = self.fmax_now(f, fc), self._energy()
                converged = fm < fmax
                last = converged or s.step >= steps
                self._log(e, fm, force=last or (thermo > 0 and s.step % thermo == 0))
                if last or (every > 0 and s.step % every == 0):
                    self._frame(e, fm)
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
        if self.cell:   # NPT's box check: the displacement less the cell's deformation (engine/run/rank_domain.py)
            sim.domain.nl.box_check = True
            sim.domain.shrink_fix = (f"the relaxed cell does not fit {sim.comm.size} domains: relax on fewer (or "
                                     "check minimize.pressure)")
        sim.rebuild()
        if sim._min_distance > 0:
            health.close_contacts(sim.comm, sim.domain.close_pairs(s, sim._min_distance), sim._min_distance)
        sim.run_record.kind = "minimize"   # the trajectory says so: plot and info show a minimisation
        with sim._output_step():
            sim._open_writer()
        n_fixed = getattr(sim.integrator, "n_fixed", 0)
        sim.reporter.line(f"ShardMD FIRE minimisation (as ASE's): {sim.n_global} atoms ({n_fixed} fixed), model "
                          f"{sim.run_record.origin_line()}, fmax {fmax:g} eV/Å, at most {steps} steps, maxstep "
                          f"{self.p['maxstep']:g} Å, {sim.cfg.precision} on {sim.device}, domains {sim.comm.size}"
                          + (f"; the cell relaxes too (FrechetCellFilter, {self.pressure:g} bar)" if self.cell else ""))
        sim.compute_forces()
        if self.cell:
            if sim.results.get("virial") is None:
                raise UserError(f"minimize.cell=true needs the model's virial (the stress) and model "
                                f"{sim.run_record.origin_line()} returns none; use a model with a virial or drop "
                                "minimize.cell")
            self.filter = FrechetCell(s.cell.double().cpu().numpy(), sim.n_global,
                                      self.pressure / EV_PER_A3_TO_BAR)

    def _energy(self) -> float:
        e = float(self.sim.results["energy"])
        if not math.isfinite(e):
            raise UnhealthyRun(f"FIRE step {self.sim.state.step}: the energy is {e}; check the model and the "
                               "structure")
        return e

    def _log(self, e: float, fm: float, force: bool) -> None:
        if force:
            vol = f"  volume {abs(float(torch.linalg.det(self.sim.state.cell.double()))):.6f} Å^3" if self.cell else ""
            self.sim.reporter.line(f"FIRE {self.sim.state.step:6d}  energy {e:.10f} eV  fmax {fm:.6e} eV/Å  "
                                   f"dt {self.dt:.4g}{vol}")

    def _frame(self, e: float, fm: float) -> None:
        """A frame and its observables: the energy (eV) and fmax (eV/Å) of this FIRE step."""
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

    def _write_structure(self, path: str, e: float) -> None:
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.constraints import FixAtoms
        from ase.io import write

        sim = self.sim
        from shardmd.engine.run.state import atoms_from_arrays

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


def _times(x: torch.Tensor, a: np.ndarray) -> torch.Tensor:
    """x @ a for rows x (n, 3) and a (3, 3), by columns: each row's three products and two adds in a
    fixed order, so an atom's result does not depend on which rank holds it or how many rows there are
    (a BLAS product may block differently by size)."""
    a = a.tolist()
    return torch.stack([x[:, 0] * a[0][j] + x[:, 1] * a[1][j] + x[:, 2] * a[2][j] for j in range(3)], dim=1)


def minimize_cfg(cfg):
    """The run configuration of ``python -m engine minimize``: no thermal velocities, no
    velocity field in frames, no checkpoints; refusals in one line."""
    import copy

    from omegaconf import open_dict

    if cfg.restart.file is not None:
        raise UserError("python -m engine minimize does not restart from checkpoints; drop restart= (start "
                        "from the structure: system.file=...)")
    from shardmd.engine.run.preflight import check_outputs

    check_outputs(cfg, structure=structure_path(cfg))   # the relaxed structure is no input, no other output
    structure = structure_path(cfg)
    if not cfg.overwrite and os.path.lexists(structure):   # as run's output: replaced only when asked
        given = ("minimize.structure" if cfg.minimize.structure is not None
                 else "output= with .extxyz: minimize.structure=null")
        raise UserError(f"the relaxed structure {structure!r} ({given}) exists; add overwrite=true to replace it, "
                        "or give minimize.structure= another name")
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.system.velocities = "zero"
        cfg.neighbor.deferred = False
        cfg.trajectory.fields = [f for f in cfg.trajectory.fields if f != "velocity"]
        cfg.checkpoint.every = 0
    return cfg


def structure_path(cfg) -> str:
    """Where ``minimize`` writes the relaxed structure: ``minimize.structure``, else ``output``
    with the suffix .extxyz."""
    m = cfg.minimize
    return str(m.structure) if m.structure is not None else str(Path(cfg.output).with_suffix(".extxyz"))


def minimize_run(cfg, comm=None) -> int:
    """``python -m engine minimize``: FIRE per the ``minimize`` keys on this rank; exit status 0
    (also when not converged within minimize.steps: the log says so)."""
    from shardmd.engine.run.simulation import Simulation

    cfg = minimize_cfg(cfg)
    m = cfg.minimize
    structure = structure_path(cfg)
    sim = Simulation(cfg, comm=comm)
    FIRE(sim, cell=bool(m.cell), pressure=float(m.pressure), dt=float(m.dt), maxstep=float(m.maxstep),
         dtmax=float(m.dtmax)).run(
        fmax=float(m.fmax), steps=int(m.steps), structure=structure)
    return 0
