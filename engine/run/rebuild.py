"""When to rebuild the neighbour list: one controller for the per-step and the deferred skin check.

After each drift the step loop asks :meth:`RebuildController.update` one question and gets one
answer (:class:`Update`):

    REFRESHED    same list; ghost positions refreshed from their owners
    REBUILT      wrapped, migrated, re-sorted; new ghosts and a new list
    ROLLED_BACK  a deferred read-back found a step of its window over skin / 2 (or an incomplete
                 model result): the state is back at an earlier step, whose forces the loop
                 recomputes (``kick`` says whether its velocities still take the second
                 half-kick); the loop then replays from there

Per-step mode (``neighbor.deferred=false``, and always on the CPU by default): every
``neighbor.every`` steps one all-reduce decides the skin criterion, the health measure and
the stop request together (engine/run/rank_domain.py ``check_and_stop``); the steps between
checks agree on the stop request alone (one all-reduce each). Deferred mode: the criterion stays on the device and
is read back only at scheduled steps (engine/run/skin_check.py explains the schedule, the
pipelined reads and the rollback; engine/run/rollback.py keeps the snapshots). Either way the
health measure (engine/run/health.py, max ``|v| dt``) is judged at every read through
``on_measure``, which raises when it is out of bounds.

Everything the deferred protocol needs between steps lives here: whether this step's read was
blocking (``verified``), whether a read is in flight, whether a stop request was seen by the
reads. ``stop_agreed`` answers the loop's "stop now?" at a step all ranks agree on.
"""
from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shardmd.engine.run import health
from shardmd.engine.run.rank_domain import RankDomain
from shardmd.engine.run.skin_check import DeferredSkinCheck
from shardmd.engine.run.state import State


class Outcome(enum.Enum):
    REFRESHED = "refreshed"
    REBUILT = "rebuilt"
    ROLLED_BACK = "rolled back"


@dataclass(frozen=True)
class Update:
    """outcome: what happened to the list; kick: whether the current velocities still need
    the second half-kick after the forces (False only for a rollback to the run's first step)."""

    outcome: Outcome
    kick: bool = True


REFRESHED, REBUILT = Update(Outcome.REFRESHED), Update(Outcome.REBUILT)


