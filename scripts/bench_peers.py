"""MACE molecular dynamics side by side: ShardMD, torch-sim and ASE + mace-torch's MACECalculator.

Same model file, same system (fcc Cu, a = 3.59 Å, positions rattled by 0.05 Å so step-0 forces
are not ~0, Maxwell-Boltzmann velocities at 300 K), NVE velocity Verlet at dt = 1 fs, same
device and dtype. For each size and peer: atom-steps/s over --steps timed steps after --warmup
(CUDA synchronised), peak torch-allocator memory (reset before each peer; the stream-ordered pool
used by Warp and cuEquivariance is reported once per process at the end), and the step-0 energy
and forces against ShardMD's (|dE| per atom, max |dF| over atoms and components).

    python scripts/bench_peers.py --sizes 6 16 30 48 --device cuda               # shipped Cu model
    python scripts/bench_peers.py --sizes 6 16 --foundation --device cuda        # MACE-MP-medium shape
    python scripts/bench_peers.py --sizes 2 --device cpu --steps 2 --warmup 1    # a smoke run
    python scripts/bench_peers.py --capacity --sizes 48 56 60 62 64 --peers shardmd torch-sim --steps 2
    python scripts/bench_peers.py --sizes 16 30 48 --peers shardmd shardmd-compiled torch-sim

Each peer runs with its best documented settings (printed in the table's "settings" column):

- ShardMD: model=mace, cuEquivariance on CUDA (model.cueq=auto), CUDA graph between rebuilds
  (model.cuda_graph=auto: up to 50,000 atoms; ``--graph both`` adds a forced-graph and an
  eager row), deferred and pipelined skin checks (the CUDA defaults), skin 1 Å, float64 sums.
- torch-sim (PyPI torch-sim-atomistic, the 0.6 API): ``torch_sim.models.mace.MaceModel`` with
  ``enable_cueq=True`` (else the module converted by mace-torch's converter), compute_stress=False
  (NVE needs no stress), its cell list (``--ts-nl alchemiops_nl_cell_list``; its default O(N^2)
  list is 13.5x slower at 442k atoms), rebuilt every step as torch-sim does, ``ts.integrate``
  with nve (no trajectory reporter).
- ASE: ``mace.calculators.MACECalculator(enable_cueq=True on CUDA)`` + ``ase.md.VelocityVerlet``
  (mace-torch's documented MD route; the graph is rebuilt on the host every step); run only up to
  --ase-max atoms (it is 10-50x slower).

A peer that fails (not installed, out of memory) gets one row saying why; the others go on.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

A_CU = 3.59
DT_FS = 1.0
RATTLE = 0.05


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _fresh(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def make_atoms(n: int, elements=(29,), seed: int = 0):
    """fcc a = 3.59 Å, n^3 cubic cells (4 n^3 atoms), rattled, 300 K velocities (ASE units)."""
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    atoms = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat((n, n, n))
    rng = np.random.default_rng(seed)
    atoms.positions += rng.normal(0.0, RATTLE, atoms.positions.shape)
    if len(elements) > 1:   # a multi-element model: spread its first few species over the sites
        atoms.numbers = np.asarray(elements)[rng.integers(0, min(len(elements), 4), len(atoms))]
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=rng)
    Stationary(atoms)
    return atoms


def _quiet():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("ignore")
    return w


# ---------------------------------------------------------------- ShardMD
def run_shardmd(atoms, a, graph: str, compiled: bool = False) -> dict:
    from shardmd.engine.ase_calculator import ShardMDCalculator
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    dev, cueq = a.device, ("true" if a.device.startswith("cuda") else "false")
    _fresh(dev)
    calc = ShardMDCalculator(model="mace", checkpoint=str(a.model_path), precision=a.dtype, device=dev,
                             cueq=cueq == "true", cuda_graph=False)
    ref = atoms.copy()
    ref.calc = calc
    e0, f0 = float(ref.get_potential_energy()), np.array(ref.get_forces())
    del ref, calc
    _fresh(dev)
    ov = ["model=mace", f"model.checkpoint={a.model_path}", f"precision={a.dtype}", f"device={dev}",
          f"model.cueq={cueq}", f"model.cuda_graph={graph}", "trajectory.every=0", "thermo.every=0",
          "checkpoint.every=0", "quiet=true", f"dt={DT_FS}", f"steps={a.warmup + a.steps}",
          f"output={tempfile.gettempdir()}/bench_peers_{os.getpid()}.h5", "overwrite=true",
          f"model.compile={str(compiled).lower()}"]
    state = State.from_atoms(atoms, dtype=getattr(torch, a.dtype), device=dev)
    t = time.perf_counter()
    sim = Simulation(compose_config(ov), state=state)
    sim.setup()
    sim.started = True
    for _ in range(a.warmup):
        sim.step()
    _sync(dev)
    start = time.perf_counter() - t   # set-up and warm-up: what compiling adds to a run, once
    t = time.perf_counter()
    for _ in range(a.steps):
        sim.step()
    _sync(dev)
    wall = time.perf_counter() - t
    g = getattr(sim.model, "_graphed", None)
    note = (f"start {start:.1f} s, {sim.nl.n_builds} list builds"
            + (f", {g.replays} graph replays" if g is not None and g.replays else ""))
    sim.close()
    return {"rate": len(atoms) * a.steps / wall, "peak": _peak_gib(dev), "e0": e0, "f0": f0, "note": note}


# ---------------------------------------------------------------- torch-sim
def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _mace_module(a, convert: bool = True):
    """The model file as a mace-torch module on the device, converted to cuEquivariance on CUDA
    with mace-torch's own converter (what ShardMD and the calculator run) unless ``convert`` is off."""
    from shardmd.models.mace import load_mace, to_cueq

    dt = getattr(torch, a.dtype)
    m = load_mace(a.model_path, a.device, dt, trust_pickle=True)
    if convert and a.device.startswith("cuda"):
        m = to_cueq(m, torch.device(a.device))
    return m.to(dtype=dt)


