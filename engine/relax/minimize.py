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
from shardmd.engine.relax.base import Relaxation, _times, check_restart_keys
from shardmd.engine.relax.cell_filter import FrechetCell
from shardmd.integrators.units import EV_PER_A3_TO_BAR

#: ASE's FIRE defaults (ase/optimize/fire.py; maxstep from Optimizer.defaults)
ASE_DEFAULTS = {"dt": 0.1, "maxstep": 0.2, "dtmax": 1.0, "nmin": 5, "finc": 1.1, "fdec": 0.5, "astart": 0.1,
                "fa": 0.99, "a": 0.1}


class FIRE(Relaxation):
    """FIRE on a :class:`~shardmd.engine.run.simulation.Simulation` that has not run yet (its state,
    model, decomposition, fixed atoms, writer and reporter).  Keyword arguments: ASE's FIRE
    parameters (:data:`ASE_DEFAULTS`; ``nmin`` is ASE's ``Nmin``)."""

    name, method, title = "FIRE", "fire", "as ASE's"

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
        super().__init__(sim, cell, pressure)
        self.p = p
        self.maxstep = float(p["maxstep"])
        self.dt, self.a, self.nsteps_pos = float(p["dt"]), float(p["a"]), 0   # ASE's dt, a, Nsteps
        self._first = True
        self.filter: FrechetCell | None = None   # the cell's part (set up in run)
        self.vc = np.zeros((3, 3))                # the cell's FIRE velocity (the same on every rank)
        self._f: torch.Tensor | None = None       # the forces _measure saw, and the cell's rows
        self._fc: np.ndarray | None = None
        self._cell0 = None
        if self.restored is not None:   # the checkpoint's state, checked before anything is written
            self.dt, self.a = self._scalar("dt"), self._scalar("a")
            self.nsteps_pos, self._first = self._scalar("nsteps_pos", int), self._scalar("first", bool)
            self.vc = np.array(self._saved("vc", (3, 3)), dtype=np.float64)
            self._cell0 = self._saved("cell0", (3, 3)) if cell else None

    # -- state: fresh, restored, saved -----------------------------------------------------------
    def _start(self) -> None:
        if self.cell:   # the filter's reference cell: the first one, or the checkpoint's
            cell0 = self.sim.state.cell.double().cpu().numpy() if self._cell0 is None else self._cell0
            self.filter = FrechetCell(cell0, self.sim.n_global, self.pressure / EV_PER_A3_TO_BAR)

    def _state(self) -> tuple[dict, dict]:
        """FIRE's scalars and the cell's velocity and reference cell (its v is the atoms' velocities)."""
        arrays = {"vc": self.vc}
        if self.filter is not None:
            arrays["cell0"] = self.filter.cell0
        return {"dt": self.dt, "a": self.a, "nsteps_pos": self.nsteps_pos, "first": self._first}, arrays

    def _log_extra(self) -> str:
        return f"  dt {self.dt:.4g}"

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

    def _measure(self) -> float:
        self._f, self._fc = self._forces()
        return self.fmax_now(self._f, self._fc)

    def fmax_now(self, f: torch.Tensor, fc: np.ndarray | None = None) -> float:
        """Largest |f_i| over all atoms (eV/Å; collective), and over the cell's rows ``fc``."""
        local = (f * f).sum(1).max() if f.shape[0] else torch.zeros((), dtype=torch.float64, device=f.device)
        comm = self.sim.comm
        fm = math.sqrt(float((comm.all_reduce(local.reshape(1), "max") if comm.size > 1 else local.reshape(1))[0]))
        return fm if fc is None else max(fm, math.sqrt(float((fc * fc).sum(1).max())))

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> None:
        """ASE's FIRE.step with the forces :meth:`_measure` saw (fixed rows 0) and, relaxing
        the cell, the cell's rows: moves the atoms (and the cell), then the list and the forces."""
        self.move()
        self._moved()

    def move(self) -> None:
        """:meth:`step` up to the list and the forces (engine/batch/relax_lockstep.py: many
        systems' forces in one call)."""
        p, f, fc = self.p, self._f, self._fc
        s = self.sim.state
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


def check_method(m) -> None:
    """The minimize keys that exclude each other (one-line UserError)."""
    if m.symmetry and m.method == "fire":
        raise UserError("minimize.symmetry=true keeps the space group through ASE's FixSymmetry, which acts on ASE's "
                        "optimisers: use minimize.method=lbfgs or bfgs (or drop minimize.symmetry)")


def minimize_cfg(cfg):
    """The run configuration of ``python -m engine minimize``: no thermal velocities, no
    velocity field in frames, ``steps`` = ``minimize.steps`` (a restart's bound); refusals in
    one line, before anything runs."""
    import copy

    from omegaconf import open_dict

    m = cfg.minimize
    check_method(m)
    from shardmd.engine.run.preflight import check_outputs

    check_outputs(cfg, structure=structure_path(cfg))   # the relaxed structure is no input, no other output
    structure = structure_path(cfg)
    # as run's output: replaced only when asked, or by the relaxation it belongs to (restart=)
    if not cfg.overwrite and cfg.restart.file is None and os.path.lexists(structure):
        given = ("minimize.structure" if m.structure is not None
                 else "output= with .extxyz: minimize.structure=null")
        raise UserError(f"the relaxed structure {structure!r} ({given}) exists; add overwrite=true to replace it, "
                        "or give minimize.structure= another name")
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.system.velocities = "zero"
        cfg.neighbor.deferred = False
        cfg.trajectory.fields = [f for f in cfg.trajectory.fields if f != "velocity"]
        cfg.steps = int(m.steps)
    return cfg


def structure_path(cfg) -> str:
    """Where ``minimize`` writes the relaxed structure: ``minimize.structure``, else ``output``
    with the suffix .extxyz."""
    m = cfg.minimize
    return str(m.structure) if m.structure is not None else str(Path(cfg.output).with_suffix(".extxyz"))


def minimizer(sim, m) -> Relaxation:
    """The minimiser ``minimize.method`` names (the ``minimize`` keys ``m``) on ``sim``."""
    if m.method == "fire":
        return FIRE(sim, cell=bool(m.cell), pressure=float(m.pressure), dt=float(m.dt), maxstep=float(m.maxstep),
                    dtmax=float(m.dtmax))
    from shardmd.engine.relax.quasi_newton import BFGS, LBFGS

    kw = {"cell": bool(m.cell), "pressure": float(m.pressure), "symmetry": bool(m.symmetry),
          "symprec": float(m.symprec), "maxstep": float(m.maxstep), "alpha": float(m.alpha)}
    return LBFGS(sim, memory=int(m.memory), **kw) if m.method == "lbfgs" else BFGS(sim, **kw)


def minimize_run(cfg, comm=None) -> int:
    """``python -m engine minimize``: the ``minimize`` keys' relaxation on this rank, fresh or
    continued from a checkpoint (``restart=``); exit status 0 (also when not converged within
    minimize.steps: the log says so)."""
    from shardmd.engine.run.simulation import Simulation

    cfg = minimize_cfg(cfg)
    m = cfg.minimize
    sim = Simulation(cfg, comm=comm)
    if sim.checkpoint_in is not None:
        check_restart_keys(cfg, sim.checkpoint_in)
    minimizer(sim, m).run(fmax=float(m.fmax), steps=int(m.steps), structure=structure_path(cfg))
    return 0