class RebuildController:
    """domain: this rank's :class:`RankDomain`; dt: fs; every: ``neighbor.every`` (check the
    criterion every that many steps); check: ``neighbor.check`` (False: rebuild at every check
    step); deferred: a :class:`DeferredSkinCheck` or None (per-step mode); on_measure(worst Å,
    where): judges the reduced health measure, raising when it is out of bounds; timers: the
    run's time split (the deferred check's host work counts as ``neighbor``)."""

    def __init__(self, domain: RankDomain, dt: float, every: int, check: bool,
                 deferred: DeferredSkinCheck | None, on_measure: Callable[[float, str], None],
                 timers: dict[str, float]):
        self.domain, self.dt, self.every, self.check = domain, dt, every, check
        self.deferred = deferred
        self.on_measure = on_measure
        self.timers = timers
        self.verified = False      # this step's deferred read was blocking (the step is verified)
        self._posted = False       # this step's read was posted (settled at the next step)
        self._stop_seen = False    # a read-back carried a stop request from some rank
        self._stop_checked: bool | None = None   # per-step mode: this step's check's stop (None: no check)

    @property
    def comm(self):
        return self.domain.comm

    # -- set-up ------------------------------------------------------------------------
    def rebuild(self, s: State) -> None:
        """Wrap, migrate, sort, ghosts and a new list now."""
        self.domain.rebuild(s)
        if self.deferred is not None:
            self.deferred.built(s.step)

    def start(self, s: State) -> None:
        """The run's first step, its list in place: the first rollback point (before any kick)."""
        if self.deferred is not None:
            self.deferred.built(s.step)
            self.deferred.schedule(s.step, 0.0)
            self.deferred.save(s, kick=False)

    # -- every step ----------------------------------------------------------------------
    def update(self, s: State, must_verify: bool, stop_requested: bool) -> Update:
        """The list for step ``s.step`` (positions just drifted). must_verify: this step
        writes output or is the last (a deferred check reads back blocking there)."""
        if self.deferred is not None:
            upd = self._update_deferred(s, must_verify, stop_requested)
            if upd.outcome is not Outcome.ROLLED_BACK and (self.verified or self._posted):
                # before the forces, which a rollback recomputes
                self.deferred.save(s, posted=self._posted)
            return upd
        self._stop_checked = None
        if s.step % self.every != 0:
            self.domain.refresh(s)
            return REFRESHED
        need, worst, self._stop_checked = self.domain.check_and_stop(s, self.dt, stop_requested)
        self.on_measure(worst, f"at step {s.step}")
        if need or not self.check:
            self.rebuild(s)
            return REBUILT
        self.domain.refresh(s)
        return REFRESHED

    def observe_fill(self, out: dict) -> None:
        """A model's device-side capacity fill joins the deferred read-back."""
        if self.deferred is not None and "capacity_fill" in out:
            self.deferred.observe_fill(out["capacity_fill"])

    def stop_agreed(self, requested: bool) -> bool:
        """Stop now? Decided at a step all ranks agree on, from the requests the ranks made.

        Per-step mode: at a step with a skin check (every ``neighbor.every`` steps) the
        request went into the check's all-reduce in :meth:`update` (no second all-reduce);
        a request that came after the check, while this step's forces were computed, is
        honoured at the next step's decision. At a step without a check, one all-reduce of
        ``requested`` here. Deferred mode: at the blocking read-backs, which carry the request."""
        if self.deferred is None:
            if self._stop_checked is not None:
                return self._stop_checked
            return self.comm.any(requested)
        return self.verified and self._stop_seen

    # -- the deferred protocol -------------------------------------------------------------
    def _update_deferred(self, s: State, must_verify: bool, stop_requested: bool) -> Update:
        chk, d = self.deferred, self.domain
        t = time.perf_counter()
        local = (d.nl.max_displacement(s.positions) if s.n_atoms
                 else torch.zeros((), dtype=s.dtype, device=s.positions.device))
        chk.observe(local)
        self.verified = self._posted = False
        verify_now = False
        if chk.pending is not None:
            settled = self._settle(s)
            if isinstance(settled, Update):          # rolled back: the step is abandoned
                self.timers["neighbor"] += time.perf_counter() - t
                return settled
            verify_now = settled
        must = verify_now or must_verify or self._stop_seen
        if not chk.due(s.step, must):
            self.timers["neighbor"] += time.perf_counter() - t
            d.refresh(s)
            return REFRESHED
        chk.health = health.max_speed(s.velocities)   # measured at read-backs only: no per-step cost
        if chk.pipelined and not must and not chk.replaying(s.step):
            chk.post(self.comm, stop_requested, s.step)   # settled at the next step
            self._posted = True
            self.timers["neighbor"] += time.perf_counter() - t
            d.refresh(s)
            return REFRESHED
        self.verified = True
        window, last, self._stop_seen = chk.read(self.comm, stop_requested)
        self.timers["neighbor"] += time.perf_counter() - t
        self._judge(window, last, f"at or before step {s.step}")
        if chk.violated(window):
            self.verified = False
            return self._roll_back(s, chk.rollback(s, detected_at=s.step))
        if chk.plan(s.step, last) or d.nl.cell_changed(s.cell):
            self.rebuild(s)
            chk.schedule(s.step, 0.0)
            return REBUILT
        d.refresh(s)
        return REFRESHED

    def _settle(self, s: State) -> bool | Update:
        """Decide on the read posted at the previous step p: the rollback's Update, or whether
        this step must read blocking (a rebuild is due: rebuilds happen at blocking reads only,
        which a rebuild's own size reads make no dearer; or a stop was requested)."""
        chk = self.deferred
        p, window, last, stop = chk.settle()
        self._judge(window, last, f"at or before step {p}")
        self._stop_seen = self._stop_seen or stop
        if chk.violated(window):      # an earlier step of p's window: back to the last rollback point
            return self._roll_back(s, chk.rollback(s, detected_at=s.step))
        if chk.violated(last):        # p itself: redo p with a new list
            chk.late_rebuilds += 1
            chk.force_rebuild = True
            return self._roll_back(s, chk.rollback(s, detected_at=s.step, to_posted=True))
        chk.settled_clean()
        return chk.plan(p, last, lead=2) or self.domain.nl.cell_changed(s.cell) or self._stop_seen

    def _judge(self, window: float, last: float, where: str) -> None:
        """A read-back's health: the max speed at the read step times dt, and displacements that
        are NaN (a NaN velocity at any step of the window makes the positions NaN, and the
        window's running maximum keeps it; an inf window is the check's own signal for an
        incomplete model result)."""
        worst = self.deferred.health_seen * self.dt
        self.on_measure(math.inf if math.isnan(window) or math.isnan(last) else worst, where)

    def _roll_back(self, s: State, kick: bool) -> Update:
        """After ``chk.rollback``: a new list at the restored step if the check asks for one
        (an incomplete result or a step past the skin; the model resizes), else ghosts refreshed."""
        chk = self.deferred
        self.verified = False
        if chk.force_rebuild:
            chk.force_rebuild = False
            self.rebuild(s)
            chk.schedule(s.step, 0.0)
            chk.save(s, kick)   # the rebuild may have reordered the arrays
        else:
            self.domain.refresh(s)
        return Update(Outcome.ROLLED_BACK, kick)
