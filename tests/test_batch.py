"""Many systems in one run (system.frames; engine/batch/): each system equals the same frame run
alone, for every integrator and FIRE, whatever else is in the batch; outputs read by MDAnalysis
and ASE; bad frames named by index or left out; the record that restart=auto continues."""
from __future__ import annotations

import csv
import re

import h5py
import numpy as np
import pytest
from ase.build import bulk
from ase.io import read, write
from conftest import cli_in_process

KR = ["model.epsilon.Kr=0.014", "model.sigma.Kr=3.65"]


def frames(n: int = 4, seed: int = 0):
    """Rattled fcc Ar cells of 32 and 48 atoms, every other one with a quarter Kr."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2 + k % 2))
        a.positions += rng.normal(0.0, 0.05, a.positions.shape)
        if k % 2:
            a.numbers[::4] = 36
        out.append(a)
    return out


@pytest.fixture
def many(tmp_path):
    path = tmp_path / "many.extxyz"
    write(path, frames())
    return path


def run(args, cwd, capfd, monkeypatch, command="run"):
    r = cli_in_process([command, "model=lj", *KR, "quiet=true", *args], cwd, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    return r


def final(path, field="position"):
    with h5py.File(path) as f:
        x = f[f"particles/all/{field}/value"][-1]
        if field == "position":   # unwrapped: the image flags and the box of that frame
            x = x + f["particles/all/image/value"][-1] @ f["particles/all/box/edges/value"][-1]
        return x


def summary(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("integrator", ["verlet", "langevin", "nose-hoover", "csvr", "npt"])
def test_each_system_equals_its_frame_alone(integrator, many, tmp_path, capfd, monkeypatch):
    common = [f"system.file={many}", "steps=200", "trajectory.every=100", f"integrator={integrator}",
              "temperature=60"]
    run([*common, "system.frames=all", "output=b.h5"], tmp_path, capfd, monkeypatch)
    run([*common, "system.frames=1:4:2", "output=c.h5"], tmp_path, capfd, monkeypatch)   # another batch
    for k in (1, 3):
        run([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        alone = final(tmp_path / f"a{k}.h5")
        for batch in ("b", "c"):
            x = final(tmp_path / f"{batch}.{k}.h5")
            assert np.abs(x - alone).max() <= 1e-10, (integrator, batch, k)
    # two frames of one batch differ (no system copies another's numbers)
    assert final(tmp_path / "b.1.h5").shape != final(tmp_path / "b.0.h5").shape
    rows = summary(tmp_path / "b.summary.csv")
    assert [int(r["system"]) for r in rows] == [0, 1, 2, 3]
    assert [int(r["atoms"]) for r in rows] == [32, 48, 32, 48]
    assert all(r["status"] == "ok" and int(r["steps"]) == 200 for r in rows)


def test_random_numbers_are_keyed_by_the_frame(tmp_path, capfd, monkeypatch):
    """Two identical frames under Langevin draw different noise (keyed by frame index)."""
    a = frames(1)[0]
    write(tmp_path / "twins.extxyz", [a, a])
    run([f"system.file={tmp_path / 'twins.extxyz'}", "system.frames=all", "integrator=langevin", "steps=20",
         "trajectory.every=20", "output=t.h5"], tmp_path, capfd, monkeypatch)
    assert np.abs(final(tmp_path / "t.0.h5") - final(tmp_path / "t.1.h5")).max() > 1e-3


def test_fire_queue_equals_each_relaxation_alone(many, tmp_path, capfd, monkeypatch):
    common = [f"system.file={many}", "minimize.fmax=0.01", "trajectory.every=0"]
    run([*common, "system.frames=all", "output=r.h5"], tmp_path, capfd, monkeypatch, "minimize")
    run([*common, "system.index=2", "output=s2.h5"], tmp_path, capfd, monkeypatch, "minimize")
    alone, batch = read(tmp_path / "s2.extxyz"), read(tmp_path / "r.2.extxyz")
    assert np.abs(alone.positions - batch.positions).max() <= 1e-10
    rows = summary(tmp_path / "r.summary.csv")
    assert all(r["converged"] == "True" and float(r["fmax_eV_per_A"]) < 0.01 for r in rows)
    assert float(rows[2]["energy_eV"]) == pytest.approx(alone.get_potential_energy(), abs=1e-10)


def test_outputs_open_in_mdanalysis_and_ase(many, tmp_path, capfd, monkeypatch):
    import MDAnalysis as mda

    run([f"system.file={many}", "system.frames=0:2", "steps=20", "trajectory.every=10", "output=m.h5"],
        tmp_path, capfd, monkeypatch)
    for k, n in ((0, 32), (1, 48)):
        u = mda.Universe(str(tmp_path / f"m.{k}.h5"), format="H5MD", topology_format="MINIMAL", n_atoms=n)
        assert len(u.atoms) == n and len(u.trajectory) == 3
        images = read(tmp_path / f"m.{k}.h5", index=":")
        assert len(images) == 3 and len(images[-1]) == n


def test_a_larger_steps_continues_the_batch_bit_exact(many, tmp_path, capfd, monkeypatch):
    common = [f"system.file={many}", "system.frames=all", "trajectory.every=50", "checkpoint.every=50",
              "integrator=langevin"]
    run([*common, "steps=200", "output=u.h5"], tmp_path, capfd, monkeypatch)
    run([*common, "steps=100", "output=v.h5"], tmp_path, capfd, monkeypatch)
    run([*common, "steps=200", "output=v.h5", "restart=auto"], tmp_path, capfd, monkeypatch)
    for k in range(4):
        for field in ("position", "velocity"):
            assert np.array_equal(final(tmp_path / f"u.{k}.h5", field), final(tmp_path / f"v.{k}.h5", field))
    assert [int(r["steps"]) for r in summary(tmp_path / "v.summary.csv")] == [200] * 4


def _bad_file(tmp_path):
    """Frames 0 and 3 fine; 1 an unknown element; 2 two atoms 0.1 Å apart; 4 a NaN position."""
    good = frames(5)
    close = good[2].copy()
    close.positions[1] = close.positions[0] + [0.1, 0.0, 0.0]
    nan = good[4].copy()
    nan.positions[3, 1] = np.nan
    parts = []
    for k, a in enumerate([good[0], good[1], close, good[3], nan]):
        p = tmp_path / f"f{k}.extxyz"
        write(p, a)
        text = p.read_text()
        parts.append(text.replace("\nKr ", "\nQq ") if k == 1 else text)
    path = tmp_path / "bad.extxyz"
    path.write_text("".join(parts))
    return path


def test_bad_frames_are_named_by_index(tmp_path, capfd, monkeypatch):
    path = _bad_file(tmp_path)
    r = cli_in_process(["run", "model=lj", *KR, f"system.file={path}", "system.frames=all", "steps=5"],
                       tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "frame 1: unknown element 'Qq'" in r.stderr and "system.skip_bad=true" in r.stderr
    assert not list(tmp_path.glob("run.*.h5"))   # refused before anything ran
    r = cli_in_process(["run", "model=lj", *KR, f"system.file={path}", "system.frames=2:3", "steps=5"],
                       tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and "frame 2: atoms 0 and 1 are 0.100 Å apart" in r.stderr, r.stderr


def test_skip_bad_leaves_them_out_and_lists_them(tmp_path, capfd, monkeypatch):
    path = _bad_file(tmp_path)
    run([f"system.file={path}", "system.frames=all", "system.skip_bad=true", "steps=10", "output=k.h5"],
        tmp_path, capfd, monkeypatch)
    rows = {int(r["system"]): r for r in summary(tmp_path / "k.summary.csv")}
    assert [rows[k]["status"] for k in range(5)] == ["ok", "skipped", "skipped", "ok", "skipped"]
    assert "unknown element" in rows[1]["note"] and "apart" in rows[2]["note"] and "not finite" in rows[4]["note"]
    assert sorted(p.name for p in tmp_path.glob("k.*.h5")) == ["k.0.h5", "k.3.h5"]


@pytest.mark.parametrize("frames_value, words", [
    ("5:9", "holds 5 frame(s)"), ("3:1", "selects no frame"), ("1:2:0", "give all or START:STOP:STEP"),
    ("every", "give all or START:STOP:STEP")])
def test_bad_selections_are_one_line(frames_value, words, many, tmp_path, capfd, monkeypatch):
    path = tmp_path / "five.extxyz"
    write(path, frames(5))
    r = cli_in_process(["run", "model=lj", *KR, f"system.file={path}", f"system.frames={frames_value}"],
                       tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


@pytest.mark.parametrize("args, words", [
    (["system.file=empty.extxyz", "system.frames=all"], "ASE cannot read it (Empty file"),
    (["system.file=bad.extxyz", "system.frames=0:1"], "its first line is not an atom count"),
    (["system.frames=0:2"], "system.frames needs system.file"),
    (["system.files=[]", "system.frames=all"], "system.frames needs system.file"),
    (["system.file=five.extxyz", "system.frames=all", "system.index=2"], "system.index=2 picks one frame")])
def test_an_empty_or_missing_input_of_frames_is_one_line(args, words, tmp_path, capfd, monkeypatch):
    (tmp_path / "empty.extxyz").write_text("")
    (tmp_path / "bad.extxyz").write_text("one\nAr 0 0 0\n")
    write(tmp_path / "five.extxyz", frames(5))
    r = cli_in_process(["run", "model=lj", *KR, "steps=1", *args], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_restart_auto_with_another_input_is_one_line(many, tmp_path, capfd, monkeypatch):
    """restart=auto continues the recorded systems: frames of another size are refused, not run
    on from the old checkpoints under the new input's name."""
    out = f"output={tmp_path / 'b.h5'}"
    run([f"system.file={many}", "system.frames=all", "steps=5", out], tmp_path, capfd, monkeypatch)
    before = (tmp_path / "b.summary.csv").read_text()
    other = tmp_path / "other.extxyz"
    write(other, [bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))] * 4)
    r = cli_in_process(["run", "model=lj", *KR, "quiet=true", f"system.file={other}", "system.frames=all", "steps=10",
                        out, "restart=auto"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "system 0 of" in r.stderr and "has 108 atoms" in r.stderr and "another input" in r.stderr
    assert (tmp_path / "b.summary.csv").read_text() == before


def test_an_earlier_record_is_not_overwritten_silently(many, tmp_path, capfd, monkeypatch):
    common = [f"system.file={many}", "system.frames=0:1", "steps=5", "output=w.h5"]
    run(common, tmp_path, capfd, monkeypatch)
    r = cli_in_process(["run", "model=lj", *KR, *common], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and "restart=auto" in r.stderr and "overwrite=true" in r.stderr, r.stderr
    run([*common, "overwrite=true"], tmp_path, capfd, monkeypatch)


def cu_frames(n: int = 4):
    """Rattled fcc Cu cells of 32 and 48 atoms (a sheared one among them) for the shipped MACE model."""
    rng = np.random.default_rng(2)
    out = []
    for k in range(n):
        a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2 + k % 2))
        a.positions += rng.normal(0.0, 0.04, a.positions.shape)
        if k % 3 == 2:
            a.cell[0, 1] = 0.2
        out.append(a)
    return out


def mace(args, cwd, capfd, monkeypatch):
    r = cli_in_process(["run", "model=mace", "quiet=true", *args], cwd, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("integrator", ["verlet", "langevin", "npt"])
def test_one_mace_call_for_many_systems_equals_each_alone(integrator, tmp_path, capfd, monkeypatch):
    """batch.size=3 over 4 frames: three systems per model call, the fourth takes a finished one's place."""
    write(tmp_path / "cu.extxyz", cu_frames())
    common = ["system.file=cu.extxyz", "steps=30", "trajectory.every=10", f"integrator={integrator}"]
    mace([*common, "system.frames=all", "batch.size=3", "output=b.h5"], tmp_path, capfd, monkeypatch)
    for k in (2, 3):
        mace([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert np.abs(final(tmp_path / f"b.{k}.h5") - final(tmp_path / f"a{k}.h5")).max() <= 1e-10
    assert [r["status"] for r in summary(tmp_path / "b.summary.csv")] == ["ok"] * 4


def test_fire_steps_of_many_systems_in_one_mace_call_equal_each_alone(tmp_path, capfd, monkeypatch):
    """minimize, batch.size=3 over 4 frames: FIRE stepped together (one model call per step for
    the systems in flight, engine/batch/relax_lockstep.py); each relaxation is its frame's alone."""
    from shardmd.models import mace as mace_mod

    write(tmp_path / "cu.extxyz", cu_frames())
    calls = []
    joined = mace_mod.MaceModel.compute_batch
    monkeypatch.setattr(mace_mod.MaceModel, "compute_batch", lambda self, items: calls.append(len(items)) or
                        joined(self, items))
    common = ["minimize", "model=mace", "quiet=true", "system.file=cu.extxyz", "minimize.fmax=0.02",
              "trajectory.every=0"]
    r = cli_in_process([*common, "system.frames=all", "batch.size=3", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert max(calls) == 3 and sum(calls) > 3 * 10   # three systems per call, for many steps
    rows = summary(tmp_path / "b.summary.csv")
    assert [x["status"] for x in rows] == ["ok"] * 4 and all(x["converged"] == "True" for x in rows)
    for k in (0, 3):
        r = cli_in_process([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
        together, alone = read(tmp_path / f"b.{k}.extxyz"), read(tmp_path / f"a{k}.extxyz")
        assert np.abs(together.positions - alone.positions).max() <= 1e-10
        alone_steps = re.search(r"FIRE converged: (\d+) steps", (tmp_path / f"a{k}.log").read_text()).group(1)
        assert int(rows[k]["steps"]) == int(alone_steps)


def test_a_system_that_blows_up_leaves_the_others_running(tmp_path, capfd, monkeypatch):
    frames_ = cu_frames(3)
    frames_[1].set_velocities(np.full((len(frames_[1]), 3), 20.0))   # ~2 Å/fs: past health.max_step at once
    write(tmp_path / "cu.extxyz", frames_)
    r = cli_in_process(["run", "model=mace", "quiet=true", "system.file=cu.extxyz", "system.frames=all", "steps=10",
                        "trajectory.every=5", "output=h.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 3, r.stderr
    rows = summary(tmp_path / "h.summary.csv")
    assert [x["status"] for x in rows] == ["ok", "failed", "ok"]
    assert "exit status 3" in rows[1]["note"] and int(rows[0]["steps"]) == int(rows[2]["steps"]) == 10


def test_python_api_relaxes_and_runs_lists_of_atoms(tmp_path, monkeypatch):
    from ase.optimize import FIRE

    from shardmd.engine.ase_calculator import ShardMDCalculator
    from shardmd.engine.batch.api import relax_many, run_many
    from shardmd.engine.errors import UserError

    monkeypatch.chdir(tmp_path)
    given = frames(3)
    relaxed = relax_many(given, "model=lj", *KR, "minimize.fmax=0.01", "trajectory.every=0", "output=r/r.h5",
                         "quiet=true")
    assert [a.info["shardmd"]["status"] for a in relaxed] == ["ok"] * 3
    # the same relaxation by ASE's own FIRE through our calculator (the engine's FIRE is ASE's, step for step)
    ref = given[1].copy()
    ref.calc = ShardMDCalculator(model="lj", epsilon={"Ar": 0.0104, "Kr": 0.014}, sigma={"Ar": 3.4, "Kr": 3.65})
    FIRE(ref, logfile=None).run(fmax=0.01)
    from ase.geometry import find_mic

    shift, _ = find_mic(relaxed[1].positions - ref.positions, ref.cell, ref.pbc)   # ours are wrapped
    assert np.abs(shift).max() < 1e-8
    assert relaxed[1].get_potential_energy() == pytest.approx(ref.get_potential_energy(), abs=1e-8)
    assert given[1].positions is not relaxed[1].positions   # the input is left as it was
    final_ = run_many(given[:2], "model=lj", *KR, "steps=20", "trajectory.every=10", "output=m/m.h5", "quiet=true")
    assert [len(a) for a in final_] == [32, 48] and np.abs(final_[0].get_velocities()).max() > 0
    with pytest.raises(UserError, match="list of ase.Atoms"):
        relax_many([], "model=lj")
    with pytest.raises(UserError, match="trajectory.every > 0"):
        run_many(given, "model=lj", "trajectory.every=0")


def test_systems_stepped_together_restart_bit_exact(tmp_path, capfd, monkeypatch):
    write(tmp_path / "cu.extxyz", cu_frames(3))
    common = ["system.file=cu.extxyz", "system.frames=all", "batch.size=3", "integrator=langevin",
              "trajectory.every=10", "checkpoint.every=10"]
    mace([*common, "steps=20", "output=u.h5"], tmp_path, capfd, monkeypatch)
    mace([*common, "steps=10", "output=v.h5"], tmp_path, capfd, monkeypatch)
    mace([*common, "steps=20", "output=v.h5", "restart=auto"], tmp_path, capfd, monkeypatch)
    for k in range(3):
        for field in ("position", "velocity"):
            assert np.array_equal(final(tmp_path / f"u.{k}.h5", field), final(tmp_path / f"v.{k}.h5", field))


def test_several_files_by_pattern(tmp_path, capfd, monkeypatch):
    """system.files: a pattern's matches in order, every frame of each; structure i draws with frame_seed(seed, i)."""
    from shardmd.integrators.random import frame_seed

    (tmp_path / "in").mkdir()
    f = frames(3)
    write(tmp_path / "in" / "a.extxyz", f[:2])
    write(tmp_path / "in" / "b.cif", f[2])
    common = ["integrator=langevin", "steps=30", "trajectory.every=30"]
    run([*common, "system.files=[in/*.extxyz,in/*.cif]", "output=f.h5"], tmp_path, capfd, monkeypatch)
    assert [int(r["atoms"]) for r in summary(tmp_path / "f.summary.csv")] == [32, 48, 32]
    run([*common, "system.file=in/b.cif", f"seed={frame_seed(12345, 2)}", "output=alone.h5"], tmp_path, capfd,
        monkeypatch)
    assert np.abs(final(tmp_path / "f.2.h5") - final(tmp_path / "alone.h5")).max() <= 1e-10
    r = cli_in_process(["run", "model=lj", "system.files=[in/*.xyz]"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and "'in/*.xyz' matches no file" in r.stderr, r.stderr


def test_the_room_packs_by_count_or_by_memory_and_corrects_itself():
    from shardmd.engine.batch.room import Room, system_bytes

    by_count = Room(count=2)
    assert by_count.admits([], 1e30) and by_count.admits([1.0], 1.0) and not by_count.admits([1.0, 1.0], 1.0)
    room = Room(budget=100.0, cost=lambda n: float(n))
    assert room.admits([], 1e6)                      # one system always flies, whatever it costs
    assert room.admits([40.0, 40.0], 20.0) and not room.admits([40.0, 40.0], 21.0)
    room.observe(160.0, [40.0, 40.0])                # the device needed twice the estimate
    assert room.scale == 2.0 and not room.admits([40.0], 20.0) and room.admits([30.0], 20.0)
    room.observe(40.0, [40.0])                        # a smaller ratio never lowers a measured one
    assert room.scale == 2.0
    # 500 atoms at 0.05 /Å^3 within 6 Å: ~45 neighbours each; an open cluster: all others at worst
    assert system_bytes(500, 10000.0, 6.0, 100.0, 1000.0) == pytest.approx(500 * (1000 + 0.05 * 4 / 3 * np.pi * 216
                                                                                  * 100))
    assert system_bytes(10, None, 6.0, 100.0, 1000.0) == 10 * (1000 + 9 * 100)


def test_info_summarises_many_systems(many, tmp_path, capfd, monkeypatch):
    run([f"system.file={many}", "system.frames=all", "steps=5", "output=n.h5"], tmp_path, capfd, monkeypatch)
    r = cli_in_process(["info", "n.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0 and r.stdout.startswith("many systems n.h5: 4 system(s), 4 ok; summary n.summary.csv")
