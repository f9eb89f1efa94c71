"""Two ranks on CUDA: decomposed LJ and MACE against the same single-process references as
the CPU suites (brute-force LJ sums; mace-torch's own calculator on the CPU). With two GPUs
the ranks talk over NCCL (one GPU each); with one, both share it and talk through host memory
(gloo, the engine's "staged" mode). The MACE runs take 50 MD steps with the engine's CUDA
defaults: the deferred, pipelined skin check and halo exchanges that receive in place.

Skipped (with the reason) without CUDA; on the device machine:
``pytest -q -m gpu tests/test_gpu_mpi.py`` (``nvidia-h200-x2`` for the NCCL path).
"""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import mpiexec_cmd
from reference import lj_reference, mix_lorentz_berthelot
from systems import make_system
from test_mace import _reference, mace_setup  # noqa: F401  (a fixture, used by name)

HERE = Path(__file__).resolve().parent
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.mpi,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on the device machine"),
]
ENV = dict(os.environ, SHARDMD_TEST_DEVICE="cuda", NCCL_NVLS_ENABLE="0")


def test_lj_on_two_gpus_equals_reference(tmp_path):
    cases = ["ortho:1x1x2", "triclinic:auto", "slab:auto"]
    r = subprocess.run(mpiexec_cmd(2, [str(HERE / "mpi" / "lj_cases.py"), str(tmp_path), *cases]),
                       capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    eps, sig = mix_lorentz_berthelot(np.array([0.0104, 0.014]), np.array([3.40, 3.65]))
    for case in cases:
        name, grid = case.split(":")
        a = make_system(name)
        e_ref, f_ref, w_ref = lj_reference(a.positions, a.cell.array, a.pbc, a.numbers, eps, sig,
                                           {18: 0, 36: 1}, 7.0, True)[:3]
        d = np.load(tmp_path / f"{name}_{grid}_float64.npz")
        assert np.prod(d["grid"]) == 2 and d["ghosts"] > 0
        fmax = np.abs(f_ref).max()
        assert np.abs(d["forces"] - f_ref).max() <= 1e-12 * fmax, case
        assert abs(d["energy"] - e_ref) <= 1e-12 * abs(e_ref), case
        assert np.abs(d["virial"] - w_ref).max() <= 1e-12 * np.abs(w_ref).max(), case


def _no_cueq_kernels() -> bool:
    """Whether CUDA is here but cuEquivariance's kernels are not. Asked at collection: without
    CUDA the module is skipped anyway, and importing them (mace-torch's converter) would cost
    every test process ~5 s of CPU for nothing."""
    if not torch.cuda.is_available():
        return False
    from shardmd.models.mace import cueq_available

    return not cueq_available(kernels=True)


@pytest.mark.parametrize("cases", [
    ["ortho.extxyz:1x1x2"],
    pytest.param(["tri.extxyz::cueq"], marks=pytest.mark.skipif(
        _no_cueq_kernels(), reason="cuEquivariance's CUDA kernels are not installed "
                                    "(pip install cuequivariance-ops-torch-cu13)")),
], ids=["e3nn", "cueq"])
def test_mace_on_two_gpus_equals_mace_calculator(mace_setup, tmp_path, cases):  # noqa: F811
    d, model = mace_setup
    specs = [str(d / c.split(":")[0]) + c[c.index(":"):] for c in cases]
    r = subprocess.run(mpiexec_cmd(2, [str(HERE / "mpi" / "mace_cases.py"), str(tmp_path), str(model), *specs]),
                       capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    for c in cases:
        cueq = c.endswith(":cueq")
        res = np.load(tmp_path / f"{Path(c.split(':')[0]).stem}{'_cueq' if cueq else ''}_float64.npz")
        assert np.prod(res["grid"]) == 2
        # cuEquivariance's GPU kernels contract in another order than e3nn (the reference)
        tol = 1e-9 if cueq else 1e-10
        for tag in ("0", "1"):   # before and after 50 hot MD steps (atoms migrated between GPUs)
            e, f, w = _reference(model, res["numbers"], res["pos" + tag], res["cell"])
            fmax = np.abs(f).max()
            assert np.abs(res["f" + tag] - f).max() <= tol * fmax, (c, tag)
            assert abs(float(res["e" + tag]) - e) <= tol * abs(e), (c, tag)
            assert np.abs(res["w" + tag] - w).max() <= tol * np.abs(w).max(), (c, tag)
        assert int(res["migrated"]) > 0
