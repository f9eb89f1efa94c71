"""``malloc=keep`` (engine/run/malloc.py): glibc told to keep freed memory for the next step on
CPU runs. Each run is its own process (the setting is process-wide): the header says it is on,
the trajectory has the same bits as with the allocator's defaults (an allocator changes where
tensors live, never what they hold), and a bad value is refused in one line."""
from __future__ import annotations

import h5py
import numpy as np
from conftest import run_engine

COMMON = ["run", "model=mace", "system.repeat=[3,3,3]", "steps=6", "temperature=600", "trajectory.every=3",
          "thermo.every=3", "threads=1"]


def test_keep_gives_the_same_bits_and_says_so(tmp_path):
    ends = {}
    for mode in ("system", "keep"):
        r = run_engine([*COMMON, f"malloc={mode}", f"output={mode}.h5"], tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        header = (r.stdout + r.stderr).splitlines()[0]
        assert ("malloc keep" in header) == (mode == "keep"), header
        with h5py.File(tmp_path / f"{mode}.h5") as f:
            ends[mode] = (f["particles/all/position/value"][-1], f["particles/all/velocity/value"][-1])
    assert np.array_equal(ends["keep"][0], ends["system"][0]) and np.array_equal(ends["keep"][1], ends["system"][1])


def test_a_bad_value_is_refused_in_one_line(tmp_path):
    r = run_engine([*COMMON, "malloc=fast"], tmp_path, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "malloc" in lines[0] and "keep" in lines[0], r.stderr
