"""A restart onto a trajectory whose writer was killed while creating it or writing its first
frame (engine/io/h5md_salvage.py: ``Fresh``, ``set_aside``; H5MDWriter(mode="a")).

The killed files are real: the writer loop (tests/helpers/h5md_writer_loop.py) runs under
strace, which sends it SIGKILL as it enters its k-th ``pwrite64`` (the file then holds
exactly the first k-1 writes HDF5 made; no mocks, no edited bytes).  Measured with HDF5 2.0,
200 atoms: the first ~65 writes create the file and write frame 0; about a third of those
states do not open read-only at all ("truncated file", "bad object header version number")
or lose /particles/all or the first rows ("addr overflow"), and before this change every
restart onto them failed with "move it away", at every requeue.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md import H5MDWriter, TrajectoryRebuilt, read_frames
from shardmd.engine.io.h5md_read import TrajectoryReadError

pytestmark = pytest.mark.fault

HELPER = Path(__file__).parent / "helpers" / "h5md_writer_loop.py"
_spec = importlib.util.spec_from_file_location("h5md_writer_loop", HELPER)
loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(loop)

N = 200
STRACE = shutil.which("strace")


def _strace_works() -> bool:
    if STRACE is None:
        return False
    r = subprocess.run([STRACE, "-qq", "-o", os.devnull, "true"], capture_output=True, timeout=30)
    return r.returncode == 0


needs_strace = pytest.mark.skipif(not _strace_works(), reason="strace (ptrace) not available")


def killed_at(path: Path, k: int, frames: int = 2) -> None:
    """Run the writer loop (mode "w", ``frames`` frames) and SIGKILL it as it enters its
    k-th pwrite64 (k=1: before HDF5 wrote anything)."""
    cmd = [STRACE, "-f", "-qq", "-o", os.devnull, "-e", "trace=pwrite64",
           "-e", f"inject=pwrite64:signal=SIGKILL:when={k}",
           sys.executable, str(HELPER), str(path), str(N), "float64", "w", str(frames)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert r.returncode in (-9, 137), (k, r.returncode, r.stderr[-2000:])


def pwrites(path: Path, frames: int = 2) -> int:
    """How many pwrite64 calls a whole run of the writer loop makes."""
    log = path.with_suffix(".strace")
    subprocess.run([STRACE, "-f", "-qq", "-o", str(log), "-e", "trace=pwrite64", sys.executable, str(HELPER),
                    str(path), str(N), "float64", "w", str(frames)], check=True, capture_output=True,
                   timeout=120, cwd=Path(__file__).parents[1])
    n = sum(1 for ln in log.read_text().splitlines() if "pwrite64(" in ln)
    log.unlink()
    path.unlink()
    return n


def writer(path, mode="a") -> H5MDWriter:
    species, masses, ids = loop.system(N)
    return H5MDWriter(path, species=species, masses=masses, ids=ids, pbc=[True, True, False],
                      config={"run": {"n_atoms": N}}, mode=mode)


def restart(path: Path) -> tuple[str, list[int]]:
    """What a restart does with the killed file: reopen with mode "a", drop what follows the
    last frame, append two frames.  Returns (what happened, the steps read back), checking
    that every file left beside ``path`` is the original's bytes."""
    original = path.read_bytes()
    try:
        before = [a.info["step"] for a in read_frames(path)]
    except TrajectoryReadError:
        before = None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        w = writer(path)
    assert [str(r.message) for r in rec if issubclass(r.category, TrajectoryRebuilt)] == (
        [w.rebuilt] if w.rebuilt else [])
    with w:
        kept = [] if w.last_step is None else list(range(0, w.last_step + 1, loop.STRIDE))
        start = 0 if w.last_step is None else w.last_step + loop.STRIDE
        w.truncate_after(start - 1)   # as the engine does from its checkpoint's step
        for step in (start, start + loop.STRIDE):
            d = loop.frame_data(step, N)
            w.write_observables(step, step * loop.DT_FS, {"potential_energy": d["potential_energy"]})
            w.write_frame(step, step * loop.DT_FS, d["cell"], positions=d["positions"], images=d["images"],
                          velocities=d["velocities"], forces=d["forces"])
    line = w.rebuilt or ""
    assert "\n" not in line
    others = sorted(p.name for p in path.parent.iterdir() if p.name != path.name)
    if w.rebuilt is None:
        what = "appended"
        assert before is not None and kept == before
    elif "could not be read" in line:
        what = "set aside"
        assert kept == [] and f"moved to '{path}.damaged-1'" in line
        assert others == [f"{path.name}.damaged-1"]
        assert (path.parent / others[0]).read_bytes() == original  # the bytes, untouched
    elif "was empty" in line:
        what = "empty"
        assert original == b"" and kept == []
    else:
        what = "rebuilt"
        if before is None:   # the reader gave up on a row or group the rebuild could leave out
            assert kept == [] and "could not read" in line
        else:
            assert kept == before
        if "could not read" in line:   # something counted was lost: the original is kept
            assert (path.parent / f"{path.name}.damaged-1").read_bytes() == original
    if what != "set aside":
        assert [o for o in others if not o.endswith(".damaged-1")] == []
    steps = [a.info["step"] for a in read_frames(path)]
    assert steps == kept + [start, start + loop.STRIDE]
    for a in read_frames(path)[len(kept):]:
        assert np.array_equal(a.positions, loop.frame_data(a.info["step"], N)["positions"])
    return what, steps


