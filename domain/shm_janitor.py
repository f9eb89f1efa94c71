"""MPI's shared-memory segments removed after any end of a run, also an abnormal one.

MPICH keeps a node-local segment ``/dev/shm/mpich_shm_<world id>_<node>`` (~2 MB, and
``mpich_vci_...``) for the life of a job and removes it in ``MPI_Finalize``; a rank that is
killed or aborts (``MPI_Abort``, a rank that stopped answering, SIGKILL) never gets there and
the segment stays until the machine reboots. Its world id hashes a random name of the process
manager's, so no later process can tell which job left it; only the job's own ranks know it,
from their own memory map (``/proc/self/maps``).

So, right after MPI starts, the node's first rank (:func:`watch_segments`) reads the segments
it maps and starts a janitor: a detached process (its own session, no descriptors of the rank's,
standard library only: this file run as a script) that waits until every rank of the node has
ended, then removes each segment that is still there, is a regular file owned by this user, and
is mapped by no live process. A segment is removed only when it is provably the job's (its own
ranks mapped it) and its owners are dead. A job that ended normally left nothing; the janitor
then finds nothing to do. A self-launching parent also removes them itself, synchronously, from
the names the ranks note in its private folder (``NOTE_ENV``), before it returns.

Under SLURM, a requeued step's leftovers are removed at its next start as well
(domain/stale_shm.py), where the step's cgroup ended the janitor with the ranks.
"""
from __future__ import annotations

import os
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

SHM = Path("/dev/shm")
#: a folder (made private by a self-launching parent) where each node's first rank notes its segments
NOTE_ENV = "SHARDMD_SHM_NOTE"


def mapped_segments(pid: int | str = "self") -> list[str]:
    """Names of the MPICH segments under /dev/shm that process ``pid`` maps ([] if unreadable)."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return []
    names = {ln.split(None, 5)[5] for ln in lines if len(ln.split(None, 5)) == 6}
    return sorted(Path(n).name for n in names
                  if n.startswith(f"{SHM}/mpich_") and not n.endswith(" (deleted)"))


def _mapped_by_live_process(path: Path) -> bool:
    target = str(path)
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if target in (d / "maps").read_text():
                return True
        except OSError:   # gone, or another user's (who cannot map a 0600 segment of ours)
            continue
    return False


def remove_orphans(names, shm: Path = SHM) -> list[Path]:
    """Remove the segments ``names`` (bare file names) that are regular files of this user under
    ``shm`` and mapped by no live process; the paths removed."""
    removed = []
    for name in names:
        if "/" in name or not name.startswith("mpich_"):
            continue
        path = shm / name
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or _mapped_by_live_process(path):
                continue
            path.unlink()
            removed.append(path)
        except OSError:   # gone already (removed by MPI_Finalize, or by the other cleaner)
            continue
    return removed


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def wait_for_end(ranks: list[tuple[int, str]], poll_s: float = 1.0) -> None:
    """Return when every (pid, start time) process has ended (a pidfd each where the kernel
    has them: no polling; else a look at /proc every ``poll_s``)."""
    fds = []
    for pid, started in ranks:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        if _start_time(pid) != started:   # ended already (or the pid is another process now)
            if fd is not None:
                os.close(fd)
            continue
        fds.append((fd, pid, started))
    for fd, pid, started in fds:
        if fd is not None:
            select.select([fd], [], [])
            os.close(fd)
        else:
            while _start_time(pid) == started:
                time.sleep(poll_s)


def watch_segments(local_comm, local_rank: int) -> None:
    """Collective over the node's ranks (``local_comm``, mpi4py), right after MPI starts: the
    node's first rank starts the janitor for the segments it maps (and notes them for a
    self-launching parent). Never raises: a cleaner that cannot start leaves things as before."""
    try:
        ranks = local_comm.allgather((os.getpid(), _start_time(os.getpid())))
        if local_rank != 0:
            return
        names = mapped_segments()
        if not names:
            return
        _note(names)
        args = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), ",".join(names),
                *(f"{pid}:{started}" for pid, started in ranks)]
        subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True, cwd="/")
    except Exception:  # noqa: BLE001 - cleaning up is a courtesy; the run goes on regardless
        return


def _note(names: list[str]) -> None:
    """Write the names for a self-launching parent (its private folder), if there is one."""
    folder = os.environ.get(NOTE_ENV)
    if not folder:
        return
    path = Path(folder) / f"{socket.gethostname()}.{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(names) + "\n")


def noted(folder: Path) -> list[str]:
    """The segment names the ranks noted in ``folder`` (this host's notes only)."""
    names = []
    for p in Path(folder).glob(f"{socket.gethostname()}.*"):
        try:
            names += [n for n in p.read_text().split() if n]
        except OSError:
            continue
    return names


def main(argv: list[str]) -> int:
    """``python -I -S shm_janitor.py NAME[,NAME...] PID:START ...``: wait, then remove."""
    names, ranks = argv[0].split(","), []
    for item in argv[1:]:
        pid, _, started = item.partition(":")
        ranks.append((int(pid), started))
    wait_for_end(ranks)
    deadline = time.monotonic() + 60.0   # a process still mapping one (it ends too): look again
    while True:
        remove_orphans(names)
        left = [n for n in names if (SHM / n).exists()]
        if not left or time.monotonic() > deadline:
            return 0
        names = left
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
