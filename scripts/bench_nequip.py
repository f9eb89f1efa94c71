"""NequIP (models/nequip.py) speed and memory: the engine's MD loop on one domain (or R ranks
under mpiexec), and nequip's own ASE calculator driving ASE's VelocityVerlet on the same system.

    python scripts/bench_nequip.py                                   # tiny CPU check (~1 min)
    python scripts/bench_nequip.py --sizes 6 10 14 --device cuda --dtype float32 --steps 50
    python scripts/bench_nequip.py --sizes 10 --ranks 2 --device cuda     # mpiexec -n 2 (one GPU a rank)
    python scripts/bench_nequip.py --sizes 4 --no-ase --num-features 32 --l-max 2 --num-layers 4

System: fcc Cu with 30% Ni, cubic repeats n (4 n^3 atoms), 300 K, 1 fs; model: nequip with random
weights (--num-features, --l-max, --num-layers, --r-max: MACE-MP-like sizes are 32-64
features, l_max 2, 4-5 layers).  Rates are atom-steps per second over the timed steps after
``--warmup`` steps (CUDA synchronised); peak memory is torch's peak allocation on the GPU
(rank 0), or the process's peak resident set on the CPU.  One line per size and path.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch


def _peak(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**30:.3f} GiB GPU"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.3f} GiB RSS"


def system(n: int, path: Path) -> int:
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((n, n, n))
    atoms.numbers[np.random.default_rng(0).random(len(atoms)) < 0.3] = 28
    atoms.write(path)
    return len(atoms)


def model_args(a) -> list[str]:
    return ["model=nequip", "model.species=[Cu,Ni]", f"model.r_max={a.r_max}", f"model.num_layers={a.num_layers}",
            f"model.l_max={a.l_max}", f"model.num_features={a.num_features}"]


def engine(a, n: int, path: Path, out: Path) -> None:
    """``python -m engine run`` (under mpiexec for --ranks > 1); rate from the log's Loop line
    (warm-up excluded: two runs, warmup and warmup + steps steps, differenced)."""
    times = []
    for steps in (a.warmup, a.warmup + a.steps):
        args = [*model_args(a), f"system.file={path}", f"steps={steps}", "dt=1.0", "temperature=300",
                f"precision={a.dtype}", f"device={a.device}", "trajectory.every=0", "checkpoint.every=0",
                "thermo.every=0", "quiet=true", f"output={out / f'run{steps}.h5'}", "overwrite=true"]
        cmd = [sys.executable, "-m", "engine", "run", *args]
        if a.ranks > 1:
            from shardmd.engine.launch.parallel import find_mpiexec

            cmd = [find_mpiexec() or "mpiexec", "-n", str(a.ranks), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
        if r.returncode != 0:
            print(f"engine n={n}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            return
        log = (out / f"run{steps}.log").read_text()
        times.append(float(re.search(r"Loop: ([\d.]+) s", log).group(1)))
        mem = re.search(r"Memory: (.*)", log)
    if times[1] - times[0] < 0.01:   # the log prints the loop time to 1 ms
        print(f"engine   {n:7d} atoms: the timed steps took under 10 ms; raise --steps")
        return
    rate = n * a.steps / (times[1] - times[0])
    print(f"engine   {n:7d} atoms  ranks {a.ranks}  {rate:12.1f} atom-steps/s  "
          f"{mem.group(1).strip() if mem else 'peak ' + _children_rss()}")   # the log's "peak GPU ..."


def _children_rss() -> str:
    """Peak resident set of the largest finished child process (the engine's ranks on the CPU)."""
    return f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.3f} GiB RSS (largest process)"


def ase_md(a, n: int, path: Path) -> None:
    """nequip's own ASE calculator with ASE's VelocityVerlet (one process)."""
    from ase import units
    from ase.io import read
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    from shardmd.models.registry import nequip

    dtype = {"float32": torch.float32, "float64": torch.float64}[a.dtype]
    model = nequip(species=["Cu", "Ni"], r_max=a.r_max, num_layers=a.num_layers, l_max=a.l_max,
                   num_features=a.num_features, precision=dtype, device=a.device)
    atoms = read(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(1))
    atoms.calc = model.ase_calculator()
    torch.set_default_dtype(dtype)   # nequip's calculator builds its inputs in the default dtype
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    md = VelocityVerlet(atoms, 1.0 * units.fs)
    md.run(a.warmup)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    md.run(a.steps)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    rate = n * a.steps / (time.perf_counter() - t)
    print(f"ase      {n:7d} atoms  ranks 1  {rate:12.1f} atom-steps/s  peak {_peak(a.device)}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[3], help="cubic fcc repeats n (4 n^3 atoms)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--r-max", type=float, default=4.0)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--l-max", type=int, default=1)
    p.add_argument("--num-features", type=int, default=8)
    p.add_argument("--no-ase", action="store_true", help="skip nequip's own calculator")
    a = p.parse_args(argv)
    if a.ranks > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"nequip random model: {a.num_layers} layers, l_max {a.l_max}, {a.num_features} features, "
          f"r_max {a.r_max} Å; {a.device}, {a.dtype}; {a.steps} timed steps after {a.warmup}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for n in a.sizes:
            path = out / f"cuni{n}.extxyz"
            natoms = system(n, path)
            engine(a, natoms, path, out)
            if not a.no_ase:
                ase_md(a, natoms, path)


if __name__ == "__main__":
    main()
