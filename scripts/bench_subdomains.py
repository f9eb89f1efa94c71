"""Capacity and speed of a model call made in parts (``subdomains=N``, domain/subdomains.py).

For each (size, parts) pair: one MD run of fcc Cu with the shipped MACE model (NVE, 1 fs,
float32 on CUDA) through ``python -m engine run``, in its own process; prints atom-steps/s of
the loop, the device's peak memory and the rate against the first row of the same parts count
(the 1M-atom run in one piece is the reference of the issue's target). Peak memory: the GPU's
(the run's own summary line), or on the CPU the process's peak resident set.

    python scripts/bench_subdomains.py --sizes 63:1 100:1 100:8 136:27 --steps 20 --device cuda
    python scripts/bench_subdomains.py --sizes 6:1 6:2 --steps 5 --device cpu      # a smoke run
    python scripts/bench_subdomains.py --sizes 6:1 10:1 --steps 5 --device cpu --extra malloc=keep

``SIZE:PARTS``: SIZE fcc cells per axis (4 SIZE^3 atoms: 63 -> 1.0M, 100 -> 4.0M, 136 -> 10.1M).
A run that fails (out of memory, refused) gets one row saying why; the others go on.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

A_CU = 3.61


def one(size: int, parts: int, steps: int, device: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        precision = "float32" if device != "cpu" else "float64"
        args = ["run", "model=mace", f"device={device}", f"precision={precision}",
                "system.lattice=fcc", "system.element=Cu", f"system.a={A_CU}", f"system.repeat=[{size},{size},{size}]",
                f"steps={steps}", "temperature=300", "trajectory.every=0", "checkpoint.every=0",
                f"thermo.every={steps}", "quiet=false", f"subdomains={parts}", f"output={d}/run.h5", *extra]
        t = time.perf_counter()
        with open(os.path.join(d, "out"), "w+") as out, open(os.path.join(d, "err"), "w+") as err:
            p = subprocess.Popen([sys.executable, "-m", "engine", *args], stdout=out, stderr=err, text=True, cwd=d)
            _, status, usage = os.wait4(p.pid, 0)   # this child's own peak resident memory (kB on Linux)
            p.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            r = subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read())
        wall = time.perf_counter() - t
        loop = re.search(r"Loop: .*?([0-9.e+]+) atom-steps/s.*?(\d+) neighbour builds", r.stdout + r.stderr)
        split = re.search(r"Time split: (.*)", r.stdout + r.stderr)   # where the loop's time went
        logged = re.search(r"Memory: peak GPU ([0-9.]+) GiB", r.stdout + r.stderr)   # the run's own summary line
        mem = (float(logged.group(1)) if logged else usage.ru_maxrss / 2**20 if device == "cpu" else float("nan"))
        if r.returncode or loop is None:
            tail = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
            return {"rate": float("nan"), "mem": mem, "wall": wall, "note": tail[0][:140]}
        note = f"{loop.group(2)} builds; " + (split.group(1) if split else "")
        return {"rate": float(loop.group(1)), "mem": mem, "wall": wall, "note": note}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["63:1", "100:8", "136:27"], help="SIZE:PARTS pairs")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--extra", nargs="*", default=[], help="more engine keys, e.g. neighbor.skin=1.0")
    a = p.parse_args()
    print(f"# fcc Cu, shipped MACE, NVE, {a.steps} steps, {a.device}")
    print("| atoms | subdomains | atom-steps/s | vs first row | peak GiB | wall s | note |\n"
          "|---|---|---|---|---|---|---|")
    first = None
    for item in a.sizes:
        size, parts = (int(v) for v in item.split(":"))
        r = one(size, parts, a.steps, a.device, a.extra)
        first = first if first is not None or r["rate"] != r["rate"] else r["rate"]
        ratio = r["rate"] / first if first and r["rate"] == r["rate"] else float("nan")
        print(f"| {4 * size**3:,} | {parts} | {r['rate']:.3g} | {ratio:.2f} | {r['mem']:.1f} | {r['wall']:.0f} | "
              f"{r['note']} |", flush=True)


if __name__ == "__main__":
    main()
