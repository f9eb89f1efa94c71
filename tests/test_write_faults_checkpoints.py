"""Checkpoint writes that fail (full disk, links, non-files, temporary names): the newest
healthy checkpoint is never lost, nothing is written through a link, a temporary is never
a predictable name (tests/test_write_faults.py has the trajectory and engine cases)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from fsfaults import tmpfs

pytestmark = pytest.mark.fault


def _ckpt_args(n=864, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {k: rng.random((n, 3)) * 10 for k in ("positions", "velocities", "reference_positions")}
    arrays.update(masses=np.full(n, 39.948), numbers=np.full(n, 18, dtype=np.int64),
                  ids=np.arange(n, dtype=np.int64), images=np.zeros((n, 3), dtype=np.int32))
    return arrays


def _write_ck(directory, step, arrays, keep=3):
    from shardmd.engine.io.checkpoint import write_checkpoint

    return write_checkpoint(Path(directory), step, step * 1.0, arrays, np.eye(3) * 20.0, np.ones(3, bool),
                            {"model": {"name": "lj"}}, {"name": "verlet"}, "lj", "x" * 64, "0.1.0", keep=keep)


@pytest.mark.parametrize("keep,size", [(1, "150k"), (5, "400k")])  # a checkpoint: ~100 kB
def test_checkpoint_disk_full_keeps_older(tmp_path, keep, size):
    """A checkpoint that does not fit: OutputError naming it, older ones kept and readable,
    no temporary file left; rotation never ran for the failed one."""
    from shardmd.engine.errors import OutputError
    from shardmd.engine.io.checkpoint import list_checkpoints, read_checkpoint

    arrays = _ckpt_args()
    with tmpfs(tmp_path / "mnt", size) as mnt:
        d = mnt / "run.ckpt"
        written = []
        with pytest.raises(OutputError) as ei:
            for step in range(0, 10000, 10):
                written.append(_write_ck(d, step, arrays, keep=keep))
        msg = str(ei.value)
        assert "No space left on device" in msg and f"step-{step:012d}.h5" in msg and str(d) in msg
        assert "\n" not in msg
        kept = [p for _, p in list_checkpoints(d)]
        assert written and kept == written[-keep:]
        for p in kept:
            ck = read_checkpoint(p)
            assert np.array_equal(ck["arrays"]["positions"], arrays["positions"])
        assert sorted(os.listdir(d)) == [p.name for p in kept]  # no .tmp left


def test_checkpoint_refuses_links_and_non_files(tmp_path):
    """A symlinked checkpoint directory or final name is refused (nothing written through
    it); a directory at the final name too.  Decision: refuse rather than replace."""
    from shardmd.engine.errors import OutputError
    from shardmd.engine.io.checkpoint import list_checkpoints

    arrays = _ckpt_args(20)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "a.ckpt").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputError, match="is a symlink") as ei:
        _write_ck(tmp_path / "a.ckpt", 20, arrays)
    assert str(tmp_path / "a.ckpt") in str(ei.value)
    assert list(elsewhere.iterdir()) == []

    (tmp_path / "b.ckpt").write_text("a file where the directory should be")
    with pytest.raises(OutputError, match="not a directory"):
        _write_ck(tmp_path / "b.ckpt", 20, arrays)

    d = tmp_path / "c.ckpt"
    _write_ck(d, 10, arrays)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    (d / "step-000000000020.h5").symlink_to(victim)
    with pytest.raises(OutputError, match="is a symlink") as ei:
        _write_ck(d, 20, arrays)
    assert "step-000000000020.h5" in str(ei.value)
    assert victim.read_bytes() == b"precious\n"
    (d / "step-000000000030.h5").mkdir()
    with pytest.raises(OutputError, match="not a regular file"):
        _write_ck(d, 30, arrays)
    assert [s for s, _ in list_checkpoints(d)] == [10, 20, 30]  # nothing rotated away
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_checkpoint_temporary_names(tmp_path, monkeypatch):
    """Temporaries: unpredictable, never the old name; a killed writer's are ignored, and
    removed once older than the process (ours by name/owner); links are never followed."""
    import shardmd.engine.io.checkpoint as ck

    arrays = _ckpt_args(20)
    d = tmp_path / "run.ckpt"
    d.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    (d / "step-000000000020.h5.tmp").symlink_to(victim)  # the old predictable name
    stale = d / ".step-000000000010.h5.0123456789abcdef.tmp"
    stale.write_bytes(b"half a checkpoint")
    fresh = d / ".step-000000000010.h5.fedcba9876543210.tmp"
    fresh.write_bytes(b"another writer, now")
    link = d / ".step-000000000010.h5.aaaaaaaaaaaaaaaa.tmp"
    link.symlink_to(victim)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(link, (old, old), follow_symlinks=False)
    monkeypatch.setattr(ck, "_PROCESS_START", time.time() - 60)

    seen = []
    real_open = os.open

    def spy(path, flags, *a, **k):
        if str(path).endswith(".tmp"):
            seen.append((Path(path).name, flags))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(ck.os, "open", spy)
    p = _write_ck(d, 20, arrays)
    _write_ck(d, 30, arrays)
    names = [n for n, _ in seen]
    assert len(names) == 2 and len(set(names)) == 2
    for name, flags in seen:
        assert name.startswith(".step-") and name.endswith(".tmp") and len(name) > 30
        assert flags & os.O_EXCL and flags & os.O_CREAT and flags & os.O_NOFOLLOW
    assert victim.read_bytes() == b"precious\n"
    assert p.is_file() and not p.is_symlink()
    assert not stale.exists()  # ours, older than the process: removed
    assert fresh.exists()  # may be another live writer's: left alone
    assert link.is_symlink() and victim.exists()  # not a regular file: left alone
    assert (d / "step-000000000020.h5.tmp").is_symlink()  # not our name: left alone


# ---------------------------------------------------------------------- engine runs
