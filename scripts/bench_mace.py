"""MACE speed and memory: the engine vs mace-torch's own ASE calculator, bare mace-torch, capacity.

Modes (any combination; each prints a table):

    --vs-ase      our engine (1 domain) vs mace-torch's MACECalculator driving ASE's VelocityVerlet,
                  same system (fcc Cu, shipped model, 300 K, 1 fs), same device and dtype
    --bare        mace-torch forward + backward (forces by autograd) on a fixed graph, the
                  engine's last configuration: the floor an MD engine cannot beat;
                  engine overhead = 1 - engine rate / bare rate
    --capacity    largest system that fits: runs ``python -m engine run`` (under ``mpirun -n R``
                  for R > 1) on growing fcc repeats until one fails; peak GPU memory per rank
                  from the engine's "Memory:" line

    python scripts/bench_mace.py --vs-ase --bare --sizes 8 16 24 --dtype float32 --device cuda
    python scripts/bench_mace.py --capacity --ranks 1 2 --sizes 60 80 100 120 --dtype float32

Sizes are cubic fcc repeats n (4 n^3 atoms).  Rates are atom-steps per second over the timed
steps after warm-up (CUDA synchronised).  Model: --model (default: the shipped Cu model);
--cueq converts it with mace-torch's own cuEquivariance converter (GPU) for every path.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

A_CU = 3.59


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def pool_high_bytes(device: str) -> int:
    """High-water mark of the device's stream-ordered memory pool (``cudaMallocAsync``): what
    Warp and cuEquivariance's kernels allocate outside torch's caching allocator, which
    ``torch.cuda.max_memory_allocated`` does not see. Process lifetime; 0 when not on CUDA or
    Warp cannot tell."""
    if not device.startswith("cuda"):
        return 0
    try:
        import warp as wp

        return int(wp.get_mempool_used_mem_high(device if ":" in device else "cuda:0"))
    except Exception:  # noqa: BLE001 - no Warp, an old Warp, pools off
        return 0


def peak_bytes_per_atom(device: str, atoms: int) -> float:
    """The capacity figure: (torch allocator peak + stream-ordered pool high) / atoms, bytes."""
    if not device.startswith("cuda") or not atoms:
        return float("nan")
    return (torch.cuda.max_memory_allocated() + pool_high_bytes(device)) / atoms


def atoms_for(n: int, seed: int = 0):
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    atoms = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat((n, n, n))
    import numpy as np

    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(seed))
    return atoms


def engine_overrides(n: int, a) -> list[str]:
    ov = ["model=mace", f"system.repeat=[{n},{n},{n}]", f"precision={a.dtype}", f"device={a.device}",
          "trajectory.every=0", "thermo.every=0", "checkpoint.every=0", "quiet=true", "dt=1.0",
          # the run's length: steps at or past it read the skin check back blocking (the last
          # step is always verified); model=mace's own default is 20
          f"steps={a.warmup + a.steps}",
          f"output={tempfile.gettempdir()}/bench_mace_{os.getpid()}.h5", "overwrite=true"]
    if a.model:
        ov.append(f"model.checkpoint={a.model}")
    ov.append(f"model.cueq={str(a.cueq).lower()}")
    if a.no_pipelined_reads:
        ov.append("neighbor.pipelined=false")
    ov.append(f"model.cuda_graph={'false' if a.no_cuda_graph else 'auto'}")
    return ov


def run_engine(n: int, a) -> dict:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    _reset_peak(a.device)
    sim = Simulation(compose_config(engine_overrides(n, a)))
    if hasattr(sim.model, "recompute_radial"):   # default 'auto': recompute only after running out of memory
        sim.model.recompute_radial = True if a.recompute else False if a.keep_activations else "auto"
    sim.setup()
    sim.started = True
    for _ in range(a.warmup):
        sim.step()
    _sync(a.device)
    t = time.perf_counter()
    for _ in range(a.steps):
        sim.step()
    _sync(a.device)
    wall = time.perf_counter() - t
    natoms = sim.state.n_atoms
    c = sim.deferred
    f = getattr(sim.model, "_filter", None)   # MaceModel's RadiusFilter: the edges the model was given
    edges = f"{f.capacity} edge slots" if f is not None and f.capacity else "exact edges"
    reads = (f"skin check read {c.reads} times ({c.posted} posted), {c.rollbacks} rollbacks, "
             f"health measure in the same reads (last: max |v| {c.health_seen:.2g} Å/fs)"
             if c is not None else "skin check and health measure every step, one read")
    g = getattr(sim.model, "_graphed", None)
    if g is not None:
        reads += (f"; CUDA graph: {g.captures} captures, {g.replays} replays, {g.eager} eager calls"
                  + (f" (off: {g.disabled})" if g.disabled else ""))
    print(f"  engine, {natoms} atoms: {sim.nl.n_builds} builds, {reads}; {edges}")
    final = sim.domain.gather(sim.state, ("positions",))["positions"]   # id order, Å
    sim.close()
    return {"atoms": natoms, "rate": natoms * a.steps / wall, "peak_gib": _peak_gib(a.device),
            "bytes_per_atom": peak_bytes_per_atom(a.device, natoms), "positions": final}


def _calculator(a):
    import warnings

    from mace.calculators import MACECalculator

    from shardmd.models.mace import DEFAULT_MODEL

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MACECalculator(model_paths=str(a.model or DEFAULT_MODEL), device=a.device,
                              default_dtype=a.dtype, enable_cueq=a.cueq)


def run_ase(n: int, a, calc) -> dict:
    from ase import units
    from ase.md.verlet import VelocityVerlet

    _reset_peak(a.device)
    atoms = atoms_for(n)
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    dyn.run(a.warmup)
    t = time.perf_counter()
    dyn.run(a.steps)  # the calculator hands back numpy arrays: every step is synchronised
    wall = time.perf_counter() - t
    return {"atoms": len(atoms), "rate": len(atoms) * a.steps / wall, "peak_gib": _peak_gib(a.device)}


def run_bare(n: int, a, calc, positions=None) -> dict:
    """Forward + backward of the calculator's (converted) model on one fixed graph: the
    engine's last configuration when ``positions`` (Å, id order) are given. A thermalised
    crystal has more edges inside r_max than the perfect lattice (fcc Cu, 300 K, 5 Å, 55k
    atoms: 2.40e6 against 2,322,432, +3.3 %), so timing the bare model on the lattice would
    flatter it."""
    from mace import data as mdata
    from mace.tools import torch_geometric

    atoms = atoms_for(n)
    if positions is not None:
        atoms.positions = positions
        atoms.wrap()
    model = calc.models[0]
    config = mdata.config_from_atoms(atoms)
    ad = mdata.AtomicData.from_config(config, z_table=calc.z_table, cutoff=calc.r_max,
                                      heads=getattr(calc, "available_heads", None))
    batch = next(iter(torch_geometric.dataloader.DataLoader([ad], batch_size=1))).to(a.device)
    dt = getattr(torch, a.dtype)
    d = {k: (v.to(dt) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in batch.to_dict().items()}

    def once():
        out = model(dict(d), compute_force=True, training=False)
        return out["forces"]

    _reset_peak(a.device)
    for _ in range(a.warmup):
        once()
    _sync(a.device)
    t = time.perf_counter()
    for _ in range(a.steps):
        once()
    _sync(a.device)
    wall = time.perf_counter() - t
    return {"atoms": len(atoms), "rate": len(atoms) * a.steps / wall, "peak_gib": _peak_gib(a.device),
            "edges": int(d["edge_index"].shape[1])}


def make_bench_mace(path: Path, channels: int, max_ell: int = 3, correlation: int = 3, r_max: float = 5.0,
                    seed: int = 0) -> Path:
    """A Cu MACE of MACE-MP-medium's shape (channels x (0e + 1o), l <= 3, correlation 3) with
    random weights: speed does not depend on the weights' values."""
    from shardmd.models.mace_random import make_random_mace

    return make_random_mace(path, elements=(29,), r_max=r_max, channels=channels, max_ell=max_ell,
                            correlation=correlation, num_bessel=8, mlp_channels=16, avg_num_neighbors=43.5,
                            e0=(-3.5,), scale=1.0, shift=0.0, seed=seed)


