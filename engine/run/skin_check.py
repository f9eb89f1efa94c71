"""Deferred skin check: the neighbour-list criterion read back to the host only at scheduled steps.

Why, and what the protocol guarantees: docs/design.md, "When to rebuild: the skin check".
The contract, in this file's terms:

- every step, :meth:`DeferredSkinCheck.observe` folds the step's max displacement (Å, a device
  scalar) into the window; :meth:`observe_fill` folds a model's ``capacity_fill`` (count /
  capacity; over 1: its result was incomplete);
- at a verification step (:meth:`due`: scheduled by :meth:`plan`/:meth:`schedule` from the
  measured displacement rate, at most ``max_every`` apart; or forced by the caller for output,
  the last step, a stop request, a replay) one all-reduce of ``[window max, this step's, stop
  flag, fill, max |v|]`` is read back, blocking (:meth:`read`) or posted and settled at the
  next step (:meth:`post`, :meth:`settle`; pipelined reads, for CUDA);
- a window over ``skin / 2`` (or a fill over 1) means a force may have come from an
  incomplete list: :meth:`rollback` restores the last verified snapshot (engine/run/rollback.py)
  and marks the steps up to the detection for per-step checks (``replay_until``); replay is
  exact because integrators are deterministic given (step, atom id).

engine/run/rebuild.py drives this class; nothing else should call it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from shardmd.engine.run.rollback import RollbackPoints

#: a model's capacity fill above which the list is rebuilt (so that the model resizes) at a read-back
FILL_REBUILD = 0.99
#: most steps between read-backs while a model reports a capacity fill (a rollback replays them)
FILL_READ_EVERY = 10


@dataclass
class DeferredSkinCheck:
    """half_skin: Å; max_every: most steps between read-backs."""

    half_skin: float
    max_every: int = 50
    window: torch.Tensor | None = None   # device 0-d: max displacement over the window's earlier steps (Å)
    last: torch.Tensor | None = None     # device 0-d: this step's max displacement (Å)
    fill: torch.Tensor | None = None     # device 0-d: max capacity fill a model reported (> 1: incomplete)
    fill_seen: float = 0.0               # the last read-back's fill
    health: torch.Tensor | None = None   # device 0-d: max |v| at the read step (Å/fs), set by the engine
    health_seen: float = 0.0             # the last read-back's max |v| (Å/fs), engine/run/health.py
    fill_rate: float = 0.0               # its growth per step on the current list
    _fill_prev: tuple | None = None      # (step, fill) of the previous read-back on this list
    _fill_steps: int | None = None       # steps until the next read the fill asks for
    _fill_first: float = 0.0             # the first fill read on this list
    force_rebuild: bool = False          # set by read(): the window had an incomplete result
    next_check: int = 0                  # step of the next scheduled verification
    build_step: int = 0                  # step of the last neighbour build
    rate: float | None = None            # Å per step: growth of the max displacement since a build
    points: RollbackPoints = field(default_factory=RollbackPoints)   # where a rollback returns
    replay_until: int = -1               # steps <= this are checked every step (after a rollback)
    rollbacks: int = 0
    reads: int = 0
    pipelined: bool = False              # post scheduled reads and settle them a step later (see above)
    posted: int = 0                      # reads that were posted (the rest were blocking)
    late_rebuilds: int = 0               # posted steps found over skin/2: redone with a new list
    pending: "PendingRead | None" = None
    _host: torch.Tensor | None = None    # pinned landing buffer of posted reads

    # -- every step ----------------------------------------------------------------------
    def observe(self, d: torch.Tensor) -> None:
        """Fold this step's (rank-local) max displacement into the window, on the device."""
        d = d.detach().reshape(())
        if self.last is not None:  # the previous step's forces were computed: it joins the window
            self.window = self.last if self.window is None else torch.maximum(self.window, self.last)
        self.last = d

    def observe_fill(self, fill: torch.Tensor) -> None:
        """Fold a model's device-side capacity fill (0-d; > 1 means its result is incomplete)."""
        fill = fill.detach().reshape(()).to(torch.float64)
        self.fill = fill if self.fill is None else torch.maximum(self.fill, fill)

    def due(self, step: int, must: bool) -> bool:
        return must or step >= self.next_check or step <= self.replay_until

    # -- at verification steps ---------------------------------------------------------------
    def _pack(self, stop: bool) -> torch.Tensor:
        """(5,) float64 on the device: window max, this step's, stop flag, fill, health; starts a
        new window."""
        last = self.last.to(torch.float64)
        window = self.window.to(torch.float64) if self.window is not None else torch.zeros_like(last)
        fill = self.fill if self.fill is not None else torch.zeros_like(last)
        health = self.health.to(torch.float64) if self.health is not None else torch.zeros_like(last)
        self.window = self.last = self.fill = self.health = None
        self.reads += 1
        return torch.stack([window, last, torch.full_like(last, float(stop)), fill, health])

    def _unpack(self, values: list[float]) -> tuple[float, float, bool]:
        w, last, st, self.fill_seen, self.health_seen = values
        if self.fill_seen > 1:     # an incomplete result: as if the window had crossed the skin
            w = math.inf
            self.force_rebuild = True
        return w, last, bool(st)

    def read(self, comm, stop: bool) -> tuple[float, float, bool]:
        """One blocking collective read-back: (max over the window's earlier steps, this step's,
        stop requested on any rank). Earlier steps over ``skin / 2`` mean forces from a list that
        may have missed a pair (roll back); this step over it only means: rebuild now."""
        return self._unpack(comm.all_reduce(self._pack(stop), "max").tolist())

    def post(self, comm, stop: bool, step: int) -> None:
        """Start the read of ``step`` without waiting (settled by :meth:`settle` at the next step).
        With NCCL the all-reduce is queued on the device like the copy; gloo reduces at once."""
        v = comm.all_reduce(self._pack(stop), "max")
        event = None
        if v.is_cuda:
            if self._host is None:
                self._host = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
            self._host.copy_(v, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            v = self._host
        self.pending = PendingRead(step, v, event)
        self.posted += 1

    def settle(self) -> tuple[int, float, float, bool]:
        """The posted read: (its step, window max before it, its own value, stop flag)."""
        p, self.pending = self.pending, None
        if p.event is not None:
            p.event.synchronize()   # only up to the posted copy: later steps' kernels keep running
        return (p.step, *self._unpack(p.values.tolist()))

    def replaying(self, step: int) -> bool:
        return step <= self.replay_until

    def violated(self, window_max: float) -> bool:
        return window_max > self.half_skin

    def plan(self, step: int, last: float, lead: int = 1) -> bool:
        """After a clean window: whether to rebuild now (``step`` is over ``skin / 2``, or the step
        ``lead`` after it would likely be; a settled posted read decides one step late: lead 2);
        schedules the next verification from ``step``."""
        elapsed = step - self.build_step
        if elapsed > 0 and last > 0:
            self.rate = last / elapsed
        # rebuild when the next step would likely cross skin/2: a margin of one step's growth;
        # a rollback costs only the replayed steps, so the lean margin wins over a wide one
        # (in.lj counts: docs/design.md, "Deferred skin check: measured margins")
        rebuild = last > self.half_skin or (self.rate is not None and last + lead * self.rate > self.half_skin)
        rebuild = self._plan_fill(step, lead) or rebuild
        self.schedule(step, 0.0 if rebuild else last)
        return rebuild

    def _plan_fill(self, step: int, lead: int = 1) -> bool:
        """A model's capacity fill: True when the next step would likely pass ``FILL_REBUILD``.
        While the fill is read, reads come at most ``FILL_READ_EVERY`` steps apart, fewer as the
        headroom left shrinks, and at half the linearly predicted crossing (the fill accelerates
        after a start from a lattice)."""
        f = self.fill_seen
        if f <= 0:
            return False
        if self._fill_prev is None:
            self._fill_first = f
        elif step > self._fill_prev[0]:
            self.fill_rate = max(0.0, (f - self._fill_prev[1]) / (step - self._fill_prev[0]))
        self._fill_prev = (step, f)
        if f > FILL_REBUILD or f + lead * self.fill_rate > FILL_REBUILD:
            return True
        room = (FILL_REBUILD - f) / max(FILL_REBUILD - self._fill_first, 1e-12)
        n = FILL_READ_EVERY * min(room, 1.0)
        if self.fill_rate > 0:
            n = min(n, 0.5 * (FILL_REBUILD - f) / self.fill_rate)
        self._fill_steps = max(1, int(n))
        return False

    def schedule(self, step: int, current: float) -> None:
        if self.rate is None or self.rate <= 0:
            n = 1 if self.rate is None else self.max_every
        else:
            n = int(0.9 * (self.half_skin - current) / self.rate)
        if self._fill_steps is not None:
            n, self._fill_steps = min(n, self._fill_steps), None
        self.next_check = step + max(1, min(self.max_every, n))

    def built(self, step: int) -> None:
        self.build_step = step
        self._fill_prev, self.fill_rate = None, 0.0   # a new list: the model's capacity is new
        if self.fill_seen > 0:
            self._fill_steps = FILL_READ_EVERY

    # -- save / roll back ----------------------------------------------------------------
    def save(self, s, kick: bool = True, posted: bool = False) -> None:
        """Snapshot at a verification step, before its forces (engine/run/rollback.py). ``kick``
        False: the run's first step. ``posted``: the step's read is pending; the snapshot
        becomes the rollback point once settled clean."""
        self.points.save(s, kick, posted)

    def settled_clean(self) -> None:
        """The posted step's window was clean: its snapshot is the new rollback point."""
        self.points.settle()

    def rollback(self, s, detected_at: int, to_posted: bool = False) -> bool:
        """Back to the rollback point (before its forces), or to the posted step's snapshot;
        steps up to ``detected_at`` are then replayed checked. Returns whether the restored
        velocities still need the second half-kick."""
        kick = self.points.restore(s, to_posted)
        self.pending = None
        self.replay_until = detected_at
        self.rollbacks += 1
        self.window = self.last = self.fill = self.health = None
        return kick


@dataclass(frozen=True)
class PendingRead:
    """A posted read-back. values: (5,) float64 (pinned host memory on CUDA) valid once
    ``event`` (None on the CPU: already valid) has completed."""

    step: int
    values: torch.Tensor
    event: object | None
