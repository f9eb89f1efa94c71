"""Domain decomposition through the engine's own launches (self-launched ranks, mpiexec,
failures on one rank): N domains follow 1 domain. The hot-gas stress runs on the shared 8-rank
world (tests/conftest.py's ``mpi_world``), the rest through launches of their own."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import WorldTask, mpiexec_cmd, run_in_process

from shardmd.engine.config.compose import compose_config
from shardmd.engine.io.h5md import read_frames
from shardmd.engine.run.simulation import Simulation

HERE = Path(__file__).resolve().parent


def _unwrapped(frames):
    return [f.positions + f.arrays["image"] @ f.cell.array for f in frames]


# threads=1: the 1- and 4-domain runs go side by side (ranks of several domains use one thread)
COMMON = ["model=lj", "system.repeat=[6,6,6]", "steps=200", "trajectory.every=50", "thermo.every=50",
          "quiet=true", "temperature=90", "dt=2.0", "neighbor.skin=0.6", "threads=1"]


_PAIRS: dict = {}


@pytest.fixture(scope="module")
def one_and_four(tmp_path_factory):
    """``one_and_four(integrator)``: a folder with COMMON's run on 1 domain (d1.h5) and
    self-launched on 4 (``+domains=4``, d4.h5), run side by side. The verlet pair also serves
    test_self_launch_equals_mpiexec (one 4-rank launch fewer)."""
    def runs(integrator):
        if integrator not in _PAIRS:
            d = tmp_path_factory.mktemp(f"pair_{integrator}")
            procs = [subprocess.Popen([sys.executable, "-m", "engine", "run", *COMMON, f"integrator={integrator}",
                                       *extra], cwd=d, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for extra in (["output=d1.h5"], ["+domains=4", "output=d4.h5"])]    # side by side
            errs = [p.communicate(timeout=300)[1] for p in procs]
            assert [p.returncode for p in procs] == [0, 0], errs
            _PAIRS[integrator] = d
        return _PAIRS[integrator]
    return runs


@pytest.mark.mpi
# langevin in the full suite only: the fast tier checks its noise keyed by atom id, not memory
# order or rank (test_dynamics, test_integrators), and 2-domain langevin restarts to the bit
@pytest.mark.parametrize("integrator", ["verlet", pytest.param("langevin", marks=pytest.mark.slow)])
def test_trajectories_1_vs_4_domains(integrator, one_and_four):
    tmp_path = one_and_four(integrator)
    a, b = read_frames(tmp_path / "d1.h5"), read_frames(tmp_path / "d4.h5")
    assert [f.info["step"] for f in a] == [f.info["step"] for f in b] == [0, 50, 100, 150, 200]
    for ua, ub in zip(_unwrapped(a), _unwrapped(b)):
        assert np.abs(ua - ub).max() < 1e-8
    assert "neighbour builds" in (tmp_path / "d4.log").read_text()


@pytest.mark.mpi
def test_self_launch_equals_mpiexec(tmp_path, one_and_four):
    """``mpiexec -n 4 python -m engine run ...`` and the self-launched ``+domains=4`` run of the
    same job (test_trajectories_1_vs_4_domains' verlet run): the same bits."""
    args = ["-m", "engine", "run", "+model=lj", *COMMON[1:], "integrator=verlet", "output=m.h5"]
    r = subprocess.run(mpiexec_cmd(4, args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m, s = read_frames(tmp_path / "m.h5"), read_frames(one_and_four("verlet") / "d4.h5")
    assert [f.info["step"] for f in m] == [f.info["step"] for f in s] == [0, 50, 100, 150, 200]
    for fa, fb in zip(m, s):
        assert np.array_equal(fa.positions, fb.positions)
        assert np.array_equal(fa.get_velocities(), fb.get_velocities())


GAS = ["model=lj", "system.a=11.0", "system.repeat=[4,4,4]", "temperature=2500", "dt=2.0", "steps=300",
       "neighbor.skin=1.0", "trajectory.every=0", "thermo.every=30", "quiet=true", "model.cutoff=5.0"]


def world_tasks(item):
    if item.originalname == "test_hot_gas_migration_stress_on_8_domains":
        return [WorldTask(8, "hot_gas8", "engine_runs", [*GAS, "grid=[2,2,2]", "output={out}/g8.h5"])]
    return []


def _energies(log: str) -> np.ndarray:
    return np.array([float(line.split()[5]) for line in log.splitlines() if line.strip()[:1].isdigit()])


@pytest.mark.mpi
@pytest.mark.slow
def test_hot_gas_migration_stress_on_8_domains(mpi_world, tmp_path):
    """A hot dilute gas crossing faces and periodic corners for 300 steps on 8 domains (~145 atom
    migrations; 3,000 steps cost 3.5 minutes): the atom count and id checksum are verified at
    every rebuild (a mismatch stops the run); NVE energy behaves as on one domain."""
    log = (mpi_world(8, "hot_gas8") / "g8.log").read_text()
    migrations = int(log.split(" atom migrations")[0].split()[-1])
    assert migrations > 75, log[-500:]
    sim = Simulation(compose_config([*GAS, f"output={tmp_path / 'g1.h5'}"]))
    sim.run()
    e8, e1 = _energies(log), _energies((tmp_path / "g1.log").read_text())
    assert len(e8) == len(e1) == 11
    # before chaos separates them, the two runs are the same trajectory
    assert np.allclose(e8[:2], e1[:2], rtol=1e-9, atol=0)
    # afterwards both conserve energy alike: velocity Verlet's error at dt = 2 fs in a
    # 2,500 K gas (collisions resolved by ~20 steps) stays far below 2e-4 of the kinetic
    # energy (3/2 N kT ~ 83 eV); a lost or duplicated atom, or a missing ghost, breaks it
    ke = 1.5 * 256 * 8.617e-5 * 2500
    drift8, drift1 = np.abs(e8 - e8[0]).max(), np.abs(e1 - e1[0]).max()
    assert drift8 < 2e-4 * ke and drift1 < 2e-4 * ke, (drift8, drift1)


@pytest.mark.mpi
@pytest.mark.slow
def test_thin_domains_error_names_largest_count(tmp_path, capfd, monkeypatch):
    """Refused before any rank starts: in this process (cli.main, stderr at the fd)."""
    code, lines = run_in_process(["run", "model=lj", "system.repeat=[3,3,3]", "domains=16", "steps=5"], tmp_path,
                                 capfd, monkeypatch)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("error:") and "at most domains=" in lines[0], lines


@pytest.mark.mpi
def test_launcher_count_mismatch_is_one_line(tmp_path):
    r = subprocess.run(mpiexec_cmd(2, ["-m", "engine", "run", "model=lj", "domains=3", "steps=5"]),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "domains=3" in errors[0] and "2 ranks" in errors[0], r.stderr


@pytest.mark.mpi
def test_failure_on_one_rank_ends_all_ranks(tmp_path):
    """An exception on rank 1 ends all three ranks within 10 s, non-zero, message shown once
    (the exception comes from a test-only wrapper of the step: tests/helpers/inject_failure.py)."""
    helper = str(Path(__file__).parent / "helpers" / "inject_failure.py")
    p = subprocess.Popen(mpiexec_cmd(3, [helper, "1:20", "run", "model=lj", "system.repeat=[6,6,6]",
                                         "steps=100000", "quiet=true"]), cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    t_fail = None
    for line in p.stderr:
        lines.append(line)
        if "injected failure" in line and t_fail is None:
            t_fail = time.time()
    code = p.wait(timeout=60)
    t_end = time.time()
    assert code != 0
    assert t_fail is not None and t_end - t_fail < 10, (t_end - (t_fail or 0))
    assert sum("injected failure at step 20" in line for line in lines) == 1, lines
