"""Checkpoints and restarts of relaxations (engine/relax/base.py) with real processes: a relaxation
continued from a checkpoint ends bit for bit where the uninterrupted one does (FIRE, L-BFGS with
FixSymmetry, BFGS, all with the cell), a SIGKILLed one resumes with restart=auto, the
checkpoint's optimiser state is plain HDF5 arrays, and bad restarts are one line."""
import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from ase.build import bulk
from ase.io import read, write
from conftest import run_engine, run_in_process

from shardmd.engine.io.h5md import read_frames

_STRAIN = np.array([[1.03, 0.01, 0.0], [0.0, 0.98, 0.02], [0.0, 0.0, 1.01]])


def _argon(repeat=3, rattle=0.2):
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((repeat,) * 3)
    a.rattle(rattle, seed=1)
    a.set_cell(a.cell.array @ _STRAIN, scale_atoms=True)
    a.info.clear()
    return a


def _symmetric_argon():
    """32 argon atoms in a monoclinic cell, one atom shifted: a group FixSymmetry keeps."""
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2))
    a.set_cell(a.cell.array @ np.array([[1.04, 0.02, 0.0], [0.02, 0.99, 0.0], [0.0, 0.0, 0.97]]), scale_atoms=True)
    a.positions[0] += [0.1, 0.0, 0.0]
    return a


