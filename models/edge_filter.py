"""Keep the edges shorter than a radius, with or without a device→host read.

A skin neighbour list reaches ``r_max + skin``; a model whose radial functions vanish past
``r_max`` wastes its time on the outer edges (~40 % of them at r_max 5 Å, skin 1 Å).  Selecting
the inner ones with ``torch.nonzero`` reads the count back to the host: a synchronisation in
every step, which on a GPU drains the launch queue.

Sync-free selection (``static=True``) writes the kept edge indices into a buffer of fixed
capacity (``torch.nonzero_static``).  The capacity is sized at each new neighbour list (whose
build already synchronises) as the count then plus a margin; the unused tail is filled with
*padding edges* — self-edges spread over the points (one point taking them all serialises the
scatter-adds on a GPU) with a vector of length ``2 r_max`` — which a model with
a radial cutoff maps to exactly zero energy and zero gradient.  If the count ever grows
past the capacity, :attr:`EdgeSelection.fill` (count / capacity, on the device) exceeds 1: the
result is incomplete and the caller must discard it (the engine's deferred skin check rolls back
and rebuilds; the margin then doubles). A fill close to 1 asks for a new list before that
happens (the engine rebuilds at its next read-back when the fill is over 0.99): a run started
from a perfect lattice gains edges inside r_max within its first tens of fs (fcc Cu, r_max
5 Å: the shell at 5.08 Å moves in), and a rollback would replay up to a whole check window.
Both findings: docs/benchmarks.md, "Sync-free MACE steps".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EdgeSelection:
    """index: (m,) int64 rows of the full edge list (padding rows point at edge 0);
    valid: (m,) bool, False on padding rows, or None when there are none (exact selection);
    fill: () float, count / capacity; > 1 when edges were lost (static selection only)."""

    index: torch.Tensor
    valid: torch.Tensor | None
    fill: torch.Tensor | None


class RadiusFilter:
    """radius: Å.  margin: capacity over the count at a new list, as a fraction (doubles after
    an overflow was seen); slack: extra edges always allowed."""

    def __init__(self, radius: float, margin: float = 0.03, slack: int = 256):
        self.radius = float(radius)
        self.margin = float(margin)
        self.slack = int(slack)
        self.capacity: int | None = None
        self.resizes = 0
        self._list = None            # the neighbour list the capacity was sized for
        self._fill: torch.Tensor | None = None   # max fill on the current list (device)
        self._far: torch.Tensor | None = None    # the padding vector, made once per dtype/device

    def select(self, lengths: torch.Tensor, nl, static: bool) -> EdgeSelection:
        """lengths: (E,) Å of every edge of ``nl``."""
        inside = lengths < self.radius
        if not static or lengths.shape[0] == 0:
            return EdgeSelection(torch.nonzero(inside).squeeze(1), None, None)
        count = inside.sum()
        if nl is not self._list:       # a new list: one read-back, where the build already had many
            if self._fill is not None and bool(self._fill > 1):
                self.margin = min(max(2 * self.margin, 0.01), 0.5)
            self._fill = None
            n = int(count)
            self.capacity = n + int(self.margin * n) + self.slack
            self._list = nl
            self.resizes += 1
        index = torch.nonzero_static(inside, size=self.capacity, fill_value=0).squeeze(1)
        valid = torch.arange(self.capacity, device=lengths.device) < count
        fill = count.to(torch.float64) / self.capacity
        return EdgeSelection(index, valid, fill)

    def observe(self, fill: torch.Tensor) -> None:
        """Fold a call's fill (device, no sync) into the list's maximum, which doubles the
        margin at the next list if it passed 1. Called after the call returns, not inside it,
        so that a call replayed as a CUDA graph is counted at every replay."""
        self._fill = fill if self._fill is None else torch.maximum(self._fill, fill)

    def pad(self, receivers: torch.Tensor, senders: torch.Tensor, vectors: torch.Tensor, sel: EdgeSelection,
            n_points: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The selected rows' (receivers, senders, vectors Å); padding rows become self-edges
        of point ``row % n_points`` with vector (2 radius, 0, 0)."""
        if sel.valid is None:
            return receivers, senders, vectors
        far = self._far
        if far is None or far.dtype != vectors.dtype or far.device != vectors.device:
            # made once: a host scalar written into a device tensor per call would sync
            far = self._far = torch.tensor([2.0 * self.radius, 0.0, 0.0], dtype=vectors.dtype).to(vectors.device)
        spread = torch.arange(vectors.shape[0], device=vectors.device) % max(n_points, 1)
        keep = sel.valid
        return (torch.where(keep, receivers, spread), torch.where(keep, senders, spread),
                torch.where(keep[:, None], vectors, far))
