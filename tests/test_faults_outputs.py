"""Outputs and inputs that must not be clobbered, and sizes refused up front.

* a running job's output: a second run (``overwrite=true``, fresh or restart) is refused in
  one line naming the job (pid, host) and touches nothing; two runs started at once on one
  output end with one trajectory that reads (engine/io/output_lock.py);
* the input structure, a checkpoint restarted from, and the outputs (trajectory, log,
  checkpoint folder, relaxed structure) are never one file, by path, symbolic or hard link;
* systems too large, too dense or in a flat cell are refused before anything is allocated
  (engine/run/preflight.py), under a memory cap so that a regression fails here, not the machine.

Real processes for everything two jobs or a cap need; the refusals decided before any rank
starts run the CLI in this process (``run_in_process``).
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from conftest import run_in_process

from shardmd.engine.io.h5md import read_frames

pytestmark = pytest.mark.fault

SMALL = ["model=lj", "system.repeat=[3,3,3]", "quiet=true", "threads=1"]


def _engine(args, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(cond, what: str, proc: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job ended ({proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


def _committed_frames(path: Path) -> int:
    try:
        return len(read_frames(path))
    except Exception:  # noqa: BLE001 - not there yet, or being written
        return 0


def _one_error(lines: list[str], *needles: str) -> str:
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _intact(path: Path, last_step: int | None = None) -> list:
    """Every frame of ``path`` reads and its stored config is the run's (not empty)."""
    frames = read_frames(path)
    assert frames
    steps = [a.info["step"] for a in frames]
    assert steps == sorted(set(steps))
    if last_step is not None:
        assert steps[-1] == last_step
    with h5py.File(path, "r", locking=False) as f:
        cfg = json.loads(f["parameters/config_json"][()])
    assert cfg["model"]["name"] == "lj" and cfg["output"], cfg
    return frames


# -- item: an output in use is never touched ---------------------------------------------------------
@pytest.mark.parametrize("second", [["overwrite=true"], ["restart=auto"], []])
def test_second_run_on_a_running_jobs_output_touches_nothing(tmp_path, capfd, monkeypatch, second):
    """overwrite=true on the output of a job still running truncated its trajectory before HDF5's
    lock refused the second run; the first then ended with exit 0 and a file no reader opened.
    Now the second is refused by the job's lock before anything is opened for writing."""
    first = _engine(["run", *SMALL, "steps=1000000", "trajectory.every=20", "checkpoint.every=200",
                     "thermo.every=100"], tmp_path)
    try:
        _wait_for(lambda: _committed_frames(tmp_path / "run.h5") >= 3 and list((tmp_path / "run.ckpt").glob("*.h5")),
                  "frames and a checkpoint", first)
        log_before = (tmp_path / "run.log").read_text()
        code, lines = run_in_process(["run", *SMALL, "steps=1000000", *second], tmp_path, capfd, monkeypatch)
        assert first.poll() is None                       # the first job goes on
        assert (tmp_path / "run.log").read_text().startswith(log_before)   # its log not truncated
        assert _committed_frames(tmp_path / "run.h5") >= 3    # nor its trajectory
        assert code == 2
        _one_error(lines, "'run.h5' is open in another running process", f"pid {first.pid}",
                   f"host {socket.gethostname()}")
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=600) == 75, first.stderr.read()
    frames = _intact(tmp_path / "run.h5")
    assert frames[0].info["step"] == 0 and len(frames) >= 3
    assert not (tmp_path / "run.h5.lock").exists()      # released at the end of the run


