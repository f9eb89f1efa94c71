"""A trajectory damaged past reading is set aside, never overwritten: moved to
``<name>.damaged-<n>`` (a hard link, then an unlink; an existing name is never replaced) so
that a new one can start in its place; plus the small checks the writer's append path makes
first (empty, HDF5 signature, held by another process). The rule: docs/design.md,
"Appending after a kill"; the rebuild of a readable one: engine/io/h5md_salvage.py."""
from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass

import h5py

from shardmd.engine.io.safe_io import error_errno, fsync_dir, output_error

_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _unique_damaged(path: str) -> str:
    for n in range(1, 10000):
        cand = f"{path}.damaged-{n}"
        if not os.path.lexists(cand):
            return cand
    raise FileExistsError(errno.EEXIST, "too many damaged copies", f"{path}.damaged-*")


@dataclass
class Fresh:
    """What :func:`rebuild` did with a file damaged past reading: moved it to ``kept``."""

    kept: str
    reason: str   # HDF5's reason it could not be read

    def line(self, path: str) -> str:
        """The one-line report."""
        return (f"trajectory {path!r} could not be read (HDF5: {self.reason}): moved to {self.kept!r} "
                "as it was, and a new trajectory was started in its place")


def empty_line(path: str) -> str:
    """The one-line report for a trajectory found empty at a restart (started anew in place)."""
    return (f"trajectory {path!r} was empty (0 bytes, what a writer killed while creating it leaves): "
            "a new trajectory was started in its place")


def is_hdf5(path: str) -> bool:
    """``h5py.is_hdf5``, with the OS's failure to read the file (a permission) as a one-line
    OutputError rather than h5py's PermissionError."""
    try:
        return h5py.is_hdf5(path)
    except OSError as exc:
        raise output_error("reopen trajectory", path, exc) from None


def damaged(path: str, cause: BaseException) -> bool:
    """True when ``path`` is taken for our trajectory, damaged: it starts with the HDF5
    signature (the writer never writes a user block, so ours always do) and reading it
    failed in HDF5's decoding, not in the OS (``cause`` carries no errno: a permission or
    I/O error says nothing about the bytes and keeps its one-line error)."""
    if error_errno(cause) is not None:
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == _SIGNATURE
    except OSError:
        return False


def set_aside(path: str) -> str:
    """Give the file at ``path`` the first free name ``<path>.damaged-<n>`` and return it:
    a hard link then an unlink (``link`` never replaces an existing name, so a concurrent
    or earlier ``.damaged-<n>`` is never overwritten; one that already is this file, left by
    an attempt killed between the two, is reused); a rename checked just before where the
    file system has no hard links.  Raises OSError with ``path`` unchanged."""
    directory = os.path.dirname(os.path.abspath(path))
    for n in range(1, 10000):
        cand = f"{path}.damaged-{n}"
        made = True
        try:
            os.link(path, cand)
        except FileExistsError:
            made = False
            try:
                if not os.path.samefile(cand, path):
                    continue
            except OSError:
                continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
                raise
            if os.path.lexists(cand):
                continue
            os.rename(path, cand)
            fsync_dir(directory)
            return cand
        try:
            os.unlink(path)
        except OSError:
            if made:
                try:
                    os.unlink(cand)
                except OSError:
                    pass
            raise
        fsync_dir(directory)
        return cand
    raise FileExistsError(errno.EEXIST, "too many damaged copies", f"{path}.damaged-*")


class Unreadable(Exception):
    """The original cannot be read (read-only open or the rows that count); ``cause`` is
    HDF5's or the OS's error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SetAsideError(Exception):
    """A damaged file could not be moved aside (the OSError is the ``__cause__``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotATrajectory(KeyError):
    """An intact HDF5 file without the trajectory layout (``/particles/all`` with species,
    mass and box is not there): not ours, never rebuilt nor moved."""


class FileBusy(OSError):
    """Another process has the file open (HDF5's lock, or ours): it must not be rebuilt."""


def _lock(path: str) -> int:
    """An fd of ``path`` holding an exclusive ``flock``, the lock HDF5 takes for writing: a
    running writer (or reader that locks) of the file makes this fail with FileBusy."""

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise FileBusy(exc.errno, "open in another running process", path) from None
        if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # no locks here
    return fd
