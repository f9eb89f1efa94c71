"""Faults a tired user or an attacker meets: bad values and files, blow-ups, clashing outputs,
launches too large, damaged checkpoints (README "When a run goes wrong"); signals are in
test_faults_signals.py.

Every case asserts the exit status, one line ``error: ...`` naming the key, file or atom, no
traceback, and that what was written before the fault is intact (h5py, ``engine info``).
Bad-input cases run the real CLI entry point in this process (``cli.main``: the code a
subprocess would run, without a second's start-up each); blow-ups, MPI runs and the killed
launcher run as real processes. Write faults (disk full, symlinks) are in test_write_faults.py,
malicious model files in test_safe_load.py.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_engine, run_in_process
from faultkit import SMALL, assert_intact, cli, digest, one_line

from shardmd.engine.io.checkpoint import read_checkpoint
from shardmd.engine.io.h5md import read_frames

pytestmark = pytest.mark.fault

# -- structure files a user might hand over ------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from ase.build import bulk, fcc111

    d = tmp_path_factory.mktemp("files")
    base = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((4, 4, 4))
    a = base.copy()
    a.positions[7, 1] = np.nan
    a.write(d / "nan_position.extxyz")
    a = base.copy()
    a.set_velocities(np.zeros((len(a), 3)))
    v = a.get_velocities()
    v[11] = [np.inf, 0, 0]
    a.set_velocities(v)
    a.write(d / "inf_velocity.extxyz")
    a = base.copy()
    a.positions[5] = a.positions[4]          # two atoms on one site (low-x half: one rank of 2)
    a.write(d / "duplicate.extxyz")
    a = base.copy()
    a.positions[9] = a.positions[8] + [0.2, 0, 0]
    a.write(d / "close.extxyz")
    a = base.copy()
    m = a.get_masses()
    m[3] = 0.0
    a.set_masses(m)
    a.write(d / "zero_mass.extxyz")
    fcc111("Ar", size=(3, 3, 3), a=5.26).write(d / "slab_no_z.extxyz")   # ASE's usual slab: zero z
    a = base.copy()
    a.cell[1] = a.cell[0]
    a.write(d / "singular.extxyz")
    (d / "garbage.extxyz").write_text("3\nnot a header\nAr 0 0\n")
    return d


BAD_INPUT = [
    # values (every float key refuses inf and NaN)
    (["dt=inf"], "dt=inf"),
    (["dt=nan"], "dt=nan"),
    (["dt=0"], "dt="),
    (["temperature=inf"], "temperature=inf"),
    (["temperature=-5"], "temperature="),
    (["model.cutoff=inf"], "model.cutoff=inf"),
    (["neighbor.skin=inf"], "neighbor.skin=inf"),
    (["neighbor.skin=-1"], "neighbor.skin="),
    (["system.a=inf"], "system.a=inf"),
    (["system.a=0"], "system.a="),
    (["model.epsilon.Ar=nan"], "model.epsilon"),
    (["integrator=langevin", "integrator.friction=inf"], "integrator.friction=inf"),
    (["health.max_step=0"], "health.max_step"),
    (["health.min_distance=-1"], "health.min_distance"),
    (["steps=-3"], "steps="),
    (["domains=0"], "domains="),
    (["device=tpu"], "device="),
    (["seed=-1"], "seed="),
    (["seed=9223372036854775808"], "from 0 to 2**63 - 1"),   # over int64: the fix names the range
    (["checkpoint.keep=0"], "checkpoint.keep"),
    (["stesp=3"], "did you mean 'steps'"),
    # structure files
    (["system.file=nope.xyz"], "nope.xyz"),
    (["system.file={d}/garbage.extxyz"], "garbage.extxyz"),
    (["system.file={d}/nan_position.extxyz"], "atom id 7"),
    (["system.file={d}/inf_velocity.extxyz"], "atom id 11"),
    (["system.file={d}/zero_mass.extxyz"], "atom id 3"),
    (["system.file={d}/duplicate.extxyz"], "atoms 4 and 5 are 0 Å apart"),
    (["system.file={d}/close.extxyz"], "atoms 8 and 9 are 0.2 Å apart"),
    (["system.file={d}/slab_no_z.extxyz"], "cell vector 2"),
    (["system.file={d}/singular.extxyz"], "singular"),
    # outputs that clash or cannot be written (refused before anything starts)
    (["output=run.log"], "same path"),
    (["output=run.ckpt"], "same path"),
    (["output=adir"], "is a directory"),
    (["output=run.pdb"], "the trajectory is H5MD (HDF5), not PDB; give output=run.h5"),
    (["output=run.extxyz"], "not extended XYZ; give output=run.h5"),
    (["output=afile/run.h5"], "is a file, not a folder"),
    # launches too large for the system or the machine (refused before any rank starts)
    (["domains=1000"], "domains=1000 would start 1000 local ranks"),
    (["domains=4"], "domains=4: domains would be"),
    (["domains=3", "grid=[3,1,1]"], "grid=[3, 1, 1]"),
]


@pytest.mark.parametrize("extra, needle", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, files, capsys, monkeypatch, extra, needle):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    before = set(os.listdir(tmp_path))
    args = [a.replace("{d}", str(files)) for a in extra]
    code, lines = cli(["run", *SMALL, "steps=5", *args], tmp_path, capsys, monkeypatch)
    assert code == 2
    line = one_line(lines, needle)
    assert "(rank" not in line          # decided before any rank started
    assert set(os.listdir(tmp_path)) == before


def test_min_distance_is_the_users_bound(tmp_path, capsys, monkeypatch):
    """fcc Ar at 5.26 Å has neighbours 3.72 Å apart: refused under a 3.8 Å bound
    (108 atoms x 12 neighbours / 2 = 648 pairs), run under 3.7."""
    code, lines = cli(["run", *SMALL, "steps=3", "health.min_distance=3.8"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(lines, "3.72 Å apart, closer than health.min_distance=3.8 Å (648 such pair(s))")
    assert not (tmp_path / "run.h5").exists() and not (tmp_path / "run.log").exists()
    code, lines = cli(["run", *SMALL, "steps=3", "health.min_distance=3.7"], tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    assert_intact(tmp_path, capsys=capsys, monkeypatch=monkeypatch)


# -- blow-ups: exit 3, the step and the atom named, healthy files kept ------------------------
def test_dt_300_stops_at_step_1(tmp_path):
    r = run_engine(["run", *SMALL, "dt=300", "steps=200", "checkpoint.every=20"], cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    line = one_line(r.stderr.strip().splitlines(), "at step 1: atom id")
    assert "health.max_step=1 Å" in line
    frames = read_frames(tmp_path / "run.h5")
    assert [f.info["step"] for f in frames] == [0]


@pytest.mark.parametrize("pipelined", [False, True])
def test_dt_300_with_the_deferred_check(tmp_path, pipelined, capfd, monkeypatch):
    """The GPU's read-back schedule (here on the CPU): the measure rides on the scheduled reads;
    the error names the read-back step, and no frame after the last healthy one is written.
    In this process (run_in_process: stderr at the fd, warnings as lines); the exit of a real
    process on a blow-up is test_dt_300_stops_at_step_1's."""
    code, lines = run_in_process(["run", *SMALL, "dt=300", "steps=200", "checkpoint.every=20", "trajectory.every=20",
                                  "neighbor.deferred=true", f"neighbor.pipelined={str(pipelined).lower()}"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 3, lines
    line = one_line(lines, "blew up at or before step 1: atom id")
    assert "health.max_step=1 Å" in line
    assert [f.info["step"] for f in read_frames(tmp_path / "run.h5")] == [0]


def test_dt_300_nan_keeps_the_finite_checkpoints(tmp_path, capfd, monkeypatch):
    """The reported case: NaN energies after some tens of steps (where exactly follows the last
    bits of the force sums, so the list kind and the CPU's vector width: 38 to 90 seen). With the
    step bound lifted the non-finite check stops it; the checkpoints before it survive, finite,
    the newest one the last multiple of 10 before the blow-up. In this process, as the case above."""
    code, lines = run_in_process(["run", *SMALL, "dt=300", "steps=200", "checkpoint.every=10", "trajectory.every=10",
                                  "health.max_step=1e300"], tmp_path, capfd, monkeypatch)
    assert code == 3, lines
    line = one_line(lines, "blew up at step")
    step = int(line.split("at step ")[1].split(":")[0])
    assert 20 < step <= 200 and "atom id" in line   # past two checkpoints
    frames, ckpts = assert_intact(tmp_path, capsys=capfd, monkeypatch=monkeypatch)
    assert max(f.info["step"] for f in frames) < step and len(ckpts) >= 2
    assert read_checkpoint(ckpts[-1])["step"] == 10 * ((step - 1) // 10)


@pytest.mark.mpi
@pytest.mark.parametrize("domains, extra", [(2, []), pytest.param(4, ["neighbor.deferred=true"],
                                                                  marks=pytest.mark.slow)])
def test_nan_on_one_rank_stops_all(tmp_path, files, domains, extra):
    """Two atoms on one site, allowed on purpose: one rank's forces are NaN at step 0. The other
    ranks end with it, not by a timeout: a rank left waiting would end by the heartbeat (exit 5,
    health.rank_silence) or by gloo's (exit 1), so the status says which (no clock is read: a
    busy machine takes minutes to start 4 ranks)."""
    r = run_engine(["run", *SMALL, "steps=50", f"domains={domains}", f"system.file={files}/duplicate.extxyz",
                    "health.min_distance=0", *extra], cwd=tmp_path, timeout=900)
    assert r.returncode == 3, r.stderr
    one_line(r.stderr.strip().splitlines(), "atom id 4: its force is not finite")


@pytest.mark.mpi
# full suite only: the fast tier keeps one rank's NaN ending both of 2 ranks with one line
# (test_nan_on_one_rank_stops_all[2]) and the mid-run step bound on one rank (test_dt_300_*)
@pytest.mark.slow
def test_blowup_mid_run_on_one_rank_of_4(tmp_path, files):
    """Two atoms 0.2 Å apart on one rank: thrown apart at step 1; all 4 ranks stop."""
    r = run_engine(["run", *SMALL, "steps=50", "domains=4", "system.repeat=[4,4,4]", "checkpoint.every=0",
                    f"system.file={files}/close.extxyz", "health.min_distance=0"], cwd=tmp_path, timeout=900)
    assert r.returncode == 3, r.stderr
    line = one_line(r.stderr.strip().splitlines(), "at step 1: atom id")
    assert "atom id 8" in line or "atom id 9" in line
    assert [f.info["step"] for f in read_frames(tmp_path / "run.h5")] == [0]


# -- restarts never overwrite silently, damaged checkpoints are named -----------------------------
@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    r = run_engine(["run", *SMALL, "steps=20", "checkpoint.every=10", "trajectory.every=5"], cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def _copy(good_run, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(good_run, d)
    return d


def _edit(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


def _replace(f, name, data):
    del f[name]
    f[name] = data


DAMAGE = {
    "negative step": lambda f: f.attrs.__setitem__("step", -100),
    "short array": lambda f: _replace(f, "atoms/positions", f["atoms/positions"][:-1]),
    "Z=250": lambda f: _replace(f, "atoms/numbers", np.full(f["atoms/numbers"].shape, 250)),
    "duplicate ids": lambda f: _replace(f, "atoms/ids", np.zeros(f["atoms/ids"].shape, dtype=np.int64)),
    "nan velocity": lambda f: _replace(f, "atoms/velocities", f["atoms/velocities"][()] * np.nan),
    "singular cell": lambda f: _replace(f, "box/cell", np.zeros((3, 3))),
    "missing field": lambda f: f.__delitem__("atoms/masses"),
}
NEEDLE = {"negative step": "step -100", "short array": "atoms/positions has shape", "Z=250": "atomic numbers",
          "duplicate ids": "ids are not unique", "nan velocity": "atoms/velocities holds non-finite",
          "singular cell": "box/cell is singular", "missing field": "atoms/masses is missing"}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_refused_and_nothing_changes(good_run, tmp_path, capsys, monkeypatch, damage):
    d = _copy(good_run, tmp_path)
    ck = d / "run.ckpt" / "step-000000000020.h5"
    _edit(ck, DAMAGE[damage])
    before = digest(d)
    code, lines = cli(["run", *SMALL, "steps=40", f"restart={ck}"], d, capsys, monkeypatch)
    assert code == 2
    line = one_line(lines, NEEDLE[damage])
    assert "step-000000000020.h5" in line
    assert digest(d) == before


def test_restart_auto_falls_back_past_a_damaged_newest(good_run, tmp_path, capsys, monkeypatch):
    d = _copy(good_run, tmp_path)
    _edit(d / "run.ckpt" / "step-000000000020.h5", DAMAGE["negative step"])
    code, lines = cli(["run", *SMALL, "steps=30", "restart=auto", "trajectory.every=5", "checkpoint.every=10"],
                      d, capsys, monkeypatch)
    assert code == 0, lines
    frames, ckpts = assert_intact(d, capsys=capsys, monkeypatch=monkeypatch)   # 20 rewritten from step 10
    assert [f.info["step"] for f in frames] == [0, 5, 10, 15, 20, 25, 30]
    assert ckpts[-1].name == "step-000000000030.h5"


def test_restart_auto_over_unusable_checkpoints_is_refused(good_run, tmp_path, capsys, monkeypatch):
    d = _copy(good_run, tmp_path)
    for ck in (d / "run.ckpt").iterdir():
        ck.write_bytes(ck.read_bytes()[:3000])
    before = digest(d)
    code, lines = cli(["run", *SMALL, "steps=40", "restart=auto"], d, capsys, monkeypatch)
    assert code == 2
    one_line(lines, "none of the 2 checkpoint(s)")
    assert digest(d) == before


def test_restart_onto_another_systems_output(good_run, tmp_path, capsys, monkeypatch):
    """A checkpoint of 108 atoms continued into an output that holds 256: refused, both kept."""
    d = _copy(good_run, tmp_path)
    assert cli(["run", "model=lj", "system.repeat=[4,4,4]", "quiet=true", "steps=5", "output=big.h5"],
               d, capsys, monkeypatch)[0] == 0
    before = digest(d)
    code, lines = cli(["run", *SMALL, "steps=40", "output=big.h5",
                       f"restart={d / 'run.ckpt' / 'step-000000000020.h5'}"], d, capsys, monkeypatch)
    assert code == 2
    one_line(lines, "does not belong to this run")
    assert digest(d) == before


def test_unreadable_output_folder(tmp_path, capsys, monkeypatch):
    """A read-only file system (a read-only tmpfs: chmod does not stop root)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)],
                                           capture_output=True).returncode != 0:
        if os.geteuid() == 0:
            pytest.skip("mounting a read-only tmpfs is not permitted here")
        ro.chmod(0o555)
    try:
        code, lines = cli(["run", *SMALL, "steps=5", f"output={ro}/run.h5"], tmp_path, capsys, monkeypatch)
        assert code == 2
        one_line(lines, "cannot write in")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


# -- the ASE calculator: bad Atoms give one clear error, never a silent number ---------------------
def _calc_atoms(kind):
    from ase import Atoms
    from ase.build import bulk, fcc111

    if kind == "no atoms":
        return Atoms("", cell=[5, 5, 5], pbc=True)
    if kind == "zero vector":
        return Atoms("Ar2", positions=[[0, 0, 0], [3.8, 0, 0]], cell=[[10, 0, 0], [0, 10, 0], [0, 0, 0]], pbc=True)
    if kind == "slab without z":
        return fcc111("Ar", size=(3, 3, 3), a=5.26)
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    a.positions[6, 0] = np.nan
    return a


@pytest.mark.parametrize("kind, needle", [("no atoms", "holds no atoms"), ("zero vector", "singular"),
                                          ("slab without z", "cell vector 2"), ("nan position", "atom id 6")])
def test_ase_calculator_refuses_bad_atoms(kind, needle):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    atoms = _calc_atoms(kind)
    atoms.calc = ShardMDCalculator(model="lj")
    with pytest.raises(ValueError) as info:
        atoms.get_potential_energy()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("ShardMDCalculator: ") and needle in msg, msg


def test_open_clusters_keep_running(tmp_path, capsys, monkeypatch):
    """A cluster read from .xyz has no cell and no periodic axis: that worked and still does."""
    from ase.cluster import Icosahedron

    Icosahedron("Ar", 3).write(tmp_path / "ico.xyz")
    code, lines = cli(["run", "model=lj", "system.file=ico.xyz", "steps=10", "quiet=true"], tmp_path, capsys,
                      monkeypatch)
    assert code == 0, lines
    assert_intact(tmp_path, capsys=capsys, monkeypatch=monkeypatch)


def test_second_run_on_a_live_output_is_refused(tmp_path, capsys, monkeypatch):
    """A job resubmitted while the first still runs: HDF5's file lock, named in one line."""
    first = subprocess.Popen([sys.executable, "-m", "engine", "run", *SMALL, "steps=1000000",
                              "checkpoint.every=50", "thermo.every=0"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "run.ckpt").glob("step-*.h5")):
            time.sleep(0.3)
        code, lines = cli(["run", *SMALL, "steps=1000000", "restart=auto"], tmp_path, capsys, monkeypatch)
        assert code == 2
        one_line(lines, "'run.h5' is open in another running process")
        assert first.poll() is None            # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 75, first.stderr.read()
    assert_intact(tmp_path)


@pytest.mark.mpi
@pytest.mark.slow   # ~20 s; the one-rank disk-full cases stay in the fast tier
def test_disk_full_on_two_ranks_is_one_line(tmp_path):
    """Rank 0 writes; a full disk ends both ranks together with exit 4 and one line (no MPI
    abort and its launcher noise). A 2 MiB tmpfs: skipped where mounting is not permitted."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (the disk-full case of test_write_faults.py too)")
    try:
        r = run_engine(["run", "model=lj", "system.repeat=[5,5,5]", "steps=400", "trajectory.every=1",
                        "thermo.every=0", "quiet=true", "domains=2", "checkpoint.every=10"], cwd=small, timeout=600)
        assert r.returncode == 4, r.stderr
        line = one_line(r.stderr.strip().splitlines(), "No space left on device")
        assert "run.h5" in line or "step-" in line
        frames = read_frames(small / "run.h5")
        assert frames and all(np.isfinite(f.positions).all() for f in frames)
        assert [f.info["step"] for f in frames] == list(range(len(frames)))
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)
