"""Shared-memory segments an earlier, killed start of the same SLURM job step left behind.

MPICH (the PyPI wheel this project installs, and many site builds) keeps a node-local segment
``/dev/shm/mpich_shm_<world id>_<node>`` (and ``mpich_vci_...``) for the life of a job step and
removes it in ``MPI_Finalize``. The world id is the 32-bit FNV-1a hash of the process
manager's job name, which SLURM's PMI-2 gives as ``"<job id>.<step id>"``. A start whose ranks
were killed (SIGKILL when a preemption's grace time ran out, ``srun --kill-on-bad-exit`` after
one rank died) leaves its segment; a requeued job keeps its job id and counts steps from 0
again, so the next start's ranks open the old segment, find it already initialised, and fail
in ``MPI_Init`` ("Message truncated") or hang. docs/design.md, "Requeued jobs and MPICH's
shared memory", has the measurement.

:func:`remove_stale_segments` runs on every rank just before MPI starts: it removes this job
step's segments that were last written before this process existed (a live sibling rank's
segment is written after all ranks of the step started). It needs no MPI and no coordination
between ranks, and touches nothing outside this job step's names.
"""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

SHM = Path("/dev/shm")
#: a segment last written this long before this process started is never a sibling's: ranks of
#: one step start within milliseconds of each other and reach MPI_Init seconds later
MARGIN_S = 1.0


def fnv1a_32(text: str) -> int:
    """32-bit FNV-1a of ``text``'s UTF-8 bytes (MPICH's HASH_FNV)."""
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def segment_prefixes(env=os.environ) -> list[str]:
    """The file-name prefixes of this SLURM job step's MPICH segments ([] outside a step)."""
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
    if not job or step is None:
        return []
    world = f"{fnv1a_32(f'{job}.{step}'):x}"
    return [f"mpich_shm_{world}_", f"mpich_vci_{world}_"]


def process_start_time() -> float | None:
    """This process's start, seconds since the epoch (None where /proc cannot tell)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])                    # field 22: start time after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def remove_stale_segments(env=os.environ, shm: Path = SHM, started: float | None = None) -> list[Path]:
    """Remove this job step's MPICH segments last written before ``started`` - MARGIN_S (this
    process's start by default) and owned by this user; the paths removed."""
    prefixes = segment_prefixes(env)
    if not prefixes:   # not in a SLURM step: nothing to read
        return []
    started = process_start_time() if started is None else started
    if started is None:
        return []
    removed = []
    try:
        names = [n for n in os.listdir(shm) if n.startswith(tuple(prefixes))]
    except OSError:
        return []
    for name in names:
        path = shm / name
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mtime < started - MARGIN_S:
                path.unlink()
                removed.append(path)
        except OSError:   # gone already (a sibling rank removed it) or not ours to remove
            continue
    return removed