@needs_strace
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_restart_after_a_kill_while_the_file_was_created(tmp_path, k):
    """k=1: the open (O_TRUNC) left 0 bytes; k=2: the superblock alone ("truncated file");
    k=3, k=8: part of the first flush (no root group; /particles listed but unreadable).
    The restart starts a new trajectory; a damaged file is kept, never deleted."""
    path = tmp_path / "run.h5"
    killed_at(path, k)
    what, steps = restart(path)
    assert what == ("empty" if k == 1 else "set aside")
    assert steps == [0, loop.STRIDE]


@needs_strace
@pytest.mark.slow
def test_restart_after_a_kill_at_every_write_of_the_first_frame(tmp_path):
    """Every moment from the file's creation through frame 1: each restart goes on (in
    place, rebuilt, or anew with the damaged file kept), with no frame lost that a reader
    counted."""
    total = pwrites(tmp_path / "count.h5")
    seen: dict[str, int] = {}
    for k in range(1, total + 1):
        d = tmp_path / f"k{k}"
        d.mkdir()
        killed_at(d / "run.h5", k)
        what, _ = restart(d / "run.h5")
        seen[what] = seen.get(what, 0) + 1
        shutil.rmtree(d)
    assert seen.get("set aside", 0) > 0 and seen.get("empty") == 1, seen
    assert seen.get("appended", 0) + seen.get("rebuilt", 0) > total // 2, seen


def test_a_damaged_name_already_taken_is_never_overwritten(tmp_path):
    """A '.damaged-1' that is another file stays as it is (the next free name is used); one
    that is this very file (a restart killed between the link and the unlink) is reused."""
    path = tmp_path / "run.h5"
    with writer(path, mode="w"):
        pass
    os.truncate(path, 96)   # the superblock alone: what a kill at the second write leaves
    original = path.read_bytes()
    (tmp_path / "run.h5.damaged-1").write_text("an earlier one\n")
    with pytest.warns(TrajectoryRebuilt, match="moved to .*run.h5.damaged-2"):
        writer(path).close()
    assert (tmp_path / "run.h5.damaged-1").read_text() == "an earlier one\n"
    assert (tmp_path / "run.h5.damaged-2").read_bytes() == original
    # killed between the link and the unlink: both names are the damaged file
    other = tmp_path / "b.h5"
    other.write_bytes(original)
    os.link(other, tmp_path / "b.h5.damaged-1")
    with pytest.warns(TrajectoryRebuilt, match="moved to .*b.h5.damaged-1'"):
        writer(other).close()
    assert (tmp_path / "b.h5.damaged-1").read_bytes() == original
    assert not (tmp_path / "b.h5.damaged-2").exists()
    assert len(read_frames(other)) == 0