def test_two_runs_started_at_once_leave_one_readable_trajectory(tmp_path):
    """Two fresh runs on one output started together: the kernel's lock lets exactly one write;
    the other is refused in one line (or, had the first ended already, finds the output there).
    Before: both created the file, one truncating the other's (once an empty stored config)."""
    args = ["run", *SMALL, "steps=1500", "trajectory.every=50", "thermo.every=0", "overwrite=true"]
    procs = [_engine(args, tmp_path) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for c, err in results:
        if c == 2:
            lines = err.strip().splitlines()
            _one_error(lines, "'run.h5' is open in another running process")
    _intact(tmp_path / "run.h5", last_step=1500)


# -- item: inputs and outputs are never one file ----------------------------------------------------
@pytest.fixture(scope="module")
def argon(tmp_path_factory) -> Path:
    """A small argon crystal as extxyz, slightly displaced (FIRE has work to do)."""
    from ase.build import bulk

    d = tmp_path_factory.mktemp("argon")
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    a.positions[0] += 0.2
    a.write(d / "my.extxyz")
    return d / "my.extxyz"


def _place(src: Path, dst: Path, how: str) -> None:
    if how == "copy":
        dst.write_bytes(src.read_bytes())
    elif how == "symlink":
        dst.symlink_to(src.name)
    else:
        dst.hardlink_to(src)


@pytest.mark.parametrize("case", ["default name", "symlink", "hard link"])
def test_minimize_never_writes_over_its_input(tmp_path, argon, capfd, monkeypatch, case):
    """The relaxed structure's default name is output's with .extxyz, which was the input's for
    system.file=my.extxyz output=my.h5: the run overwrote its input and exited 0; a link to it
    as minimize.structure did the same."""
    src = tmp_path / "my.extxyz"
    _place(argon, src, "copy")
    before = src.read_bytes()
    extra = []
    if case != "default name":
        _place(src, tmp_path / "alias.extxyz", "symlink" if case == "symlink" else "hard")
        extra = ["minimize.structure=alias.extxyz"]
    code, lines = run_in_process(["minimize", "model=lj", "system.file=my.extxyz", "output=my.h5", "quiet=true",
                                  "threads=1", "minimize.steps=5", *extra], tmp_path, capfd, monkeypatch)
    assert src.read_bytes() == before
    assert code == 2
    line = _one_error(lines, "system.file='my.extxyz'", "relaxed structure", "minimize.structure=")
    if case == "hard link":
        assert "the same file by a link" in line
    assert not (tmp_path / "my.h5").exists() and not (tmp_path / "my.log").exists()


@pytest.mark.parametrize("case", ["trajectory by hard link", "log by symlink", "restart onto the output"])
def test_run_never_writes_over_its_input(tmp_path, argon, capfd, monkeypatch, case):
    """The structure file or the checkpoint a run starts from is never one of its outputs, also
    through a link (before: only one path spelled two ways was caught, for the trajectory)."""
    if case == "restart onto the output":
        code, _ = run_in_process(["run", *SMALL, "steps=10", "output=first.h5"], tmp_path, capfd, monkeypatch)
        assert code == 0
        ckpt = sorted((tmp_path / "first.ckpt").glob("step-*.h5"))[-1]
        (tmp_path / "out.h5").hardlink_to(ckpt)
        src, args = ckpt, [f"restart={ckpt}", "steps=20", "output=out.h5"]
        needle = "restart.file="
    else:
        src = tmp_path / "my.extxyz"
        _place(argon, src, "copy")
        if case == "trajectory by hard link":
            (tmp_path / "out.h5").hardlink_to(src)
        else:
            (tmp_path / "out.log").symlink_to("my.extxyz")
        args = ["system.file=my.extxyz", "output=out.h5", "overwrite=true", "steps=5"]
        needle = "system.file='my.extxyz'"
    before = src.read_bytes()
    code, lines = run_in_process(["run", *SMALL, *args], tmp_path, capfd, monkeypatch)
    assert src.read_bytes() == before
    assert code == 2
    _one_error(lines, needle, "is also this run's", "overwrite the")


# -- item: sizes refused up front, under a memory cap ------------------------------------------------
CAP_BYTES = 6 * 2**30   # address space of the capped engine: torch needs ~3 GiB of it to start


def _capped_engine(args, cwd, timeout=240) -> subprocess.CompletedProcess:
    """``python -m engine`` under RLIMIT_AS = CAP_BYTES: a regression that allocates the
    gigabytes fails here (MemoryError, traceback), never the machine."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


def _write_atoms(path: Path, kind: str) -> None:
    import numpy as np
    from ase import Atoms

    if kind == "dense":      # 50,000 atoms in a 10 Å box
        pos = np.random.default_rng(0).random((50_000, 3)) * 10
        Atoms(f"Ar{len(pos)}", positions=pos, cell=[10, 10, 10], pbc=True).write(path)
    else:                    # flat: two vectors 0.01 degrees apart
        Atoms("Ar4", positions=[[0, 0, 0], [2.6, 0, 0], [0, 2.6, 0], [2.6, 2.6, 2.6]],
              cell=[[5.2, 0, 0], [5.2, 0.001, 0], [0, 0, 5.2]], pbc=True).write(path)


@pytest.mark.parametrize("case, args, needles", [
    ("repeat", ["system.repeat=[400,400,400]"], ["256,000,000 atoms", "limits.max_atoms=100,000,000"]),
    ("repeat, limit raised", ["system.repeat=[400,400,400]", "limits.max_atoms=1000000000"],
     ["256,000,000 atoms", "GiB", "limits.memory_gb="]),
    ("dense", ["system.file=in.extxyz"], ["50,000 atoms in 1000 Å^3", "health.min_distance=0.5"]),
    ("dense", ["system.file=in.extxyz", "health.min_distance=0"], ["GiB per rank", "limits.memory_gb="]),
    ("flat", ["system.file=in.extxyz", "health.min_distance=0"], ["the cell is nearly flat"]),
])
def test_sizes_are_refused_before_allocating(tmp_path, case, args, needles):
    """Before: 5-7.5 GB allocations and a traceback (the flat cell: minutes of work)."""
    if case in ("dense", "flat"):
        _write_atoms(tmp_path / "in.extxyz", case)
    r = _capped_engine(["run", "model=lj", "quiet=true", "threads=1", "steps=2", *args], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    _one_error(r.stderr.strip().splitlines(), *needles)
    assert not (tmp_path / "run.h5").exists() and not (tmp_path / "run.log").exists()


def test_memory_limit_is_the_users(tmp_path, capfd, monkeypatch):
    """limits.memory_gb is the budget when given: a small run refused under a tiny one, run under the default."""
    code, lines = run_in_process(["run", *SMALL, "steps=2", "limits.memory_gb=0.0001"], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, "limits.memory_gb=0.0001", "GiB per rank")
    code, lines = run_in_process(["run", *SMALL, "steps=2"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines


# -- minor items: what an input is, names too long ----------------------------------------------------
@pytest.mark.parametrize("kind, needle", [("fifo", "is a named pipe (FIFO)"), ("dev", "is a device"),
                                          ("dir", "is a directory"), ("long", "longer than file systems allow")])
def test_structure_that_is_no_file_says_what_it_is(tmp_path, capfd, monkeypatch, kind, needle):
    import os

    path = {"fifo": tmp_path / "pipe", "dev": Path("/dev/zero"), "dir": tmp_path / "folder",
            "long": tmp_path / ("a" * 300 + ".extxyz")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    code, lines = run_in_process(["run", *SMALL, f"system.file={path}"], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, "system.file=", needle)


@pytest.mark.parametrize("key", ["output", "minimize.structure"])
def test_output_name_too_long_is_one_line(tmp_path, capfd, monkeypatch, key):
    cmd = "minimize" if key == "minimize.structure" else "run"
    code, lines = run_in_process([cmd, *SMALL, "steps=2", f"{key}={'b' * 300}.h5"], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, f"{key}=", "longer than file systems allow")
