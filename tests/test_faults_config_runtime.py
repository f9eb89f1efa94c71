"""Faults at run time of the command line and the API: a sweep whose job fails (a per-job
summary, exit non-zero, no traceback), the ASE calculator under pickle, deepcopy and threads,
and values from the environment (``${oc.env:VAR}``) kept out of the files a run writes."""
from __future__ import annotations

import pytest
from conftest import run_engine

pytestmark = pytest.mark.fault

SMALL = ["system.repeat=[3,3,3]", "steps=2", "quiet=true", "threads=1"]
#: a model whose factory argument boom=1 gives one that raises at its first call (a bug)
BOOM = '''from shardmd.models.registry import lj


class Boom:
    def __init__(self, inner):
        self.cutoff = inner.cutoff

    def compute(self, positions, cell, pbc, numbers, nl):
        raise RuntimeError("kernel fault")


def make(boom: int = 0):
    m = lj(epsilon={"Ar": 0.0104}, sigma={"Ar": 3.4}, cutoff=8.5)
    return Boom(m) if boom else m
'''


def test_a_sweep_with_a_failing_job_prints_a_summary_and_exits_non_zero(tmp_path):
    (tmp_path / "boommodel.py").write_text(BOOM)
    r = run_engine(["run", "model=py:boommodel:make", "model.boom=0,1,0", *SMALL, "hydra.sweep.dir=sw", "-m"],
                   cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "error: job 1: RuntimeError: kernel fault (SHARDMD_TRACEBACK=1 prints the traceback)"
    assert lines[1] == "sweep: 2 of 3 jobs succeeded"
    for num, boom, code in ((0, 0, 0), (1, 1, 1), (2, 0, 0)):
        row = lines[2 + num]
        assert row.startswith(f"  job {num}: ") and f"model.boom={boom}" in row, row
        assert row.endswith(f"-> exit {code}, {tmp_path / 'sw' / str(num)}"), row
    assert lines[-1] == "error: 1 of 3 jobs failed: job 1 (exit 1); outputs in sw"
    # the jobs after the failed one ran
    assert (tmp_path / "sw" / "2" / "run.h5").is_file() and (tmp_path / "sw" / "0" / "run.h5").is_file()