def test_files_that_are_not_ours_are_refused_untouched(tmp_path):
    """Not HDF5 (text that happens to sit at output=): today's one-line error.  An intact HDF5
    file of another layout: refused.  Neither is moved or changed."""
    text = tmp_path / "notes.h5"
    text.write_text("x y z\n" * 1000)
    with pytest.raises(UserError, match="not an HDF5 file"):
        writer(text)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["particles/water/position"] = np.zeros((3, 3))
    for path in (text, other):
        before = path.read_bytes()
        with pytest.raises(UserError) as e:
            writer(path)
        assert "\n" not in str(e.value) and "output=" in str(e.value)
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.h5", "other.h5"]


_TRY = """
import sys
sys.path.insert(0, {tests!r})
import test_h5md_early_kill as t
from shardmd.engine.errors import UserError
try:
    t.writer({path!r}).close()
    print("OPENED")
except UserError as exc:
    print("ERROR", type(exc).__name__, exc)
"""


def _as_a_user(path: Path) -> str:
    """Open ``path`` with mode "a" in a process without the capabilities that let root past
    file permissions; its one line of output."""
    cmd = [sys.executable, "-c", _TRY.format(tests=str(Path(__file__).parent), path=str(path))]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    out = r.stdout.strip()
    assert r.returncode == 0 and "\n" not in out, (out, r.stderr[-2000:])
    return out


def test_unwritable_directory_keeps_the_damaged_file_in_place(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    path = d / "run.h5"
    with writer(path, mode="w"):
        pass
    os.truncate(path, 96)
    original = path.read_bytes()
    d.chmod(0o555)
    try:
        out = _as_a_user(path)
    finally:
        d.chmod(0o755)
    assert out.startswith("ERROR OutputError "), out
    assert f"cannot move damaged trajectory aside {str(path)!r}: Permission denied" in out
    assert "the file was not changed" in out and "truncated file" in out
    assert path.read_bytes() == original and os.listdir(d) == ["run.h5"]


def test_an_os_read_failure_is_no_damage(tmp_path):
    """A file the OS does not let us read says nothing about its bytes: refused, not moved."""
    path = tmp_path / "run.h5"
    with writer(path, mode="w"):
        pass
    os.truncate(path, 96)
    path.chmod(0o200)
    try:
        out = _as_a_user(path)
    finally:
        path.chmod(0o644)
    assert out.startswith("ERROR OutputError ") and "Permission denied" in out, out
    assert os.listdir(tmp_path) == ["run.h5"]


def test_engine_restart_onto_a_trajectory_killed_in_its_creation(tmp_path, capfd, monkeypatch):
    """restart=auto with a good checkpoint and a trajectory a kill left unreadable: the run
    goes on, its log says where the damaged file went, the new trajectory holds the frames
    after the checkpoint."""
    from conftest import run_in_process

    base = ["run", "model=lj", "system.repeat=[3,3,3]", "dt=2.0", "temperature=100", "trajectory.every=5",
            "thermo.every=0", "quiet=true", "checkpoint.every=10", "threads=1", "output=run.h5"]
    code, lines = run_in_process([*base, "steps=20"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    path = tmp_path / "run.h5"
    os.truncate(path, 96)   # as a kill at the trajectory's second write leaves it
    original = path.read_bytes()
    code, lines = run_in_process([*base, "steps=30", "restart=auto"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    assert not any("could not be read" in ln for ln in lines), lines   # in the log, not a warning
    log = (tmp_path / "run.log").read_text()
    assert f"moved to '{tmp_path / 'run.h5.damaged-1'}'" in log or "moved to 'run.h5.damaged-1'" in log, log
    assert (tmp_path / "run.h5.damaged-1").read_bytes() == original
    assert [a.info["step"] for a in read_frames(path)] == [25, 30]
