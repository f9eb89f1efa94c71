"""threads=0 (the default) against explicit thread counts on a machine whose cores are busy.

    python scripts/bench_threads.py --busy 2 --model mace --steps 10 --rounds 2

Starts ``--busy`` spinning processes, waits until the 1-minute load average shows them (the
default choice reads it), then runs ``python -m engine run`` with threads=0, 1 and all cores in
turn, ``--rounds`` times, and prints the loop's steps/s of each (the log's "Loop:" line) and the
threads the default took (the log's header). Numbers go to docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spin() -> None:
    while True:
        pass


def run(model: str, steps: int, threads: int, cwd: str) -> tuple[float, str]:
    out = Path(cwd) / f"t{threads}.h5"
    r = subprocess.run([sys.executable, "-m", "engine", "run", f"model={model}", f"steps={steps}", f"threads={threads}",
                        "trajectory.every=0", "checkpoint.every=0", f"output={out}", "overwrite=true"],
                       cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr.strip())
    rate = float(re.search(r"Loop: [\d.]+ s, ([\d.]+) steps/s", r.stdout).group(1))
    took = re.search(r"threads (\d+ \([^)]*\))", r.stdout).group(1)
    return rate, took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--model", default="mace")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for s in spinners:
        s.start()
    try:
        end = time.monotonic() + 300
        while os.getloadavg()[0] < a.busy - 0.5 and time.monotonic() < end:
            time.sleep(2)
        print(f"# {cores} cores, {a.busy} busy processes, load {os.getloadavg()[0]:.2f}; {a.model}, {a.steps} steps")
        print("| threads | steps/s per round | default took |\n|---|---|---|")
        rates: dict[int, list[float]] = {0: [], 1: [], cores: []}
        took = ""
        with tempfile.TemporaryDirectory() as d:
            for _ in range(a.rounds):
                for t in rates:
                    rate, why = run(a.model, a.steps, t, d)
                    rates[t].append(rate)
                    took = why if t == 0 else took
        for t, r in rates.items():
            print(f"| {t if t else '0 (default)'} | {', '.join(f'{x:.3g}' for x in r)} | {took if t == 0 else ''} |")
        best = max(sum(r) / len(r) for t, r in rates.items() if t)
        print(f"default / best explicit: {sum(rates[0]) / len(rates[0]) / best:.2f}")
    finally:
        for s in spinners:
            s.terminate()


if __name__ == "__main__":
    main()
