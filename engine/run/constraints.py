"""Fixed atoms: ASE ``FixAtoms`` of an input and the ``fix.ids`` key, applied around any integrator.

Which atoms: the union of the input's ``FixAtoms`` (a structure file's, or of the ``ase.Atoms``
given to :meth:`State.from_atoms`; kept on the State as ``fixed_ids``) and ``fix.ids`` (global
atom ids, 0-based: the order of the input).  A restart takes the set stored in its checkpoint
(the integrator's state dict, key ``fixed_ids``, as [start, stop) id ranges); a ``fix.ids`` that
is not part of it is refused.  Any other ASE constraint (FixBondLengths, FixCom, Hookean,
FixCartesian, ...) is refused with one line naming it: it would otherwise be dropped silently.
Ids out of range, an id named twice and a set that holds every atom are refused too; so is a
checkpoint's set with ranges beyond its atoms, ids no atom has or every atom (checked on the ranges
before they are expanded: :func:`fixed_ranges_problem`).

How (:class:`FixedAtoms`, installed by one line in ``Simulation.__init__``; the integrators stay
unaware of it): before each half step the integrator gets the forces with the fixed atoms' rows
zeroed (a copy: the model's forces in the state, written to the trajectory, are left as the
model gave them); after the first half the fixed atoms' positions are put back exactly (a
Langevin kick or a thermostat never moves them) and their velocities set to 0.0, and after
the second half their velocities are 0.0 again.  So a fixed atom moves by exactly 0.0 with
every integrator.  The rows are found by id (``torch.isin`` on the current ids, recomputed only
when the ids tensor changes, i.e. after a migration or re-sort), so fixed-ness follows the
atoms across domains.

Degrees of freedom (temperature, thermostats): with k > 0 fixed atoms, dof = 3 (N - k), the
convention of ASE (``Atoms.get_temperature``: 3N minus ``FixAtoms.get_removed_dof`` = 3 per
fixed atom; ASE never removes the centre-of-mass 3).  We do not subtract the 3 of momentum
conservation that verlet, nose-hoover and csvr take without fixed atoms (3N - 3): fixed atoms
are an external potential for the others, so the mobile atoms' total momentum is not conserved
(a slab on fixed layers exchanges momentum with them) and all 3 (N - k) velocity components
fluctuate.  LAMMPS keeps its ``extra/dof`` of 3 unless told otherwise (``compute_modify extra/dof
0``); with a temperature compute over the mobile group it gives 3 (N - k) - 3, which differs
from ours by 3 and is only right for mobile atoms that never touch the fixed ones.  For the
same reason thermal initial velocities are not made momentum-free when atoms are fixed.  The
thermostats (nose-hoover, csvr) count their dof through their own ``degrees_of_freedom``;
the wrapper sets that attribute on the wrapped integrator's instance (the hook: a bound
method shadowing the class's), so their chain masses and targets use 3 (N - k).

Units: Å, Å/fs, eV/Å, amu, fs, as the integrators.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from shardmd.engine.errors import UserError
from shardmd.engine.io.checkpoint_check import fixed_ranges_problem
from shardmd.integrators.units import MVV_TO_EV

#: the ASE constraint the engine applies; every other one is refused
SUPPORTED = ("FixAtoms",)


def ase_constraints(atoms) -> tuple[np.ndarray, tuple[str, ...]]:
    """(indices of the atoms ASE ``FixAtoms`` hold fixed (sorted, unique, int64), class names of
    every other constraint) of ``atoms``."""
    fixed, other = [], []
    if not atoms.constraints:   # the usual case: ase.constraints imports scipy (~0.5 s of CPU)
        return np.zeros(0, dtype=np.int64), ()
    from ase.constraints import FixAtoms

    for c in atoms.constraints:
        if type(c) is FixAtoms:
            fixed.append(np.asarray(c.get_indices(), dtype=np.int64))
        else:
            other.append(type(c).__name__)
    idx = np.unique(np.concatenate(fixed)) if fixed else np.zeros(0, dtype=np.int64)
    return idx, tuple(other)


def fixed_dof(n_atoms: int, n_fixed: int) -> int:
    """Degrees of freedom of ``n_atoms`` atoms of which ``n_fixed`` > 0 are fixed: 3 (N - k)."""
    return max(3 * (int(n_atoms) - int(n_fixed)), 1)


def check_thermostat_dof(integrator, n_atoms: int) -> None:
    """Refuse a thermostat that holds the total momentum (nose-hoover, csvr, npt) for a single
    atom: 3N - 3 = 0 degrees of freedom, nothing it could act on (its scaling would change the
    one momentum it must keep).  Verlet runs it (temperature 0 K, integrators/velocity_verlet.py),
    langevin too (3N)."""
    if n_atoms < 2 and getattr(integrator, "conserves_momentum", False) and hasattr(integrator, "temperature"):
        raise UserError(f"integrator={integrator.name} with {n_atoms} atom: a thermostat that holds the total "
                        "momentum has 3N - 3 = 0 degrees of freedom to act on; use integrator=langevin (3N) or "
                        "integrator=verlet, or give 2 atoms or more")


def to_ranges(ids: torch.Tensor) -> list[list[int]]:
    """Sorted unique ids -> [[start, stop), ...] (how a checkpoint stores them: compact for layers)."""
    x = ids.cpu().tolist()
    out: list[list[int]] = []
    for i in x:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def from_ranges(ranges) -> torch.Tensor:
    """[[start, stop), ...] -> the ids (int64); ``ranges`` checked by :func:`fixed_ranges_problem`
    first (a range of 1e11 ids would allocate 800 GB)."""
    if not ranges:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(int(a), int(b), dtype=torch.int64) for a, b in ranges])


def _group_ids(cfg, state, name: str) -> np.ndarray:
    """The ids of ``groups.<name>`` (engine/observables/groups.py); one line when there is none."""
    from shardmd.engine.observables.groups import select

    defined = cfg.get("groups") or {}
    if name not in defined:
        raise UserError(f"fix.group={name}: no group {name!r}; define it, e.g. groups.{name}={{ids: '0-99'}} "
                        f"(groups: {', '.join(defined) or 'none'})")
    return select(name, dict(defined[name]), state.ids.cpu().numpy(), state.numbers.cpu().numpy())


def resolve_fixed(cfg, state, checkpoint: dict | None) -> torch.Tensor:
    """Sorted unique global ids (int64, CPU) of the atoms held fixed in this run; empty: none.

    cfg: the run's configuration (``fix.ids``, ``fix.group``); state: the full initial State (every atom, id
    order not needed); checkpoint: a restart's checkpoint (its set wins) or None."""
    fix_cfg = cfg.get("fix") if hasattr(cfg, "get") else None
    given = [int(i) for i in (fix_cfg.ids if fix_cfg is not None else [])]
    if len(set(given)) != len(given):
        dup = sorted({i for i in given if given.count(i) > 1})
        raise UserError(f"fix.ids names id {dup[0]} more than once; give each id once")
    group = fix_cfg.get("group") if fix_cfg is not None else None
    if group is not None:   # fix.group: the group's atoms besides fix.ids
        given = sorted(set(given) | set(_group_ids(cfg, state, str(group)).tolist()))
    if checkpoint is not None:
        stored = (checkpoint.get("integrator") or {}).get("fixed_ids")
        problem = fixed_ranges_problem(stored, state.ids.cpu().numpy()) if stored else None
        if problem:   # read_checkpoint checks this too; a checkpoint dict built by hand meets it here
            where = checkpoint.get("shown", checkpoint.get("path", ""))
            raise UserError(f"checkpoint {where}: fixed_ids {problem}; use another checkpoint")
        fixed = from_ranges(stored) if stored else torch.zeros(0, dtype=torch.int64)
        extra = sorted(set(given) - set(fixed.tolist()))
        if extra:
            raise UserError(f"fix.ids holds id {extra[0]}, which the checkpoint's run did not fix; a restart keeps "
                            "the checkpoint's fixed atoms: drop fix.ids or start a fresh run")
        return fixed
    other = tuple(getattr(state, "other_constraints", ()) or ())
    if other:
        raise UserError(f"the input carries the ASE constraint {other[0]}, which ShardMD does not apply; only "
                        f"{', '.join(SUPPORTED)} is supported: remove it (atoms.set_constraint()) or use fix.ids")
    ids = state.ids.cpu()
    n = int(ids.shape[0])
    sets = [torch.as_tensor(given, dtype=torch.int64)]
    if getattr(state, "fixed_ids", None) is not None:
        sets.append(state.fixed_ids.cpu().to(torch.int64))
    fixed = torch.unique(torch.cat(sets))
    missing = fixed[~torch.isin(fixed, ids)]
    if missing.numel():
        lo, hi = (int(ids.min()), int(ids.max())) if n else (0, -1)
        raise UserError(f"fix.ids holds id {int(missing[0])}, but the system's ids are {lo}..{hi} ({n} atoms); "
                        "give ids of this system (0-based, the input's order)")
    if fixed.numel() and fixed.numel() >= n:
        raise UserError(f"every atom ({n}) is fixed: nothing would move; fix fewer atoms (fix.ids, FixAtoms)")
    return fixed


