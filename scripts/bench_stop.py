"""How fast a stop ends the job: SIGTERM to every rank of a running 2-rank LJ job (under
mpiexec, as a scheduler signals the ranks) until each rank's process is gone, and until mpiexec
is. Two ways of starting the same ranks, alternated:

    python -m engine run ...            the engine's entry (ends with engine/launch/parallel.py exit_now)
    python -c "...sys.exit(main())" ... the same main, ended by the interpreter's normal teardown

The stop itself (common step, checkpoint, files closed) is the same in both; the difference is
what the process does after it. Prints a table of medians over ``--repeats`` pairs.

    .venv/bin/python scripts/bench_stop.py                 # 5 pairs
    .venv/bin/python scripts/bench_stop.py --repeats 3 --load 8   # 8 busy processes beside it
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from shardmd.engine.launch.parallel import find_mpiexec  # noqa: E402

ARGS = ["run", "model=lj", "system.repeat=[5,5,5]", "temperature=100", "domains=2", "threads=1",
        "quiet=true", "thermo.every=50", "trajectory.every=100", "checkpoint.every=0", "steps=10000000"]
ENTRIES = {
    "python -m engine": ["-m", "engine"],
    "sys.exit(main())": ["-c", "import sys; from shardmd.engine.cli.main import main; sys.exit(main())"],
}


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except OSError:
        return True


def one(entry: list[str], mpiexec: str) -> tuple[float, float]:
    """Seconds from SIGTERM to the last rank gone, and to mpiexec's end."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        p = subprocess.Popen([mpiexec, "-n", "2", sys.executable, *entry, *ARGS], cwd=tmp, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = Path(tmp) / "run.log"
        while not (log.exists() and log.read_text().count("\n") >= 4):
            time.sleep(0.05)
        ranks = [int(q) for q in subprocess.run(["pgrep", "-f", "-P", ",".join(_children(p.pid)), "engine"],
                                                capture_output=True, text=True).stdout.split()]
        assert len(ranks) == 2, ranks
        for r in ranks:
            os.kill(r, signal.SIGTERM)
        t0 = time.perf_counter()
        while not all(_gone(r) for r in ranks):
            time.sleep(0.005)
        ranks_s = time.perf_counter() - t0
        code = p.wait()
        assert code == 75, code
        return ranks_s, time.perf_counter() - t0


def _children(pid: int) -> list[str]:
    """mpiexec's proxy processes (the ranks' parents) and mpiexec itself."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [str(pid), *out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy processes running beside (a loaded node)")
    a = ap.parse_args()
    mpiexec = find_mpiexec()
    if mpiexec is None:
        sys.exit("bench_stop: no mpiexec (pip install mpich)")
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    try:
        got = {name: [] for name in ENTRIES}
        for _ in range(a.repeats):
            for name, entry in ENTRIES.items():
                got[name].append(one(entry, mpiexec))
    finally:
        for q in load:
            q.kill()
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, {a.load} busy processes beside, "
          f"{a.repeats} repeats, {time.strftime('%Y-%m-%d')}")
    print("| entry | ranks gone after SIGTERM (s) | mpiexec ended (s) |")
    print("|---|---|---|")
    for name, rows in got.items():
        ranks, ended = (statistics.median(r[i] for r in rows) for i in (0, 1))
        print(f"| `{name}` | {ranks:.2f} | {ended:.2f} |")


if __name__ == "__main__":
    main()
