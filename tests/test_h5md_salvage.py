"""Appending to a trajectory that a killed writer left unsafe to reopen for writing
(engine/io/h5md_salvage.py, H5MDWriter(mode="a")).

The damaged files are real HDF5 states, made with HDF5 itself, no mocks.  HDF5 writes a
flush's metadata in address order and the superblock (which holds the end-of-allocation
address, EOA) last (seen with strace on a real writer); a kill between the two leaves
metadata past the stored EOA.  ``killed_before_superblock`` makes exactly that state: a
new observable group created and flushed, then the superblock of the previous flush put
back.  Read-only, HDF5 opens the file and our reader counts every frame; opened "r+", HDF5
cannot open the new group ("len not positive after adjustment for EOA") and the earlier
writer died in its reopen with a TypeError; and the first allocations of an append would
land on the bytes past the EOA.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md import H5MDWriter, TrajectoryRebuilt, read_frames, read_observables
from shardmd.engine.io.h5md_layout import ROW_CHUNK, _create_element
from shardmd.engine.io.h5md_read import TrajectoryDamageWarning
from shardmd.engine.io.h5md_salvage import stored_eoa, tail_past_eoa

pytestmark = pytest.mark.fault

HELPER = Path(__file__).parent / "helpers" / "h5md_writer_loop.py"
_spec = importlib.util.spec_from_file_location("h5md_writer_loop", HELPER)
loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(loop)

N = 200
ELEMENTS = ("position", "image", "velocity", "force", "box/edges")
SB = 96  # bytes of a version-0 superblock with 8-byte addresses (root symbol table entry included)


def writer(path, mode="w", **kw) -> H5MDWriter:
    species, masses, ids = loop.system(N)
    return H5MDWriter(path, species=species, masses=masses, ids=ids, pbc=[True, True, False],
                      dtype="float32", config={"run": {"n_atoms": N}}, mode=mode, **kw)


def write(w: H5MDWriter, step: int) -> None:
    d = loop.frame_data(step, N)
    w.write_observables(step, step * loop.DT_FS, {"potential_energy": d["potential_energy"]})
    w.write_frame(step, step * loop.DT_FS, d["cell"], positions=d["positions"], images=d["images"],
                  velocities=d["velocities"], forces=d["forces"])


def raw(path) -> dict[str, tuple[np.ndarray, ...]]:
    """Every element's step, time and value rows, and the observables, as stored."""
    with h5py.File(path, "r", locking=False) as f:
        out = {n: tuple(f[f"particles/all/{n}/{ds}"][()] for ds in ("step", "time", "value"))
               for n in ELEMENTS}
        out["obs"] = tuple(f[f"observables/potential_energy/{ds}"][()] for ds in ("step", "time", "value"))
    return out


def tree(path) -> dict[str, tuple]:
    """Every object's kind, dtype, chunks, maxshape, fill value and attributes (not shapes)."""
    out = {}

    def visit(name, obj):
        attrs = tuple(sorted((k, repr(obj.attrs[k])) for k in obj.attrs))
        if isinstance(obj, h5py.Dataset):
            out[name] = ("dataset", obj.dtype.str, obj.chunks, obj.maxshape, repr(obj.fillvalue), attrs)
        else:
            out[name] = ("group", attrs)

    with h5py.File(path, "r", locking=False) as f:
        visit("/", f)
        f.visititems(visit)
    return out


def killed_before_superblock(path: Path, frames: int) -> dict:
    """A trajectory of ``frames`` frames (steps 0, 10, ...), then the state a kill leaves after
    HDF5 wrote a flush's metadata (a new observable group) but not its superblock.
    Returns the rows of the frames (as stored) from before the damage."""
    with writer(path) as w:
        for k in range(frames):
            write(w, loop.STRIDE * k)
    before = raw(path)
    before["tree"] = tree(path)
    superblock = path.read_bytes()[:SB]
    with h5py.File(path, "r+", rdcc_nbytes=0) as f:   # phase 1 of a new observable's first row
        g = _create_element(f["observables"], "temperature", (), np.float64, "K", (ROW_CHUNK,))
        for ds, v in (("value", 300.0), ("time", frames * loop.STRIDE * loop.DT_FS)):
            g[ds].resize((1,))
            g[ds][0] = v
        f.flush()
        damaged = bytearray(path.read_bytes())
    damaged[:SB] = superblock  # the kill came before HDF5 wrote the superblock
    path.write_bytes(bytes(damaged))
    return before


