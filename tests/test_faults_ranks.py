"""Ranks that stop answering, runs that end abnormally, launcher variables that lie.

- A rank stopped with SIGSTOP (real MPI ranks, a real signal) is found by the heartbeat
  (engine/launch/heartbeat.py): every rank ends within seconds with exit 5 and one line naming the
  silent rank, its pid and host; the checkpoints written before load and restart=auto goes on.
- An aborted run leaves no MPI shared-memory segment in /dev/shm (domain/shm_janitor.py), self-
  launched (gone when the launcher returns) and under the user's mpiexec (gone soon after).
- Stray SLURM_/PMI_/OMPI_ variables do not break a plain run: one warning names them; a SLURM
  step of several tasks without MPI wiring is refused naming its variables (domain/launcher_env.py).
- The launcher killed while a rank gets no CPU for longer than the old fixed grace: the ranks
  still stop together with a checkpoint (engine/launch/parallel.py watch_parent).

Every wait polls a condition (a file, /proc) with a generous deadline; /dev/shm is shared with
other jobs, so only the segments this test's ranks mapped are looked at.
"""
from __future__ import annotations

import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import mpiexec_cmd, run_engine, run_in_process
from faultkit import engine_procs_in

from shardmd.engine.io.checkpoint import read_checkpoint

pytestmark = pytest.mark.fault

SMALL = ["model=lj", "system.repeat=[6,6,6]", "quiet=true", "threads=1", "thermo.every=0"]
LONG = [*SMALL, "steps=1000000", "checkpoint.every=20"]


