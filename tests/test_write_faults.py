"""Write failures are errors: full disks, read-only directories, planted symlinks, bad files.

Real HDF5 files and real processes.  Disk-full and read-only cases mount small tmpfs file
systems (root only: they are skipped with the reason otherwise).  Each case checks the exit
status, a one-line ``error: ...`` naming the path (never a traceback or a segfault), and
that what was written before the failure is intact.

Run as a script (``python test_write_faults.py fill OUT.h5 N_ATOMS PRECHECK``), this file is
also the helper process that fills a disk with the trajectory writer alone.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from fsfaults import _digest, _remount_ro, _tree_digest, assert_one_line_error, tmpfs

pytestmark = pytest.mark.fault

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_spec = importlib.util.spec_from_file_location("h5md_writer_loop", HERE / "helpers" / "h5md_writer_loop.py")
loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(loop)

# threads=1: engine runs go side by side here, and torch's default of all cores would have each
# process's OpenMP workers wait on the other's
QUIET = ["quiet=true", "thermo.every=0", "threads=1"]
LJ = ["model=lj", "system.repeat=[6,6,6]"]  # 864 atoms


# ---------------------------------------------------------------------- helpers
def _engine(args, cwd):
    """Start ``python -m engine <args>`` (not waited for: launches run side by side)."""
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(p, timeout=300):
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _run_all(jobs, timeout=300):
    """Run several engine commands at once; ``jobs`` is [(args, cwd)], returns results in order."""
    procs = [_engine(a, c) for a, c in jobs]
    return [_wait(p, timeout) for p in procs]


def _check_trajectory(path: Path, every: int) -> list[int]:
    """Every frame the reader and ``engine info`` count is real: finite, on the schedule."""
    from shardmd.engine.io.h5md import file_summary, read_frames

    frames = read_frames(path)
    steps = [a.info["step"] for a in frames]
    assert steps == list(range(0, every * len(steps), every)), steps
    for a in frames:
        assert np.isfinite(a.positions).all() and np.isfinite(a.get_velocities()).all()
        assert np.isfinite(a.get_forces()).all() and np.isfinite(a.cell[:]).all()
        assert np.abs(a.positions).max() < 1e3
    assert file_summary(path)["n_frames"] == len(frames)
    return steps


def _fill_writer(out: str, n: int, precheck: bool) -> None:
    """Helper process: write frames until the disk is full; print what happened."""
    import shardmd.engine.io.h5md as h5md
    from shardmd.engine.errors import OutputError

    if not precheck:  # reach HDF5's own ENOSPC instead of the free-space check
        h5md.free_bytes = lambda fd: None
    species, masses, ids = loop.system(n)
    w = h5md.H5MDWriter(out, species=species, masses=masses, ids=ids, pbc=True)
    err = None
    for i in range(100000):
        step = loop.STRIDE * i
        d = loop.frame_data(step, n)
        try:
            w.write_observables(step, step * loop.DT_FS, {"potential_energy": d["potential_energy"]})
            w.write_frame(step, step * loop.DT_FS, d["cell"], positions=d["positions"], images=d["images"],
                          velocities=d["velocities"], forces=d["forces"])
        except OutputError as exc:
            err = exc
            break
        print(f"wrote {step}", flush=True)
    assert err is not None, "the disk never filled"
    assert w.failed is err
    for call in (lambda: w.write_frame(10**9, 0.0, d["cell"], positions=d["positions"], images=d["images"],
                                       velocities=d["velocities"], forces=d["forces"]),
                 lambda: w.write_observables(10**9, 0.0, {"x": 1.0}), w.flush, lambda: w.truncate_after(0)):
        try:
            call()
            raise AssertionError("a poisoned writer wrote")
        except OutputError as again:
            assert again is err
    w.close()
    w.close()
    print(f"error: {err}", flush=True)


# ---------------------------------------------------------------------- writer, disk full
@pytest.mark.parametrize("precheck", [False, True], ids=["hdf5-enospc", "free-space-check"])
def test_writer_disk_full(tmp_path, precheck):
    """The writer alone on a full disk: OutputError, poisoned, no segfault at exit, and every
    frame it reported is in the file, exact; nothing more is counted."""
    n = 864
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        out = mnt / "t.h5"
        r = subprocess.run([sys.executable, __file__, "fill", str(out), str(n), str(int(precheck))],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, f"exit {r.returncode}:\n{r.stderr[-3000:]}"
        assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
        printed = [int(x.split()[1]) for x in r.stdout.splitlines() if x.startswith("wrote")]
        err = [x for x in r.stdout.splitlines() if x.startswith("error:")]
        assert printed and len(err) == 1
        assert str(out) in err[0] and "No space left on device" in err[0]
        assert f"frames up to step {printed[-1]} are intact" in err[0]
        from shardmd.engine.io.h5md import file_summary, read_frames, read_observables

        frames = read_frames(out)
        assert [a.info["step"] for a in frames] == printed
        for a in frames:
            d = loop.frame_data(a.info["step"], n)
            assert np.array_equal(a.positions, d["positions"])
            np.testing.assert_allclose(a.get_forces(), d["forces"], rtol=1e-15)  # via kJ/(mol Å) in the file
            assert np.array_equal(a.arrays["image"], d["images"])
        assert file_summary(out)["n_frames"] == len(printed)
        steps = read_observables(out)["potential_energy"][0]
        assert list(steps[: len(printed)]) == printed and len(steps) - len(printed) in (0, 1)
        info = subprocess.run([sys.executable, "-m", "engine", "info", str(out)], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert info.returncode == 0 and f"frames: {len(printed)}" in info.stdout, info.stderr
        copy = tmp_path / "copy.h5"
        copy.write_bytes(out.read_bytes())
    # with space again, the file continues (as restart=auto would) right after its last frame
    from shardmd.engine.io.h5md import H5MDWriter

    species, masses, ids = loop.system(n)
    with H5MDWriter(copy, species=species, masses=masses, ids=ids, pbc=True, mode="a") as w:
        assert w.last_step == printed[-1] and w.n_frames == len(printed)
        step = printed[-1] + loop.STRIDE
        d = loop.frame_data(step, n)
        w.write_frame(step, step * loop.DT_FS, d["cell"], positions=d["positions"], images=d["images"],
                      velocities=d["velocities"], forces=d["forces"])
    frames = read_frames(copy)
    assert [a.info["step"] for a in frames] == [*printed, step]
    assert np.array_equal(frames[-1].positions, d["positions"])


def test_writer_bad_paths(tmp_path):
    """An output that is a directory, in a missing directory, or (append) not ours: UserError."""
    from shardmd.engine.errors import OutputError, UserError
    from shardmd.engine.io.h5md import H5MDWriter

    species, masses, ids = loop.system(5)
    kw = dict(species=species, masses=masses, ids=ids, pbc=True)
    (tmp_path / "somedir").mkdir()
    for path, mode, needle in ((tmp_path / "somedir", "w", "is a directory"),
                               (tmp_path / "somedir", "a", "is a directory"),
                               (tmp_path / "nodir" / "x.h5", "w", "does not exist")):
        with pytest.raises(UserError, match=needle) as ei:
            H5MDWriter(path, mode=mode, **kw)
        assert not isinstance(ei.value, OutputError) and str(path) in str(ei.value)
    (tmp_path / "text.h5").write_text("not hdf5\n")
    with pytest.raises(UserError, match="not an HDF5 file"):
        H5MDWriter(tmp_path / "text.h5", mode="a", **kw)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.arange(3)
    before = _digest(tmp_path / "other.h5")
    with pytest.raises(UserError, match="not a ShardMD/H5MD trajectory"):
        H5MDWriter(tmp_path / "other.h5", mode="a", **kw)
    assert _digest(tmp_path / "other.h5") == before


def test_writer_read_only_directory(tmp_path):
    """Creating or reopening a trajectory on a read-only file system: OutputError, file kept."""
    from shardmd.engine.errors import OutputError
    from shardmd.engine.io.h5md import H5MDWriter, read_frames

    species, masses, ids = loop.system(7)
    kw = dict(species=species, masses=masses, ids=ids, pbc=True)
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        with H5MDWriter(mnt / "t.h5", **kw) as w:
            for step in (0, 10):
                d = loop.frame_data(step, 7)
                w.write_frame(step, step * 0.5, d["cell"], positions=d["positions"], images=d["images"],
                              velocities=d["velocities"], forces=d["forces"])
        before = _digest(mnt / "t.h5")
        _remount_ro(mnt)
        with pytest.raises(OutputError, match="Read-only file system") as ei:
            H5MDWriter(mnt / "new.h5", **kw)
        assert str(mnt / "new.h5") in str(ei.value)
        with pytest.raises(OutputError, match="Read-only file system"):
            H5MDWriter(mnt / "t.h5", mode="a", **kw)
        assert _digest(mnt / "t.h5") == before
        assert [a.info["step"] for a in read_frames(mnt / "t.h5")] == [0, 10]


def test_engine_disk_full(tmp_path):
    """The engine CLI on full disks.  Run 1 fills the disk with frames every 2 steps and
    checkpoints every 10; run 2 writes checkpoints only, so a checkpoint is what fails.
    Exit status 4, one line naming the output, no segfault; frames and checkpoints written
    before are intact and readable (no fill values are counted); no temporary left."""
    from shardmd.engine.io.checkpoint import list_checkpoints, read_checkpoint

    with tmpfs(tmp_path / "m1", "2m") as m1, tmpfs(tmp_path / "m2", "400k") as m2:
        r1, r2 = _run_all([
            (["run", *LJ, "steps=400", "trajectory.every=2", "checkpoint.every=10", "checkpoint.keep=2",
              *QUIET, f"output={m1 / 'run.h5'}"], tmp_path),
            (["run", *LJ, "steps=400", "trajectory.every=0", "checkpoint.every=10", "checkpoint.keep=10",
              *QUIET, f"output={m2 / 'run.h5'}"], tmp_path),
        ])
        line = assert_one_line_error(r1, str(m1 / "run"))
        assert "No space left on device" in line
        steps = _check_trajectory(m1 / "run.h5", every=2)
        assert steps, "no frame before the disk filled"
        info = subprocess.run([sys.executable, "-m", "engine", "info", str(m1 / "run.h5")], capture_output=True,
                              text=True, timeout=120)
        assert info.returncode == 0 and f"frames: {len(steps)}" in info.stdout, info.stderr
        cks = list_checkpoints(m1 / "run.ckpt")
        assert cks, "no checkpoint before the disk filled"
        for step, p in cks:
            assert read_checkpoint(p)["step"] == step and step % 10 == 0
        assert not [n for n in os.listdir(m1 / "run.ckpt") if n.endswith(".tmp")]

        line = assert_one_line_error(r2, str(m2 / "run.ckpt" / "step-"), "No space left on device",
                                     "older checkpoints are kept")
        cks = list_checkpoints(m2 / "run.ckpt")
        assert len(cks) >= 2 and [s for s, _ in cks] == list(range(10, 10 * len(cks) + 1, 10))
        for step, p in cks:
            assert read_checkpoint(p)["step"] == step
        assert sorted(os.listdir(m2 / "run.ckpt")) == [p.name for _, p in cks]


def test_engine_planted_symlinks(tmp_path):
    """Run 1: the old predictable temporary name is a symlink to a victim: the victim is
    untouched and the run succeeds.  Run 2: the checkpoint directory is a symlink: refused
    (exit 4, one line), nothing written through it, the trajectory before is intact."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"do not overwrite me\n" * 10)
    before = victim.read_bytes()
    (tmp_path / "run.ckpt").mkdir()
    (tmp_path / "run.ckpt" / "step-000000000020.h5.tmp").symlink_to(victim)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "b.ckpt").symlink_to(elsewhere, target_is_directory=True)
    r1, r2 = _run_all([
        (["run", "model=lj", "system.repeat=[3,3,3]", "steps=40", "trajectory.every=10", "checkpoint.every=20",
          *QUIET, "output=run.h5"], tmp_path),
        (["run", "model=lj", "system.repeat=[3,3,3]", "steps=40", "trajectory.every=10", "checkpoint.every=20",
          *QUIET, "output=b.h5"], tmp_path),
    ])
    assert r1.returncode == 0, r1.stderr[-3000:]
    assert victim.read_bytes() == before
    from shardmd.engine.io.checkpoint import list_checkpoints, read_checkpoint

    assert [s for s, _ in list_checkpoints(tmp_path / "run.ckpt")] == [20, 40]
    assert read_checkpoint(tmp_path / "run.ckpt" / "step-000000000020.h5")["step"] == 20
    assert (tmp_path / "run.ckpt" / "step-000000000020.h5.tmp").is_symlink()

    assert_one_line_error(r2, "'b.ckpt'", "symlink")
    assert list(elsewhere.iterdir()) == []
    assert _check_trajectory(tmp_path / "b.h5", every=10) == [0, 10, 20]


