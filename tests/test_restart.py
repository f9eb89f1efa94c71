"""Checkpoints and restarts with real processes: bit-exact continuation, other domain
counts, SIGKILL at random moments, SIGTERM, bad restart files."""
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from conftest import run_engine, run_in_process

from shardmd.engine.io.h5md import read_frames

# threads=1: one-domain runs go side by side, and torch's default of all cores then has each
# process's OpenMP workers wait on the other's (ranks of several domains use one thread anyway)
BASE = ["model=lj", "system.repeat=[5,5,5]", "dt=2.0", "temperature=100", "trajectory.every=10",
        "thermo.every=50", "quiet=true", "checkpoint.every=0", "threads=1"]


def _frames(path):
    return {f.info["step"]: f for f in read_frames(path)}


def _same_bits(a, b, steps):
    for s in steps:
        assert np.array_equal(a[s].positions, b[s].positions), s
        assert np.array_equal(a[s].get_velocities(), b[s].get_velocities()), s
        assert np.array_equal(a[s].arrays["image"], b[s].arrays["image"]), s


def _side_by_side(jobs, cwd):
    """Run several ``python -m engine`` commands at once (independent runs); their results."""
    procs = [subprocess.Popen([sys.executable, "-m", "engine", *a], cwd=cwd, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for a in jobs]
    outs = [p.communicate(timeout=600) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


_FIRST: dict = {}


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory):
    """``first_runs(integrator, domains)``: a folder holding the 200-step run (straight.h5) and
    the first 100 steps (split.h5, its checkpoint at step 100), made once, side by side. The
    langevin 2-domain pair is also test_restart_on_other_domain_counts' reference and start
    (BASE, langevin, 2 domains, 200 and 100 steps). Tests copy the folder before they add to
    it."""
    def get(integrator, domains):
        if (integrator, domains) not in _FIRST:
            d = tmp_path_factory.mktemp(f"first_{integrator}_{domains}")
            args = [*BASE, f"integrator={integrator}", f"domains={domains}"]
            for r in _side_by_side([["run", *args, "steps=200", "output=straight.h5"],
                                    ["run", *args, "steps=100", "output=split.h5"]], d):
                assert r.returncode == 0, r.stderr
            _FIRST[integrator, domains] = d
        return _FIRST[integrator, domains]
    return get


@pytest.mark.mpi
# the 2-domain cases run in the full suite only (fast tier <= 5 min); 1 domain stays fast
@pytest.mark.parametrize("domains", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("integrator", ["verlet", "langevin"])
def test_bit_exact_continuation(tmp_path, domains, integrator, first_runs):
    """200 steps straight == 100 + restart + 100 (the checkpoint at 100 is not a rebuild step)."""
    args = [*BASE, f"integrator={integrator}", f"domains={domains}"]
    shutil.copytree(first_runs(integrator, domains), tmp_path, dirs_exist_ok=True)
    r = run_engine(["run", *args, "steps=200", "output=split.h5", "restart=auto"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    a, b = _frames(tmp_path / "straight.h5"), _frames(tmp_path / "split.h5")
    assert sorted(a) == sorted(b) == list(range(0, 201, 10))
    _same_bits(a, b, sorted(a))


@pytest.mark.mpi
@pytest.mark.slow
def test_restart_on_other_domain_counts(tmp_path, first_runs):
    args = [*BASE, "integrator=langevin"]
    shutil.copytree(first_runs("langevin", 2), tmp_path, dirs_exist_ok=True)
    ck = tmp_path / "split.ckpt" / "step-000000000100.h5"
    ref = _frames(tmp_path / "straight.h5")
    results = _side_by_side([["run", *args, f"domains={d}", "steps=200", f"output=b{d}.h5", f"restart={ck}"]
                             for d in (4, 1)], tmp_path)
    for d, r in zip((4, 1), results):
        assert r.returncode == 0, r.stderr
        got = _frames(tmp_path / f"b{d}.h5")
        u = lambda f: f.positions + f.arrays["image"] @ f.cell.array  # noqa: E731
        assert np.abs(u(got[200]) - u(ref[200])).max() < 1e-8


def _kill_trials(tmp_path, trials, seed):
    rng = random.Random(seed)
    args = ["-m", "engine", "run", "model=lj", "system.repeat=[4,4,4]", "dt=2.0", "domains=2",
            "trajectory.every=1", "thermo.every=0", "quiet=true", "checkpoint.every=7", "checkpoint.keep=2",
            "steps=400", "restart=auto", "integrator=langevin"]
    for _ in range(trials):
        p = subprocess.Popen([sys.executable, *args], cwd=tmp_path, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.5, 7.0))   # from the ranks' start-up (~3 s) into stepping
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        time.sleep(0.3)
    straight = [a if a != "restart=auto" else "output=straight.h5" for a in args]
    for r in _side_by_side([args[2:], straight[2:]], tmp_path):     # the last restart, and the reference
        assert r.returncode == 0, r.stderr
    steps = [f.info["step"] for f in read_frames(tmp_path / "run.h5")]
    assert steps == list(range(401)), (len(steps), len(set(steps)))
    _same_bits(_frames(tmp_path / "run.h5"), _frames(tmp_path / "straight.h5"), [400])


@pytest.mark.mpi
@pytest.mark.slow
def test_sigkill_twelve_trials(tmp_path):
    # twelve trials of 2.5-7 s each (~70 s): a kill lands in every phase of a step
    _kill_trials(tmp_path, 12, seed=2)


@pytest.mark.mpi
# SIGTERM to the ranks themselves (a scheduler's way) in the full suite only: the fast tier's
# SIGTERM to the launching process reaches the same rank handlers, forwarded
@pytest.mark.parametrize("target", ["parent", pytest.param("ranks", marks=pytest.mark.slow)])
def test_sigterm_checkpoints_and_restarts_exactly(tmp_path, target):
    from shardmd.engine.launch.parallel import _rank_pids

    args = [*BASE, "integrator=langevin", "domains=2"]
    p = subprocess.Popen([sys.executable, "-m", "engine", "run", *args, "steps=100000", "output=r.h5"],
                         cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "r.log"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 4):
        time.sleep(0.2)
    if target == "parent":
        p.send_signal(signal.SIGTERM)
    else:
        for pid in _rank_pids(p.pid):
            os.kill(pid, signal.SIGTERM)
    t0 = time.time()
    code = p.wait(timeout=60)
    # prompt, not the run's 100,000 steps: ~2 s on a quiet machine; 15.6 s once with four xdist
    # workers on two cores (load 10), hence the margin
    assert time.time() - t0 < 30, time.time() - t0
    assert code == 75, p.stderr.read()
    assert "Stopped by SIGTERM" in log.read_text()
    stop = int(sorted((tmp_path / "r.ckpt").iterdir())[-1].stem.split("-")[1])
    end = stop + 30
    for r in _side_by_side([["run", *args, f"steps={end}", "output=r.h5", "restart=auto"],
                            ["run", *args, f"steps={end}", "output=s.h5"]], tmp_path):
        assert r.returncode == 0, r.stderr
    a, b = _frames(tmp_path / "r.h5"), _frames(tmp_path / "s.h5")
    assert stop in a and len(a) == len(set(a))
    _same_bits(a, b, [s for s in b if s in a])


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bad_restart_files_are_one_line_and_touch_nothing(tmp_path, capfd, monkeypatch):
    """Refusals are decided before any step: run in this process (cli.main, stderr taken at the
    file descriptor), not 10 fresh engines' start-up."""
    code, lines = run_in_process(["run", *BASE, "system.repeat=[3,3,3]", "steps=20"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    ck = sorted((tmp_path / "run.ckpt").iterdir())[-1]
    (tmp_path / "trunc.h5").write_bytes(ck.read_bytes()[:2000])
    (tmp_path / "text.h5").write_text("not hdf5\n")
    before = _digest(tmp_path / "run.h5")
    cases = [
        (["restart=missing.h5"], "does not exist"),
        (["restart=trunc.h5"], "trunc.h5"),
        (["restart=text.h5"], "not an HDF5 file"),
        (["restart=run.h5"], "H5MD trajectory"),
        ([f"restart={ck}", "model.cutoff=7.0"], "restart would change model"),
        ([f"restart={ck}", "dt=1.0", "seed=5"], "dt, seed"),
        (["+restart=" + str(ck), "steps=10"], "past steps=10"),
        ([], "exists; add overwrite=true"),
    ]
    for extra, needle in cases:
        code, lines = run_in_process(["run", *BASE, "system.repeat=[3,3,3]", "steps=40", *extra], tmp_path, capfd,
                                     monkeypatch)
        assert code == 2 and len(lines) == 1 and needle in lines[0], (extra, lines)
        assert _digest(tmp_path / "run.h5") == before
    code, lines = run_in_process(["run", *BASE, "system.repeat=[3,3,3]", "steps=40", f"restart={ck}",
                                  "dt=1.0", "restart.allow_changes=true"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines


def test_checkpoint_contents(tmp_path, capfd, monkeypatch):
    code, lines = run_in_process(["run", *BASE, "system.repeat=[3,3,3]", "steps=30", "checkpoint.every=10",
                                  "checkpoint.keep=2"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    files = sorted((tmp_path / "run.ckpt").iterdir())
    assert [f.name for f in files] == ["step-000000000020.h5", "step-000000000030.h5"]
    with h5py.File(files[-1], "r") as f:
        assert f.attrs["kind"] == "shardmd-checkpoint" and f.attrs["step"] == 30
        assert f["atoms/velocities"].attrs["unit"] == "angstrom fs-1"
        assert np.array_equal(f["atoms/ids"][()], np.arange(108))
        for key in ("config", "integrator", "model_identity", "code_version"):
            assert f.attrs[key]
