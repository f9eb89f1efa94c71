"""Many small systems: one many-system run (system.frames) against the same systems run one
after another as separate `python -m engine run` commands, and the relaxation queue.

    python scripts/bench_batch.py --systems 16 --steps 200            # MD, LJ argon, 32-48 atoms each
    python scripts/bench_batch.py --model mace --systems 16 --steps 20  # shipped MACE, Cu, 32-48 atoms
    python scripts/bench_batch.py --queue 10000                        # FIRE queue of 10,000 structures

Prints a table (wall seconds from the command's start to its end, start-up included: what a
user waits for). Numbers go to docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ase.build import bulk
from ase.io import write


def structures(n: int, seed: int = 1, element: str = "Ar"):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = bulk(element, "fcc", a=5.3 if element == "Ar" else 3.61, cubic=True).repeat((2, 2, 2 + k % 2))
        a.positions += rng.normal(0.0, 0.08, a.positions.shape)
        out.append(a)
    return out


def engine(args, cwd) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "engine", *args, "quiet=true"], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"python -m engine {' '.join(args)} failed: {r.stderr.strip()}")
    return time.perf_counter() - t


def md(n: int, steps: int, threads: int, model: str) -> None:
    element = "Ar" if model == "lj" else "Cu"
    with tempfile.TemporaryDirectory() as d:
        frames = structures(n, element=element)
        write(Path(d) / "many.extxyz", frames)
        atoms = sum(len(a) for a in frames)
        common = ["run", f"model={model}", "system.file=many.extxyz", f"steps={steps}", "trajectory.every=0",
                  "checkpoint.every=0", f"threads={threads}"]
        alone = sum(engine([*common, f"system.index={k}", f"output=a{k}.h5"], d) for k in range(n))
        rows = [("separate commands", alone),
                ("one run, one system per model call", engine([*common, "system.frames=all", "batch.size=1",
                                                               "output=s.h5"], d))]
        if model == "mace":   # a model with compute_batch: systems stepped together
            rows.append((f"one run, {n} systems per model call",
                         engine([*common, "system.frames=all", f"batch.size={n}", "output=b.h5"], d)))
    for name, wall in rows:
        print(f"| MD, {model} {element}, verlet | {name} | {n} x {atoms / n:.0f} | {steps} | {wall:.1f} | "
              f"{alone / wall:.1f}x | {atoms * steps / wall:.3g} |")


def queue(n: int, threads: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        write(Path(d) / "q.extxyz", structures(n))
        wall = engine(["minimize", "model=lj", "system.file=q.extxyz", "system.frames=all", "trajectory.every=0",
                       "output=q.h5", f"threads={threads}"], d)
        done = sum(1 for _ in open(Path(d) / "q.summary.csv")) - 1
    print(f"| FIRE queue, LJ Ar, fmax 0.05 | {n} | {done} relaxed | {wall:.1f} s | {n / wall:.1f} systems/s |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=16)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--queue", type=int, default=0, help="relax this many structures instead")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="lj", choices=["lj", "mace"])
    a = p.parse_args()
    print(f"# {os.cpu_count()} cores, threads={a.threads}")
    if a.queue:
        print("| case | structures | finished | wall | rate |\n|---|---|---|---|---|")
        queue(a.queue, a.threads)
        return
    print("| case | how | systems x atoms | steps | wall, s | vs separate commands | atom-steps/s |\n"
          "|---|---|---|---|---|---|---|")
    md(a.systems, a.steps, a.threads, a.model)


if __name__ == "__main__":
    main()
