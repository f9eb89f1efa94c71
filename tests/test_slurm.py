"""The engine under a real SLURM: slurmctld, slurmd and munge on this machine
(scripts/slurm/localslurm), real srun/sbatch/scancel, the job scripts users copy
(scripts/slurm/*.sbatch, shown in README "Clusters (SLURM)").

The module fixture starts the daemons, or finds them running; where they cannot start (no
SLURM installed and no permission to install it, a port taken, not root) every test skips
with the reason, and tests/conftest.py prints the tier's status line at the end of the run.
Where SLURM is missing, the tier apt-gets it only on a machine it may change: running as root
with apt-get (a CI machine or a container), unless SHARDMD_SLURM_INSTALL=0; elsewhere it installs
nothing and skips. So the README's test command runs the same tiers as CI (.ci/run).

Systems are small (LJ argon, 256 atoms, float64, one torch thread per rank): the tier takes a
few minutes. Every wait polls with a deadline; every command has a timeout.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_engine

from shardmd.engine.io.checkpoint import read_checkpoint
from shardmd.engine.io.h5md import read_frames

pytestmark = pytest.mark.slurm
# the tests that run jobs carry mpi and slow: a few minutes together, out of the fast tier

SCRIPTS = ROOT / "scripts" / "slurm"
LJ = ["model=lj", "system.repeat=[4,4,4]", "threads=1", "quiet=true", "trajectory.every=100",
      "thermo.every=50", "checkpoint.every=0"]
# long enough to be stopped three times on the way, each after 150 steps of a start, with the run
# still going when the signal lands: at 800 steps (then ~8 s on two ranks) a faster engine (~400
# steps/s) finished a start's remaining 250 steps before the third scancel reached it
STEPS = 4000
ENGINE = ["python", "-m", "engine", "run"]


# -- the cluster ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm():
    """The environment SLURM commands run in (SLURM_CONF, this venv's python first on PATH).
    Starts the local daemons (and stops them afterwards) unless they were running already."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    script = str(SCRIPTS / "localslurm")
    conf = subprocess.run([script, "env"], capture_output=True, text=True, timeout=10).stdout
    env["SLURM_CONF"] = conf.strip().split("=", 1)[1]
    was_up = subprocess.run([script, "status"], env=env, capture_output=True, timeout=30).returncode == 0
    if not was_up and not _installed() and not _may_install():
        pytest.skip("SLURM is not installed (the tier apt-gets it only as root with apt-get; "
                    "or run scripts/slurm/localslurm start)")
    t0 = time.time()
    r = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"the local SLURM did not start: {why}")
    version = subprocess.run(["sinfo", "--version"], env=env, capture_output=True, text=True, timeout=30).stdout
    NOTES.append(f"{version.strip()}, installed if needed and started in {time.time() - t0:.1f} s "
                 f"({r.stdout.strip().removeprefix('localslurm: ')})")
    yield env
    if not was_up:
        subprocess.run([script, "stop"], env=env, capture_output=True, timeout=120)


def _may_install() -> bool:
    """Install SLURM only where the machine is ours to change: root with apt-get, not opted out."""
    return (os.environ.get("SHARDMD_SLURM_INSTALL", "1") != "0" and os.geteuid() == 0
            and subprocess.run(["bash", "-c", "command -v apt-get"], capture_output=True).returncode == 0)


def _installed() -> bool:
    return all(subprocess.run(["bash", "-c", f"command -v {p}"], capture_output=True).returncode == 0
               for p in ("slurmctld", "slurmd", "munged", "srun"))


def sh(args, env, cwd, timeout=60) -> subprocess.CompletedProcess:
    """Run a command; a non-zero exit fails the test with its output."""
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
    return r


SUBMITTED: list[str] = []
NOTES: list[str] = []   # how the cluster came up: printed by tests/conftest.py's summary line