def run_torchsim(atoms, a) -> dict:
    """torch-sim (0.6 API): its MaceModel with its fastest neighbour list (``--ts-nl``, the cell
    list) and cuEquivariance by mace-torch's own ``enable_cueq`` route where it converts (else the
    module we converted); ``ts.integrate`` with nve, n_steps = warmup and warmup + steps, the
    difference timed (its state set-up cancels)."""
    import torch_sim as ts
    import torch_sim.neighbors as tsn
    from torch_sim.models.mace import MaceModel as TSMace

    dev, dt = torch.device(a.device), getattr(torch, a.dtype)
    _fresh(a.device)
    nl = getattr(tsn, a.ts_nl)
    cuda = a.device.startswith("cuda")
    tried, model = [], None
    for route in (("enable_cueq", "converted") if cuda else ("e3nn",)):
        try:
            module = _mace_module(a) if route == "converted" else _mace_module(a, convert=False)
            model = TSMace(model=module, device=dev, dtype=dt, compute_forces=True, compute_stress=False,
                           neighbor_list_fn=nl, **({"enable_cueq": True} if route == "enable_cueq" else {}))
            out = model(ts.io.atoms_to_state(atoms, device=dev, dtype=dt))
            break
        except Exception as exc:  # noqa: BLE001 - the next route; the note says why this one failed
            tried.append(f"{route}: {type(exc).__name__}")
            model = None
    if model is None:
        raise RuntimeError("; ".join(tried))
    e0 = float(out["energy"].sum())
    f0 = out["forces"].detach().cpu().numpy().astype(np.float64)
    del out
    flavor = ts.Integrator.nve if hasattr(ts, "Integrator") else "nve"

    def integrate(k: int) -> float:
        _sync(a.device)
        t = time.perf_counter()
        ts.integrate(system=atoms, model=model, integrator=flavor, n_steps=k, temperature=300.0,
                     timestep=DT_FS * 1e-3)
        _sync(a.device)
        return time.perf_counter() - t

    wall = -integrate(a.warmup) + integrate(a.warmup + a.steps)
    return {"rate": len(atoms) * a.steps / wall, "peak": _peak_gib(a.device), "e0": e0, "f0": f0,
            "note": f"torch-sim {_version('torch-sim-atomistic')}, {a.ts_nl}, {route}"
                    + (f" ({'; '.join(tried)})" if tried else "")}


