"""Many-system runs in real processes: a relaxation queue killed with SIGKILL continues with
restart=auto and finishes only the rest; two ranks write the same files as one."""
from __future__ import annotations

import csv
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
from conftest import run_engine


def rattled(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((2, 2, 2 + k % 2))
        a.positions += rng.normal(0.0, 0.08, a.positions.shape)
        out.append(a)
    return out


def rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _wait_for(condition, what: str, limit: float = 300.0) -> None:
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, f"waited {limit} s for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_queue_finishes_only_the_rest(tmp_path):
    write(tmp_path / "q.extxyz", rattled(300))
    args = ["minimize", "model=lj", "system.file=q.extxyz", "system.frames=all", "trajectory.every=0",
            "output=q.h5", "quiet=true"]
    record = tmp_path / "q.systems" / "done.0.csv"
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: record.exists() and record.read_text().count("\n") >= 20 or proc.poll() is not None,
                  "20 relaxed systems")
        assert proc.poll() is None, f"the queue ended before it could be killed: {proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = record.read_text()
    before = {int(r.split(",")[0]) for r in text[: text.rfind("\n") + 1].splitlines()}
    stamps = {k: os.stat(tmp_path / f"q.{k:03d}.extxyz").st_mtime_ns for k in before}
    r = run_engine([*args, "restart=auto"], tmp_path)
    assert r.returncode == 0, r.stderr
    final = rows(tmp_path / "q.summary.csv")
    assert [int(x["system"]) for x in final] == list(range(300))
    assert all(x["status"] == "ok" and x["converged"] == "True" for x in final)
    log = (tmp_path / "q.log").read_text()
    assert f"{len(before)} done before" in log
    # the systems done before the kill were not run again; the one in flight was, from its start
    assert all(os.stat(tmp_path / f"q.{k:03d}.extxyz").st_mtime_ns == stamps[k] for k in before)
    in_flight = min(set(range(300)) - before)
    alone = run_engine(["minimize", "model=lj", "system.file=q.extxyz", f"system.index={in_flight}",
                        "trajectory.every=0", "output=alone.h5", "quiet=true"], tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert np.abs(read(tmp_path / "alone.extxyz").positions
                  - read(tmp_path / f"q.{in_flight:03d}.extxyz").positions).max() <= 1e-10


@pytest.mark.mpi
def test_two_ranks_write_the_same_files_as_one(tmp_path):
    write(tmp_path / "m.extxyz", rattled(5))
    common = ["run", "model=lj", "system.file=m.extxyz", "system.frames=all", "integrator=langevin", "steps=60",
              "trajectory.every=20", "quiet=true"]
    for args in ([*common, "output=one.h5"], [*common, "output=two.h5", "domains=2"]):
        r = run_engine(args, tmp_path)
        assert r.returncode == 0, r.stderr
    for k in range(5):
        with h5py.File(tmp_path / f"one.{k}.h5") as a, h5py.File(tmp_path / f"two.{k}.h5") as b:
            for field in ("position", "velocity", "force", "image"):
                key = f"particles/all/{field}/value"
                assert np.array_equal(a[key][()], b[key][()]), (k, field)
    one, two = rows(tmp_path / "one.summary.csv"), rows(tmp_path / "two.summary.csv")
    assert [r["energy_eV"] for r in one] == [r["energy_eV"] for r in two]


def _term_when(proc, condition, what: str) -> None:
    try:
        _wait_for(lambda: condition() or proc.poll() is not None, what)
        assert proc.poll() is None, f"the run ended before the signal: {proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=300) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("model, frames_, extra", [
    ("lj", rattled(4), ["steps=3000"]),
    ("mace", None, ["steps=400", "batch.size=3"]),   # stepped together: one model call for all three
])
def test_sigterm_stops_every_system_and_restart_finishes_bit_exact(model, frames_, extra, tmp_path):
    if frames_ is None:
        frames_ = [bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2)) for _ in range(3)]
        for k, a in enumerate(frames_):
            a.rattle(0.03, seed=k)
    write(tmp_path / "s.extxyz", frames_)
    args = ["run", f"model={model}", "system.file=s.extxyz", "system.frames=all", "integrator=langevin",
            "trajectory.every=100", "checkpoint.every=100", "quiet=true", *extra]
    ref = run_engine([*args, "output=ref.h5"], tmp_path)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args, "output=t.h5"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _term_when(proc, lambda: (tmp_path / "t.0.ckpt").is_dir() and any((tmp_path / "t.0.ckpt").glob("*.h5")),
               "the first system's first checkpoint")
    assert any(r["status"] == "stopped" for r in rows(tmp_path / "t.summary.csv"))
    r = run_engine([*args, "output=t.h5", "restart=auto"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [x["status"] for x in rows(tmp_path / "t.summary.csv")] == ["ok"] * len(frames_)
    for k in range(len(frames_)):
        with h5py.File(tmp_path / f"ref.{k}.h5") as a, h5py.File(tmp_path / f"t.{k}.h5") as b:
            for field in ("position", "velocity"):
                key = f"particles/all/{field}/value"
                assert np.array_equal(a[key][-1], b[key][-1]), (k, field)
