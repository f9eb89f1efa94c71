"""Faults at run time of the command line and the API: a sweep whose job fails (a per-job
summary, exit non-zero, no traceback), the ASE calculator under pickle, deepcopy and threads,
and values from the environment (``${oc.env:VAR}``) kept out of the files a run writes."""
from __future__ import annotations

import csv

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
    assert lines[-2] == "  summary: sw/summary.csv"
    assert lines[-1] == "error: 1 of 3 jobs failed: job 1 (exit 1); outputs in sw"
    with open(tmp_path / "sw" / "summary.csv", newline="") as fh:
        assert [row["exit_status"] for row in csv.DictReader(fh)] == ["0", "1", "0"]
    # the jobs after the failed one ran
    assert (tmp_path / "sw" / "2" / "run.h5").is_file() and (tmp_path / "sw" / "0" / "run.h5").is_file()


# -- the ASE calculator: pickle, deepcopy, threads --------------------------------------------------
def _atoms(seed: int = 0):
    import numpy as np
    from ase.build import bulk

    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    a.positions += np.random.default_rng(seed).normal(0, 0.05, a.positions.shape)
    return a


def test_the_ase_calculator_pickles_and_deepcopies_by_its_config():
    import copy
    import pickle

    import numpy as np

    from shardmd.engine.ase_calculator import ShardMDCalculator

    calc = ShardMDCalculator(model="lj", epsilon={"Ar": 0.011}, cutoff=8.0, skin=0.5)
    atoms = _atoms()
    atoms.calc = calc
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    for copied in (pickle.loads(pickle.dumps(calc)), copy.deepcopy(calc)):
        assert copied is not calc and copied.todict() == calc.todict()
        assert copied.model is not calc.model   # rebuilt from the record
        other = atoms.copy()
        other.calc = copied
        assert other.get_potential_energy() == e
        assert np.array_equal(other.get_forces(), f)


def test_the_ase_calculator_is_safe_from_threads():
    """Four threads share one calculator, each with its own atoms: every answer equals the
    one a calculator of its own gives."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from shardmd.engine.ase_calculator import ShardMDCalculator

    shared = ShardMDCalculator(model="lj", cutoff=8.0)
    systems = [_atoms(seed) for seed in range(4)]
    expected = []
    for a in systems:
        b = a.copy()
        b.calc = ShardMDCalculator(model="lj", cutoff=8.0)
        expected.append((b.get_potential_energy(), b.get_forces()))

    def work(i: int):
        out = []
        for _ in range(5):
            e = shared.get_potential_energy(systems[i])
            f = shared.get_forces(systems[i])
            out.append((e, f))
        return out

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    for (e0, f0), got in zip(expected, results):
        for e, f in got:
            assert np.isclose(e, e0, rtol=1e-12, atol=0) and np.allclose(f, f0, rtol=1e-10, atol=1e-12)