# ---------------------------------------------------------------- ASE
def run_ase(atoms, a) -> dict:
    from ase import units
    from ase.md.verlet import VelocityVerlet
    from mace.calculators import MACECalculator

    _fresh(a.device)
    calc = MACECalculator(model_paths=str(a.model_path), device=a.device, default_dtype=a.dtype,
                          enable_cueq=a.device.startswith("cuda"))
    at = atoms.copy()
    at.calc = calc
    e0, f0 = float(at.get_potential_energy()), np.array(at.get_forces())
    dyn = VelocityVerlet(at, timestep=DT_FS * units.fs)
    dyn.run(a.warmup)
    t = time.perf_counter()
    dyn.run(a.steps)   # numpy results every step: synchronised
    wall = time.perf_counter() - t
    return {"rate": len(atoms) * a.steps / wall, "peak": _peak_gib(a.device), "e0": e0, "f0": f0,
            "note": "MACECalculator + VelocityVerlet"}


SETTINGS = {
    "shardmd": "cueq, graph auto (<=50k), deferred+pipelined skin check, skin 1 A",
    "shardmd-graph": "cueq, CUDA graph forced (model.cuda_graph=true)",
    "shardmd-eager": "cueq, eager (model.cuda_graph=false)",
    "shardmd-compiled": "cueq, graph auto, the module compiled (model.compile=true)",
    "torch-sim": "its nl (--ts-nl) every step, no stress",
    "ase": "MACECalculator(enable_cueq), VelocityVerlet, host graph every step",
}


def pool_high_gib(device: str) -> float:
    if not device.startswith("cuda"):
        return float("nan")
    try:
        import warp as wp

        return wp.get_mempool_used_mem_high(device if ":" in device else "cuda:0") / 2**30
    except Exception:  # noqa: BLE001
        return float("nan")


