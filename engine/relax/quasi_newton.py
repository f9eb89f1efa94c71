"""L-BFGS and BFGS minimisation: ASE's own optimisers (``ase.optimize.LBFGS``, ``BFGS``; ASE
3.29) driven by the engine's forces under domain decomposition.

    python -m engine minimize model=mace system.file=slab.extxyz minimize.method=lbfgs minimize.fmax=0.01

    sim = Simulation(cfg, state=State.from_atoms(atoms))
    LBFGS(sim, memory=100).run(fmax=0.01, steps=500)       # {'converged', 'steps', 'energy', 'fmax'}

Rank 0 holds the problem as ASE sees it: an ``ase.Atoms`` of every atom in id order (positions
continuous: never wrapped), with the input's ``FixAtoms``, with ASE's ``FixSymmetry`` when asked
(engine/relax/symmetry.py), wrapped in ``FrechetCellFilter(atoms, scalar_pressure=p)`` when the
cell relaxes, and ASE's optimiser on it with ASE's parameters (maxstep 0.2 Å, alpha 70 eV/Å^2,
L-BFGS memory 100; no line search).  One iteration, as ASE's ``Optimizer.irun`` takes it:

    all ranks  forces (and the virial) of the current positions; the forces gathered to rank 0
    rank 0     the results put on the Atoms (a SinglePointCalculator: energy, forces, stress
               -W/V), ASE's gradient (constraints and filter applied); its largest row is fmax,
               broadcast (converged when fmax < minimize.fmax, strictly)
    rank 0     ``opt.step()``: the displacement dx = x_new - x_old (n, 3) and the new cell,
               broadcast
    all ranks  their atoms move by their rows of dx less images @ (cell_new - cell_old) (the
               positions are wrapped, ASE's are not), the skin check, a rebuild or ghost refresh

so the optimiser's state exists once, by construction the same for every domain count, and the
decomposition changes the forces' rounding only (docs/design.md, "Quasi-Newton minimisers under
decomposition").  Per iteration: one gather of the forces and one broadcast of dx (O(n) each);
rank 0 holds L-BFGS's history, 2 * memory * 3n floats (480 MB for 1e5 atoms at memory 100), or
BFGS's (3n)^2 Hessian, eigendecomposed every step: refused above :data:`BFGS_MAX_ATOMS` atoms.

Checkpoints hold ASE's own restart content (what its ``restart=`` JSON file would: L-BFGS's
iteration, s, y, rho, r0, f0; BFGS's Hessian, pos0, forces0), ASE's positions and cell, the
filter's reference cell and FixSymmetry's operations, as HDF5 arrays (engine/relax/base.py); a
restart hands them back through the optimiser's ``read()`` and continues bit for bit.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from shardmd.engine.errors import UnhealthyRun, UserError
from shardmd.engine.relax import symmetry as sym
from shardmd.engine.relax.base import Relaxation, _times
from shardmd.integrators.units import EV_PER_A3_TO_BAR

#: most atoms BFGS takes: its (3n)^2 Hessian (2000 atoms: 290 MB) is eigendecomposed every step
BFGS_MAX_ATOMS = 2000


class AseOptimizer(Relaxation):
    """ASE's optimiser ``ase_name`` on rank 0, on the engine's forces (module docstring)."""

    ase_name = "?"

    def __init__(self, sim, cell: bool = False, pressure: float = 0.0, symmetry: bool = False,
                 symprec: float = 0.01, maxstep: float = 0.2, alpha: float = 70.0):
        """cell: relax the cell too (ASE's FrechetCellFilter); pressure: its target, bar;
        symmetry: keep the space group (ASE's FixSymmetry at ``symprec`` Å); maxstep: Å, the
        largest atom's step (at most 1, ASE's bound); alpha: eV/Å^2, the initial Hessian."""
        if not (isinstance(maxstep, (int, float)) and 0 < maxstep <= 1.0):
            raise UserError(f"minimize.maxstep={maxstep!r}: {self.name} takes a step of 0 < maxstep <= 1.0 Å "
                            "(ASE's bound)")
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise UserError(f"minimize.alpha={alpha!r}: give a curvature > 0 in eV/Å^2")
        if not isinstance(symmetry, bool):
            raise UserError(f"minimize.symmetry={symmetry!r}: use true or false")
        if not (isinstance(symprec, (int, float)) and math.isfinite(symprec) and symprec > 0):
            raise UserError(f"minimize.symprec={symprec!r}: give a tolerance > 0 in Å")
        super().__init__(sim, cell, pressure)
        if symmetry:
            sym.check_applicable(sim)
            if self.restored is None:   # the group, before anything is written (the checkpoint has one)
                full = sim.domain.gather(sim.state, ("positions", "numbers"))
                with sim._output_step():
                    if full is not None:
                        from ase import Atoms

                        sym.space_group(Atoms(numbers=full["numbers"], positions=full["positions"],
                                              cell=sim.state.cell.double().cpu().numpy(), pbc=True), float(symprec))
        self.maxstep, self.alpha = float(maxstep), float(alpha)
        self.symmetry, self.symprec = symmetry, float(symprec)
        self.title = f"ASE's {self.ase_name} on rank 0" + (", FixSymmetry" if symmetry else "")
        self.atoms = self.opt = self.fix_symmetry = None   # rank 0's ASE objects (made in _start)
        self._history_saved = self._symmetry_saved = None
        if self.restored is not None:   # the checkpoint's state checked before anything is written
            n = int(sim.n_global)
            self._saved("x", (n, 3))
            self._saved("cell", (3, 3))
            if cell:
                self._saved("orig_cell", (3, 3))
            if symmetry:
                self._symmetry_saved = sym.saved_state(self._saved, self._unusable, n)
            self._history_saved = self._restore_history()
        self._ids: np.ndarray | None = None                # (n,) the global ids in id order (every rank)
        self._cell: np.ndarray | None = None               # (3, 3) Å float64, ASE's cell (every rank)

    def _optimizer(self, target):
        raise NotImplementedError

    def _history(self) -> tuple[dict, dict]:
        """(scalars, arrays) of the optimiser's ASE restart content (rank 0)."""
        raise NotImplementedError

    def _restore_history(self) -> tuple | None:
        """The ASE restart content (the tuple ``opt.read()`` loads) from the checkpoint, checked,
        or None (a checkpoint of a relaxation that took no step yet)."""
        raise NotImplementedError

    def _ndofs(self) -> int:
        """The optimiser's degrees of freedom: 3 per atom, and the cell's 9 (FrechetCellFilter)."""
        return 3 * (int(self.sim.n_global) + (3 if self.cell else 0))

    # -- set-up: rank 0's ASE objects ----------------------------------------------------------------
    def _start(self) -> None:
        sim = self.sim
        s = sim.state
        full = sim.domain.gather(s, ("positions", "images", "numbers", "masses"))
        self._cell = s.cell.double().cpu().numpy()
        moved = None
        with sim._output_step():   # a refusal on rank 0 (symmetry, a damaged checkpoint) ends every rank
            if full is not None:
                moved = self._build(full)
        ids, dx, cell = sim.comm.broadcast_object(moved)
        self._ids = ids
        if self.restored is not None:
            self._cell = cell   # ASE's cell (the state's, in float64 runs)
            return
        if dx is not None:   # FixSymmetry refined the structure: move, rebuild, forces again
            self._apply(dx, cell)
            sim.rebuild()
            sim.compute_forces()

    def _build(self, full: dict) -> tuple:
        """Rank 0: the Atoms, constraints, filter and optimiser, fresh or from the checkpoint;
        returns (ids, dx of the refinement or None, ASE's cell)."""
        from ase import Atoms
        from ase.constraints import FixAtoms
        from ase.filters import FrechetCellFilter

        sim = self.sim
        ids = full["ids"]
        pbc = sim.state.pbc.cpu().numpy()
        if self.restored is None:
            x = full["positions"].astype(np.float64) + full["images"].astype(np.float64) @ self._cell
            cell = self._cell
        else:
            x = np.array(self._saved("x", (len(ids), 3)), dtype=np.float64)
            cell = np.array(self._saved("cell", (3, 3)), dtype=np.float64)
        atoms = Atoms(numbers=full["numbers"], positions=x, cell=cell, pbc=pbc,
                      masses=full["masses"].astype(np.float64))
        fixed = getattr(sim.integrator, "fixed_ids", None)
        if fixed is not None:
            atoms.set_constraint(FixAtoms(indices=np.searchsorted(ids, fixed.numpy())))
        dx = None
        if self.symmetry and self.restored is None:
            self.fix_symmetry, line = sym.fix_symmetry(atoms, self.symprec)
            sim.reporter.line(line)
            dx = atoms.positions - x
            cell = atoms.cell.array.copy()
        elif self.symmetry:
            self.fix_symmetry = sym.restored(atoms, self.symprec, self._symmetry_saved)
        if self.fix_symmetry is not None:
            atoms.set_constraint(self.fix_symmetry)
        target = atoms
        if self.cell:
            target = FrechetCellFilter(atoms, scalar_pressure=self.pressure / EV_PER_A3_TO_BAR)
            if self.restored is not None:
                target.orig_cell = self._saved("orig_cell", (3, 3))
        self.atoms, self.target = atoms, target
        self.opt = self._optimizer(target)
        if self.restored is not None:
            self.opt.nsteps = sim.state.step
            history = self._history_saved
            if history is not None:
                if self.cell and len(history) == 4:   # BFGS's content on a filter ends with its reference cell
                    history = (*history, np.array(target.orig_cell))
                self.opt.saved_history = history
                self.opt.read()   # ASE's own restart path, from our arrays instead of its JSON file
        return ids, dx, cell

    def _state(self) -> tuple[dict, dict | None]:
        if self.opt is None:   # ranks other than 0
            return {}, None
        scalars, arrays = self._history()
        arrays.update({"x": self.atoms.positions, "cell": self.atoms.cell.array})
        if self.cell:
            arrays["orig_cell"] = np.asarray(self.target.orig_cell, dtype=np.float64)
        if self.fix_symmetry is not None:
            arrays.update(sym.state(self.fix_symmetry))
        return scalars, arrays

    # -- one iteration -----------------------------------------------------------------------------------
    def _measure(self) -> float:
        """Rank 0 puts this step's results on its Atoms and reads ASE's gradient; its largest
        row (eV/Å) for every rank."""
        from ase.calculators.singlepoint import SinglePointCalculator

        sim = self.sim
        full = sim.domain.gather(sim.state, ("forces",))
        fm = None
        with sim._output_step():
            if full is not None:
                e = float(sim.results["energy"])
                res = {"energy": e, "free_energy": e, "forces": full["forces"].astype(np.float64)}
                if self.cell:   # ASE's stress (Voigt xx yy zz yz xz xy) from the virial, as our ASE calculator
                    s = -sim.results["virial"].detach().double().cpu().numpy() / abs(np.linalg.det(self._cell))
                    res["stress"] = np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])
                self.atoms.calc = SinglePointCalculator(self.atoms, **res)
                optimizable = self.opt.optimizable
                fm = float(optimizable.gradient_norm(optimizable.get_gradient()))
        return float(sim.comm.broadcast_object(fm))

    def step(self) -> None:
        """ASE's step on rank 0; every rank's atoms (and cell) follow it; the list; the forces."""
        sim = self.sim
        msg = None
        with sim._output_step():
            if self.opt is not None:
                msg = self._ase_step()
        dx, cell = sim.comm.broadcast_object(msg)
        self._apply(dx, cell)
        self._moved()

    def _ase_step(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Rank 0: ``opt.step()``; (dx (n, 3) Å, the new cell or None when it did not change)."""
        from ase.calculators.calculator import PropertyNotImplementedError

        x0 = self.atoms.positions.copy()
        try:
            self.opt.step()
        except (RuntimeError, ValueError, PropertyNotImplementedError, np.linalg.LinAlgError) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UnhealthyRun(f"{self.name} step {self.sim.state.step + 1}: ASE's {self.ase_name} failed ({text}); "
                               "lower minimize.maxstep or check the structure") from None
        self.opt.nsteps += 1
        cell = self.atoms.cell.array
        return self.atoms.positions - x0, (None if np.array_equal(cell, self._cell) else cell.copy())

    def _apply(self, dx: np.ndarray, cell: np.ndarray | None) -> None:
        """This rank's atoms move by their rows of ``dx`` (n, 3) Å, id order; a new ``cell``:
        less images @ (cell - old cell), as their positions are wrapped images of ASE's."""
        s = self.sim.state
        rows = torch.as_tensor(np.searchsorted(self._ids, s.ids.cpu().numpy()), device=s.device)
        d = torch.as_tensor(dx, dtype=torch.float64, device=s.device)[rows]
        if cell is not None and not np.array_equal(cell, self._cell):
            d = d - _times(s.images.double(), cell - self._cell)
            self._cell = np.array(cell, dtype=np.float64)
            s.cell = torch.tensor(self._cell, dtype=s.cell.dtype, device=s.cell.device)
        s.positions.copy_((s.positions.double() + d).to(s.dtype))


def _restorable(cls):
    """``cls`` (an ASE optimiser) whose ``load`` hands ASE's own ``read()`` the restart content
    a checkpoint held (``saved_history``), not a JSON file's (it writes none: ``restart=None``)."""
    class Restorable(cls):
        saved_history: tuple | None = None

        def load(self):
            return self.saved_history

    Restorable.__name__ = cls.__name__
    return Restorable


class LBFGS(AseOptimizer):
    """ASE's ``LBFGS`` (memory, maxstep, alpha; damping 1, no line search) on the engine's forces."""

    name, method, ase_name = "L-BFGS", "lbfgs", "LBFGS"

    def __init__(self, sim, memory: int = 100, **kw):
        if not (isinstance(memory, int) and not isinstance(memory, bool) and memory >= 1):
            raise UserError(f"minimize.memory={memory!r}: give a whole number >= 1")
        self.memory = memory
        super().__init__(sim, **kw)

    def _optimizer(self, target):
        from ase.optimize import LBFGS as AseLBFGS
        from ase.parallel import DummyMPI

        return _restorable(AseLBFGS)(target, logfile=None, maxstep=self.maxstep, memory=self.memory,
                                    alpha=self.alpha, comm=DummyMPI())

    def _history(self) -> tuple[dict, dict]:
        st = self.opt.state
        d = self.opt.optimizable.ndofs()
        k = len(st.s)
        arrays = {"s": np.array(st.s, dtype=np.float64).reshape(k, d),
                  "y": np.array(st.y, dtype=np.float64).reshape(k, d),
                  "rho": np.array(st.rho, dtype=np.float64).reshape(k)}
        if self.opt.r0 is not None:
            arrays.update({"r0": self.opt.r0, "f0": self.opt.f0})
        return {"iteration": int(st.iteration), "task": str(self.opt.task)}, arrays

    def _restore_history(self) -> tuple | None:
        it = self._scalar("iteration", int)
        if it == 0:
            return None
        d = self._ndofs()
        s = self._saved("s", (None, d))
        k = s.shape[0]
        if k > self.memory + 1:
            raise self._unusable(f"minimizer/s holds {k} steps, more than minimize.memory={self.memory} keeps")
        y, rho = self._saved("y", (k, d)), self._saved("rho", (k,))
        r0, f0 = self._saved("r0", (d,)), self._saved("f0", (d,))
        task = self.restored["state"].get("task", "START")
        return (it, [r.copy() for r in s], [r.copy() for r in y], [float(v) for v in rho], r0.copy(), f0.copy(),
                None, str(task))


class BFGS(AseOptimizer):
    """ASE's ``BFGS`` (maxstep, alpha) on the engine's forces; at most :data:`BFGS_MAX_ATOMS` atoms."""

    name, method, ase_name = "BFGS", "bfgs", "BFGS"

    def __init__(self, sim, **kw):
        n = int(sim.n_global)
        if n > BFGS_MAX_ATOMS:
            d = 3 * (n + 3)
            raise UserError(f"minimize.method=bfgs keeps a (3N)^2 Hessian on rank 0: {n} atoms need "
                            f"{d * d * 8 / 2**30:.1f} GiB and its eigendecomposition every step; use "
                            f"minimize.method=lbfgs (bfgs takes at most {BFGS_MAX_ATOMS} atoms)")
        super().__init__(sim, **kw)

    def _optimizer(self, target):
        from ase.optimize import BFGS as AseBFGS
        from ase.parallel import DummyMPI

        return _restorable(AseBFGS)(target, logfile=None, maxstep=self.maxstep, alpha=self.alpha, comm=DummyMPI())

    def _history(self) -> tuple[dict, dict]:
        opt = self.opt   # what ASE's dump writes: (hessian, pos0, forces0, maxstep[, orig_cell]), once it stepped
        if opt.state is None:
            return {"iteration": 0}, {}
        return {"iteration": 1}, {"hessian": opt.H, "pos0": opt.pos0, "forces0": opt.forces0}

    def _restore_history(self) -> tuple | None:
        if self._scalar("iteration", int) == 0:
            return None
        d = self._ndofs()
        return (np.array(self._saved("hessian", (d, d))), self._saved("pos0", (d,)).copy(),
                self._saved("forces0", (d,)).copy(), self.maxstep)
