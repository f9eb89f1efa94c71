"""A model family's MD step on one GPU, ours beside torch-sim 0.6.2's wrapper of the same model.

    python3 scripts/bench_family_peers.py --family sevennet --sizes 6 16 30 --steps 10 --warmup 3
    python3 scripts/bench_family_peers.py --family sevennet --capacity --sizes 16 24 30 36 40 44 --steps 2

Run in the family's own environment (sevenn with e3nn >= 0.5: not beside mace-torch). The model:
SevenNet-0 from sevenn's wheel (no download), float32, on rattled fcc Cu (a = 3.61 Å) at 300 K,
NVE at 1 fs. Ours: ``python -m engine run model=sevennet model.name=7net-0`` as a Simulation
in this process (the engine's neighbour list and skin, the spec path, one domain), timed over
--steps after --warmup. torch-sim: its ``SevenNetModel`` (sevenn.torchsim, re-exported by
torch_sim.models.sevennet) on the same checkpoint, its fastest neighbour list (``--ts-nl``, the
cell list, rebuilt every step as it does), ``ts.integrate`` nve with n_steps = warmup and
warmup + steps, the difference timed. Each side's step-0 energy per atom and largest force
difference from ours are printed beside the rate and the peak of torch's allocator.
--capacity: instead, each side's largest of --sizes in a fresh process per size. --profile:
instead, at the first size, our step and model call and torch-sim's model call timed in one
process on the same state, and the kernel launches of our step (torch.profiler).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import torch
from bench_peers import _fresh, _peak_gib, _sync  # scripts/ is the script's own folder on sys.path

A_CU = 3.61
DT_FS = 1.0


def crystal(n: int):
    """fcc Cu, n^3 cubic cells (4 n^3 atoms), rattled 0.05 Å, 300 K velocities (ASE units)."""
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    atoms = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat((n, n, n))
    rng = np.random.default_rng(0)
    atoms.positions += rng.normal(0.0, 0.05, atoms.positions.shape)
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=rng)
    Stationary(atoms)
    return atoms


# The families torch-sim 0.6.2 wraps and this script knows: our keys, torch-sim's model.
def _ours_keys(family: str) -> list[str]:
    return {"sevennet": ["model=sevennet", "model.name=7net-0"]}[family]


def _torchsim_model(family: str, a):
    import torch_sim.neighbors as tsn

    nl = getattr(tsn, a.ts_nl)
    if family == "sevennet":
        from torch_sim.models.sevennet import SevenNetModel

        from shardmd.models.sevennet import _shipped_path

        return SevenNetModel(model=str(_shipped_path("7net-0")), device=torch.device(a.device),
                             dtype=torch.float32, neighbor_list_fn=nl)
    raise ValueError(f"--family {family}: not known here")


def run_ours(atoms, a) -> dict:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    _fresh(a.device)
    ov = [*_ours_keys(a.family), "precision=float32", f"device={a.device}", "trajectory.every=0", "thermo.every=0",
          "checkpoint.every=0", "quiet=true", f"dt={DT_FS}", f"steps={a.warmup + a.steps}", "overwrite=true",
          f"output={tempfile.gettempdir()}/bench_family_peers_{os.getpid()}.h5"]
    sim = Simulation(compose_config(ov), state=State.from_atoms(atoms, dtype=torch.float32, device=a.device))
    sim.setup()
    sim.started = True
    e0 = float(sim.observables(["potential_energy"])["potential_energy"])
    f0 = np.asarray(sim.domain.gather(sim.state, ("forces",))["forces"], dtype=np.float64)
    for _ in range(a.warmup):
        sim.step()
    _sync(a.device)
    t = time.perf_counter()
    for _ in range(a.steps):
        sim.step()
    _sync(a.device)
    wall = time.perf_counter() - t
    note = f"{sim.nl.n_builds} list builds"
    sim.close()
    return {"rate": len(atoms) * a.steps / wall, "peak": _peak_gib(a.device), "e0": e0, "f0": f0, "note": note}


def run_torchsim(atoms, a) -> dict:
    import torch_sim as ts

    _fresh(a.device)
    model = _torchsim_model(a.family, a)
    out = model(ts.io.atoms_to_state(atoms, device=torch.device(a.device), dtype=torch.float32))
    e0, f0 = float(out["energy"].sum()), out["forces"].detach().cpu().numpy().astype(np.float64)
    del out

    def integrate(k: int) -> float:
        _sync(a.device)
        t = time.perf_counter()
        ts.integrate(system=atoms, model=model, integrator=ts.Integrator.nve, n_steps=k, temperature=300.0,
                     timestep=DT_FS * 1e-3)
        _sync(a.device)
        return time.perf_counter() - t

    integrate(1)   # its first call carries one-off work; the two timed calls then cancel the set-up
    wall = -integrate(a.warmup) + integrate(a.warmup + a.steps)
    from importlib.metadata import version

    return {"rate": len(atoms) * a.steps / wall, "peak": _peak_gib(a.device), "e0": e0, "f0": f0,
            "note": f"torch-sim {version('torch-sim-atomistic')}, {a.ts_nl}"}


def profile(a) -> None:
    """Our step, our model call (with and without energy) and torch-sim's model call, ms, medians
    of 5 after 3, on one state; then our kernel launches a step over 3 steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    atoms = crystal(a.sizes[0])
    ov = [*_ours_keys(a.family), "precision=float32", f"device={a.device}", "trajectory.every=0", "thermo.every=0",
          "checkpoint.every=0", "quiet=true", f"dt={DT_FS}", "steps=1000", "overwrite=true",
          f"output={tempfile.gettempdir()}/bench_family_peers_{os.getpid()}.h5"]
    sim = Simulation(compose_config(ov), state=State.from_atoms(atoms, dtype=torch.float32, device=a.device))
    sim.setup()
    sim.started = True
    def ms(fn) -> float:
        for _ in range(3):
            fn()
        out = []
        for _ in range(5):
            _sync(a.device)
            t = time.perf_counter()
            fn()
            _sync(a.device)
            out.append((time.perf_counter() - t) * 1e3)
        return statistics.median(out)

    rows = [("our step", ms(sim.step)), ("our model call", ms(sim.compute_forces)),
            ("our model call, forces only", ms(lambda: sim.compute_forces(energy=False)))]
    try:
        import torch_sim as ts

        model = _torchsim_model(a.family, a)
        state = ts.io.atoms_to_state(atoms, device=torch.device(a.device), dtype=torch.float32)
        rows.append(("torch-sim's model call (its neighbour list included)", ms(lambda: model(state))))
    except ImportError as exc:
        rows.append((f"torch-sim's model call: {exc}", float("nan")))
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            sim.step()
        _sync(a.device)
    launches = sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC"))
    sim.close()
    print(f"# {a.family}, {len(atoms)} atoms, float32, {a.device}\n| what | ms |\n|---|---:|")
    for name, v in rows:
        print(f"| {name} | {v:.1f} |")
    print(f"| kernel launches a step (ours) | {launches / 3:.0f} |", flush=True)