def test_engine_read_only_directory(tmp_path):
    """After a run, the output's file system becomes read-only.  Continuing it, or a new run
    there: exit 4 (or 2), one line naming the path; the files already there are unchanged."""
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        r = _wait(_engine(["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "trajectory.every=10",
                           "checkpoint.every=10", *QUIET, f"output={mnt / 'run.h5'}"], tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        before = _tree_digest(mnt)
        _remount_ro(mnt)
        r2, r3 = _run_all([
            (["run", "model=lj", "system.repeat=[3,3,3]", "steps=40", "trajectory.every=10",
              "checkpoint.every=10", *QUIET, f"output={mnt / 'run.h5'}", "restart=auto"], tmp_path),
            (["run", "model=lj", "system.repeat=[3,3,3]", "steps=40", *QUIET, f"output={mnt / 'new.h5'}"],
             tmp_path),
        ])
        for res in (r2, r3):
            line = assert_one_line_error(res, str(mnt), codes=(2, 4))
            assert "Read-only file system" in line or "read-only" in line.lower()
        assert _tree_digest(mnt) == before
        assert _check_trajectory(mnt / "run.h5", every=10) == [0, 10, 20]


# ---------------------------------------------------------------------- info / convert / plot
def test_info_on_bad_files(tmp_path):
    """``engine info`` on a truncated, empty, zero-byte, text, foreign HDF5 file and a
    directory: exit 2, one ``error:`` line naming the file, no traceback."""
    from shardmd.engine.io.h5md import H5MDWriter

    good = tmp_path / "good.h5"
    species, masses, ids = loop.system(300)
    with H5MDWriter(good, species=species, masses=masses, ids=ids, pbc=True) as w:
        for step in range(0, 100, 10):
            d = loop.frame_data(step, 300)
            w.write_frame(step, step * 0.5, d["cell"], positions=d["positions"], images=d["images"],
                          velocities=d["velocities"], forces=d["forces"])
    data = good.read_bytes()
    (tmp_path / "truncated.h5").write_bytes(data[: len(data) // 2])
    (tmp_path / "header_only.h5").write_bytes(data[:2048])
    (tmp_path / "zero.h5").write_bytes(b"")
    (tmp_path / "text.h5").write_text("step,x\n0,1.0\n")
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["data/x"] = np.arange(10)
    with h5py.File(tmp_path / "half_ours.h5", "w") as f:
        f.create_group("particles/other")
    (tmp_path / "adir.h5").mkdir()
    names = ["truncated.h5", "header_only.h5", "zero.h5", "text.h5", "foreign.h5", "half_ours.h5", "adir.h5"]
    procs = [subprocess.Popen([sys.executable, "-m", "engine", "info", n], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in names]
    for n, p in zip(names, procs):
        assert_one_line_error(_wait(p, 120), n, codes=(2,))
    # the Python reader gives the same one-line error (a ValueError too)
    from shardmd.engine.io.h5md import file_summary, read_frames
    from shardmd.engine.io.h5md_read import TrajectoryReadError

    for n in names:
        for fn in (read_frames, file_summary):
            with pytest.raises(TrajectoryReadError) as ei:
                fn(tmp_path / n)
            assert n in str(ei.value) and "\n" not in str(ei.value)
    assert len(read_frames(good)) == 10


def test_convert_and_plot_outputs(tmp_path):
    """convert/plot: an output that is a directory or in a missing directory is a UserError;
    a full disk an OutputError that leaves an existing output file as it was."""
    from shardmd.engine.errors import OutputError, UserError
    from shardmd.engine.io import inspect_files
    from shardmd.engine.io.convert import convert
    from shardmd.engine.io.h5md import H5MDWriter

    src = tmp_path / "run.h5"
    species, masses, ids = loop.system(2000)
    with H5MDWriter(src, species=species, masses=masses, ids=ids, pbc=True) as w:
        for step in range(0, 60, 10):
            d = loop.frame_data(step, 2000)
            w.write_frame(step, step * 0.5, d["cell"], positions=d["positions"], images=d["images"],
                          velocities=d["velocities"], forces=d["forces"])
            w.write_observables(step, step * 0.5, {"potential_energy": d["potential_energy"],
                                                   "temperature": 300.0})
    (tmp_path / "adir").mkdir()
    for fn, out in ((convert, "adir"), (inspect_files.plot, "adir"),
                    (convert, "nodir/x.extxyz"), (inspect_files.plot, "nodir/x.png")):
        with pytest.raises(UserError) as ei:
            fn(str(src), str(tmp_path / out))
        assert not isinstance(ei.value, OutputError) and out in str(ei.value)
    with pytest.raises(UserError, match="cannot write the format"):
        convert(str(src), str(tmp_path / "x.notaformat"))
    with tmpfs(tmp_path / "mnt", "256k") as mnt:
        out = mnt / "frames.extxyz"
        out.write_bytes(b"old content\n")
        with pytest.raises(OutputError) as ei:
            convert(str(src), str(out))
        assert "No space left on device" in str(ei.value) and str(out) in str(ei.value)
        assert out.read_bytes() == b"old content\n" and sorted(os.listdir(mnt)) == ["frames.extxyz"]
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)  # fill what is left, then plot
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        with pytest.raises(OutputError, match="No space left on device"):
            inspect_files.plot(str(src), str(mnt / "e.png"))
        assert sorted(os.listdir(mnt)) == ["filler", "frames.extxyz"]


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "fill":
        _fill_writer(sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4])))
    else:
        sys.exit("usage: test_write_faults.py fill OUT.h5 N_ATOMS PRECHECK(0|1)")
