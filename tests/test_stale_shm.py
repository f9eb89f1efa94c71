"""domain/stale_shm.py: which of MPICH's /dev/shm segments a starting rank removes (a folder of
files here; the real thing under SLURM is tests/test_slurm.py's requeue-after-SIGKILL test)."""
from __future__ import annotations

import os
import time

import pytest

from shardmd.domain.stale_shm import fnv1a_32, process_start_time, remove_stale_segments, segment_prefixes

pytestmark = pytest.mark.fault

STEP = {"SLURM_JOB_ID": "52353184", "SLURM_STEP_ID": "0"}


def test_fnv1a_known_answers_and_the_name_mpich_gave_a_real_step():
    # the published FNV-1a 32-bit vectors (Noll's test suite) ...
    assert [fnv1a_32(s) for s in ("", "a", "foobar")] == [0x811C9DC5, 0xE40C292C, 0xBF9CF968]
    # ... and the segment MPICH 5.0.2 created for step 0 of SLURM job 52353184 on this machine
    assert segment_prefixes(STEP) == ["mpich_shm_cd6b23d0_", "mpich_vci_cd6b23d0_"]
    assert segment_prefixes({}) == [] and segment_prefixes({"SLURM_JOB_ID": "5"}) == []


def test_process_start_time_is_now_minus_this_process_age():
    started = process_start_time()
    assert started is not None and started <= time.time()
    assert time.time() - started < 24 * 3600


def test_only_this_steps_old_files_go(tmp_path):
    started = time.time()
    old = started - 60
    names = {
        "mpich_shm_cd6b23d0_0": old,      # this step, a killed earlier start's: removed
        "mpich_vci_cd6b23d0_1": old,      # the same for the vci segment of node 1
        "mpich_shm_cd6b23d0_2": started,  # written after this process started: a sibling's
        "mpich_shm_cd6b23d1_0": old,      # another step or job
        "mpich_shm_12345678_0": old,
        "ucx_shm_posix_cd6b23d0": old,
    }
    for name, t in names.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (t, t))
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "mpich_shm_cd6b23d0_3").symlink_to(outside)        # never followed, never removed
    (tmp_path / "mpich_shm_cd6b23d0_4").mkdir()
    os.utime(tmp_path / "mpich_shm_cd6b23d0_4", (old, old))

    assert remove_stale_segments({}, tmp_path, started) == []     # not in a SLURM step: nothing
    removed = remove_stale_segments(STEP, tmp_path, started)
    assert sorted(p.name for p in removed) == ["mpich_shm_cd6b23d0_0", "mpich_vci_cd6b23d0_1"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(set(names) - {"mpich_shm_cd6b23d0_0", "mpich_vci_cd6b23d0_1"}
                          | {"outside", "mpich_shm_cd6b23d0_3", "mpich_shm_cd6b23d0_4"})
    assert outside.read_bytes() == b"keep"
    assert remove_stale_segments(STEP, tmp_path / "missing", started) == []