def _side_by_side(jobs, cwd):
    procs = [subprocess.Popen([sys.executable, "-m", "engine", *a], cwd=cwd, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for a in jobs]
    outs = [p.communicate(timeout=600) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


def _same_frames(full, split):
    """Every frame of the uninterrupted run's trajectory is in the continued one, bit for bit
    (positions, images, cell, energy); the continued one may hold the first part's last frame."""
    a = {f.info["step"]: f for f in read_frames(full)}
    b = {f.info["step"]: f for f in read_frames(split)}
    assert set(a) <= set(b) and max(a) == max(b)
    for s in a:
        assert np.array_equal(a[s].positions, b[s].positions), s
        assert np.array_equal(a[s].arrays["image"], b[s].arrays["image"]), s
        assert np.array_equal(a[s].cell.array, b[s].cell.array), s
    return a, b


@pytest.mark.parametrize("method,extra", [
    ("fire", []), ("lbfgs", ["minimize.symmetry=true"]), pytest.param("bfgs", [], marks=pytest.mark.slow)])
def test_continued_relaxation_is_bit_exact(method, extra, tmp_path):
    """A cell relaxation stopped at minimize.steps=23 (checkpoints every 5 steps and at the end)
    and continued with restart=auto and more steps ends bit for bit where the uninterrupted one
    does: FIRE's velocities and scalars, ASE's L-BFGS history and FixSymmetry's operations, BFGS's
    Hessian, the filter's reference cell and the lists' cell all come back from the checkpoint."""
    write(tmp_path / "in.extxyz", _symmetric_argon() if extra else _argon())
    base = ["minimize", "model=lj", "system.file=in.extxyz", f"minimize.method={method}", "minimize.cell=true",
            "minimize.fmax=1e-4", "trajectory.every=5", "quiet=true", "threads=1", *extra]
    for r in _side_by_side([[*base, "output=full.h5"],
                            [*base, "output=split.h5", "minimize.steps=23", "checkpoint.every=5"]], tmp_path):
        assert r.returncode == 0, r.stderr
    r = run_engine([*base, "output=split.h5", "checkpoint.every=5", "restart=auto"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    a, _ = _same_frames(tmp_path / "full.h5", tmp_path / "split.h5")
    log = (tmp_path / "split.log").read_text()
    assert "Restart from" in log and "at step 23" in log and "converged" in log.splitlines()[-1]
    energy = [read(tmp_path / f"{name}.extxyz").get_potential_energy() for name in ("full", "split")]
    assert energy[0] == energy[1]
    assert max(a) > 40


def _kill_when_checkpointed(args, cwd, step):
    """Start ``python -m engine`` with ``args``, SIGKILL its process group once a checkpoint of at
    least ``step`` exists (the run is then past its start, mid-relaxation); its exit status."""
    p = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=cwd, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = cwd / "run.ckpt"
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        names = [n for n in os.listdir(ckpt) if n.startswith("step-")] if ckpt.is_dir() else []
        if any(int(n[5:17]) >= step for n in names):
            break
        time.sleep(0.05)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.wait()


@pytest.mark.parametrize("domains", [1, pytest.param(2, marks=[pytest.mark.mpi, pytest.mark.slow])])
def test_sigkill_resumes_with_restart_auto(domains, tmp_path):
    """The issue's acceptance: an L-BFGS relaxation (500 argon atoms, ~300 steps) killed with SIGKILL after its
    checkpoint of step 10 resumes with restart=auto and ends at the uninterrupted run's structure,
    bit for bit, with every frame."""
    write(tmp_path / "in.extxyz", _argon(repeat=5))
    args = ["minimize", "model=lj", "system.file=in.extxyz", "minimize.method=lbfgs", "minimize.fmax=1e-5",
            "trajectory.every=5", "checkpoint.every=5", "quiet=true", f"domains={domains}",
            *(["threads=1"] if domains == 1 else [])]
    code = _kill_when_checkpointed([*args, "restart=auto"], tmp_path, 10)
    assert code == -signal.SIGKILL, f"the relaxation ended by itself ({code}) before the kill"
    for r in _side_by_side([[*args, "restart=auto"], [*args, "output=full.h5"]], tmp_path):
        assert r.returncode == 0, r.stderr
    _same_frames(tmp_path / "full.h5", tmp_path / "run.h5")
    got, ref = read(tmp_path / "run.extxyz"), read(tmp_path / "full.extxyz")
    assert np.array_equal(got.positions, ref.positions) and got.get_potential_energy() == ref.get_potential_energy()
    assert "Restart from" in (tmp_path / "run.log").read_text()


def test_checkpoint_holds_the_optimiser_as_arrays(tmp_path, capfd, monkeypatch):
    """An L-BFGS checkpoint: the method and its scalars as JSON, ASE's history (s, y, rho, r0,
    f0), its positions and cell as numeric HDF5 datasets (nothing pickled), s within memory."""
    write(tmp_path / "in.extxyz", _argon())
    code, lines = run_in_process(["minimize", "model=lj", "system.file=in.extxyz", "minimize.method=lbfgs",
                                  "minimize.memory=4", "minimize.steps=9", "checkpoint.every=3", "quiet=true"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    with h5py.File(tmp_path / "run.ckpt" / "step-000000000009.h5") as f:
        g = f["minimizer"]
        state = json.loads(g.attrs["state"])
        shapes = {k: g[k].shape for k in g}
        kinds = {g[k].dtype.kind for k in g}
    assert state["method"] == "lbfgs" and state["iteration"] == 9
    assert shapes == {"s": (4, 324), "y": (4, 324), "rho": (4,), "r0": (324,), "f0": (324,), "x": (108, 3),
                      "cell": (3, 3)}
    assert kinds == {"f"}


def _damage(path, name, value):
    with h5py.File(path, "r+") as f:
        del f["minimizer"][name]
        f["minimizer"].create_dataset(name, data=value)


@pytest.fixture
def lbfgs_run(tmp_path, capfd, monkeypatch):
    """A 9-step L-BFGS relaxation of 108 argon atoms with checkpoints every 3 steps (in tmp_path)."""
    write(tmp_path / "in.extxyz", _argon())
    args = ["minimize", "model=lj", "system.file=in.extxyz", "minimize.method=lbfgs", "quiet=true"]
    code, lines = run_in_process([*args, "minimize.steps=9", "checkpoint.every=3"], tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    return args


@pytest.mark.parametrize("extra,damage,needle", [
    (["minimize.method=bfgs"], None, "restart would change minimize.method from 'lbfgs' to 'bfgs' (checkpoint"),
    (["minimize.pressure=100"], None, "restart would change minimize.pressure from 0.0 to 100.0"),
    (["minimize.cell=true"], None, "restart would change minimize.cell from False to True"),
    ([], ("s", np.zeros((3, 7))), "minimizer/s is of shape (3, 7) (float64), expected shape (n, 324)"),
    ([], ("x", np.full((108, 3), np.nan)), "minimizer/x holds non-finite values"),
    ([], ("rho", np.zeros((2, 2, 2, 2))), "minimizer/'rho' has shape (2, 2, 2, 2), expected at most 3 axes"),
])
def test_bad_restart_is_one_line(extra, damage, needle, lbfgs_run, tmp_path, capfd, monkeypatch):
    ck = tmp_path / "run.ckpt" / "step-000000000009.h5"
    if damage:
        _damage(ck, *damage)
    before = (tmp_path / "run.h5").read_bytes()
    code, lines = run_in_process([*lbfgs_run, f"restart={ck}", "minimize.steps=20", *extra], tmp_path, capfd,
                                 monkeypatch)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert (tmp_path / "run.h5").read_bytes() == before


def test_allow_changes_accepts_a_new_maxstep(lbfgs_run, tmp_path, capfd, monkeypatch):
    code, lines = run_in_process([*lbfgs_run, "restart=auto", "minimize.steps=12", "minimize.maxstep=0.1",
                                  "restart.allow_changes=true"], tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    assert "Restart from" in (tmp_path / "run.log").read_text()


def test_md_and_relaxation_checkpoints_do_not_mix(lbfgs_run, tmp_path, capfd, monkeypatch):
    """MD from a relaxation's checkpoint (its velocities are FIRE's or none) and a relaxation from
    an MD checkpoint are refused in one line, nothing written."""
    code, lines = run_in_process(["run", "model=lj", "system.file=in.extxyz", "restart=auto", "steps=20",
                                  "quiet=true"], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "is of a relaxation; continue it with" in lines[0], lines
    code, lines = run_in_process(["run", "model=lj", "system.file=in.extxyz", "steps=4", "checkpoint.every=2",
                                  "output=md.h5", "quiet=true"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    code, lines = run_in_process([*lbfgs_run, "output=md.h5", "restart=auto"], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "is of an MD run, not of a minimisation" in lines[0], lines
