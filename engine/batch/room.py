"""How many systems step together (engine/batch/lockstep.py): a count, or a memory budget.

With ``batch.size=auto`` on CUDA the systems in flight are packed to fill a share of the
device's free memory: each system costs its estimated bytes (atoms, and edges within the list
radius at its density, times the model's bytes per edge: engine/run/preflight.py's estimate),
and after every joined call the estimate is corrected by the peak the device measured
(``observe``): a model that needs more than estimated gets fewer systems at the next refill,
one that needs less gets more. At least one system always flies.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: the share of the free memory the systems in flight may fill (the rest: fragmentation, the
#: allocator's caches, what the estimate misses before its first correction)
FILL = 0.8


class Room:
    """``count``: at most that many systems; else ``budget`` bytes filled by ``cost(item)``."""

    def __init__(self, count: int | None = None, budget: float | None = None,
                 cost: Callable[[object], float] | None = None):
        if (count is None) == (budget is None):
            raise ValueError("give a count or a budget")
        self.count, self.budget, self._cost = count, budget, cost
        self.scale: float | None = None   # measured bytes per estimated byte (None: not measured yet)

    def cost(self, item) -> float:
        return float(self._cost(item)) if self._cost is not None else 1.0

    def admits(self, flying: Sequence[float], cost: float) -> bool:
        """Whether a system of ``cost`` joins the ``flying`` ones' costs."""
        if not flying:
            return True
        if self.count is not None:
            return len(flying) < self.count
        return (sum(flying) + cost) * (self.scale or 1.0) <= self.budget

    def observe(self, peak: float, flying: Sequence[float]) -> None:
        """The device's peak bytes during a joined call of systems with these costs."""
        total = sum(flying)
        if total > 0 and math.isfinite(peak) and peak > 0:
            ratio = peak / total
            self.scale = ratio if self.scale is None else max(self.scale, ratio)


def system_bytes(n: int, volume: float | None, radius: float, per_edge: float, atom_bytes: float) -> float:
    """Estimated bytes of one system: ``n`` atoms, ``volume`` Å³ (None: an open cluster, whose
    atoms are all neighbours at worst), list ``radius`` Å, ``per_edge`` and ``atom_bytes``."""
    if volume:
        neighbours = min(n / volume * 4.0 / 3.0 * math.pi * radius**3, max(n - 1, 0) * 27.0)
    else:
        neighbours = max(n - 1, 0)
    return n * (atom_bytes + neighbours * per_edge)
