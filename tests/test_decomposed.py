"""Domain decomposition on real MPI ranks (gloo, oversubscribed): N domains give the
1-domain answer.  Several systems and grids run per launch to keep the suite fast."""
from pathlib import Path

import numpy as np
import pytest
from conftest import WorldTask
from reference import lj_reference, mix_lorentz_berthelot
from systems import make_system

from shardmd.engine.io.h5md import read_frames

HERE = Path(__file__).resolve().parent
CASES = {
    2: ["ortho:1x1x2", "triclinic:auto", "slab:auto"],
    3: ["ortho:1x1x3", "triclinic:auto"],
    4: ["ortho:2x2x1", "triclinic:2x2x1", "slab:2x2x1", "vacuum:1x1x4"],
    6: ["ortho:3x2x1", "triclinic:auto"],
    8: ["ortho:2x2x2", "triclinic:auto"],
}


@pytest.fixture(scope="module")
def reference():
    eps, sig = mix_lorentz_berthelot(np.array([0.0104, 0.014]), np.array([3.40, 3.65]))
    out = {}
    for name in ("ortho", "triclinic", "slab", "vacuum"):
        a = make_system(name)
        out[name] = lj_reference(a.positions, a.cell.array, a.pbc, a.numbers, eps, sig, {18: 0, 36: 1}, 7.0, True)[:3]
    return out


def _vacuum_file(factory):
    from ase.io import write

    d = factory.mktemp("vacuum")
    write(d / "vac.extxyz", make_system("vacuum"))
    return d / "vac.extxyz"


def world_tasks(item):
    """The LJ cases of k ranks, and the empty-domains run on 4, join the shared k-rank worlds
    (conftest.MPIWorlds)."""
    if item.originalname == "test_lj_on_k_domains_equals_reference":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"lj_cases{k}", "lj_cases", ["{out}", *CASES[k]])]
    if item.originalname == "test_empty_domains_run":
        return [WorldTask(4, "empty_domains", "engine_runs", [
            "model=lj", lambda factory: f"system.file={_vacuum_file(factory)}", "grid=[1,1,4]", "steps=40",
            "trajectory.every=20", "quiet=true", "model.epsilon.Kr=0.014", "model.sigma.Kr=3.65",
            "output={out}/run.h5"])]
    return []


@pytest.mark.mpi
# the fast tier splits one axis (k=2) and two (k=4); 3 ways, 6 (3x2x1) and all three axes (k=8)
# in the full suite only (each world of its own rank count is ~20-30 s of a 2-core machine)
@pytest.mark.parametrize("k", [pytest.param(k, marks=pytest.mark.slow) if k in (3, 6, 8) else k for k in sorted(CASES)])
def test_lj_on_k_domains_equals_reference(k, mpi_world, reference):
    # clean: the world (lj_cases.py's run here) exited 0 after its gloo shutdown check
    tmp_path = mpi_world(k, f"lj_cases{k}", clean=True)
    for case in CASES[k]:
        name, grid = case.split(":")
        e_ref, f_ref, w_ref = reference[name]
        d64 = np.load(tmp_path / f"{name}_{grid}_float64.npz")
        assert np.prod(d64["grid"]) == k
        if grid != "auto":
            assert "x".join(map(str, d64["grid"])) == grid
        assert np.array_equal(d64["ids"], np.arange(len(f_ref)))
        fmax = np.abs(f_ref).max()
        assert np.abs(d64["forces"] - f_ref).max() <= 1e-12 * fmax, case
        assert abs(d64["energy"] - e_ref) <= 1e-12 * abs(e_ref), case
        assert np.abs(d64["virial"] - w_ref).max() <= 1e-12 * np.abs(w_ref).max(), case
        # float32: positions carry ~6e-8 relative rounding (|x| ~ 30 Å -> 2e-6 Å); a force
        # sums ~100 pair terms whose derivatives reach ~20 max|F| per Å: 1e-4 max|F| bounds it
        d32 = np.load(tmp_path / f"{name}_{grid}_float32.npz")
        assert np.abs(d32["forces"] - f_ref).max() <= 1e-4 * fmax, case
        assert abs(d32["energy"] - e_ref) <= 1e-5 * abs(e_ref), case


@pytest.mark.mpi
def test_empty_domains_run(mpi_world):
    """Atoms only in the lower part of the box: two of four z-slabs start empty. The run is
    the engine's on the shared 4-rank world (tests/mpi/engine_runs.py: the CLI's run without
    its launch; launching is what test_self_launch_equals_mpiexec and the 1-vs-4 runs test)."""
    frames = read_frames(mpi_world(4, "empty_domains") / "run.h5")
    assert len(frames) == 3 and len(frames[-1]) == len(make_system("vacuum"))
