"""The lock that keeps a running job's outputs safe: one job per ``output`` at a time.

A run holds an exclusive ``flock`` on ``<output>.lock`` (beside the trajectory) from before it
touches any output (trajectory, log, checkpoints, relaxed structure) until it has closed them.
A second run on the same ``output`` (``overwrite=true`` or not, fresh or restart) meets the held
lock and is refused in one line naming the running job (pid, host, since when) before it
truncates, creates or appends anything.  The kernel decides who wins, so two runs started at
the same instant cannot both get it.

Why a file of its own and not HDF5's lock on the trajectory: HDF5 opens a file with
``O_TRUNC`` (mode "w") before it takes its lock, so the lock check came after the damage; and
the log and the checkpoint folder have no HDF5 lock at all.

Safety of the predictable name: opened with ``O_NOFOLLOW`` (a symbolic link planted there is
refused, never followed), ``O_NONBLOCK`` and ``O_CLOEXEC`` without ``O_TRUNC``; the holder's
line is written only after the lock is held and only into a regular file with one link that
this user owns.  ``flock`` locks belong to the open file description: a second open in the same
process conflicts too, and the lock goes when the process dies (``kill -9`` leaves a stale file,
which the next run simply locks).  On release the file is removed while still locked; a run
that locked a file just removed sees that its inode is no longer the path's and tries again.
NFS: Linux maps ``flock`` to byte-range locks there, which work across clients.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
import weakref
from pathlib import Path

from shardmd.engine.errors import CollectiveError, UserError

#: name of the lock beside the output: ``run.h5`` -> ``run.h5.lock``
SUFFIX = ".lock"


def lock_path(output: str | os.PathLike) -> Path:
    """``<output>.lock``, beside the output."""
    p = Path(output)
    return p.with_name(p.name + SUFFIX)


def _holder_line(fd: int) -> str:
    """What the holder wrote: ``pid N on host H since T (command)``; '' while it writes."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace")
    except OSError:
        return ""
    return " ".join(text.split())


def _busy(output: str, path: Path, holder: str) -> UserError:
    who = holder or "a process that is starting (no pid written yet)"
    return UserError(f"output {output!r} is open in another running process: {who} (it holds {str(path)!r}); "
                     "wait for it to end or stop it, or choose another output=")


def _open(path: Path, output: str) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"output {output!r}: its lock {str(path)!r} is a symbolic link, which is never "
                            "followed; remove it or choose another output=") from None
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise UserError(f"output {output!r}: cannot create or open its lock {str(path)!r} ({exc.strerror}); "
                            "make the folder writable, remove the file if another user left it, or choose "
                            "another output=") from None
        raise UserError(f"output {output!r}: cannot open its lock {str(path)!r} ({exc.strerror}); "
                        "choose another output=") from None


def _check_ours(fd: int, path: Path, output: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        what = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
                "has other hard links" if st.st_nlink != 1 else "belongs to another user")
        raise UserError(f"output {output!r}: its lock {str(path)!r} {what}; remove it or choose another output=")
    return st


class OutputLock:
    """An exclusive lock on ``output``'s lock file, held until :meth:`release` (or until this
    object is garbage-collected, or the process ends).

    ``OutputLock(output, command="run")`` blocks nothing: it takes the lock or raises at once a
    one-line :class:`~shardmd.engine.errors.UserError` naming the job that holds it.
    """

    def __init__(self, output: str | os.PathLike, command: str = "run"):
        self.output = os.fspath(output)
        self.path = lock_path(output)
        self._fd: int | None = None
        # a retry: another run released (removed) the file between our open and our lock, or
        # the lock is held without a holder line (a quick look by output_in_use, or a holder
        # between its lock and its write): up to ~0.5 s of those before calling it busy
        self.path.parent.mkdir(parents=True, exist_ok=True)   # output=new/dir/run.h5
        for attempt in range(100):
            fd = _open(self.path, self.output)
            try:
                st = _check_ours(fd, self.path, self.output)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder_line(fd)
                    if not holder and attempt < 50:
                        os.close(fd)
                        time.sleep(0.01)
                        continue
                    raise _busy(self.output, self.path, holder) from None
                try:
                    now = os.lstat(self.path)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)   # the holder removed it as it released: lock the file that is there now
                    continue
                os.ftruncate(fd, 0)
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {stamp} "
                              f"(python -m engine {command})\n".encode(), 0)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            self._finalizer = weakref.finalize(self, _release, fd, str(self.path))
            return
        raise UserError(f"output {self.output!r}: its lock {str(self.path)!r} keeps being replaced by other "
                        "processes; choose another output=")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file (while still holding it) and unlock; further calls do nothing."""
        if self._fd is not None:
            self._fd = None
            self._finalizer()

    def __enter__(self) -> "OutputLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _release(fd: int, path: str) -> None:
    try:
        st, now = os.fstat(fd), os.lstat(path)
        if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
            os.unlink(path)
    except OSError:   # gone already, or the folder is read-only now: the unlock below is what counts
        pass
    try:
        os.close(fd)   # closing the last descriptor releases the flock
    except OSError:
        pass


def output_in_use(output: str | os.PathLike) -> str | None:
    """The one-line refusal for an ``output`` whose lock a running job holds, else None.

    Creates nothing: a missing lock file means no job holds it.  A quick look only (the holder
    may end a moment later, another job may start); what counts is :class:`OutputLock`."""
    path = lock_path(output)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:   # none, or one we may not open: OutputLock gives the line when it matters
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return str(_busy(os.fspath(output), path, _holder_line(fd)))
        except OSError:
            return None
        return None
    finally:
        os.close(fd)   # also drops the shared lock taken above


def refuse_if_in_use(comm, output: str | os.PathLike) -> None:
    """CollectiveError on every rank of ``comm`` when rank 0 finds ``output`` held by a running
    job (:func:`output_in_use`); rank 0's line names it.  Collective."""
    busy = output_in_use(output) if comm.is_root else None
    if comm.any(busy is not None):
        raise CollectiveError(busy or "the output is open in another running process (rank 0 says which)")
