"""The systems in flight as one array set: a batch's steps without Python per system.

engine/batch/lockstep.py steps many one-rank ``Simulation``s with one model call per step. Where
every system runs velocity Verlet, Langevin, Nosé-Hoover or CSVR on a fixed cell (fixed atoms
allowed, no protocol ramp) and the model joins graphs (``compute_joined``: MACE, models/mace_batch.py), a step of all of
them is a fixed number of tensor operations, whatever their number:

    first half    integrators/batched.py over all atoms (each atom its system's constants;
                  Langevin's noise keyed by its system's seed and step; a Nosé-Hoover chain
                  or CSVR thermostat steps in its system's own object, which gives the
                  factor the set scales that system's velocities by)
    skin check    |x - x_build| per atom against its system's skin / 2 and the health measure
                  |v| dt against health.max_step: one flag per system, one read
    forces        one model call over the joined graph, kept since the last rebuild
    second half   the half kick with the new forces (and each chain's second half)

A flagged system gets its arrays back (:meth:`Joined.hand_back`: its ``Simulation`` state) and
makes its own decision as it would alone (its rebuild: wrap, sort, list, then its arrays and
graph come back into the set; or the health error that ends it). A system whose step writes
output or a checkpoint, or is its last, gets its arrays and its outputs of the joined call and
does that step's reporting itself. So every system's trajectory is the one it has alone, to
rounding (the same operations per atom; sums over systems in another order).

Variables (N atoms of S systems, in the members' order):

    x, v, f       (N, 3)  Å, Å/fs, eV/Å
    masses, ids   (N,)    amu, int64 ids within each system
    system        (N,)    int64 each atom's system
    ref           (N, 3)  Å positions at each system's last build
    trigger       (N,)    Å half its system's skin; bound (N,) its health.max_step
    steps, times  (S,)    numpy: each system's step count and time (fs)
    change        (S,)    float64 eV: Langevin's O-step energy not yet handed to its system
"""
from __future__ import annotations

import numpy as np
import torch

from shardmd.integrators import batched
from shardmd.integrators.csvr import csvr_factors
from shardmd.integrators.nose_hoover import columns_sum_agrees
from shardmd.integrators.units import MVV_TO_EV
from shardmd.models.mace_batch import merge, pad_edges, split

#: room over a count of edges (joined list, selected edges): a tenth more, and a fixed slack
MARGIN, SLACK = 1.1, 1024


def item_of(sim):
    """(positions, cell, pbc, numbers, nl) of a set-up one-rank ``Simulation`` for a batched call."""
    d, s = sim.domain, sim.state
    return d.padded_positions, s.cell, s.pbc, d.padded_numbers, d.nl.current


def usable(members, model) -> bool:
    """True when ``members``' steps can be taken together here (module docstring)."""
    if not members or not hasattr(model, "compute_joined"):
        return False
    first = _inner(members[0].sim)
    return all(_plain(m.sim) and type(_inner(m.sim)) is type(first) and m.sim.integrator.dt == first.dt
               and _periods(m.sim) == _periods(members[0].sim) for m in members)


def _plain(sim) -> bool:
    from shardmd.integrators.csvr import CSVR
    from shardmd.integrators.langevin import Langevin
    from shardmd.integrators.nose_hoover import NoseHoover
    from shardmd.integrators.velocity_verlet import VelocityVerlet

    n = sim.neighbors
    return (type(_inner(sim)) in (VelocityVerlet, Langevin, NoseHoover, CSVR) and sim.schedule is None
            and not sim._barostat and n.deferred is None and n.every == 1 and n.check and not sim.domain.nl.box_check
            and sim.domain.nl.reference is not None)


def _inner(sim):
    """The integrator itself, also where fixed atoms wrap it (engine/run/constraints.py)."""
    return getattr(sim.integrator, "inner", sim.integrator)


