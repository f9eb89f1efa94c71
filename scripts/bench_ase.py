"""ASE molecular dynamics with ShardMDCalculator against ASE's own LennardJones.

    python scripts/bench_ase.py                      # 108 Ar atoms, 200 VelocityVerlet steps of 5 fs, 40 K
    python scripts/bench_ase.py --repeat 5 --threads 1
    python scripts/bench_ase.py --profile            # cProfile of ShardMD's run: where a step's time goes

The same atoms (fcc argon at 5.26 Å, Maxwell-Boltzmann velocities at --temperature, momentum
zeroed) run --steps steps of ase.md.verlet.VelocityVerlet with each calculator:

- ``shardmd``: ShardMDCalculator(model="lj"): epsilon 0.0104 eV, sigma 3.40 Å, cutoff 8.5 Å,
  energy shifted to zero at the cutoff; the neighbour list (cutoff + --skin) is kept between calls;
- ``ase``: ase.calculators.lj.LennardJones(epsilon, sigma, rc=cutoff, smooth=False): the same
  potential (shifted energy, forces cut at rc), ASE's NeighborList updated every call;
- ``ase-smooth`` (with --smooth): smooth=True, a different potential (a cutoff function from
  0.66 rc): timing only, no energy comparison.

Runs alternate between the calculators --repeat times; each run starts from a new calculator
(a warm-up evaluation before all runs loads kernels). Printed per calculator: the first force
call (a fresh neighbour list; median over runs), the wall time per step after it (min, median,
max over the runs), the final potential energy, the total energy's drift, and the differences
from ``shardmd`` (potential energy, largest position difference).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import numpy as np
from ase import units
from ase.build import bulk
from ase.calculators.lj import LennardJones
from ase.md.velocitydistribution import Stationary, thermalize_momenta
from ase.md.verlet import VelocityVerlet

from shardmd.engine.ase_calculator import ShardMDCalculator

EPSILON, SIGMA, CUTOFF = 0.0104, 3.40, 8.5


def make_atoms(repeat: int, temperature: float, seed: int):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((repeat, repeat, repeat))
    thermalize_momenta(atoms, temperature, rng=np.random.default_rng(seed))
    Stationary(atoms)
    return atoms


def make_calc(name: str, skin: float):
    if name == "shardmd":
        return ShardMDCalculator(model="lj", epsilon={"Ar": EPSILON}, sigma={"Ar": SIGMA}, cutoff=CUTOFF, skin=skin)
    return LennardJones(epsilon=EPSILON, sigma=SIGMA, rc=CUTOFF, smooth=name == "ase-smooth")


def run_md(start, name: str, steps: int, dt: float, skin: float, profile: bool = False):
    """(wall seconds of the first force call, of the steps after it, final atoms, calculator
    stats or None, profile text of the steps)."""
    atoms = start.copy()
    atoms.calc = calc = make_calc(name, skin)
    dyn = VelocityVerlet(atoms, timestep=dt * units.fs)
    t = time.perf_counter()
    atoms.get_forces()     # the calculator's first call: a fresh neighbour list (ShardMD: decomposition too)
    first = time.perf_counter() - t
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof is not None:
        prof.enable()
    dyn.run(steps)
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t
    text = ""
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
        text = out.getvalue()
    return first, wall, atoms, getattr(calc, "stats", None), text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dt", type=float, default=5.0, help="fs")
    p.add_argument("--temperature", type=float, default=40.0, help="K, initial")
    p.add_argument("--repeat-cell", type=int, default=3, help="fcc cells per axis (3: 108 atoms)")
    p.add_argument("--skin", type=float, default=1.0, help="ShardMD's neighbour-list skin, Å")
    p.add_argument("--repeat", type=int, default=3, help="runs per calculator, alternated")
    p.add_argument("--smooth", action="store_true", help="also ASE's LennardJones(smooth=True)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="print cProfile of one ShardMD run")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    start = make_atoms(args.repeat_cell, args.temperature, args.seed)
    names = ["shardmd", "ase"] + (["ase-smooth"] if args.smooth else [])
    warm = start.copy()
    warm.calc = make_calc("shardmd", args.skin)
    warm.get_forces()                        # kernels loaded once, outside the timings
    walls: dict[str, list[float]] = {n: [] for n in names}
    firsts: dict[str, list[float]] = {n: [] for n in names}
    final, stats = {}, None
    for _ in range(args.repeat):
        for n in names:
            first, wall, atoms, st, _ = run_md(start, n, args.steps, args.dt, args.skin)
            walls[n].append(wall / args.steps)
            firsts[n].append(first)
            final[n] = atoms
            stats = st if st is not None else stats

    print(f"{len(start)} Ar atoms, {args.steps} VelocityVerlet steps of {args.dt} fs from {args.temperature} K; "
          f"torch threads {torch.get_num_threads()}; {args.repeat} runs each, alternated")
    ref = final["shardmd"]
    e_ref = ref.get_potential_energy()
    print(f"{'calculator':<12} {'1st call ms':>11} {'ms/step min':>11} {'median':>8} {'max':>8} {'E_pot end (eV)':>17} "
          f"{'E_tot drift (eV)':>17} {'dE_pot vs shardmd':>18} {'max |dx| (Å)':>13}")
    for n in names:
        w = [x * 1e3 for x in walls[n]]
        a = final[n]
        e, et = a.get_potential_energy(), a.get_total_energy()
        a0 = start.copy()
        a0.calc = make_calc(n, args.skin)
        et0 = a0.get_total_energy()
        same = n != "ase-smooth"
        de = f"{e - e_ref:18.2e}" if same else f"{'(other potential)':>18}"
        dx = f"{np.abs(a.positions - ref.positions).max():13.2e}" if same else f"{'':>13}"
        print(f"{n:<12} {statistics.median(firsts[n]) * 1e3:11.1f} {min(w):11.3f} {statistics.median(w):8.3f}"
              f" {max(w):8.3f} {e:17.10f} {et - et0:17.2e} "
              f"{de} {dx}")
    print(f"shardmd: per run {stats['builds']} fresh build(s), {stats['rebuilds']} list rebuild(s), "
          f"{stats['reuses']} calls on a kept list (skin {args.skin} Å)")
    print(f"speed-up of shardmd over ase (median per step): "
          f"{statistics.median(walls['ase']) / statistics.median(walls['shardmd']):.2f}x")
    if args.profile:
        print(run_md(start, "shardmd", args.steps, args.dt, args.skin, profile=True)[4])
        print(run_md(start, "ase", args.steps, args.dt, args.skin, profile=True)[4])


if __name__ == "__main__":
    main()