# -- helpers: real processes found through /proc ---------------------------------------------------
def wait_until(what: str, pred, timeout: float = 120.0, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rank_pid(cwd: Path, rank: int) -> int | None:
    """The pid of MPI rank ``rank`` (hydra's PMI_RANK) running in ``cwd``."""
    for pid in engine_procs_in(cwd):
        try:
            if f"PMI_RANK={rank}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                return pid
        except OSError:
            continue
    return None


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def segments_of(pid: int) -> list[Path]:
    """The MPICH /dev/shm segments process ``pid`` maps."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({Path(ln.split()[-1]) for ln in lines if "/dev/shm/mpich_" in ln})


def checkpoints(cwd: Path) -> list[Path]:
    return sorted((cwd / "run.ckpt").glob("step-*.h5"))


def start(args, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def running(cwd: Path, proc: subprocess.Popen) -> tuple[int, int]:
    """Wait until both ranks run and a checkpoint exists; (rank 0's pid, rank 1's pid)."""
    wait_until("a first checkpoint", lambda: checkpoints(cwd) or proc.poll() is not None, 240)
    assert proc.poll() is None, proc.stderr.read()
    return wait_until("both ranks", lambda: (lambda a, b: (a, b) if a and b else None)(
        rank_pid(cwd, 0), rank_pid(cwd, 1)), 60)


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.startswith("error")]


# -- 8: a rank that stops answering ------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_sigstop_of_rank_1_ends_every_rank_naming_it(tmp_path):
    """Self-launched, rank 1 SIGSTOPped: exit 5 within seconds (not gloo's 120 s timeout), one
    line naming rank 1, its pid and this host; no process left, no segment left; the checkpoints
    load and restart=auto continues from the newest."""
    proc = start([sys.executable, "-m", "engine", "run", *LONG, "domains=2", "health.rank_silence=3"], tmp_path)
    _, pid1 = running(tmp_path, proc)
    segments = segments_of(pid1)
    os.kill(pid1, signal.SIGSTOP)
    wait_until("rank 1 stopped", lambda: state(pid1) == "T", 30)
    t0 = time.monotonic()
    try:
        code = proc.wait(timeout=60)   # gloo alone waits 120 s, then exit 1
    finally:
        if proc.poll() is None:
            os.kill(pid1, signal.SIGKILL)
            proc.kill()
    took = time.monotonic() - t0
    lines = error_lines(proc.stderr.read())
    assert code == 5, lines
    assert len(lines) == 1, lines
    assert f"rank 1 (pid {pid1} on host {socket.gethostname()}) stopped answering" in lines[0]
    assert "health.rank_silence=3" in lines[0] and "restart=auto" in lines[0]
    assert took < 60
    wait_until("every rank gone", lambda: not engine_procs_in(tmp_path), 30)
    assert segments and not [s for s in segments if s.exists()], "MPI's segment is left in /dev/shm"
    ckpts = checkpoints(tmp_path)
    assert ckpts
    for ck in ckpts:
        assert read_checkpoint(ck)["step"] > 0
    last = read_checkpoint(ckpts[-1])["step"]
    r = run_engine(["run", *SMALL, "domains=2", "restart=auto", f"steps={last + 5}", "checkpoint.every=0"],
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.mpi
@pytest.mark.slow
def test_sigstop_of_rank_0_under_mpiexec_is_named_by_rank_1(tmp_path):
    """Under the user's own mpiexec, rank 0 (the writer) stopped: rank 1 names it; mpiexec
    exits 5; the shared-memory segment goes once every rank has ended."""
    proc = start(mpiexec_cmd(2, ["-m", "engine", "run", *LONG, "health.rank_silence=3"]), tmp_path)
    pid0, _ = running(tmp_path, proc)
    segments = segments_of(pid0)
    os.kill(pid0, signal.SIGSTOP)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(pid0, signal.SIGKILL)
            proc.kill()
    lines = error_lines(proc.stderr.read())
    assert code == 5, lines
    assert len(lines) == 1 and lines[0].startswith("error (rank 1): "), lines
    assert f"rank 0 (pid {pid0} on host {socket.gethostname()}) stopped answering" in lines[0]
    wait_until("the segment removed", lambda: segments and not [s for s in segments if s.exists()], 60)
    for ck in checkpoints(tmp_path):
        read_checkpoint(ck)


@pytest.mark.mpi
@pytest.mark.slow
def test_busy_machine_and_collective_waits_do_not_trip_the_heartbeat(tmp_path):
    """Both cores busy with spinning processes, a silence limit of 2 s: ranks that are slow and
    wait on each other's collectives keep beating; the run ends normally."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        r = run_engine(["run", *SMALL, "domains=2", "steps=300", "checkpoint.every=100", "health.rank_silence=2"],
                       cwd=tmp_path, timeout=400)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert r.returncode == 0, r.stderr
    assert "stopped answering" not in r.stderr
    assert read_checkpoint(checkpoints(tmp_path)[-1])["step"] == 300


# -- 9: no shared-memory segment after an abnormal end ---------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_killed_rank_of_a_self_launched_run_leaves_no_segment(tmp_path):
    proc = start([sys.executable, "-m", "engine", "run", *LONG, "domains=2"], tmp_path)
    _, pid1 = running(tmp_path, proc)
    segments = segments_of(pid1)
    assert segments, "MPICH maps no /dev/shm segment here: the test would not cover it"
    os.kill(pid1, signal.SIGKILL)
    code = proc.wait(timeout=600)
    assert code != 0
    left = [s for s in segments if s.exists()]
    assert not left, f"{left} left in /dev/shm after the launcher returned"


@pytest.mark.mpi
@pytest.mark.slow
def test_killed_rank_under_mpiexec_leaves_no_segment(tmp_path):
    proc = start(mpiexec_cmd(2, ["-m", "engine", "run", *LONG]), tmp_path)
    _, pid1 = running(tmp_path, proc)
    segments = segments_of(pid1)
    assert segments
    os.kill(pid1, signal.SIGKILL)
    assert proc.wait(timeout=600) != 0
    wait_until("the segment removed", lambda: not [s for s in segments if s.exists()], 60)


def test_only_this_users_unmapped_segments_are_removed(tmp_path):
    from shardmd.domain.shm_janitor import remove_orphans

    for name in ("mpich_shm_0badf00d_0", "mpich_shm_mapped_0", "ucx_shm_x"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "mpich_shm_link_0").symlink_to(outside)
    (tmp_path / "mpich_shm_dir_0").mkdir()
    with open(tmp_path / "mpich_shm_mapped_0", "r+b") as f, mmap.mmap(f.fileno(), 4096):   # a live owner
        removed = remove_orphans(["mpich_shm_0badf00d_0", "mpich_shm_mapped_0", "ucx_shm_x", "mpich_shm_link_0",
                                  "mpich_shm_dir_0", "../outside", "mpich_shm_missing_0"], shm=tmp_path)
    assert [p.name for p in removed] == ["mpich_shm_0badf00d_0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_dir_0", "mpich_shm_link_0",
                                                          "mpich_shm_mapped_0", "outside", "ucx_shm_x"]
    assert outside.read_bytes() == b"keep"


# -- 10: stray launcher variables ------------------------------------------------------------------
STRAYS = [
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "not inside an srun step"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "77"}, "not inside an srun step"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "no PMI_FD or PMI_PORT"),
    ({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, "no PMI_FD or PMI_PORT"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "no PMIX_SERVER_URI"),
    ({"PMIX_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "no PMIX_SERVER_URI"),
]


#: launcher variables a test's own environment must not carry (it is a plain run's)
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMIX_RANK", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID",
                 "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def clean_launcher_env(monkeypatch):
    from shardmd.engine.launch import parallel
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(parallel, "_WARNED", set(), raising=False)   # the warning is said once a process
    return monkeypatch


@pytest.mark.parametrize("env, why", STRAYS, ids=lambda v: "+".join(v) if isinstance(v, dict) else None)
def test_stray_launcher_variables_are_named_and_ignored(tmp_path, capfd, clean_launcher_env, env, why):
    for k, v in env.items():
        clean_launcher_env.setenv(k, v)
    code, lines = run_in_process(["run", "model=lj", "system.repeat=[3,3,3]", "quiet=true", "threads=1", "steps=3"],
                                 tmp_path, capfd, clean_launcher_env)
    assert code == 0, lines
    assert len(lines) == 1, lines
    named = [f"{k}={v}" for k, v in env.items() if k != "SLURM_JOB_ID"]   # the variables that claim ranks
    assert all(n in lines[0] for n in named) and why in lines[0], lines
    assert "domains 1" in (tmp_path / "run.log").read_text()


def test_slurm_step_without_mpi_wiring_is_refused_naming_it(tmp_path, capfd, clean_launcher_env):
    """srun --mpi=none with 2 tasks: each task would run the whole job alone on one output."""
    for k, v in {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}.items():
        clean_launcher_env.setenv(k, v)
    code, lines = run_in_process(["run", "model=lj", "system.repeat=[3,3,3]", "quiet=true", "steps=3"],
                                 tmp_path, capfd, clean_launcher_env)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "SLURM_PROCID=0, SLURM_NTASKS=2" in lines[0] and "step 77.0" in lines[0]
    assert "srun --mpi=pmi2" in lines[0]
    assert not (tmp_path / "run.h5").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_stray_variables_do_not_break_a_self_launched_run(tmp_path):
    """domains=2 beside a stray SLURM_PROCID/SLURM_NTASKS=3: two ranks of its own, one warning."""
    r = run_engine(["run", *SMALL, "domains=2", "steps=20", "checkpoint.every=0"], cwd=tmp_path,
                   env={"SLURM_PROCID": "1", "SLURM_NTASKS": "3"})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [ln for ln in lines if ln.startswith("Warning: ignoring SLURM_PROCID=1, SLURM_NTASKS=3")], lines
    assert len(lines) == 1
    assert "domains 2" in (tmp_path / "run.log").read_text()


# -- 15: the launcher killed while the machine is busy ---------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_sigkill_of_the_launcher_while_a_rank_gets_no_cpu_still_checkpoints(tmp_path):
    """A rank that gets no CPU for longer than the old fixed 6 s grace (here: SIGSTOP for 10 s,
    the extreme of a busy machine) while the launcher is killed: rank 0 waits for it instead of
    ending itself; both stop together with a checkpoint once it runs again."""
    proc = start([sys.executable, "-m", "engine", "run", *SMALL, "domains=2", "steps=1000000", "checkpoint.every=0"],
                 tmp_path)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)
    reader.start()
    wait_until("the run's first frame", lambda: (tmp_path / "run.log").exists()
               and "Step" in (tmp_path / "run.log").read_text() or proc.poll() is not None, 240)
    pid0, pid1 = wait_until("both ranks", lambda: (lambda a, b: (a, b) if a and b else None)(
        rank_pid(tmp_path, 0), rank_pid(tmp_path, 1)), 60)
    os.kill(pid1, signal.SIGSTOP)
    wait_until("rank 1 stopped", lambda: state(pid1) == "T", 30)
    proc.kill()
    proc.wait()
    try:
        wait_until("rank 0 saw the launcher go", lambda: any("rank 0: the launching process" in s for s in said), 60)
        # 10 s without CPU for rank 1; a rank 0 that ends itself meanwhile loses the checkpoint
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and state(pid0) != "gone":
            time.sleep(0.2)
        alive = state(pid0) not in ("gone", "Z")
    finally:
        try:
            os.kill(pid1, signal.SIGCONT)
        except ProcessLookupError:   # killed by MPI's launcher after rank 0 ended itself
            pass
    assert alive, "rank 0 ended itself while rank 1 could not run"
    wait_until("every rank gone", lambda: not engine_procs_in(tmp_path), 120)
    ckpts = checkpoints(tmp_path)
    assert ckpts, "the ranks stop as on SIGTERM and checkpoint"
    assert read_checkpoint(ckpts[-1])["step"] >= 1


def test_heartbeat_judges_ranks_only_and_names_the_silent_one():
    """Rank 0's side over real sockets: a stranger on its port (no hello, or garbage) is dropped
    and never blamed; a rank that introduced itself and then fell silent is reported, named."""
    from shardmd.engine.launch.heartbeat import Heartbeat

    lost = []
    hb = Heartbeat(0, 3, 0.5, lost=lambda peer, silent: lost.append((peer.rank, peer.host, peer.pid, silent)))
    address = hb.listen("127.0.0.1")
    hb.start()
    strangers = [socket.create_connection(address[:2]) for _ in range(2)]
    strangers[1].sendall(b"GET / HTTP/1.0\n")
    rank2 = socket.create_connection(address[:2])
    rank2.sendall(b"2 node-b 4242\n")
    wait_until("the silent rank reported", lambda: lost, 30, poll=0.05)
    assert lost[0][:3] == (2, "node-b", 4242) and lost[0][3] > 0.5
    assert len(lost) == 1
    for s in [*strangers, rank2]:
        s.close()


def test_heartbeat_ends_a_wait_on_a_rank_whose_process_ended():
    """A rank blocked in MPI never sees its partner die (gloo's connection would break): rank 0's
    heartbeat, told by domain/comm.mpi_wait that the main thread waits, reports a peer whose
    socket closed (its process ended), but only during a wait and only after GONE_WAIT_S."""
    import time

    from shardmd.domain.comm import mpi_wait, mpi_waiting_since
    from shardmd.engine.launch.heartbeat import GONE_WAIT_S, Heartbeat

    lost = []
    hb = Heartbeat(0, 2, 60.0, lost=lambda peer, silent: lost.append((peer.rank, peer.pid, silent, time.monotonic())))
    address = hb.listen("127.0.0.1")
    hb.start()
    rank1 = socket.create_connection(address[:2])
    rank1.sendall(b"1 node-b 4343\n")
    wait_until("rank 1 introduced", lambda: any(p.rank == 1 for p in hb.peers.values()), 30, poll=0.05)
    rank1.close()                    # its process ended while no one waited for it: the run's end
    wait_until("the end seen", lambda: hb.gone, 30, poll=0.05)
    assert not lost and mpi_waiting_since() is None
    with mpi_wait():                 # now the main thread waits in MPI: nothing can complete it
        t0 = time.monotonic()
        wait_until("the ended rank reported", lambda: lost, 30 + GONE_WAIT_S, poll=0.05)
    assert mpi_waiting_since() is None
    rank, pid, silent, when = lost[0]
    assert (rank, pid) == (1, 4343) and silent < 0 and when - t0 >= GONE_WAIT_S
    hb.close()
