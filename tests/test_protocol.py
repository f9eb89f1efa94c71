"""Protocols (stages: [...]; engine/protocol/): minimize -> NVT ramp -> NPT -> NVE from one config
file, the same files on 1 and 4 domains, SIGKILL inside a stage and restart=auto to the same
bits, the ramp's targets, and stage errors named before anything runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from conftest import cli_in_process, run_engine

PROTOCOL = """\
defaults:
  - shardmd
  - override model: lj
  - _self_
system:
  repeat: [4, 4, 4]
trajectory:
  every: 50
thermo:
  every: 50
checkpoint:
  every: 50
stages:
  - {{name: relax, kind: minimize, minimize: {{fmax: 0.05}}}}
  - {{name: heat, integrator: nose-hoover, temperature: [30, 60], steps: 100}}
  - {{name: npt, integrator: {{name: npt, pressure: 1.0}}, temperature: 60, steps: {npt_steps}}}
  - {{name: nve, integrator: verlet, steps: 100}}
"""
NAMES = ("relax", "heat", "npt", "nve")


def write_protocol(folder, npt_steps: int = 100):
    path = folder / "protocol.yaml"
    path.write_text(PROTOCOL.format(npt_steps=npt_steps))
    return path


def frames(path):
    with h5py.File(path) as f:
        return {k: f[f"particles/all/{k}/value"][()] for k in ("position", "image")} | {
            "velocity": f["particles/all/velocity/value"][()] if "velocity" in f["particles/all"] else None}


def same_files(a, b, names=NAMES, tol: float = 0.0):
    """Every frame of every stage equal (``tol``: to that many Å or Å/fs)."""
    for name in names:
        x, y = frames(a.parent / f"{a.stem}.{name}.h5"), frames(b.parent / f"{b.stem}.{name}.h5")
        for key in x:
            if x[key] is not None:
                assert x[key].shape == y[key].shape and np.abs(x[key] - y[key]).max() <= tol, (name, key)


@pytest.mark.mpi
def test_four_stages_on_one_and_four_domains_give_the_same_files(tmp_path):
    write_protocol(tmp_path)
    for args in (["output=one.h5"], ["output=four.h5", "domains=4"]):
        r = run_engine(["run", "config=protocol.yaml", "quiet=true", *args], tmp_path)
        assert r.returncode == 0, r.stderr
    # equal to float64 round-off: a decomposed step sums forces and the thermostat's kinetic energy
    # in another order (measured: 7e-15 Å after the 300 steps), as a single run on 4 domains does
    same_files(tmp_path / "one.h5", tmp_path / "four.h5", tol=1e-12)
    rows = (tmp_path / "one.stages.csv").read_text().splitlines()
    assert [r.split(",")[1] for r in rows] == list(NAMES)
    ends = [int(r.split(",")[2]) for r in rows]
    assert ends[1:] == [ends[0] + 100, ends[0] + 200, ends[0] + 300]   # step numbers run on across stages
    with h5py.File(tmp_path / "one.npt.h5") as f:   # the NPT stage's box moved, the NVE stage's did not
        npt_box = f["particles/all/box/edges/value"][()]
    with h5py.File(tmp_path / "one.nve.h5") as f:
        nve_box = f["particles/all/box/edges/value"][()]
    assert not np.array_equal(npt_box[0], npt_box[-1]) and np.array_equal(nve_box[0], nve_box[-1])


def test_the_ramp_reaches_its_stop_target(tmp_path, capfd, monkeypatch):
    from shardmd.engine.io.checkpoint import read_checkpoint

    write_protocol(tmp_path)
    r = cli_in_process(["run", "config=protocol.yaml", "quiet=true", "output=p.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    ckpts = sorted((tmp_path / "p.heat.ckpt").glob("*.h5"))
    temps = [read_checkpoint(p)["integrator"]["temperature"] for p in ckpts]
    steps = [read_checkpoint(p)["step"] for p in ckpts]
    begin = steps[-1] - 100
    # LAMMPS's fix nvt temp 30 60: the target of step k is 30 + (k - b) / (e - b) * 30
    assert temps == pytest.approx([30 + (s - begin) / 100 * 30 for s in steps], abs=1e-12)
    assert temps[-1] == 60.0


@pytest.mark.slow
def test_sigkill_inside_a_stage_and_restart_reach_the_same_bits(tmp_path):
    write_protocol(tmp_path, npt_steps=3000)
    args = ["run", "config=protocol.yaml", "quiet=true"]
    ref = run_engine([*args, "output=ref.h5"], tmp_path)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args, "output=k.h5"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "k.npt.ckpt"
    try:
        end = time.monotonic() + 300
        while not (ckpt.is_dir() and len(list(ckpt.glob("*.h5"))) >= 2) and proc.poll() is None:
            assert time.monotonic() < end, "waited 300 s for the NPT stage's checkpoints"
            time.sleep(0.05)
        assert proc.poll() is None, f"the protocol ended before it could be killed: {proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "k.nve.h5").exists()
    r = run_engine([*args, "output=k.h5", "restart=auto"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 finished before" in (tmp_path / "k.log").read_text()
    same_files(tmp_path / "ref.h5", tmp_path / "k.h5", names=("npt", "nve"))


@pytest.mark.parametrize("stages, words", [
    ("[{kind: anneal}]", "stages[0] (stage0): kind='anneal' is not a stage kind"),
    ("[{kind: minimize}, {minimize: {fmax: 0.1}}]", "stages[1] (stage1): minimize keys belong to a stage of kind"),
    ("[{kind: minimize, integrator: langevin}]", "stages[0] (stage0): a minimize stage has no integrator"),
    ("[{steps: 10}, {name: b, model: {name: lj}}]", "stages[1] (b): model belongs to the whole protocol"),
    ("[{steps: 10}, {name: c, stepz: 10}]", "stages[1] (c):"),
    ("[{steps: 10}, {name: d, integrator: sideways}]", "stages[1] (d): integrator='sideways' is not available"),
    ("[{steps: 10}, {name: e, temperature: [1, 2, 3]}]", "stages[1] (e): temperature=[1, 2, 3] is neither"),
    ("[{name: x}, {name: x}]", "stages[1]: name 'x' must be unique"),
    ("[{steps: -5}]", "stages[0] (stage0): steps=-5 is invalid"),
    ("[{steps: 10}, {name: warm, temperature: [100, 200], steps: 5}]",
     "stages[1] (warm): a temperature ramp needs a thermostat"),
    ("[{steps: 10}, {name: sym, kind: minimize, minimize: {symmetry: true}}]",
     "stages[1] (sym): minimize.symmetry=true"),
])
def test_bad_stages_are_one_line_before_anything_runs(stages, words, tmp_path, capfd, monkeypatch):
    r = cli_in_process(["run", "model=lj", f"stages={stages}", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("b.")]


def test_stages_with_many_systems_are_one_line(tmp_path, capfd, monkeypatch):
    from ase.build import bulk
    from ase.io import write

    write(tmp_path / "two.extxyz", [bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2))] * 2)
    r = cli_in_process(["run", "model=lj", "system.file=two.extxyz", "system.frames=all", "stages=[{steps: 5}]",
                        "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "a protocol runs one structure" in r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("b.")]


def test_info_lists_the_finished_stages(tmp_path, capfd, monkeypatch):
    write_protocol(tmp_path)
    r = cli_in_process(["run", "config=protocol.yaml", "quiet=true", "output=i.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    r = cli_in_process(["info", "i.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "protocol i.h5: 4 stage(s) finished (record i.stages.csv)"
    assert [ln.split()[2].rstrip(":") for ln in lines[1:]] == list(NAMES)
    assert lines[-1].endswith("output i.nve.h5")


@pytest.mark.parametrize("changed, words", [
    ("[{name: c, kind: minimize}, {name: b, steps: 4}]", "stages[0] is 'c', but"),
    ("[{name: a, steps: 9}, {name: b, steps: 4}]", "stages[0] (a) has steps=9, but it finished after 4"),
])
def test_restart_auto_of_another_protocol_is_one_line(changed, words, tmp_path, capfd, monkeypatch):
    """restart=auto continues the recorded protocol: a renamed or lengthened finished stage is
    refused (it was skipped without a word), and the record stays as it was."""
    base = ["run", "model=lj", "system.repeat=[3,3,3]", "quiet=true", "output=p.h5"]
    r = cli_in_process([*base, "stages=[{name: a, steps: 4}, {name: b, steps: 4}]"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    record = (tmp_path / "p.stages.csv").read_text()
    r = cli_in_process([*base, f"stages={changed}", "restart=auto"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
    assert (tmp_path / "p.stages.csv").read_text() == record


@pytest.mark.parametrize("second", [["stages=[{steps: 3}]"], ["system.file=two.extxyz", "system.frames=all"]])
def test_an_earlier_runs_log_is_kept(second, tmp_path, capfd, monkeypatch):
    """A protocol or a many-system run under the output of an earlier run refuses to replace its
    log (it did, without overwrite=true)."""
    from ase.build import bulk
    from ase.io import write

    write(tmp_path / "two.extxyz", [bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2))] * 2)
    base = ["run", "model=lj", "system.repeat=[3,3,3]", "steps=3", "quiet=true", "output=x.h5"]
    assert cli_in_process(base, tmp_path, capfd, monkeypatch).returncode == 0
    log = (tmp_path / "x.log").read_text()
    r = cli_in_process([*base, *second], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'x.log' exists (an earlier run's log); add overwrite=true" in r.stderr
    assert (tmp_path / "x.log").read_text() == log
