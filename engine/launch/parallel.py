"""Running under MPI: the launcher's ranks, or launching our own.

- Under ``mpirun``/``mpiexec``/``srun`` or ``torchrun`` (world size W) the engine uses those ranks;
  ``domains`` defaults to W and any other value is an error.
- Started alone with ``domains=K > 1`` the engine starts K local ranks through the installed
  MPI's launcher (oversubscribing when needed), streams their output and returns their exit
  status.
- An error on one rank ends every rank (MPI abort); errors every rank meets alike (bad
  configuration, impossible decomposition) are printed once, by rank 0.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from shardmd.domain.launcher_env import detect


def under_launcher() -> bool:
    """Whether a launcher (mpiexec/mpirun/srun with MPI wiring, torchrun) started this process
    (domain/launcher_env.py). Variables that form no launcher are ignored with one warning naming
    them (once a process); a SLURM step that gave several tasks no MPI wiring is refused (exit 2)."""
    found = detect()
    if found.refusal:
        from shardmd.engine.errors import UserError

        raise UserError(found.refusal)
    text = found.warning()
    if text and text not in _WARNED:
        import warnings

        from shardmd.engine.errors import OneLineWarning

        _WARNED.add(text)
        warnings.warn(text, OneLineWarning, stacklevel=2)
    return found.active


_WARNED: set[str] = set()


def default_threads(ranks: int, env=os.environ, load: float | None = None) -> int:
    """torch threads per rank for ``threads=0`` (:func:`thread_choice`'s count)."""
    return thread_choice(ranks, env, load)[0]


def _positive(value: str) -> int | None:
    try:
        n = int(str(value).split(",")[0])
    except ValueError:
        return None
    return n if n > 0 else None


def thread_choice(ranks: int, env=os.environ, load: float | None = None) -> tuple[int, str]:
    """(torch threads per rank for ``threads=0``, why): 1 under MPI (ranks share the node's
    cores); one rank: ``OMP_NUM_THREADS`` when set (the variable every OpenMP code honours),
    else ``SLURM_CPUS_PER_TASK`` (a job's cores, also where SLURM binds none), else the cores
    this process may run on (a taskset or cgroup CPU set, not the whole node) that are not
    busy: less the 1-minute load average (``load``; default ``os.getloadavg``), at least one.
    Threads on cores that other processes keep busy wait for each other at every parallel
    operation: MACE at 864 atoms on two busy cores ran 1.2-2x slower on 2 threads than on 1
    (docs/benchmarks.md, "Threads on a busy machine")."""
    if ranks > 1:
        return 1, f"one per rank of {ranks}"
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        n = _positive(env.get(name, ""))
        if n is not None:
            return n, name
    try:
        cores, where = max(len(os.sched_getaffinity(0)), 1), "the cores this process may use"
    except (AttributeError, OSError):   # no affinity call here (macOS)
        cores, where = max(os.cpu_count() or 1, 1), "the machine's cores"
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    free = max(1, min(cores, cores - int(round(load))))
    if free < cores:
        return free, f"{where}, {cores}, less the busy ones: load {load:.1f}"
    return cores, where


def env_rank() -> int:
    """This process's rank as its launcher announced it (0 without a launcher, and with stray
    variables that form none: domain/launcher_env.py)."""
    return detect().rank


def env_size() -> int:
    """The job's rank count as its launcher announced it (1 without a launcher)."""
    return detect().size


def find_mpiexec() -> str | None:
    """The launcher of the MPI mpi4py uses: beside this Python first (PyPI wheels), then PATH."""
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        if (here / name).exists():
            return str(here / name)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    return None


def launch_command(n: int, argv: list[str]) -> list[str]:
    exe = find_mpiexec()
    if exe is None:
        from shardmd.engine.errors import UserError

        raise UserError(f"domains={n} needs an MPI launcher (mpiexec) and none was found; install one "
                        "(pip install mpich) or start the job with your site's mpirun/srun")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    cmd = [exe, "-n", str(n)]
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd + [sys.executable, "-m", "engine", *argv]


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _rank_pids(launcher_pid: int) -> list[int]:
    """Our rank processes among the launcher's descendants (python running engine)."""
    pids = []
    for p in _descendants(launcher_pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"python") or b"python3" in c for c in cmd[:1]) and b"engine" in cmd:
            pids.append(p)
    return pids


