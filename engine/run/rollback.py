"""Rollback points of the deferred skin check (engine/run/skin_check.py).

A rollback point is a snapshot of the dynamic state taken at a verification step, *before*
that step's forces: positions, velocities, images, step and time, as device copies (no host
sync). Forces are not kept: a rollback recomputes them, so an incomplete force result of the
verification step itself is never reused.

Two points exist at most: the *settled* one (the last step whose read came back clean: where a
rollback returns) and, with pipelined reads, the *posted* one (the step whose read is still in
flight; it becomes the settled point once that read comes back clean).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Snapshot:
    """positions: (n, 3) Å; velocities: (n, 3) Å/fs; images: (n, 3) int; time: fs;
    kick: whether the restored velocities still need the second half-kick (False only for the
    run's first step, whose forces come before any kick)."""

    positions: torch.Tensor
    velocities: torch.Tensor
    images: torch.Tensor
    step: int
    time: float
    kick: bool

    @classmethod
    def of(cls, s, kick: bool = True) -> "Snapshot":
        return cls(s.positions.clone(), s.velocities.clone(), s.images.clone(), s.step, s.time, kick)

    def restore(self, s) -> None:
        """Copy this snapshot back into state ``s`` (fresh tensors: the snapshot stays valid)."""
        s.positions, s.velocities, s.images = self.positions.clone(), self.velocities.clone(), self.images.clone()
        s.step, s.time = self.step, self.time


@dataclass
class RollbackPoints:
    settled: Snapshot | None = None   # the last verified step: where a rollback returns
    posted: Snapshot | None = None    # the step whose read is in flight (pipelined reads)

    def save(self, s, kick: bool = True, posted: bool = False) -> None:
        """Snapshot of ``s`` as the settled point, or (``posted``) as the pending one."""
        snap = Snapshot.of(s, kick)
        if posted:
            self.posted = snap
        else:
            self.settled, self.posted = snap, None

    def settle(self) -> None:
        """The posted step's read came back clean: its snapshot is the new rollback point."""
        self.settled, self.posted = self.posted, None

    def restore(self, s, to_posted: bool = False) -> bool:
        """Back to the settled point (or the posted one); returns the snapshot's ``kick``."""
        snap = self.posted if to_posted else self.settled
        snap.restore(s)
        self.posted = None
        return snap.kick