class FixedAtoms:
    """Wraps an integrator of integrators/: the fixed atoms' forces are zero for it, their
    velocities 0.0 and positions unchanged after each half (module docstring).

    inner: the integrator; fixed_ids: (k,) sorted global ids, k >= 1; current_ids: callable
    returning the (n,) ids of this rank's atoms now (the ids the second half's rows belong to,
    after a rebuild may have re-sorted them); n_fixed: k (global)."""

    def __init__(self, inner, fixed_ids: torch.Tensor, current_ids: Callable[[], torch.Tensor]):
        self.inner = inner
        self.fixed_ids = fixed_ids.cpu().to(torch.int64)
        self.n_fixed = int(self.fixed_ids.numel())
        self.current_ids = current_ids
        self._ids = None          # the ids tensor the cached rows belong to
        self._rows: torch.Tensor | None = None
        inner.degrees_of_freedom = self.degrees_of_freedom   # the thermostats' own dof count (hook)

    # what the engine reads of an integrator
    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dt(self) -> float:
        return self.inner.dt

    conserves_momentum = False   # the fixed atoms are an external potential for the others

    def __getattr__(self, item):   # conserved_energy, temperature, ... of the wrapped integrator
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        """3 (N - k) (ASE's count; module docstring)."""
        return fixed_dof(n_atoms, self.n_fixed)

    def fixed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(m,) int64 rows of ``ids`` that are fixed atoms (cached per ids tensor)."""
        if ids is not self._ids:
            fixed = self.fixed_ids.to(ids.device)
            self._rows = torch.nonzero(torch.isin(ids, fixed)).flatten()
            self._ids = ids
        return self._rows

    def zero_fixed(self, t: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """A copy of (n, 3) ``t`` with the fixed atoms' rows 0.0."""
        return t.index_fill(0, self.fixed_rows(ids), 0.0)

    def first_half(self, positions, velocities, forces, masses, ids, step: int) -> None:
        rows = self.fixed_rows(ids)
        held = positions.index_select(0, rows)
        self.inner.first_half(positions, velocities, forces.index_fill(0, rows, 0.0), masses, ids, step)
        positions.index_copy_(0, rows, held)
        if hasattr(self.inner, "add_change"):   # langevin's O step kicked the fixed atoms: not energy the system kept
            v = velocities.index_select(0, rows).double()
            self.inner.add_change(-0.5 * MVV_TO_EV * (masses.index_select(0, rows).double()[:, None] * v * v).sum())
        velocities.index_fill_(0, rows, 0.0)

    def second_half(self, velocities, forces, masses) -> None:
        rows = self.fixed_rows(self.current_ids())
        self.inner.second_half(velocities, forces.index_fill(0, rows, 0.0), masses)
        velocities.index_fill_(0, rows, 0.0)

    def state_dict(self) -> dict:
        return {**self.inner.state_dict(), "fixed_ids": to_ranges(self.fixed_ids)}

    def load_state_dict(self, d: dict) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(d)


def constrain(integrator, cfg, state, checkpoint: dict | None, current_ids: Callable[[], torch.Tensor]):
    """The integrator the run uses: ``integrator`` itself when no atom is fixed, else wrapped in
    :class:`FixedAtoms`; the fixed atoms' velocities in ``state`` (the full initial state) are
    set to 0.0.  A one-line UserError for a set :func:`resolve_fixed` refuses."""
    fixed = resolve_fixed(cfg, state, checkpoint)
    if fixed.numel() == 0:
        check_thermostat_dof(integrator, int(state.n_atoms))
        return integrator
    rows = torch.nonzero(torch.isin(state.ids, fixed.to(state.ids.device))).flatten()
    state.velocities.index_fill_(0, rows, 0.0)
    return FixedAtoms(integrator, fixed, current_ids)
