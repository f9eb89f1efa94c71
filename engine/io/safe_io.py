"""Small helpers for writing output files safely (trajectory, checkpoints, converted files).

* :func:`output_error` turns an OS or HDF5 write failure into a one-line
  :class:`~shardmd.engine.errors.OutputError` (exit status 4): what failed, the path, the
  OS reason ("No space left on device") and the fix.
* :func:`os_reason` / :func:`error_errno` dig the errno out of h5py's errors, which come
  as ``OSError`` (with ``errno`` set) from some calls and as ``RuntimeError`` (errno only
  inside the message, ``errno = 28, error message = 'No space left on device'``) from
  others, e.g. ``File.flush`` and object closes.
* :func:`free_bytes` is a cheap (about 1 us) ``fstatvfs`` of an open file's file system.
* :func:`fence_fd` makes an open file descriptor read-only in place, so that nothing more
  reaches the file through it (used after a failed trajectory write: HDF5 would otherwise
  keep flushing dirty metadata of the failed frame at close).
* :func:`fsync_dir` makes a rename durable.
* :func:`check_output_path` gives the one-line UserError for an output path that is a
  directory or whose parent directory does not exist.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from shardmd.engine.errors import OutputError, UserError

_MESSAGE = re.compile(r"error message = '([^']*)'")
_ERRNO = re.compile(r"errno = (\d+)")
#: HDF5 / h5py errors that mean "the write did not happen"; h5py raises both
IO_ERRORS = (OSError, RuntimeError)


def error_errno(exc: BaseException) -> int | None:
    """The errno behind an OSError or an h5py OSError/RuntimeError, None if there is none."""
    e = getattr(exc, "errno", None)
    if isinstance(e, int) and e > 0:
        return e
    m = _ERRNO.search(str(exc))
    if m and int(m.group(1)) > 0:
        return int(m.group(1))
    return None


def os_reason(exc: BaseException) -> str:
    """Short reason of an I/O failure: the OS's text for its errno, else HDF5's first words."""
    e = error_errno(exc)
    if e:
        return os.strerror(e)
    m = _MESSAGE.search(str(exc))
    if m:
        return m.group(1)
    text = " ".join(str(getattr(exc, "strerror", None) or exc).split())
    if len(text) > 160:
        text = text[:157] + "..."
    return text or type(exc).__name__


def fix_hint(exc: BaseException | None, option: str = "output=") -> str:
    """What to do about a failed write, by errno."""
    e = error_errno(exc) if exc is not None else None
    if e in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"free space or choose another {option}"
    if e in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"make the directory writable or choose another {option}"
    if e == errno.EIO:
        return f"check the disk (I/O error) or choose another {option}"
    return f"check the file system or choose another {option}"


def output_error(what: str, path: str | os.PathLike, exc: BaseException | None, *,
                 reason: str | None = None, fix: str | None = None, option: str = "output=",
                 tail: str = "") -> OutputError:
    """``cannot <what> '<path>': <reason>; <fix>[; <tail>]`` as an OutputError (exit 4)."""
    reason = reason or (os_reason(exc) if exc is not None else "write failed")
    fix = fix or fix_hint(exc, option)
    msg = f"cannot {what} {os.fspath(path)!r}: {reason}; {fix}"
    if tail:
        msg += f"; {tail}"
    return OutputError(" ".join(msg.split()))


def free_bytes(fd: int) -> int | None:
    """Bytes this process may still write on the file system of open file ``fd``.

    None when unknown (the call fails, or the file system reports no size at all, as some
    FUSE and network file systems do).  Root may use the blocks reserved for it.  Quotas
    are not seen here (the write itself then reports EDQUOT).
    """
    try:
        st = os.fstatvfs(fd)
    except (OSError, ValueError):
        return None
    if st.f_blocks == 0 or st.f_frsize == 0:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks) * int(st.f_frsize)


def fence_fd(fd: int, path: str | os.PathLike) -> bool:
    """Replace open descriptor ``fd`` by a read-only one of the same file (dup2).

    Every later write or truncate through ``fd`` then fails (EBADF) and nothing more
    reaches the file; reads still work.  The same inode is reopened through
    ``/proc/self/fd`` where that exists (immune to renames), else by path, else
    ``/dev/null``.  Returns False if the descriptor could not be fenced.
    """
    for src in (f"/proc/self/fd/{fd}", os.fspath(path), os.devnull):
        try:
            ro = os.open(src, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            os.dup2(ro, fd)
            return True
        except OSError:
            return False
        finally:
            os.close(ro)
    return False


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory so that a rename in it is durable.

    File systems that cannot fsync a directory (EINVAL, ENOTSUP, EBADF) are passed over;
    any other failure (EIO, ...) is raised as OSError.
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # cannot open it to sync: nothing to do
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """UserError (exit 2) for an output path that is a directory or has no parent directory."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{what} {str(p)!r} is a directory; give a file name (e.g. {str(p / 'out')!r})")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise UserError(f"the directory of {what} {str(p)!r} does not exist; create {str(parent)!r} "
                        "or choose another path")
    if not parent.is_dir():
        raise UserError(f"{what} {str(p)!r}: {str(parent)!r} is not a directory")
    return p


#: longest name of one path component most file systems take (ext4, xfs, btrfs, NFS: bytes)
NAME_MAX = 255


def name_problem(path: str | os.PathLike) -> str | None:
    """Why the OS would refuse ``path`` as a name (a component over NAME_MAX bytes, a NUL), or None."""
    text = os.fspath(path)
    if "\x00" in text:
        return "its name holds a NUL character"
    for part in Path(text).parts:
        n = len(os.fsencode(part))
        if n > NAME_MAX:
            short = part if len(part) <= 24 else part[:12] + "..." + part[-8:]
            return (f"the name {short!r} is {n} bytes, longer than file systems allow ({NAME_MAX} bytes per "
                    "name); give a shorter name")
    return None


def input_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a regular file to read, in words (no such file, a directory, a named pipe,
    a device such as /dev/zero, a socket, a name too long), or None when it is one."""
    import stat

    bad = name_problem(path)
    if bad:
        return bad
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    return "is not a regular file"
