"""scripts/bench_peers.py runs on the CPU with a tiny system and its peers agree at step 0.

The step-0 forces of torch-sim and of mace-torch's own MACECalculator (the independent
references: other codes driving the same model file) must match ShardMD's, and every peer must
report a positive rate. Slow: three MACE set-ups on the CPU (~1-2 min on the shared machine).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch_sim") is None,
                       reason="torch-sim is not installed (pip install torch-sim-atomistic vesin vesin-torch tables)"),
    pytest.mark.skipif(importlib.util.find_spec("mace") is None, reason="mace-torch is not installed"),
]


def test_bench_peers_runs_on_cpu(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sys.modules.pop("bench_peers", None)
    import bench_peers

    assert bench_peers.main(["--sizes", "2", "--device", "cpu", "--steps", "1", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+) (shardmd|torch-sim|ase)\s+(\S+)\s+(\S+)\s+\S+\s+\S+\s+\S+\s+(\S+)\s+(\S+)", line)
        if m:
            rows[m.group(2)] = m.groups()
    assert set(rows) == {"shardmd", "torch-sim", "ase"}, out   # columns: ..., B/atom, E/atom, |dE|, |dF|
    for name, (atoms, _, rate, *_rest) in rows.items():
        assert int(atoms) == 32 and float(rate) > 0, (name, out)
    for name in ("torch-sim", "ase"):
        de, df = float(rows[name][4]), float(rows[name][5])
        assert de < 1e-5 and df < 1e-4, (name, de, df, out)   # float32 round-off, forces ~0.1-1 eV/Å