def capacity(a) -> None:
    print(f"\ncapacity: fcc Cu, shipped model, {a.dtype}, {a.device}, 5 steps per size; peak = max over ranks")
    print(f"{'GPUs':>4} {'repeat':>6} {'atoms':>10} {'result':>8} {'peak GiB/rank':>14} {'B/atom':>8} "
          f"{'atom-steps/s':>13}   (B/atom: torch allocator peak per atom of a rank)")
    first = 0  # more GPUs start from the largest size the previous count fitted
    for r in a.ranks:
        for i, n in enumerate(a.sizes[first:], start=first):
            work = Path(tempfile.mkdtemp(prefix="capacity-"))
            args = ["model=mace", f"system.repeat=[{n},{n},{n}]", f"precision={a.dtype}", f"device={a.device}",
                    "steps=5", "trajectory.every=0", "thermo.every=0", "checkpoint.every=0", "quiet=true",
                    f"output={work}/c.h5", f"model.cueq={str(a.cueq).lower()}",
                    *([f"model.checkpoint={a.model}"] if a.model else [])]
            cmd = [sys.executable, "-m", "engine", "run", *args]
            if r > 1:
                cmd = ["mpirun", "-n", str(r), *cmd]
            env = dict(os.environ, NCCL_NVLS_ENABLE="0")
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
                ok, err = p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired:
                ok, err = False, f"timeout {a.timeout} s"
            log = (work / "c.log").read_text() if (work / "c.log").exists() else ""
            mem = re.search(r"Memory: peak GPU ([\d.]+) GiB", log)
            rate = re.search(r"([\d.e+]+) atom-steps/s", log)
            print(f"{r:>4} {n:>6} {4 * n**3:>10} {'ok' if ok else 'FAILED':>8} "
                  f"{(mem.group(1) if mem else '-'):>14} "
                  f"{(f'{float(mem.group(1)) * 2**30 * r / (4 * n**3):.0f}' if mem else '-'):>8} "
                  f"{(rate.group(1) if rate else '-'):>13}", flush=True)
            if not ok:
                print(f"     ({err[:200]})", flush=True)
                break
            first = i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[6, 10])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="a mace-torch model file (default: the shipped one)")
    ap.add_argument("--cueq", action="store_true", help="mace-torch's cuEquivariance conversion")
    ap.add_argument("--random-channels", type=int, default=0,
                    help="instead of --model: a random-weight MACE with this many channels, l=3, correlation 3")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vs-ase", action="store_true")
    ap.add_argument("--bare", action="store_true")
    ap.add_argument("--no-pipelined-reads", action="store_true",
                    help="neighbor.pipelined=false: every scheduled skin-check read blocks (for an A/B)")
    ap.add_argument("--no-cuda-graph", action="store_true",
                    help="model.cuda_graph=false: the engine runs its MACE call eagerly (default: auto)")
    ap.add_argument("--recompute", action="store_true",
                    help="recompute the radial MLPs' activations in the backward pass from the first call "
                         "(MaceModel.recompute_radial=True; default 'auto': only after running out of memory)")
    ap.add_argument("--keep-activations", action="store_true",
                    help="never recompute them (MaceModel.recompute_radial=False)")
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1])
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args(argv)
    if a.random_channels:
        a.model = str(make_bench_mace(Path(tempfile.gettempdir()) / f"mace_rand_{a.random_channels}.model",
                                       a.random_channels))
    if a.capacity:
        capacity(a)
    if not (a.vs_ase or a.bare):
        return 0
    calc = _calculator(a)
    name = Path(a.model).name if a.model else "shipped Cu model"
    print(f"\nMACE ({name}{', cuEquivariance' if a.cueq else ''}), {a.dtype}, {a.device}; "
          f"{a.steps} timed steps after {a.warmup} warm-up")
    print(f"{'atoms':>9} {'engine':>12} {'ASE+calc':>12} {'bare f+b':>12} {'eng/ASE':>8} {'eng/bare':>9} "
          f"{'engine GiB':>10} {'B/atom':>8} {'bare GiB':>9}")
    for n in a.sizes:
        e = run_engine(n, a)
        s = run_ase(n, a, calc) if a.vs_ase else None
        b = run_bare(n, a, calc, e["positions"]) if a.bare else None
        if b:
            print(f"  bare, {b['atoms']} atoms: {b['edges']} edges (the engine's last configuration)")
        f = lambda r: f"{r['rate']:.4g}" if r else "-"  # noqa: E731
        print(f"{e['atoms']:>9} {f(e):>12} {f(s):>12} {f(b):>12} "
              f"{(e['rate'] / s['rate'] if s else float('nan')):>8.2f} "
              f"{(e['rate'] / b['rate'] if b else float('nan')):>9.2f} {e['peak_gib']:>10.2f} "
              f"{e['bytes_per_atom']:>8.0f} "
              f"{(b['peak_gib'] if b else float('nan')):>9.2f}", flush=True)
    print("(atom-steps/s; engine and ASE include the integrator and neighbour lists, bare is one "
          "forward+backward on the engine's last configuration; B/atom: the engine's peak bytes per atom, "
          "torch allocator peak + stream-ordered pool high (Warp, cuEquivariance), the capacity figure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