@pytest.fixture(autouse=True)
def _cancel_leftover_jobs(request):
    """A failed test leaves no job behind to hold the node's CPUs for the next one. (Also
    hands the set-up note to the report, which reaches pytest's main process under xdist.)"""
    yield
    request.node.user_properties.extend(("slurm", note) for note in NOTES)
    NOTES.clear()
    if SUBMITTED and "slurm" in request.fixturenames:
        env = request.getfixturevalue("slurm")
        subprocess.run(["scancel", *SUBMITTED], env=env, capture_output=True, timeout=30)
        SUBMITTED.clear()


def submit(env, cwd, *args) -> str:
    """sbatch ARGS from ``cwd``; the job id."""
    jobid = sh(["sbatch", "--parsable", *map(str, args)], env, cwd).stdout.strip().split(";")[0]
    SUBMITTED.append(jobid)
    return jobid


def ask(env, args, limit_s=60.0) -> str:
    """The output of a SLURM query (``scontrol show``, ``squeue``: never an action). A query that
    fails is asked again until ``limit_s``: on a loaded machine slurmctld, busy with a requeue,
    has closed scontrol's connection mid-request (scontrol died of SIGPIPE, printing nothing)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return r.stdout
            got = (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        except subprocess.TimeoutExpired:
            got = "no answer within 30 s"
        assert time.monotonic() < deadline, (args, got)
        time.sleep(1.0)


def show_job(env, jobid) -> str:
    """``scontrol show job -o``'s lines for ``jobid`` (one per array task)."""
    return ask(env, ["scontrol", "show", "job", "-o", jobid])


def job(env, jobid) -> dict[str, str]:
    """scontrol's view of a job (kept MinJobAge = 300 s after it ends): {key: value}."""
    return dict(kv.split("=", 1) for kv in show_job(env, jobid).splitlines()[0].split() if "=" in kv)


def wait_until(what, pred, timeout_s, poll_s=0.2, why=lambda: ""):
    """Poll ``pred()`` until it is true; fail naming ``what`` (and ``why()``: what the job
    printed, say) after ``timeout_s`` seconds."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{why()}")


def job_output(env, folder: Path, jobid: str) -> str:
    """For a failure message: the job's state and the end of its output file and run.log."""
    def tail(name):
        try:
            return (folder / name).read_text()[-3000:]
        except OSError as e:
            return f"({e.strerror})"
    state = subprocess.run(["scontrol", "show", "job", "-o", jobid], env=env, capture_output=True,
                           text=True, timeout=30).stdout
    return f"scontrol: {state}\nslurm-{jobid}.out:\n{tail(f'slurm-{jobid}.out')}\nrun.log:\n{tail('run.log')}"


def log_steps(folder: Path) -> list[int]:
    """The steps of run.log's thermo rows, every start's (appended), in order."""
    try:
        return [int(s) for s in re.findall(r"^\s+(\d+)\s+\d+\.\d{4}\s", (folder / "run.log").read_text(), re.M)]
    except OSError:
        return []


def log_step(folder: Path) -> int:
    """The last step in run.log's thermo table (-1 before the first)."""
    return (log_steps(folder) or [-1])[-1]


def engine_pids(cwd: Path) -> list[int]:
    """Engine ranks (python processes, not srun) running in ``cwd``, the job's working directory."""
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            if os.readlink(p / "cwd") == str(cwd) and b"python" in Path(argv[0].decode()).name.encode() \
                    and b"engine" in argv:
                out.append(int(p.name))
        except OSError:
            continue
    return out


def janitor_pids(segment: str) -> list[int]:
    """The shm janitors (domain/shm_janitor.py) waiting to remove ``segment``."""
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"shm_janitor.py") for a in argv) and any(segment.encode() in a for a in argv):
            out.append(int(p.name))
    return out


def _rank_states(cwd: Path) -> str:
    """For a failure message: each remaining rank's state and where it waits in the kernel."""
    def read(pid, name):
        try:
            return Path(f"/proc/{pid}/{name}").read_text().strip()
        except OSError as e:
            return f"({e.strerror})"
    return "".join(f"rank pid {p}: stat {read(p, 'stat')[:80]} wchan {read(p, 'wchan')}\n"
                   for p in engine_pids(cwd))