SIDES = {"ShardMD": run_ours, "torch-sim": run_torchsim}


def table(a) -> None:
    print(f"# {a.family}, float32, {torch.cuda.get_device_name(0) if a.device.startswith('cuda') else 'CPU'}, "
          f"NVE {DT_FS} fs, {a.steps} timed steps after {a.warmup}; torch {torch.__version__}\n"
          "| atoms | code | atom-steps/s | ours / it | peak GiB | E/atom eV | max abs dF from ours, eV/Å | note |\n"
          "|---:|---|---:|---:|---:|---:|---:|---|", flush=True)
    for n in a.sizes:
        atoms = crystal(n)
        base = None
        for name, fn in SIDES.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = fn(atoms, a)
            except Exception as exc:  # noqa: BLE001 - one side's failure is a row, not the end
                if os.environ.get("BENCH_TRACE"):
                    traceback.print_exc()
                print(f"| {len(atoms)} | {name} | failed | | | | | {type(exc).__name__}: "
                      f"{' '.join(str(exc).split())[:140]} |", flush=True)
                _fresh(a.device)
                continue
            base = base or r
            ratio = "" if r is base else f"{base['rate'] / r['rate']:.2f}"
            df = float(np.abs(r["f0"] - base["f0"]).max())
            print(f"| {len(atoms)} | {name} | {r['rate']:.3g} | {ratio} | {r['peak']:.2f} | {r['e0'] / len(atoms):.7f} "
                  f"| {df:.1e} | {r['note']} |", flush=True)
            _fresh(a.device)


def capacity(a) -> None:
    """Per side, ascending sizes in fresh processes until one does not run."""
    print("| code | largest run, atoms | atom-steps/s there | peak GiB | first not run, atoms | why |\n"
          "|---|---:|---:|---:|---:|---|", flush=True)
    for side in SIDES:
        best, failed = None, None
        for n in sorted(a.sizes):
            r = subprocess.run([sys.executable, __file__, "--family", a.family, "--device", a.device, "--steps",
                                str(a.steps), "--warmup", str(a.warmup), "--ts-nl", a.ts_nl, "--sizes", str(n),
                                "--child", side], capture_output=True, text=True)
            fits = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("FITS ")]
            if r.returncode == 0 and fits:
                best = (4 * n ** 3, float(fits[-1][1]), float(fits[-1][2]))
                continue
            lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            failed = (4 * n ** 3, lines[-1][:100] if lines else f"exit {r.returncode}")
            break
        print(f"| {side} | {best[0] if best else '-'} | {f'{best[1]:.3g}' if best else '-'} | "
              f"{f'{best[2]:.1f}' if best else '-'} | {failed[0] if failed else '-'} | "
              f"{failed[1] if failed else 'all sizes ran'} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="sevennet", choices=["sevennet"])
    p.add_argument("--sizes", type=int, nargs="+", default=[6, 16], help="fcc repeats n (4 n^3 atoms)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ts-nl", default="alchemiops_nl_cell_list", help="torch-sim's neighbour-list function")
    p.add_argument("--capacity", action="store_true", help="each side's largest of --sizes (fresh processes)")
    p.add_argument("--profile", action="store_true", help="where a step goes at the first size (see above)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:   # one side, one size, in this fresh process
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = SIDES[a.child](crystal(a.sizes[0]), a)
        print(f"FITS {r['rate']:.6g} {r['peak']:.3f}", flush=True)
        return
    capacity(a) if a.capacity else profile(a) if a.profile else table(a)


if __name__ == "__main__":
    main()