def launch_self(n: int, argv: list[str]) -> int:
    """Run ``python -m engine <argv>`` on n local ranks; return the launcher's exit status.

    SIGTERM, SIGINT and SIGUSR1 sent to this process are forwarded to every rank (not to the
    launcher, which might kill them), so the ranks stop together and checkpoint."""
    import signal

    from shardmd.engine.launch.stop import PENDING_ENV, early_signal

    cmd = launch_command(n, argv)
    env = dict(os.environ, SHARDMD_SELF_LAUNCHED="1", PYTHONUNBUFFERED="1",
               SHARDMD_PARENT=f"{os.getpid()}:{_start_time(os.getpid())}")
    for stray in detect(env).stray:   # ignored here (one warning), not handed to the ranks
        env.pop(stray.split("=", 1)[0], None)
    if early_signal():   # came while this process started: the ranks begin with it
        env[PENDING_ENV] = early_signal()
    unsent: list[int] = []   # signals that found no rank yet (the ranks were still starting)

    def forward(signum, frame=None):
        pids = _rank_pids(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        if not pids and signum not in unsent:
            unsent.append(signum)

    import tempfile

    from shardmd.domain.shm_janitor import NOTE_ENV

    env[NOTE_ENV] = note = tempfile.mkdtemp(prefix="shardmd-shm-")   # private (0700), unpredictable
    proc = subprocess.Popen(cmd, env=env)
    old = {}
    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        s = getattr(signal, name, None)
        if s is not None:
            old[s] = signal.signal(s, forward)
    if early_signal() and PENDING_ENV not in env:   # came between the start and the line above
        unsent.append(signal.Signals[early_signal()])
    try:
        while True:
            try:
                return proc.wait(timeout=0.2 if unsent else None)
            except subprocess.TimeoutExpired:   # a signal waits for the ranks to appear
                if _rank_pids(proc.pid):
                    for s in unsent:
                        forward(s)
                    unsent.clear()
            except KeyboardInterrupt:  # pragma: no cover - handler above replaces it
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _remove_segments(note)


def _remove_segments(note: str) -> None:
    """After the ranks ended: their MPI shared-memory segments that are left (an abnormal end:
    MPI_Finalize never ran) and mapped by no live process; the note folder too."""
    from shardmd.domain.shm_janitor import noted, remove_orphans

    remove_orphans(noted(Path(note)))
    shutil.rmtree(note, ignore_errors=True)


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc): with the pid, a name no
    later process can take. Empty where /proc is missing."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


#: seconds between the watchdog's looks at the launching process; the grace a rank has to end
#: after its run ended (checkpoint written); the longest a stop may take before that (a set-up,
#: a first compile, a step and a checkpoint on a busy machine: a fixed 6 s from the signal ended
#: loaded ranks before their checkpoint)
WATCH_EVERY, WATCH_GRACE, WATCH_LIMIT = 0.5, 10.0, 600.0


def watch_parent() -> None:
    """In a rank the engine started itself: when the launching process is gone (killed with
    SIGKILL, which it cannot forward), stop this rank as SIGTERM would (all ranks stop at a
    common step and checkpoint), and end it outright ``WATCH_GRACE`` s after its run ended
    (stop.RUN_ENDED), or ``WATCH_LIMIT`` s after the signal if the run never gets there (a
    rank that cannot stop must not outlive its launcher for ever). A daemon thread."""
    import signal
    import threading
    import time

    from shardmd.engine.launch.stop import RUN_ENDED

    spec = os.environ.get("SHARDMD_PARENT", "")
    pid, _, started = spec.partition(":")
    if not pid.isdigit():
        return

    def alive() -> bool:
        return _start_time(int(pid)) == started if started else Path(f"/proc/{pid}").exists()

    def watch() -> None:
        while alive():
            time.sleep(WATCH_EVERY)
        sys.stderr.write(f"rank {env_rank()}: the launching process {pid} is gone; stopping\n")
        os.kill(os.getpid(), signal.SIGTERM)
        RUN_ENDED.wait(WATCH_LIMIT)
        time.sleep(WATCH_GRACE)
        os._exit(1)

    threading.Thread(target=watch, name="shardmd-parent-watch", daemon=True).start()


def job_comm(device: str = "cpu", rank_silence: float = 30.0):
    """The process's :class:`~shardmd.domain.comm.Comm` for Python API runs: the launcher's ranks
    (mpiexec, srun, torchrun) joined into one process group on first use, then reused by every
    Simulation of the process; a single rank without a launcher.  The group is ended when the
    process exits normally; an uncaught exception on one rank ends every rank (as on the CLI)
    instead of leaving the others waiting in a collective."""
    global _JOB_COMM
    if _JOB_COMM is not None:
        return _JOB_COMM
    from shardmd.domain.comm import init_comm

    comm = init_comm(device)
    _JOB_COMM = comm
    if comm.size > 1:
        import atexit

        from shardmd.engine.launch.heartbeat import start

        start(comm, rank_silence)   # health.rank_silence of the first Simulation (engine/launch/heartbeat.py)

        previous = sys.excepthook

        def end_all(kind, value, tb):
            previous(kind, value, tb)
            sys.stderr.flush()
            comm.abort(1)

        sys.excepthook = end_all
        atexit.register(_end_job_comm)
    return comm


_JOB_COMM = None


def exit_now(code: int | None) -> None:
    """End a ``python -m engine`` process with ``code`` once its work is done: streams flushed,
    MPI finalized, then ``os._exit``, skipping the interpreter's teardown of torch, Warp and
    every module, which was most of the time between a SIGTERM stop's checkpoint and the rank's
    end (scripts/bench_stop.py; why: docs/design.md, "Ending the process"). Taken only when
    nothing is left to lose: with an HDF5 file still open (HDF5 writes data out on close) the
    normal exit runs instead."""
    code = 0 if code is None else code
    if not isinstance(code, int):   # sys.exit's rule: a message is printed, the status is 1
        sys.exit(code)
    h5py = sys.modules.get("h5py")
    if h5py is not None and h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed or broken pipe: nothing more can reach it
            pass
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()   # MPICH removes its node segment here; mpiexec sees a clean end
    os._exit(code)


def _end_job_comm() -> None:
    from shardmd.domain.comm import shutdown

    if _JOB_COMM is not None:
        shutdown(_JOB_COMM)


__all__ = ["env_rank", "env_size", "exit_now", "find_mpiexec", "job_comm", "launch_self", "under_launcher"]
