"""Check the Warp neighbour list and Lennard-Jones kernels on CUDA against the CPU.

    python scripts/check_cuda_lj.py            # needs a CUDA device; exits 0 with a note without one

System: ~5,000 atoms (Ar/Kr, or Ar alone) on a perturbed fcc lattice in a strongly sheared
(triclinic) periodic cell; a fifth of the atoms are moved by random lattice vectors, so the
positions are unwrapped and many edges carry image shifts.  In float64:

1. neighbour lists built on CPU and on CUDA: the same edges (compared as arrays: the order
   is defined by ids and geometry, not by the device);
2. forces, energy, virial and per-atom energies from the CUDA kernel against the CPU kernel
   (on the same list): max|dF| <= 1e-10 max|F|, and likewise for E and W;
3. CUDA results bit-identical over two launches (no atomics anywhere);
4. the ghost-point path (n_query < n_points, virial summed per edge) against the CPU;
5. a short engine run on device=cuda next to the same run on the CPU.

Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import torch

TOL = 1e-10
EPS = {"Ar": 0.0103, "Kr": 0.014}
SIG = {"Ar": 3.405, "Kr": 3.65}
CUTOFF = 8.5


def make_system(n_cells: int = 11, two_species: bool = True, seed: int = 0):
    """(positions, cell, pbc, numbers) as float64 CPU tensors: 4 n^3 atoms."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    atoms = bulk("Ar", "fcc", a=5.72, cubic=True).repeat((n_cells,) * 3)
    frac = atoms.get_scaled_positions()
    L = atoms.cell.lengths()[0]
    cell = np.array([[L, 0.0, 0.0], [0.31 * L, 0.95 * L, 0.0], [-0.22 * L, 0.27 * L, 1.02 * L]])
    pos = frac @ cell + rng.normal(scale=0.15, size=frac.shape)
    moved = rng.random(len(pos)) < 0.2
    pos[moved] += rng.integers(-2, 3, size=(int(moved.sum()), 3)) @ cell
    numbers = rng.choice([18, 36], size=len(pos)) if two_species else np.full(len(pos), 18)
    t = lambda a, dt=torch.float64: torch.tensor(a, dtype=dt)  # noqa: E731
    return t(pos), t(cell), torch.tensor([True, True, True]), t(numbers, torch.int64)


def make_lj(two_species: bool):
    from shardmd.models.lj import LennardJones

    if two_species:
        return LennardJones(epsilon=dict(EPS), sigma=dict(SIG), cutoff=CUTOFF, shift=True)
    return LennardJones(epsilon={"Ar": EPS["Ar"]}, sigma={"Ar": SIG["Ar"]}, cutoff=CUTOFF, shift=True)


def rel_errors(a: dict, b: dict) -> dict:
    """max |a - b| / max |b| per output (energy: over the per-atom energies' sum of |E_i|)."""
    a = {k: v.detach().double().cpu() for k, v in a.items()}
    b = {k: v.detach().double().cpu() for k, v in b.items()}
    return {
        "forces": float((a["forces"] - b["forces"]).abs().max() / b["forces"].abs().max()),
        "energy": float((a["energy"] - b["energy"]).abs() / b["energies"].abs().sum()),
        "energies": float((a["energies"] - b["energies"]).abs().max() / b["energies"].abs().max()),
        "virial": float((a["virial"] - b["virial"]).abs().max() / b["virial"].abs().max()),
    }


def same_list(a, b) -> bool:
    return (torch.equal(a.offsets.cpu(), b.offsets.cpu()) and torch.equal(a.neighbors.cpu(), b.neighbors.cpu())
            and torch.equal(a.shifts.cpu(), b.shifts.cpu()))