def make_foundation(path: Path) -> Path:
    """A MACE of MACE-MP-medium's published shape with random weights: 89 elements (H..Ac),
    128x0e+128x1o hidden, spherical harmonics l <= 3, correlation 3, 2 interactions, r_max 6 Å,
    10 Bessel functions, radial MLP 64x3, MLP irreps 16x0e."""
    from shardmd.models.mace_random import make_random_mace

    return make_random_mace(path, elements=tuple(range(1, 90)), r_max=6.0, channels=128, max_ell=3,
                            correlation=3, num_bessel=10, mlp_channels=16, avg_num_neighbors=61.96,
                            e0=tuple(-1.0 - 0.01 * i for i in range(89)), scale=1.0, shift=0.0, seed=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[6, 16], help="fcc repeats n (4 n^3 atoms)")
    ap.add_argument("--peers", nargs="+", default=["shardmd", "torch-sim", "ase"],
                    choices=["shardmd", "shardmd-compiled", "torch-sim", "ase"])
    ap.add_argument("--graph", choices=["auto", "both"], default="auto",
                    help="both: ShardMD also with the CUDA graph forced on and off")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="a mace-torch .model file (default: the shipped Cu model)")
    ap.add_argument("--foundation", action="store_true", help="a random MACE of MACE-MP-medium's shape")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ts-nl", default="alchemiops_nl_cell_list",
                    help="torch-sim's neighbour-list function (torch_sim.neighbors; its default O(N^2) is slow)")
    ap.add_argument("--ase-max", type=int, default=20000, help="ASE runs only up to this many atoms")
    ap.add_argument("--capacity", action="store_true",
                    help="instead of the rate table: per peer, the largest of --sizes that runs (a fresh process "
                         "per size, ascending, until the first that does not) and its peak memory")
    ap.add_argument("--capacity-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.capacity and a.capacity_child is None:
        return capacity(a)
    if a.foundation:
        a.model_path = make_foundation(Path(tempfile.gettempdir()) / "mace_mp_medium_shape_random.model")
        elements, label = tuple(range(1, 90)), "random MACE-MP-medium shape (89 el., 128x0e+128x1o, l<=3, r 6 A)"
    else:
        from shardmd.models.mace import DEFAULT_MODEL

        a.model_path = Path(a.model) if a.model else DEFAULT_MODEL
        elements, label = (29,), a.model_path.name
    print(f"MACE peers: {label}, {a.dtype}, {a.device}, NVE {DT_FS} fs, {a.steps} timed steps after {a.warmup}; "
          f"torch {torch.__version__}", flush=True)
    if elements != (29,):
        elements = (29, 28, 13, 47)   # Cu, Ni, Al, Ag sites of the random model
    hdr = (f"{'atoms':>9} {'peer':<14} {'atom-steps/s':>13} {'vs ShardMD':>10} {'peak GiB':>9} {'B/atom':>8} "
           f"{'E/atom eV':>12} {'|dE|/atom eV':>13} {'max|dF| eV/A':>13}  settings; notes")
    print(hdr, flush=True)
    for n in a.sizes:
        atoms = make_atoms(n, elements)
        runs = []
        if "shardmd" in a.peers:
            runs += [("shardmd", lambda atoms=atoms: run_shardmd(atoms, a, "auto"))]
            if a.graph == "both":
                runs += [("shardmd-graph", lambda atoms=atoms: run_shardmd(atoms, a, "true")),
                         ("shardmd-eager", lambda atoms=atoms: run_shardmd(atoms, a, "false"))]
        if "shardmd-compiled" in a.peers:
            runs += [("shardmd-compiled", lambda atoms=atoms: run_shardmd(atoms, a, "auto", compiled=True))]
        if "torch-sim" in a.peers:
            runs += [("torch-sim", lambda atoms=atoms: run_torchsim(atoms, a))]
        if "ase" in a.peers and len(atoms) <= a.ase_max:
            runs += [("ase", lambda atoms=atoms: run_ase(atoms, a))]
        if a.capacity_child is not None:   # one peer, one size, in this fresh process
            r = dict(runs)[a.capacity_child]()
            print(f"FITS {r['rate']:.6g} {r['peak']:.3f}", flush=True)
            return 0
        base = None
        for name, fn in runs:
            w = _quiet()
            try:
                r = fn()
            except Exception as exc:  # noqa: BLE001 - one peer's failure is a row, not the end
                why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
                if os.environ.get("BENCH_PEERS_TRACE"):
                    traceback.print_exc()
                print(f"{len(atoms):>9} {name:<14} {'failed':>13}  {type(exc).__name__}: {why}", flush=True)
                _fresh(a.device)
                continue
            finally:
                w.__exit__(None, None, None)
            if base is None and name.startswith("shardmd"):
                base = r
            de = abs(r["e0"] - base["e0"]) / len(atoms) if base else float("nan")
            df = float(np.abs(r["f0"] - base["f0"]).max()) if base else float("nan")
            ratio = r["rate"] / base["rate"] if base else float("nan")
            bpa = r["peak"] * 2**30 / len(atoms)
            print(f"{len(atoms):>9} {name:<14} {r['rate']:>13.4g} {ratio:>10.3g} {r['peak']:>9.2f} {bpa:>8.0f} "
                  f"{r['e0'] / len(atoms):>12.7f} {de:>13.2e} {df:>13.2e}  {SETTINGS[name]}; {r['note']}", flush=True)
            del r
            _fresh(a.device)
    print(f"(peak: torch allocator, per peer; stream-ordered pool high over the whole process (Warp, "
          f"cuEquivariance): {pool_high_gib(a.device):.2f} GiB; dE, dF against ShardMD's step 0)", flush=True)
    return 0


def capacity(a) -> int:
    """Per peer, ascending sizes in fresh processes until one does not run: the largest that
    ran (atoms, atom-steps/s, peak GiB) and the first that did not (its last error line)."""
    import subprocess

    rest = ["--device", a.device, "--dtype", a.dtype, "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--ts-nl", a.ts_nl, *(["--model", a.model] if a.model else []), *(["--foundation"] * a.foundation)]
    print("| peer | largest run, atoms | atom-steps/s there | peak GiB | first not run, atoms | why |\n"
          "|---|---:|---:|---:|---:|---|", flush=True)
    for peer in a.peers:
        best, failed = None, None
        for n in sorted(a.sizes):
            r = subprocess.run([sys.executable, __file__, *rest, "--sizes", str(n), "--capacity-child", peer],
                               capture_output=True, text=True)
            fits = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("FITS ")]
            if r.returncode == 0 and fits:
                best = (4 * n ** 3, float(fits[-1][1]), float(fits[-1][2]))
                continue
            lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            failed = (4 * n ** 3, lines[-1][:100] if lines else f"exit {r.returncode}")
            break
        print(f"| {peer} | {best[0] if best else '-'} | {f'{best[1]:.3g}' if best else '-'} | "
              f"{f'{best[2]:.1f}' if best else '-'} | {failed[0] if failed else '-'} | "
              f"{failed[1] if failed else 'all sizes ran'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
