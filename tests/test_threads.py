"""``threads=0``: how many torch threads a rank takes (engine/launch/parallel.py default_threads), and
that a run uses them."""
import os

import pytest

from shardmd.engine.launch.parallel import default_threads


def test_one_thread_per_rank_under_mpi_whatever_the_environment():
    assert default_threads(2, {"OMP_NUM_THREADS": "8"}) == 1 == default_threads(8, {})


@pytest.mark.parametrize("value, expected", [("3", 3), ("4,2", 4), ("0", None), ("-1", None), ("many", None),
                                             ("", None)])
def test_omp_num_threads_when_set_and_valid_else_the_cpu_set(value, expected):
    cpus = len(os.sched_getaffinity(0))
    assert default_threads(1, {"OMP_NUM_THREADS": value}, load=0.0) == (expected or cpus)


def test_the_cpu_set_not_the_machine(tmp_path):
    """Under a CPU set smaller than the machine (SLURM --cpus-per-task, taskset), only its
    cores: a one-core set gives one thread."""
    import subprocess
    import sys

    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from shardmd.engine.launch.parallel import default_threads; print(default_threads(1, {}, load=0.0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1", out.stderr


def test_a_run_takes_omp_num_threads(tmp_path, capfd, monkeypatch):
    import torch
    from conftest import run_in_process

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        torch.set_num_threads(2)
        code, err = run_in_process(["run", "model=lj", "system.repeat=[2,2,2]", "steps=1", "quiet=true"], tmp_path,
                                   capfd, monkeypatch)
        assert code == 0, err
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("env, expected, why", [
    ({"SLURM_CPUS_PER_TASK": "3"}, 3, "SLURM_CPUS_PER_TASK"),
    ({"OMP_NUM_THREADS": "2", "SLURM_CPUS_PER_TASK": "3"}, 2, "OMP_NUM_THREADS"),   # OpenMP's own variable first
    ({"SLURM_CPUS_PER_TASK": "0"}, None, "the cores this process may use"),
])
def test_slurm_cpus_per_task_after_omp_num_threads(env, expected, why):
    from shardmd.engine.launch.parallel import thread_choice

    assert thread_choice(1, env, load=0.0) == (expected or len(os.sched_getaffinity(0)), why)
    assert thread_choice(4, env) == (1, "one per rank of 4")


def test_busy_cores_are_left_out_of_the_default():
    """All cores but the busy ones (the 1-minute load), at least one; OMP_NUM_THREADS still wins."""
    from shardmd.engine.launch.parallel import thread_choice

    cores = len(os.sched_getaffinity(0))
    assert thread_choice(1, {}, load=0.3) == (cores, "the cores this process may use")
    n, why = thread_choice(1, {}, load=float(cores) + 3.0)
    assert n == 1 and why == f"the cores this process may use, {cores}, less the busy ones: load {cores + 3.0:.1f}"
    if cores > 1:
        assert thread_choice(1, {}, load=1.2)[0] == cores - 1
    assert thread_choice(1, {"OMP_NUM_THREADS": "2"}, load=50.0) == (2, "OMP_NUM_THREADS")


def test_the_log_says_how_many_threads_and_why(tmp_path, capfd, monkeypatch):
    import torch
    from conftest import run_in_process

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        code, err = run_in_process(["run", "model=lj", "system.repeat=[2,2,2]", "steps=1", "quiet=true"], tmp_path,
                                   capfd, monkeypatch)
        assert code == 0, err
        assert "threads 1 (OMP_NUM_THREADS)" in (tmp_path / "run.log").read_text()
        code, err = run_in_process(["run", "model=lj", "system.repeat=[2,2,2]", "steps=1", "quiet=true", "threads=2",
                                    "output=b.h5"], tmp_path, capfd, monkeypatch)
        assert code == 0, err
        assert "threads 2 (threads=2)" in (tmp_path / "b.log").read_text()
    finally:
        torch.set_num_threads(before)