def check_kernels(two_species: bool, dtype=torch.float64, n_query_drop: int = 0) -> bool:
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = make_system(two_species=two_species)
    pos, cell = pos.to(dtype), cell.to(dtype)
    n = len(pos)
    nq = n - n_query_drop
    lj = make_lj(two_species)
    radius = CUTOFF + 1.0
    t0 = time.perf_counter()
    nl_cpu = build_neighbor_list(pos, cell, pbc, radius, n_query=nq)
    t_cpu = time.perf_counter() - t0
    g = lambda x: x.to("cuda")  # noqa: E731
    build_neighbor_list(g(pos), g(cell), g(pbc), radius, n_query=nq)  # compile / warm up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    nl_gpu = build_neighbor_list(g(pos), g(cell), g(pbc), radius, n_query=nq)
    torch.cuda.synchronize()
    t_gpu = time.perf_counter() - t0
    lists_equal = same_list(nl_cpu, nl_gpu)

    ref = lj.compute(pos, cell, pbc, z, nl_cpu)
    out = lj.compute(g(pos), g(cell), g(pbc), g(z), nl_gpu if lists_equal else _to_cuda(nl_cpu))
    again = lj.compute(g(pos), g(cell), g(pbc), g(z), nl_gpu if lists_equal else _to_cuda(nl_cpu))
    bitwise = all(torch.equal(out[k], again[k]) for k in out)
    err = rel_errors(out, ref)
    fmax = float(ref["forces"].abs().max())
    ok = lists_equal and bitwise and all(v <= TOL for v in err.values())
    label = f"{'Ar/Kr' if two_species else 'Ar'} {str(dtype).split('.')[-1]}" + (
        f", ghosts: {n_query_drop} points are not queries" if n_query_drop else "")
    print(f"[{'ok' if ok else 'FAIL'}] {label}: {n} atoms, {nl_cpu.n_edges} edges, "
          f"{int((nl_cpu.shifts != 0).any(1).sum())} with image shifts")
    print(f"       list CPU == CUDA: {lists_equal} (build CPU {t_cpu * 1e3:.0f} ms, CUDA {t_gpu * 1e3:.1f} ms)")
    print(f"       max|F| = {fmax:.4e} eV/Å, max|dF| = {err['forces'] * fmax:.3e} eV/Å "
          f"= {err['forces']:.2e} max|F| (limit {TOL:.0e})")
    print(f"       |dE| / sum|E_i| = {err['energy']:.2e}, max|dE_i| / max|E_i| = {err['energies']:.2e}, "
          f"max|dW| / max|W| = {err['virial']:.2e}")
    print(f"       E = {float(ref['energy']):.10f} eV (CPU), {float(out['energy']):.10f} eV (CUDA); "
          f"CUDA bit-identical over two launches: {bitwise}")
    return ok


def _to_cuda(nl):
    from shardmd.domain.neighbors import NeighborList

    return NeighborList(offsets=nl.offsets.cuda(), neighbors=nl.neighbors.cuda(), shifts=nl.shifts.cuda(),
                        cutoff=nl.cutoff, n_points=nl.n_points)


def engine_run(device: str, steps: int, precision: str = "float64") -> tuple[dict, float]:
    from shardmd.engine.config import compose_config
    from shardmd.engine.simulation import Simulation

    out = tempfile.mkdtemp(prefix="check_cuda_lj_")
    cfg = compose_config([
        "model=lj", "system.repeat=[10,10,10]", "system.a=5.72", f"steps={steps}", "dt=5.0",
        "temperature=120.0", f"device={device}", f"precision={precision}", "threads=1", "quiet=true",
        "trajectory.every=0", "thermo.every=0", f"output={out}/run.h5",
    ])
    sim = Simulation(cfg)
    t0 = time.perf_counter()
    obs = sim.run()
    return obs, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="steps of the engine run")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing checked (run on the device machine)")
        return 0
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    ok = True
    ok &= check_kernels(two_species=True)
    ok &= check_kernels(two_species=False)
    ok &= check_kernels(two_species=True, n_query_drop=500)

    cpu, t_cpu = engine_run("cpu", args.steps)
    gpu, t_gpu = engine_run("cuda", args.steps)
    n_atoms = 4000
    d_pe = abs(gpu["potential_energy"] - cpu["potential_energy"]) / n_atoms
    d_te = abs(gpu["total_energy"] - cpu["total_energy"]) / n_atoms
    # the two runs are the same trajectory up to round-off growing over the steps
    eng_ok = d_pe < 1e-6 and d_te < 1e-6
    ok &= eng_ok
    print(f"[{'ok' if eng_ok else 'FAIL'}] engine, {n_atoms} Ar atoms, {args.steps} steps NVE float64: "
          f"PE {cpu['potential_energy']:.8f} eV (CPU) vs {gpu['potential_energy']:.8f} eV (CUDA), "
          f"|dPE|/atom = {d_pe:.1e} eV, |dE_tot|/atom = {d_te:.1e} eV; "
          f"wall CPU {t_cpu:.1f} s, CUDA {t_gpu:.1f} s (compile included)")
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
