"""DFT-D3 (model=d3, models/d3.py) cost per MD step on the CPU, beside the shipped MACE model's, and
the D3 libraries we looked at, against dftd3 (simple-DFT-D3, the reference) on a periodic slab.

    python scripts/bench_d3.py                       # sizes 2 3 4 (32, 108, 256 Cu atoms), ~3 min on 2 cores
    python scripts/bench_d3.py --sizes 3 5 --repeats 5 --threads 2
    python scripts/bench_d3.py --no-libraries

A step is one evaluation of energy, forces and virial through ShardMDCalculator on one domain,
with the neighbour list kept (positions moved by less than half the skin between calls), the
median of ``--repeats`` calls after one warm-up. System: fcc Cu (a = 3.61 Å), cubic repeats n
(4 n^3 atoms), rattled by 0.05 Å. Columns: D3(BJ)/PBE at s-dftd3's default cutoffs (60, 40 Bohr:
31.75 Å two-body, 21.17 Å CN), at 12 Å / 10 Å, and with the ATM term (12 / 10 / 7 Å three-body);
MACE is ``model=mace`` (the shipped Cu model, float64); the last column is the default-cutoff D3
step over the MACE step.

The second table (``--no-libraries`` skips it): a 27-atom Cu(111) slab, periodic, D3(BJ)/PBE
two-body at 12 Å / 10 Å; the largest deviation of the energy per atom and of the forces from
dftd3, and seconds for one energy + forces.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch
from ase.build import bulk, fcc111
from ase.units import Bohr, Hartree

SHORT = {"cutoff": 12.0, "cn_cutoff": 10.0}


def crystal(n: int):
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((n, n, n))
    atoms.rattle(0.05, seed=1)
    return atoms


def per_step(atoms, repeats: int, **keys) -> float:
    """Median seconds of one energy + forces + stress evaluation (list reused)."""
    from shardmd.engine.ase_calculator import ShardMDCalculator

    a = atoms.copy()
    a.calc = ShardMDCalculator(**keys)
    a.get_forces()
    a.get_stress()
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats):
        a.positions = atoms.positions + rng.normal(scale=0.01, size=atoms.positions.shape)
        t0 = time.perf_counter()
        a.get_forces()
        a.get_stress()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_table(sizes, repeats: int) -> None:
    print(f"{'atoms':>6} {'d3 default s':>13} {'d3 12/10 s':>11} {'d3+ATM s':>9} {'mace s':>8} {'d3/mace':>8}")
    for n in sizes:
        atoms = crystal(n)
        d3_def = per_step(atoms, repeats, model="d3")
        d3_short = per_step(atoms, repeats, model="d3", **SHORT)
        d3_atm = per_step(atoms, repeats, model="d3", three_body=True, three_body_cutoff=7.0, **SHORT)
        mace = per_step(atoms, repeats, model="mace")
        print(f"{len(atoms):>6} {d3_def:>13.3f} {d3_short:>11.3f} {d3_atm:>9.3f} {mace:>8.3f} {d3_def / mace:>8.1f}")


def library_table() -> None:
    from dftd3.interface import DispersionModel, RationalDampingParam

    atoms = fcc111("Cu", size=(3, 3, 3), vacuum=6.0, periodic=True)
    atoms.rattle(0.05, seed=3)
    n, c2, ccn = len(atoms), SHORT["cutoff"], SHORT["cn_cutoff"]

    def reference():
        m = DispersionModel(atoms.numbers, atoms.positions / Bohr, atoms.cell[:] / Bohr, np.array(atoms.pbc))
        m.set_realspace_cutoff(c2 / Bohr, c2 / Bohr, ccn / Bohr)
        r = m.get_dispersion(RationalDampingParam(method="pbe", atm=False), grad=True)
        return float(r["energy"]) * Hartree, -r["gradient"] * Hartree / Bohr

    def ours():
        from shardmd.models.d3 import D3Dispersion

        r = D3Dispersion("pbe", "bj", **SHORT).calculate(atoms.positions, atoms.cell[:], atoms.pbc, atoms.numbers)
        return r["energy"], r["forces"]

    def torch_dftd():
        from torch_dftd.torch_dftd3_calculator import TorchDFTD3Calculator

        a = atoms.copy()
        a.calc = TorchDFTD3Calculator(atoms=a, device="cpu", damping="bj", xc="pbe", cutoff=c2, cnthr=ccn,
                                      abc=False, dtype=torch.float64)
        return a.get_potential_energy(), a.get_forces()

    def timed(fn):
        fn()
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    (e_ref, f_ref), t_ref = timed(reference)
    print(f"\n{'library':<34} {'|dE|/atom eV':>13} {'max|dF| eV/Å':>13} {'s':>7}")
    print(f"{'dftd3 1.7 (reference, Fortran)':<34} {0.0:>13.1e} {0.0:>13.1e} {t_ref:>7.3f}")
    rows = [("model=d3 (tad-dftd3 tables, ours)", ours), ("torch-dftd 0.5", torch_dftd)]
    for name, fn in rows:
        try:
            (e, f), t = timed(fn)
        except Exception as exc:  # noqa: BLE001 - an optional library missing or failing: say so, go on
            print(f"{name:<34} {'-':>13} {'-':>13} {'-':>7}  ({type(exc).__name__}: {str(exc)[:60]})")
            continue
        print(f"{name:<34} {abs(e - e_ref) / n:>13.1e} {np.abs(f - f_ref).max():>13.1e} {t:>7.3f}")
    print(f"{'tad-dftd3 0.7 (dftd3())':<34} {'no periodic input (positions only)':>35}")
    print(f"{'nvalchemi-toolkit-ops 0.5':<34} {'BJ only, no ATM, tables not shipped, float32':>35}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4], help="cubic repeats n (4 n^3 atoms)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--no-libraries", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    step_table(args.sizes, args.repeats)
    if not args.no_libraries:
        library_table()


if __name__ == "__main__":
    main()