def unwrapped(frames) -> np.ndarray:
    """Positions (Å) in id order, unwrapped with the image flags: (frames, atoms, 3)."""
    return np.stack([(f.positions + f.arrays["image"] @ f.cell.array)[np.argsort(f.arrays["id"])]
                     for f in frames])


def same_frames(a: Path, b: Path) -> None:
    """Every frame of trajectory ``b`` is in ``a``, bit for bit (``a`` may hold more: a stopped
    run writes a frame at its stop step)."""
    fa = {f.info["step"]: f for f in read_frames(a)}
    fb = read_frames(b)
    assert set(fa) >= {f.info["step"] for f in fb}, (sorted(fa), [f.info["step"] for f in fb])
    for y in fb:
        x = fa[y.info["step"]]
        order_x, order_y = np.argsort(x.arrays["id"]), np.argsort(y.arrays["id"])
        assert np.array_equal(x.positions[order_x], y.positions[order_y]), x.info["step"]
        assert np.array_equal(x.get_velocities()[order_x], y.get_velocities()[order_y]), x.info["step"]
        assert np.array_equal(x.get_forces()[order_x], y.get_forces()[order_y]), x.info["step"]


# -- srun: the launcher's ranks are the domains -------------------------------------------------
@pytest.fixture(scope="module")
def one_domain(slurm, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("one_domain")
    r = run_engine(["run", *LJ, f"steps={STEPS}"], cwd=d, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


@pytest.fixture(scope="module")
def srun2(slurm, tmp_path_factory) -> Path:
    """An uninterrupted ``srun -n 2`` run (also the preempted job's reference)."""
    d = tmp_path_factory.mktemp("srun2")
    sh(["srun", "-n", "2", "--kill-on-bad-exit=1", *ENGINE, *LJ, f"steps={STEPS}"], slurm, d, timeout=300)
    return d


@pytest.mark.mpi
@pytest.mark.slow
def test_srun_2_equals_one_domain(srun2, one_domain):
    assert "domains 2" in (srun2 / "run.log").read_text()
    a, b = read_frames(srun2 / "run.h5"), read_frames(one_domain / "run.h5")
    assert [f.info["step"] for f in a] == list(range(0, STEPS + 1, 100))
    assert np.abs(unwrapped(a) - unwrapped(b)).max() <= 1e-10


@pytest.mark.mpi
@pytest.mark.slow
def test_srun_4_overcommit_equals_one_domain(slurm, one_domain, tmp_path):
    """Four ranks on this machine's two cores (--overcommit): the first 200 steps."""
    sh(["srun", "-n", "4", "--overcommit", "--kill-on-bad-exit=1", *ENGINE, *LJ, "steps=200"], slurm, tmp_path,
       timeout=300)
    assert "domains 4" in (tmp_path / "run.log").read_text()
    a, b = read_frames(tmp_path / "run.h5"), read_frames(one_domain / "run.h5", slice(0, 3))
    assert [f.info["step"] for f in a] == [f.info["step"] for f in b] == [0, 100, 200]
    assert np.abs(unwrapped(a) - unwrapped(b)).max() <= 1e-10


# -- preemption: signal, checkpoint, requeue, restart=auto ---------------------------------------
# A requeued job starts again cred_expire + 1 s later (10 s in localslurm's config; 120 s is
# SLURM's default).
PREEMPTIONS = [   # (what, scancel's flags, at start-up: while the ranks import, before any step)
    ("batch shell only, while the ranks start", ["--batch"], True),
    ("batch shell only, as #SBATCH --signal=B:TERM@N", ["--batch"], False),
    ("the shell's process group and every step", ["--full"], False),
    ("every step, not the shell, as --signal=TERM@N", [], False),
]


@pytest.mark.mpi
@pytest.mark.slow
def test_preempted_job_requeues_and_ends_as_uninterrupted(slurm, srun2, tmp_path):
    jobid = submit(slurm, tmp_path, SCRIPTS / "preemptible.sbatch", *LJ, f"steps={STEPS}")
    stops = [0]
    for k, (what, flags, early) in enumerate(PREEMPTIONS):
        if early:   # the ranks exist but import torch for seconds yet: no handler, no log
            wait_until("the ranks to exist", lambda: len(engine_pids(tmp_path)) == 2, 120, poll_s=0.05,
                       why=lambda: job_output(slurm, tmp_path, jobid))
            assert log_step(tmp_path) == -1
        else:
            wait_until(f"start {k} to run 150 steps", lambda: job(slurm, jobid)["JobState"] == "RUNNING"
                       and log_step(tmp_path) >= stops[-1] + 150, 120,
                       why=lambda: job_output(slurm, tmp_path, jobid))
        before = int(job(slurm, jobid)["Restarts"])
        sh(["scancel", *flags, "--signal=TERM", jobid], slurm, tmp_path)
        info = wait_until(f"the requeue after '{what}'",
                          lambda before=before: int((i := job(slurm, jobid))["Restarts"]) > before and i, 60,
                          why=lambda: job_output(slurm, tmp_path, jobid))
        assert info["JobState"] in ("COMPLETING", "REQUEUED", "PENDING", "RUNNING"), (what, info["JobState"])
        ckpts = sorted((tmp_path / "run.ckpt").glob("step-*.h5"))
        if not early:
            stops.append(read_checkpoint(ckpts[-1])["step"])
            assert 0 < stops[-1] < STEPS and stops == sorted(set(stops)), (what, stops)
    info = wait_until("the job to complete", lambda: (i := job(slurm, jobid))["JobState"] not in
                      ("PENDING", "RUNNING", "REQUEUED", "COMPLETING") and i, 180,
                      why=lambda: job_output(slurm, tmp_path, jobid))
    out = (tmp_path / f"slurm-{jobid}.out").read_text()
    # at least our four requeues: on a loaded machine SLURM may deliver a step signal once more,
    # late, to the next start's step of the same id (slurmctld retries an RPC that slurmd was
    # slow to answer), and that start stops and requeues as well; the run's end is the same
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 4, (info, out[-3000:])
    # a stop at start-up: 75 (the signal recorded from the interpreter's start, the run stops
    # after step 1), or 143 when it came in the ~0.1 s before the engine records signals
    codes = [int(s) for s in re.findall(r"engine exit status (\d+)", out)]
    assert len(codes) == int(info["Restarts"]) + 1 and codes[-1] == 0, out[-3000:]
    assert set(codes[:-1]) <= {75, 143} and codes[1:-1].count(75) >= 3, out[-3000:]
    same_frames(tmp_path / "run.h5", srun2 / "run.h5")
    mine, ref = (read_checkpoint(sorted((d / "run.ckpt").glob("step-*.h5"))[-1]) for d in (tmp_path, srun2))
    assert mine["step"] == ref["step"] == STEPS
    for key in ("positions", "velocities"):
        order_a, order_b = np.argsort(mine["arrays"]["ids"]), np.argsort(ref["arrays"]["ids"])
        assert np.array_equal(mine["arrays"][key][order_a], ref["arrays"][key][order_b]), key


def _running_job(slurm, cwd, *extra) -> str:
    """preemptible.sbatch with a run that never ends by itself, once its ranks are stepping."""
    jobid = submit(slurm, cwd, SCRIPTS / "preemptible.sbatch", *LJ, "steps=10000000", *extra)
    wait_until("the ranks to step", lambda: log_step(cwd) >= 100 and len(engine_pids(cwd)) == 2, 120)
    return jobid


def _ended(slurm, jobid) -> dict:
    return wait_until("the job to end", lambda: (i := job(slurm, jobid))["JobState"] not in
                      ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") and i, 60)


@pytest.mark.mpi
@pytest.mark.slow
def test_scancel_ends_every_rank_before_slurms_own_kill(slurm, tmp_path):
    jobid = _running_job(slurm, tmp_path)
    sh(["scancel", jobid], slurm, tmp_path)
    t0 = time.time()
    # the ranks end by themselves: SLURM's SIGKILL follows only KillWait = 30 s after its
    # SIGTERM. Under a second quiet; the interpreter's teardown once made it over 10 s in
    # CI's run of four workers (now skipped: engine/launch/parallel.py exit_now)
    wait_until("every rank to end", lambda: not engine_pids(tmp_path), 20,
               why=lambda: _rank_states(tmp_path) + job_output(slurm, tmp_path, jobid))
    print(f"scancel: ranks gone in {time.time() - t0:.1f} s")
    info = _ended(slurm, jobid)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info     # cancelled for good
    frames = read_frames(tmp_path / "run.h5")
    assert len(frames) >= 2 and all(np.isfinite(f.positions).all() for f in frames)
    # no checkpoint is asserted: on a cancel srun itself gets SIGTERM too and answers with SIGKILL
    # to the ranks, racing their own SIGTERM stop (they usually win: README, "Clusters (SLURM)")


@pytest.mark.mpi
@pytest.mark.slow
def test_sigkill_of_one_rank_ends_the_job(slurm, tmp_path):
    jobid = _running_job(slurm, tmp_path)
    rank1 = [p for p in engine_pids(tmp_path)
             if b"SLURM_PROCID=1\0" in Path(f"/proc/{p}/environ").read_bytes()]
    assert len(rank1) == 1, rank1
    os.kill(rank1[0], signal.SIGKILL)
    t0 = time.time()
    wait_until("the other rank to end", lambda: not engine_pids(tmp_path), 15)
    info = _ended(slurm, jobid)
    print(f"SIGKILL of rank 1: job over in {time.time() - t0:.1f} s")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", info     # a crash is not requeued
    assert "engine exit status 75" not in (tmp_path / f"slurm-{jobid}.out").read_text()
    assert read_frames(tmp_path / "run.h5")      # what was written stays readable


@pytest.mark.mpi
@pytest.mark.slow
def test_requeue_after_killed_ranks_starts_again(slurm, tmp_path):
    """A start killed outright (SIGKILL: a preemption's grace time ran out) leaves MPICH's
    segment for step 0 of this job in /dev/shm; the requeued start's step 0 has the same name.
    Without domain/stale_shm.py its MPI_Init failed ("Message truncated") and the job hung."""
    from shardmd.domain.stale_shm import segment_prefixes

    jobid = _running_job(slurm, tmp_path, "checkpoint.every=100")
    segment = [p for p in Path("/dev/shm").iterdir()
               if p.name.startswith(segment_prefixes({"SLURM_JOB_ID": jobid, "SLURM_STEP_ID": "0"})[0])]
    assert len(segment) == 1, "MPICH's segment of this step is not where stale_shm.py looks"
    # a preemption kills the whole step, the segment's janitor (domain/shm_janitor.py) with it
    # where SLURM tracks processes by cgroup; this SLURM may not, so it is killed here first
    for pid in janitor_pids(segment[0].name) + engine_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)
    info = _ended(slurm, jobid)
    assert info["JobState"] == "FAILED" and segment[0].exists(), info     # what the next start meets
    rows = len(log_steps(tmp_path))
    time.sleep(1.0)    # the segment is stale by more than stale_shm.MARGIN_S once the job restarts
    sh(["scontrol", "requeue", jobid], slurm, tmp_path)
    wait_until("the requeued start to step", lambda: len(log_steps(tmp_path)) >= rows + 3, 120,
               why=lambda: job_output(slurm, tmp_path, jobid))
    out = (tmp_path / f"slurm-{jobid}.out").read_text()
    assert f"shardmd: removed {segment[0]}" in out, out[-3000:]
    sh(["scancel", jobid], slurm, tmp_path)


# -- a sweep as a job array -----------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_array_sweep_runs_each_job_in_its_folder(slurm, tmp_path):
    temps = [80, 100, 120]
    jobid = submit(slurm, tmp_path, f"--array=0-{len(temps) - 1}", SCRIPTS / "sweep.sbatch", "model=lj",
                   "system.repeat=[3,3,3]", "steps=20", "threads=1", "quiet=true",
                   f"temperature={','.join(map(str, temps))}")
    wait_until("every array task to end",
               lambda: not ask(slurm, ["squeue", "-h", "-j", jobid]).strip(), 180, poll_s=1)
    states = show_job(slurm, jobid)
    assert states.count("JobState=COMPLETED") == len(temps), states
    for k, t in enumerate(temps):
        folder = tmp_path / "multirun" / jobid / str(k)
        assert f"temperature={float(t)}" in (folder / "run.log").read_text().splitlines()[0]
        frames = read_frames(folder / "run.h5")
        assert frames[-1].info["step"] == 20
    assert sorted(p.name for p in (tmp_path / "multirun" / jobid).iterdir() if p.is_dir()) == ["0", "1", "2"]


# -- the GPU job script: its CPU side --------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_gpu_script_runs_one_rank_per_task_on_cpu(slurm, tmp_path):
    """gpu.sbatch with DEVICE=cpu, two tasks, its --gpus-per-task line taken out (this SLURM has
    no GPUs): the script's srun line runs the engine on 2 ranks."""
    text = (SCRIPTS / "gpu.sbatch").read_text()
    assert text.count("#SBATCH --gpus-per-task=1\n") == 1
    (tmp_path / "cpu.sbatch").write_text(text.replace("#SBATCH --gpus-per-task=1\n", ""))
    jobid = submit(slurm, tmp_path, "--export=ALL,DEVICE=cpu", "--ntasks-per-node=2", "--cpus-per-task=1",
                   tmp_path / "cpu.sbatch", *LJ, "steps=50")
    info = _ended(slurm, jobid)
    assert info["JobState"] == "COMPLETED", (info, (tmp_path / f"slurm-{jobid}.out").read_text()[-3000:])
    assert "domains 2" in (tmp_path / "run.log").read_text()


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2])
def test_local_rank_is_slurms(slurm, tmp_path, ranks):
    """The rank -> GPU choice rests on the local rank: the engine's (from MPI) is SLURM_LOCALID."""
    out = sh(["srun", "-n", str(ranks), "--overcommit", "python", str(ROOT / "tests/helpers/slurm_local_rank.py")],
             slurm, tmp_path, timeout=120).stdout
    rows = sorted((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [int(r["SLURM_PROCID"]) for r in rows] == list(range(ranks))
    assert [r["local_rank"] for r in rows] == [int(r["SLURM_LOCALID"]) for r in rows] == list(range(ranks))
    assert {r["size"] for r in rows} == {ranks} and {r["backend"] for r in rows} == {"gloo"}


@pytest.mark.mpi
@pytest.mark.slow
def test_gpu_binding_on_gpus(slurm, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU here: the device part (rank -> cuda:local rank under srun) runs only where CUDA is")
    n = torch.cuda.device_count()
    code = ("from shardmd.domain.comm import init_comm, shutdown; c = init_comm('cuda'); "
            "print('DEV', c.local_rank, c.device, flush=True); shutdown(c)")
    out = sh(["srun", "-n", str(min(n, 2)), "python", "-c", code], slurm, tmp_path, timeout=180).stdout
    devs = sorted(ln.split()[1:] for ln in out.splitlines() if ln.startswith("DEV "))
    assert devs == [[str(i), f"cuda:{i}"] for i in range(min(n, 2))], out


# -- the README shows the scripts as they are --------------------------------------------------------
@pytest.mark.parametrize("name", ["preemptible.sbatch", "gpu.sbatch", "sweep.sbatch"])
def test_readme_shows_the_script(name):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sbatch\n(.*?)```", readme, re.S)
    assert (SCRIPTS / name).read_text() in blocks, f"README's copy of scripts/slurm/{name} differs or is missing"