def killed_in_a_frame(path: Path, element: str = "position") -> None:
    """The state of a kill after the next frame's first row of a new chunk of ``element`` was
    written (past the EOA) and HDF5 flushed its metadata, but not the superblock."""
    superblock = path.read_bytes()[:SB]
    with h5py.File(path, "r+", rdcc_nbytes=0) as f:
        v = f[f"particles/all/{element}/value"]
        row = v.chunks[0] * (v.shape[0] // v.chunks[0] + 1)  # the first row of a new chunk
        v.resize((row + 1, *v.shape[1:]))
        v[row] = 1.0
        f.flush()
        damaged = bytearray(path.read_bytes())
    damaged[:SB] = superblock
    path.write_bytes(bytes(damaged))
    assert tail_past_eoa(path) is not None


def assert_rows_equal(path, before: dict, frames: int) -> None:
    after = raw(path)
    for name in (*ELEMENTS, "obs"):
        for a, b in zip(after[name], before[name]):
            assert a.dtype == b.dtype
            assert np.array_equal(a[:frames], b[:frames]), name  # bit for bit (no NaN in these rows)


def test_append_after_a_kill_before_the_superblock(tmp_path):
    path = tmp_path / "run.h5"
    frames = 7
    before = killed_before_superblock(path, frames)
    # the damage: bytes past the stored EOA; read-only the frames are all there
    size, eoa = tail_past_eoa(path)
    assert size > eoa == stored_eoa(path)
    with pytest.warns(TrajectoryDamageWarning, match="observable 'temperature' cannot be read"):
        assert [a.info["step"] for a in read_frames(path)] == [loop.STRIDE * k for k in range(frames)]
    with h5py.File(path, "r") as f, pytest.raises(KeyError, match="EOA"):
        f["observables/temperature"]  # its header lies past the EOA
    original = path.read_bytes()

    with pytest.warns(TrajectoryRebuilt) as rec:
        w = writer(path, mode="a")
    assert len(rec) == 1
    line = str(rec[0].message)
    assert "\n" not in line and w.rebuilt == line
    assert f"kept {frames} complete frames" in line and "past HDF5's end of allocation" in line
    # the new group could not be read: the original's bytes are kept, by a clear name
    assert "observable 'temperature'" in line and f"{path}.damaged-1" in line
    assert Path(f"{path}.damaged-1").read_bytes() == original
    assert tail_past_eoa(path) is None
    assert w.n_frames == frames and w.last_step == loop.STRIDE * (frames - 1)
    new = [loop.STRIDE * k for k in range(frames, frames + 3)]
    with w:
        for step in new:
            write(w, step)
    assert sorted(os.listdir(tmp_path)) == ["run.h5", "run.h5.damaged-1"]  # no leftover

    steps = [loop.STRIDE * k for k in range(frames)] + new
    assert_rows_equal(path, before, frames)
    assert tree(path) == before["tree"]  # groups, datasets (dtype, chunks, fill), attributes as they were
    back = read_frames(path)
    assert [a.info["step"] for a in back] == steps  # no gap, no duplicate
    for a in back[frames:]:
        d = loop.frame_data(a.info["step"], N)
        assert np.array_equal(a.positions, d["positions"].astype(np.float32).astype(np.float64))
    obs_steps, _, obs_values = read_observables(path)["potential_energy"]
    assert list(obs_steps) == steps
    assert np.array_equal(obs_values[:frames], before["obs"][2])
    # a third-party reader: MDAnalysis keeps float32, the file's own precision: bit for bit
    mda = pytest.importorskip("MDAnalysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(str(path), format="H5MD", topology_format="MINIMAL", n_atoms=N)
    assert u.trajectory.n_frames == len(steps)
    for k, ts in enumerate(u.trajectory):
        assert ts.data["step"] == steps[k]
        if k < frames:
            assert np.array_equal(ts.positions, before["position"][2][k])
    u.trajectory.close()


def test_append_when_the_reopen_fails_on_a_cut_file(tmp_path):
    """The same damage with the file cut at its stored EOA (its tail lost): nothing lies past
    the EOA, "r+" opens, and the append's reopen fails on the observable whose header is
    gone; the file is rebuilt from the read-only view all the same."""
    path = tmp_path / "cut.h5"
    frames = 4
    before = killed_before_superblock(path, frames)
    os.truncate(path, stored_eoa(path))
    assert tail_past_eoa(path) is None
    with pytest.warns(TrajectoryDamageWarning, match="observable 'temperature'"):
        assert len(read_frames(path)) == frames
    with pytest.warns(TrajectoryRebuilt, match=f"reopening it for append failed: observable 'temperature' "
                      f"cannot be opened.*kept {frames} complete frames"):
        w = writer(path, mode="a")
    with w:
        write(w, loop.STRIDE * frames)
    assert_rows_equal(path, before, frames)
    assert [a.info["step"] for a in read_frames(path)] == [loop.STRIDE * k for k in range(frames + 1)]


def test_a_killed_frame_is_dropped_and_the_original_not_kept(tmp_path):
    """A kill between a frame's chunk writes and its flush (the common case: about half the
    moments of a write loop): bytes of the unfinished frame past the EOA.  Every counted row is
    copied, so the original is not kept."""
    path = tmp_path / "k.h5"
    with writer(path) as w:
        for k in range(3):
            write(w, loop.STRIDE * k)
    before = raw(path)
    killed_in_a_frame(path)
    with pytest.warns(TrajectoryRebuilt, match="kept 3 complete frames and 3 observable rows; the bytes "
                      "dropped held no complete frame"):
        w = writer(path, mode="a")
    with w:
        write(w, 30)
    assert os.listdir(tmp_path) == ["k.h5"]
    assert_rows_equal(path, before, 3)
    assert [a.info["step"] for a in read_frames(path)] == [0, 10, 20, 30]


def test_frames_that_cannot_be_read_are_cut_and_the_original_kept(tmp_path):
    """A committed frame whose chunk cannot be read (its address in the chunk B-tree points
    past the file: HDF5 'addr overflow'): the rebuild keeps the frames before it, says which
    were lost, and keeps the original's bytes."""
    path = tmp_path / "c.h5"
    frames = 30
    with writer(path) as w:
        for k in range(frames):
            write(w, loop.STRIDE * k)
    before = raw(path)
    with h5py.File(path, "r") as f:
        d = f["particles/all/position/value"]
        per_chunk = d.chunks[0]
        address = d.id.get_chunk_info(1).byte_offset  # the chunk of frames per_chunk, ...
    assert per_chunk < frames
    data = bytearray(path.read_bytes())
    old = struct.pack("<Q", address)
    assert data.count(old) == 1  # its entry in the B-tree node
    i = data.index(old)
    data[i:i + 8] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(data))
    killed_in_a_frame(path, "force")
    original = path.read_bytes()
    with pytest.warns(TrajectoryRebuilt) as rec:
        w = writer(path, mode="a")
    line = str(rec[0].message)
    assert f"kept {per_chunk} of {frames} complete frames" in line
    assert f"could not read frames from step {loop.STRIDE * per_chunk}" in line
    assert Path(f"{path}.damaged-1").read_bytes() == original
    with w:
        assert w.last_step == loop.STRIDE * (per_chunk - 1)
        w.truncate_after(w.last_step)  # as a restart does: observable rows after it go too
        write(w, loop.STRIDE * per_chunk)
    assert_rows_equal(path, before, per_chunk)
    assert [a.info["step"] for a in read_frames(path)] == [loop.STRIDE * k for k in range(per_chunk + 1)]


def test_files_that_cannot_be_read_keep_their_one_line_errors(tmp_path):
    bad = tmp_path / "notes.h5"
    bad.write_text("not an HDF5 file\n" * 100)
    with pytest.raises(UserError, match="not an HDF5 file") as e:
        writer(bad, mode="a")
    assert "\n" not in str(e.value) and "output=" in str(e.value)
    assert bad.read_text() == "not an HDF5 file\n" * 100 and os.listdir(tmp_path) == ["notes.h5"]


def test_an_hdf5_file_that_does_not_open_is_set_aside(tmp_path):
    """An HDF5 file cut short opens neither way (what a kill early in the file's life leaves,
    tests/test_h5md_early_kill.py): it is kept, byte for byte, under '.damaged-1' and a new
    trajectory starts in its place, said in one line."""
    cut = tmp_path / "cut.h5"
    with writer(cut) as w:
        for k in range(3):
            write(w, loop.STRIDE * k)
    os.truncate(cut, cut.stat().st_size - 4096)
    original = cut.read_bytes()
    with pytest.warns(TrajectoryRebuilt) as rec:
        w = writer(cut, mode="a")
    line = str(rec[0].message)
    assert line == w.rebuilt and "\n" not in line
    assert "could not be read (HDF5: truncated file" in line and f"moved to '{cut}.damaged-1'" in line
    with w:
        assert w.last_step is None
        write(w, 100)
    assert Path(f"{cut}.damaged-1").read_bytes() == original
    assert [a.info["step"] for a in read_frames(cut)] == [100]


def test_the_reader_says_which_observable_it_leaves_out(tmp_path):
    """An observable listed in the file whose group HDF5 cannot open (its header past the
    EOA, as a kill before the superblock leaves it): the frames and the other observables
    read, and a one-line warning names the one left out; file_summary lists it."""
    from shardmd.engine.io.h5md_read import file_summary

    path = tmp_path / "run.h5"
    killed_before_superblock(path, 3)
    with pytest.warns(TrajectoryDamageWarning) as rec:
        frames = read_frames(path)
    assert [a.info["step"] for a in frames] == [0, 10, 20] and "potential_energy" in frames[0].info
    msgs = [str(r.message) for r in rec]
    assert len(msgs) == 1 and "\n" not in msgs[0]
    assert msgs[0].startswith(f"{str(path)!r}: observable 'temperature' cannot be read (")
    assert msgs[0].endswith("EOA); it is left out")   # HDF5's words: "len not positive after adjustment for EOA"
    with pytest.warns(TrajectoryDamageWarning, match="observable 'temperature'"):
        obs = read_observables(path)
    assert list(obs) == ["potential_energy"] and list(obs["potential_energy"][0]) == [0, 10, 20]
    with pytest.warns(TrajectoryDamageWarning):
        s = file_summary(path)
    assert s["unreadable_observables"] == ["temperature"] and s["observables"] == {"potential_energy": 3}
    # an intact file: no warning, nothing listed
    good = tmp_path / "good.h5"
    with writer(good) as w:
        write(w, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert file_summary(good)["unreadable_observables"] == []


def test_a_file_another_process_holds_is_not_rebuilt(tmp_path):
    """Bytes past the EOA while the file is locked (a writer still running, mid-frame): the
    existing one-line 'open in another running process' error, the file untouched."""
    import fcntl

    path = tmp_path / "busy.h5"
    with writer(path) as w:
        write(w, 0)
    killed_in_a_frame(path)
    original = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the lock HDF5 takes for writing
        with pytest.raises(UserError, match="open in another running process") as e:
            writer(path, mode="a")
        assert "\n" not in str(e.value)
    finally:
        os.close(fd)
    assert path.read_bytes() == original and os.listdir(tmp_path) == ["busy.h5"]


_NO_WRITE = """
import sys
sys.path.insert(0, {tests!r})
import test_h5md_salvage as t
from shardmd.engine.errors import OutputError
try:
    t.writer({path!r}, mode="a")
except OutputError as exc:
    print("ERROR", exc)
"""


def test_unwritable_directory_gives_one_line_and_leaves_the_file(tmp_path):
    """The rebuild cannot create its file: one-line OutputError, the original untouched."""
    d = tmp_path / "ro"
    d.mkdir()
    path = d / "run.h5"
    killed_before_superblock(path, 3)
    original = path.read_bytes()
    d.chmod(0o555)
    cmd = [sys.executable, "-c", _NO_WRITE.format(tests=str(Path(__file__).parent), path=str(path))]
    if os.geteuid() == 0:  # root writes anywhere: drop the capabilities that bypass permissions
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).parents[1])
    finally:
        d.chmod(0o755)
    out = r.stdout.strip()
    assert r.returncode == 0 and out.startswith("ERROR "), (out, r.stderr[-2000:])
    assert "\n" not in out
    assert f"cannot rebuild trajectory {str(path)!r}: Permission denied" in out
    assert "make the directory writable or choose another output=" in out
    assert "the file was not changed" in out
    assert path.read_bytes() == original and os.listdir(d) == ["run.h5"]


