"""The step loop keeps the objects alive at its start out of the garbage collector's scans
(engine/run/heap.py) and gives them back when it ends; the collector still collects what the
loop drops in cycles."""
from __future__ import annotations

import gc
import weakref

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.heap import frozen_heap
from shardmd.engine.run.simulation import Simulation


class _Cycle:
    def __init__(self):
        self.me = self


def test_loop_freezes_the_heap_and_collects_its_cycles(tmp_path):
    assert gc.get_freeze_count() == 0
    sim = Simulation(compose_config(["model=lj", "system.repeat=[3,3,3]", "quiet=true", "trajectory.every=0",
                                     "steps=6", f"output={tmp_path / 'run.h5'}"]))
    seen = []
    step = sim.step

    def watched():
        c = _Cycle()
        ref = weakref.ref(c)
        del c
        gc.collect()   # a cycle made in the loop: collected although the heap is frozen
        seen.append((gc.get_freeze_count(), ref() is None))
        return step()

    sim.step = watched
    sim.run()
    assert len(seen) == 6
    assert all(frozen > 1000 for frozen, _ in seen)   # the set-up's objects (modules, model) frozen
    assert all(collected for _, collected in seen)
    assert gc.get_freeze_count() == 0                 # and given back after the loop


def test_nested_blocks_unfreeze_once_at_the_outermost():
    with frozen_heap():
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_an_error_in_the_loop_still_unfreezes():
    try:
        with frozen_heap():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
