"""Check the Warp neighbour list and Lennard-Jones kernels on CUDA against the CPU.

    python scripts/check_cuda_lj.py            # needs a CUDA device; exits 0 with a note without one
    python scripts/check_cuda_lj.py --write-reference ref.npz   # CPU results, on a machine with
    python scripts/check_cuda_lj.py --reference ref.npz         # Warp's CPU compiler, for one without

The CPU side needs Warp's CPU (LLVM) compiler; where it is missing (a GPU machine given only
warp's CUDA part), ``--reference`` reads the CPU results written by ``--write-reference``:
hashes of the neighbour lists and the forces, energies and virials.

System: ~5,000 atoms (Ar/Kr, or Ar alone) on a perturbed fcc lattice in a strongly sheared
(triclinic) periodic cell; a fifth of the atoms are moved by random lattice vectors, so the
positions are unwrapped and many edges carry image shifts.  In float64:

1. neighbour lists built on CPU and on CUDA: the same edges (compared as arrays: the order
   is defined by ids and geometry, not by the device);
2. forces, energy, virial and per-atom energies from the CUDA kernel against the CPU kernel
   (each on its own device's list, which must be the same): max|dF| <= 1e-10 max|F|, and
   likewise for E and W;
3. CUDA results bit-identical over two launches (no atomics anywhere);
4. the ghost-point path (n_query < n_points, virial summed per edge) against the CPU;
5. a short engine run on device=cuda next to the same run on the CPU.

Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import hashlib
import json
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


CASES = {  # name: (two species, points that are not query points)
    "ArKr": (True, 0),
    "Ar": (False, 0),
    "ArKr-ghosts": (True, 500),
}
RADIUS = CUTOFF + 1.0


def list_digest(nl) -> str:
    """sha256 of the list arrays (offsets, neighbors, shifts as little-endian int32)."""
    h = hashlib.sha256()
    for t in (nl.offsets, nl.neighbors, nl.shifts):
        h.update(t.detach().cpu().contiguous().numpy().astype("<i4").tobytes())
    return h.hexdigest()


def cpu_results(name: str) -> dict:
    """CPU neighbour list digest and LJ outputs (float64) of one case."""
    from shardmd.domain.neighbors import build_neighbor_list

    two_species, n_ghost = CASES[name]
    pos, cell, pbc, z = make_system(two_species=two_species)
    nl = build_neighbor_list(pos, cell, pbc, RADIUS, n_query=len(pos) - n_ghost)
    out = make_lj(two_species).compute(pos, cell, pbc, z, nl)
    return {"digest": list_digest(nl), "n_edges": nl.n_edges,
            "n_shifted": int((nl.shifts != 0).any(1).sum()), **{k: v.numpy() for k, v in out.items()}}


def check_kernels(name: str, ref: dict) -> bool:
    from shardmd.domain.neighbors import build_neighbor_list

    two_species, n_ghost = CASES[name]
    pos, cell, pbc, z = (t.cuda() for t in make_system(two_species=two_species))
    nq = len(pos) - n_ghost
    lj = make_lj(two_species)
    build_neighbor_list(pos, cell, pbc, RADIUS, n_query=nq)  # compile / warm up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    nl = build_neighbor_list(pos, cell, pbc, RADIUS, n_query=nq)
    torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    lists_equal = list_digest(nl) == ref["digest"]
    out = lj.compute(pos, cell, pbc, z, nl)
    again = lj.compute(pos, cell, pbc, z, nl)
    bitwise = all(torch.equal(out[k], again[k]) for k in out)
    err = rel_errors(out, {k: torch.as_tensor(ref[k]) for k in ("forces", "energy", "energies", "virial")})
    fmax = float(abs(ref["forces"]).max())
    ok = lists_equal and bitwise and all(v <= TOL for v in err.values())
    print(f"[{'ok' if ok else 'FAIL'}] {name} float64: {len(pos)} atoms ({n_ghost} of them not query points), "
          f"{int(ref['n_edges'])} edges, {int(ref['n_shifted'])} with image shifts")
    print(f"       list CUDA == CPU (sha256 of offsets, neighbors, shifts): {lists_equal}; "
          f"CUDA build {t_build * 1e3:.1f} ms")
    print(f"       max|F| = {fmax:.4e} eV/Å, max|dF| = {err['forces'] * fmax:.3e} eV/Å "
          f"= {err['forces']:.2e} max|F| (limit {TOL:.0e})")
    print(f"       |dE| / sum|E_i| = {err['energy']:.2e}, max|dE_i| / max|E_i| = {err['energies']:.2e}, "
          f"max|dW| / max|W| = {err['virial']:.2e}")
    print(f"       E = {float(ref['energy']):.10f} eV (CPU), {float(out['energy']):.10f} eV (CUDA); "
          f"CUDA bit-identical over two launches: {bitwise}")
    return ok


def engine_run(device: str, steps: int, precision: str = "float64") -> tuple[dict, float]:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

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


def cpu_available() -> bool:
    from shardmd.domain.warp_setup import init_warp

    return init_warp().is_cpu_available()


def write_reference(path: str, steps: int) -> None:
    data = {}
    for name in CASES:
        for key, value in cpu_results(name).items():
            data[f"{name}/{key}"] = np.asarray(value)
    obs, _ = engine_run("cpu", steps)
    data["engine"] = np.asarray(json.dumps({k: obs[k] for k in ("potential_energy",
                                                                "total_energy")} | {"steps": steps}))
    np.savez_compressed(path, **data)
    print(f"wrote CPU reference of {', '.join(CASES)} and a {steps}-step engine run to {path}")


def read_reference(path: str) -> tuple[dict, dict]:
    z = np.load(path)
    cases = {name: {k.split("/", 1)[1]: (str(z[k]) if k.endswith("digest") else z[k])
                    for k in z.files if k.startswith(name + "/")} for name in CASES}
    return cases, json.loads(str(z["engine"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="steps of the engine run")
    ap.add_argument("--write-reference", metavar="NPZ", help="write the CPU results and exit")
    ap.add_argument("--reference", metavar="NPZ", help="CPU results written by --write-reference")
    args = ap.parse_args(argv)
    if args.write_reference:
        write_reference(args.write_reference, args.steps)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing checked (run on the device machine)")
        return 0
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    if args.reference:
        refs, cpu = read_reference(args.reference)
        steps = int(cpu["steps"])
        print(f"CPU side: {args.reference}")
    elif cpu_available():
        refs = {name: cpu_results(name) for name in CASES}
        steps = args.steps
        cpu, _ = engine_run("cpu", steps)
    else:
        print("Warp's CPU compiler is not available here: give --reference (see --write-reference)")
        return 2
    ok = True
    for name in CASES:
        ok &= check_kernels(name, refs[name])

    gpu, t_gpu = engine_run("cuda", steps)
    n_atoms = 4000
    d_pe = abs(gpu["potential_energy"] - cpu["potential_energy"]) / n_atoms
    d_te = abs(gpu["total_energy"] - cpu["total_energy"]) / n_atoms
    # the same trajectory up to round-off (fused multiply-adds differ) growing over the steps
    eng_ok = d_pe < 1e-8 and d_te < 1e-8
    ok &= eng_ok
    print(f"[{'ok' if eng_ok else 'FAIL'}] engine, {n_atoms} Ar atoms, {steps} steps NVE float64 on cuda: "
          f"PE {cpu['potential_energy']:.10f} eV (CPU) vs {gpu['potential_energy']:.10f} eV (CUDA), "
          f"|dPE|/atom = {d_pe:.1e} eV, |dE_tot|/atom = {d_te:.1e} eV; CUDA wall {t_gpu:.1f} s (compile included)")
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