def test_engine_restart_says_the_rebuild_in_its_log(tmp_path, capfd, monkeypatch):
    """A restart (restart=auto) onto a trajectory left past its EOA: the run continues, its
    log has the one-line report, no Python warning reaches stderr, and the frames run on
    without gap or duplicate."""
    from conftest import run_in_process

    base = ["run", "model=lj", "system.repeat=[3,3,3]", "dt=2.0", "temperature=100", "trajectory.every=5",
            "thermo.every=0", "quiet=true", "checkpoint.every=10", "threads=1", "output=run.h5"]
    code, lines = run_in_process([*base, "steps=20"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    path = tmp_path / "run.h5"
    superblock = path.read_bytes()[:SB]
    with h5py.File(path, "r+", rdcc_nbytes=0) as f:   # metadata of a flush whose superblock never came
        # in the root group (4 links): a 9th link of /observables (8 observables) would split its
        # symbol-table node, and the node the old metadata points to past the EOA is unreadable
        _create_element(f, "extra", (), np.float64, "K", (ROW_CHUNK,))
        f.flush()
        damaged = bytearray(path.read_bytes())
    damaged[:SB] = superblock
    path.write_bytes(bytes(damaged))
    assert tail_past_eoa(path) is not None
    code, lines = run_in_process([*base, "steps=30", "restart=auto"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    assert not any("rebuilt" in ln for ln in lines), lines   # said in the log, not as a warning
    log = (tmp_path / "run.log").read_text()
    assert "was rebuilt before appending" in log, log
    assert [a.info["step"] for a in read_frames(path)] == list(range(0, 31, 5))


def test_engine_info_names_an_unreadable_observable_and_warnings_are_one_line(tmp_path, capfd, monkeypatch):
    """`python -m engine info` on such a file: its observables line names the one left out
    (and no warning repeats it); the CLI prints warnings about the user's data as one line
    ``Warning: ...`` (Python's format adds the file, line and source)."""
    from conftest import cli_in_process

    from shardmd.engine.cli import main as cli
    path = tmp_path / "run.h5"
    killed_before_superblock(path, 3)
    r = cli_in_process(["info", str(path)], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert "observables: potential_energy (3), temperature (unreadable: left out)" in r.stdout, r.stdout
    assert "temperature" not in r.stderr, r.stderr
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)   # restored after the test
    cli._one_line_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        read_observables(path)
        warnings.warn("some other warning", UserWarning, stacklevel=1)
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith("Warning: ") and "observable 'temperature' cannot be read" in err[0], err
    assert len(err) == 1, err   # any other warning goes to the handler before (here pytest's record)
