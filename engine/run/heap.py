"""The step loop and Python's cyclic garbage collector.

Python's collector scans every tracked object when it runs a full collection: with torch, Warp
and a model loaded that is ~300,000 objects and ~170 ms on the CPU, once in a few thousand steps of
a small system (a 4,000-atom step is ~3 ms: ~2-3 % of the loop's time, in one stall).  Nearly all
of those objects live as long as the run (modules, the model, the system's set-up), so the loop
moves them out of the collector's view (``gc.freeze``) and back when it ends (``gc.unfreeze``).
The collector still runs: what the loop makes and drops in cycles is collected as before, and the
set-up's own garbage is collected after the loop.  Process-wide, nested runs counted (the
outermost ends the freeze)."""
from __future__ import annotations

import gc
from contextlib import contextmanager

_depth = [0]


@contextmanager
def frozen_heap():
    """The objects alive now out of the collector's scans until the block ends."""
    gc.freeze()
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            gc.unfreeze()


__all__ = ["frozen_heap"]
