"""mace-torch's calculator and ours in one process (models/mace.py's TorchScript executor
switch). Apart from tests/test_mace.py, whose shared MPI worlds keep it on one pytest-xdist
worker."""
import subprocess

import pytest

MIXED_EXECUTORS = """
import sys
import numpy as np
from ase.build import bulk
from mace.calculators import MACECalculator
from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.models.mace import DEFAULT_MODEL
from shardmd.models.mace_random import make_random_mace

a = bulk("Cu", "fcc", a=3.59, cubic=True)
a.calc = MACECalculator(model_paths=str(DEFAULT_MODEL), device="cpu", default_dtype="float64")
a.get_forces()   # e3nn's shared scripted functions now run on the profiling executor
path = make_random_mace(sys.argv[1], max_ell=3, correlation=3)
b = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
b.rattle(0.05, seed=5)
b.calc = ShardMDCalculator(model="mace", checkpoint=str(path))
c = b.copy()
c.calc = MACECalculator(model_paths=str(path), device="cpu", default_dtype="float64")
print("max force difference", float(np.abs(b.get_forces() - c.get_forces()).max()))
"""


@pytest.mark.slow
def test_mace_calculator_then_ours_in_one_process(tmp_path):
    """mace-torch's calculator first, ours after it, in one process: e3nn's scripted spherical
    harmonics are shared by both, and our executor switch (models/mace.py) once broke them with
    a segmentation fault or TorchScript INTERNAL ASSERT. A fresh
    process: the executor a function gets is kept for the life of the process."""
    import sys

    r = subprocess.run([sys.executable, "-c", MIXED_EXECUTORS, str(tmp_path / "l3.model")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    diff = float(r.stdout.split("max force difference")[1])
    assert diff <= 1e-10