def _fixed_rows(sim) -> torch.Tensor | None:
    """The rows of ``sim``'s fixed atoms now (None: it fixes none)."""
    wrapper = sim.integrator
    return wrapper.fixed_rows(sim.state.ids) if hasattr(wrapper, "fixed_rows") else None


def _periods(sim) -> tuple[int, ...]:
    """The step intervals at which ``sim`` writes something (its ``_output_due`` but the last)."""
    has_writer = sim.writer is not None
    return tuple(sorted({p for p, on in ((sim._thermo_every, True), (sim._traj_every, has_writer),
                                         (sim._obs_every, has_writer), (sim._ckpt_every, True)) if on and p > 0}))


class Joined:
    """``members`` (engine/batch/lockstep.py ``Member``s, each set up and at the same point of
    its step loop) as one array set; ``model`` with ``join`` and ``compute_joined``."""

    #: the sync-free edge selection: None on CUDA only (there a host read drains the launch
    #: queue; on the CPU the exact selection costs nothing extra), else always or never
    sync_free: bool | None = None

    def __init__(self, members, model):
        self.members, self.model = list(members), model
        sims = [m.sim for m in self.members]
        s0 = sims[0].state
        self.dt = float(sims[0].integrator.dt)
        self.langevin = sims[0].integrator.name == "langevin"
        #: each system's Nosé-Hoover chain or CSVR thermostat (its own object, its own state: the
        #: set sums each system's kinetic energy and scales its velocities by the factor it gives)
        scaled = sims[0].integrator.name in ("nose-hoover", "csvr")
        self.chains = [_inner(sim) for sim in sims] if scaled else None
        self.csvr = sims[0].integrator.name == "csvr"
        self.sizes = [sim.state.n_atoms for sim in sims]
        starts = np.concatenate([[0], np.cumsum(self.sizes)]).tolist()
        self.slices = [slice(a, b) for a, b in zip(starts[:-1], starts[1:])]
        dev, S = s0.device, len(sims)
        self.system = torch.repeat_interleave(torch.arange(S, device=dev),
                                              torch.tensor(self.sizes, device=dev), output_size=starts[-1])
        self.x = torch.cat([sim.state.positions for sim in sims])
        self.v = torch.cat([sim.state.velocities for sim in sims])
        self.f = torch.cat([sim.state.forces for sim in sims])
        self.masses = torch.cat([sim.state.masses for sim in sims])
        self.ids = torch.cat([sim.state.ids for sim in sims])
        self.ref = torch.cat([sim.domain.nl.reference for sim in sims])
        per_system = lambda values, dtype: torch.tensor(values, dtype=dtype, device=dev)[self.system]  # noqa: E731
        self.trigger = per_system([0.5 * sim.domain.nl.skin for sim in sims], self.x.dtype)
        self.bound = per_system([sim._max_step for sim in sims], torch.float64)
        self.steps = np.array([sim.state.step for sim in sims], dtype=np.int64)
        self.times = np.array([sim.state.time for sim in sims], dtype=np.float64)
        self.lasts = np.array([m.last for m in self.members], dtype=np.int64)
        self.periods = _periods(sims[0])
        self.change = torch.zeros(S, dtype=torch.float64, device=dev)
        if self.langevin:
            self.seeds = per_system([sim.integrator.seed for sim in sims], torch.int64)
            constants = [self._constants(sim) for sim in sims]   # (c1, scale (n, 1)) per system
            self.c1 = torch.cat([torch.full((n, 1), c1, dtype=self.v.dtype, device=dev)
                                 for n, (c1, _) in zip(self.sizes, constants)])
            self.scale = torch.cat([scale for _, scale in constants])
        #: the fixed atoms' rows in the set (None: no system fixes any), as FixedAtoms holds them
        self.fixed_in = [_fixed_rows(sim) for sim in sims]
        self._fixed_rows()
        self.parts = [model.join([item_of(sim)]) for sim in sims]
        self.graph = None   # merged when next needed
        self.out = None     # the last joined call's outputs
        # on CUDA: the joined edges padded to ``edge_rows`` and selected into ``capacity`` rows
        # without a host read, so the call keeps one shape over rebuilds (a CUDA graph replays it)
        self.static = dev.type == "cuda" if self.sync_free is None else self.sync_free
        self.edge_rows, self.capacity = 0, None

    def _constants(self, sim):
        i = sim.integrator
        return batched.langevin_constants(self.dt, i.temperature, i.friction, sim.state.masses, sim.state.dtype)

    def _fixed_rows(self) -> None:
        rows = [r + sl.start for r, sl in zip(self.fixed_in, self.slices) if r is not None]
        self.fixed = torch.cat(rows) if rows else None

    def _forces_used(self) -> torch.Tensor:
        """The forces the integrators see: the fixed atoms' rows 0.0 (a copy), as FixedAtoms gives them."""
        return self.f if self.fixed is None else self.f.index_fill(0, self.fixed, 0.0)

    # -- the step ------------------------------------------------------------------------
    def first_half(self) -> None:
        """Every system's first half; step counts and times advance."""
        f = self._forces_used()
        held = None if self.fixed is None else self.x.index_select(0, self.fixed)
        if self.langevin:
            steps = torch.as_tensor(self.steps, device=self.x.device)[self.system]
            self.change += batched.langevin_first(self.x, self.v, f, self.masses, self.ids, self.dt, self.c1,
                                                  self.scale, self.seeds, steps, self.system, len(self.sizes))
        else:
            if self.chains is not None:
                self._chains_half(first=True)
            batched.verlet_first(self.x, self.v, f, self.masses, self.dt)
        if held is not None:   # FixedAtoms.first_half: back in place, at rest
            self.x.index_copy_(0, self.fixed, held)
            if self.langevin:   # the O step's kick of a fixed atom is no energy its system kept
                v = self.v.index_select(0, self.fixed).double()
                kinetic = 0.5 * MVV_TO_EV * (self.masses.index_select(0, self.fixed).double()[:, None] * v * v).sum(1)
                self.change.index_add_(0, self.system.index_select(0, self.fixed), -kinetic)
            self.v.index_fill_(0, self.fixed, 0.0)
        self.steps += 1
        self.times += self.dt

    def flagged(self) -> list[int]:
        """The systems past their skin criterion or health bound (or not finite): they decide themselves."""
        d = torch.linalg.vector_norm(self.x - self.ref, dim=1)
        h = torch.linalg.vector_norm(self.v, dim=1).to(torch.float64) * self.dt
        bad = ~(d <= self.trigger) | ~(h <= self.bound)
        count = torch.zeros(len(self.sizes), dtype=torch.int32, device=self.x.device).index_add_(0, self.system,
                                                                                                 bad.int())
        return torch.nonzero(count).flatten().tolist()

    def rebuilt(self, j: int) -> None:
        """System ``j`` rebuilt its list (its arrays wrapped and reordered): they come back."""
        sim, sl = self.members[j].sim, self.slices[j]
        s = sim.state
        for name, mine in (("positions", self.x), ("velocities", self.v), ("forces", self.f),
                           ("masses", self.masses), ("ids", self.ids)):
            mine[sl] = getattr(s, name)
        self.ref[sl] = sim.domain.nl.reference
        if self.langevin:
            self.scale[sl] = self._constants(sim)[1]
        if self.fixed_in[j] is not None:   # its rows were re-sorted
            self.fixed_in[j] = _fixed_rows(sim)
            self._fixed_rows()
        self.parts[j] = self.model.join([item_of(sim)])
        self.graph = None

    def forces(self) -> None:
        """One model call over every system, then their second half."""
        if self.graph is None:
            self.graph = self._merged()
        out = None
        if self.capacity is not None:
            out = self.model.compute_joined(self.graph, self.x, capacity=self.capacity, owner=self)
            fill = float(out["capacity_fill"])   # the step's one other read
            if fill > 1:   # edges lost: this step again, exactly, and more room from now on
                seen = fill * self.capacity
                self.capacity, out = max(int(seen * MARGIN) + SLACK, int(seen) + 1), None
        if out is None:
            out = self.model.compute_joined(self.graph, self.x)
            if self.static:
                self.capacity = max(self.capacity or 0, int(out["selected"] * MARGIN) + SLACK)
        self.out = out
        self.f = out["forces"].to(self.x.dtype)
        batched.half_kick(self.v, self._forces_used(), self.masses, self.dt)
        if self.chains is not None and not self.csvr:
            self._chains_half(first=False)
        if self.fixed is not None:
            self.v.index_fill_(0, self.fixed, 0.0)

    def _chains_half(self, first: bool) -> None:
        """Every system's thermostat scaling: NHC(dt/2) as nose_hoover.py's first_half (with its
        set-up at the first step) or second_half (on the velocities just kicked) takes it; CSVR's
        rescale (first half only), keyed by the step each system is starting."""
        chains = self.chains
        sums = None
        if self.csvr or not first or any(c.t_current is None for c in chains):
            sums = self._kinetic()
        if self.csvr:
            factors = csvr_factors(chains, [mv2 for mv2, _ in sums], [n for _, n in sums], self.steps)
        else:
            for c, (mv2, n) in zip(chains, sums or ()):
                if not first:
                    c.measured(mv2, n)
                elif c.t_current is None:
                    c.measured(mv2, n)
                    c.set_up()
            factors = [c.nhc_factor() for c in chains]
        batched.scale_per_system(self.v, factors, self.system)

    def _kinetic(self) -> list[tuple[float, int]]:
        """Each system's (sum m v^2 eV, atoms), the bits of its own thermostat's exact sum."""
        chains = self.chains
        for c, sl in zip(chains, self.slices):
            if c._columns is None:   # the choice each system's own run makes, once
                c._columns = columns_sum_agrees(self.v[sl])
        columns = [c._columns for c in chains]
        sums = batched.mv2_per_system(self.v, self.masses, self.system, len(chains), all(columns))
        if not all(columns) and any(columns):   # mixed (never seen on one machine): each its own way
            by_columns = batched.mv2_per_system(self.v, self.masses, self.system, len(chains), True)
            sums = [c if on else r for c, r, on in zip(by_columns, sums, columns)]
        return sums

    def _merged(self):
        graph = merge(self.parts)
        if not self.static:
            return graph
        rows = int(graph.receivers.shape[0])
        if rows > self.edge_rows:
            self.edge_rows = int(rows * MARGIN) + SLACK
        return pad_edges(graph, self.edge_rows, self.model.cutoff)

    def due(self) -> list[int]:
        """The systems whose step now writes something or is their last."""
        due = self.steps >= self.lasts
        for p in self.periods:
            due |= self.steps % p == 0
        return np.nonzero(due)[0].tolist()

    # -- a system's own work ---------------------------------------------------------------
    def hand_back(self, j: int, with_outputs: bool = False) -> None:
        """System ``j``'s state (and Langevin energy change) into its ``Simulation``; with
        ``with_outputs`` also this step's model outputs, as its own call would have left them."""
        sim, sl = self.members[j].sim, self.slices[j]
        s = sim.state
        s.positions, s.velocities, s.forces = self.x[sl].clone(), self.v[sl].clone(), self.f[sl].clone()
        s.step, s.time = int(self.steps[j]), float(self.times[j])
        if self.langevin:
            sim.integrator.add_change(self.change[j].clone())
            self.change[j] = 0.0
        sim.domain.refresh(s)
        if with_outputs:
            self.members[j].handed.ready = split(self.out, self.sizes, j, sl.start, self.out["forces"].dtype)
            sim.compute_forces()

    def hand_back_all(self, with_outputs: bool = False) -> None:
        for j in range(len(self.members)):
            self.hand_back(j, with_outputs)
