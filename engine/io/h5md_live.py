"""Reading a trajectory while a running job writes it (``engine info run.h5``, ``read_frames``,
``ase.io.read``, ``engine convert`` during a run).

The writer holds the file open with HDF5's lock and without SWMR; a reader opens it without the
lock (:func:`open_unlocked`).  HDF5 does not keep a file consistent for a reader while another
process writes it: between the writer's flushes (after every frame, and after its commit record:
engine/io/h5md.py) a reader may meet metadata that points past the end of the file as it saw it
("addr overflow"), and its read fails.  Such a failure is transient: the writer's next flush
makes the file whole again.  :func:`retried` reads again, from a fresh open, while the file is
being written: it changed during the attempt (inode, size or modification time) or a running job
holds its output lock (engine/io/output_lock.py); up to :data:`LIVE_WAIT_S` seconds, then the
error is raised as it is, saying that the file is being written.  A failure of a file that nobody
writes is raised at once.  A warning about a part left out (an observable HDF5 cannot read) during
an attempt that is read again is dropped with that attempt; those of the attempt that counts are
given.  What a read returns is the committed frames as of one moment (the reader's row rules:
engine/io/h5md_read.py), never a frame the writer had not finished.
"""
from __future__ import annotations

import functools
import os
import time
import warnings
from typing import Callable, TypeVar

import h5py

from shardmd.engine.errors import OneLineWarning, UserError
from shardmd.engine.io.output_lock import output_in_use

T = TypeVar("T")

#: how long a read of a file being written is tried again (s): the writer flushes every frame
LIVE_WAIT_S = 30.0


def open_unlocked(p: str) -> h5py.File:
    """``h5py.File(p, "r")`` without HDF5's file lock (so a running job's file opens), or with
    it where this process already has the file open with the lock: HDF5 refuses a second open
    of one file with other locking flags ("file locking flag values don't match"), which is
    what an MDAnalysis Universe or a plain ``h5py.File`` left open in the same process holds."""
    try:
        return h5py.File(p, "r", locking=False)
    except TypeError:  # very old h5py without the locking keyword
        return h5py.File(p, "r")
    except OSError as exc:
        if "locking flag values don't match" not in str(exc):
            raise
        return h5py.File(p, "r")


def _stamp(path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def being_written(path, before: tuple | None) -> bool:
    """Whether ``path`` changed since ``before`` (:func:`_stamp`) or a running job holds its lock."""
    return _stamp(path) != before or output_in_use(path) is not None


def retried(path, attempt: Callable[[int], T]) -> T:
    """``attempt(n)`` (n: 0, 1, ...: a later one opens the file afresh) until it returns without
    a UserError or a :class:`OneLineWarning`, while ``path`` is being written (module docstring)."""
    deadline = time.monotonic() + LIVE_WAIT_S
    n, pause = 0, 0.01
    while True:
        before = _stamp(path)
        failed: UserError | None = None
        with warnings.catch_warnings(record=True) as caught:
            try:
                out = attempt(n)
            except UserError as exc:
                failed = exc
        damaged = failed is not None or any(issubclass(w.category, OneLineWarning) for w in caught)
        if damaged and time.monotonic() < deadline and being_written(path, before):
            n += 1
            time.sleep(pause)   # the writer's flush is due within a frame
            pause = min(2 * pause, 0.5)
            continue
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        if failed is None:
            return out
        if n and being_written(path, before):
            raise type(failed)(f"{failed.one_line()} (read again for {LIVE_WAIT_S:g} s while a running job "
                               "writes it; its writer may be stopped: try again later)") from None
        raise failed


def while_written(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(path, ...)`` read again from the start while ``path`` is being written (:func:`retried`)."""
    @functools.wraps(fn)
    def wrapper(path, *args, **kwargs):
        return retried(path, lambda _n: fn(path, *args, **kwargs))
    return wrapper


def check_settled(reader, error: type[UserError]) -> None:
    """Raise ``error`` (read again) when per-atom fields of ``reader`` (an ``h5md_read._Reader``
    after its set-up) end before its last committed frame while a running job holds the file's
    lock: HDF5 gave this open an older view of those fields than of the commit record, so that
    frame would lack them.  Not when the same fields ended at the same steps in the previous
    attempt while the committed frames moved on: a field that a restart with fewer
    ``trajectory.fields`` stopped writing. The same lag at the same last frame is read again:
    two opens can both get the older view while a loaded writer is between its flushes."""
    steps = reader.steps
    if reader.primary != "box" or not len(steps.get("box", ())):
        return
    last = int(steps["box"][-1])
    lag = tuple((name, int(s[-1]) if len(s) else None) for name, s in steps.items()
                if name != "box" and (not len(s) or s[-1] < last))
    previous = getattr(reader, "lag", None)   # (last committed step, lag) of the previous attempt
    if not lag or (previous is not None and previous[1] == lag and previous[0] < last) \
            or output_in_use(reader.path) is None:
        return
    reader.lag = (last, lag)
    raise error(f"{reader.path!r}: the frame at step {last} is committed but {lag[0][0]} ends at step {lag[0][1]} "
                "(read between two of a running job's flushes)")
