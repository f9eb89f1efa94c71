"""A model family's MD step on one GPU, ours beside torch-sim 0.6.2's wrapper of the same model.

    python3 scripts/bench_family_peers.py --family sevennet --sizes 6 16 30 --steps 10 --warmup 3
    python3 scripts/bench_family_peers.py --family sevennet --capacity --sizes 16 24 30 36 40 44 --steps 2
    python3 scripts/bench_family_peers.py --family orb --sizes 6 16 --steps 10
    python3 scripts/bench_family_peers.py --family uma --checkpoint uma.pt --sizes 6 16
    python3 scripts/bench_family_peers.py --family aimnet2 --checkpoint a2.pt --sizes 7 12

Run in the family's own environment (e.g. sevenn with e3nn >= 0.5: not beside mace-torch). The
models: SevenNet-0 from sevenn's wheel (no download); the other families' real architectures at
their released sizes with random weights, built as ``model=<family>`` builds them (allegro: 64
scalar and 32 tensor features, l <= 2, 2 layers, 5 Å; mattersim: M3GNet, 4 blocks of 128 units;
orb: orb-v3 direct, latent 256, 5 layers, cap 20; uma, metatomic and aimnet2: the file given by
--checkpoint). float32, on rattled fcc Cu (a = 3.61 Å; aimnet2: n^3 waters on a 3.1 Å grid) at
300 K, NVE at 1 fs. Ours: ``python -m engine run model=<family> ...`` as a Simulation in this
process (the engine's neighbour list and skin, the spec path, one domain), timed over --steps
after --warmup. torch-sim (the families it wraps): its wrapper of the same weights, its fastest
neighbour list (``--ts-nl``, the cell list, rebuilt every step as it does), ``ts.integrate`` nve
with n_steps = warmup and warmup + steps, the difference timed. Each side's step-0 energy per
atom and largest force difference from ours are printed beside the rate and the peak of torch's
allocator. --capacity: instead, each side's largest of --sizes in a fresh process per size.
--profile: instead, at the first size, our step and model call and torch-sim's model call timed
in one process on the same state, and the kernel launches of our step (torch.profiler).
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


def crystal(n: int, family: str = "sevennet"):
    """fcc Cu, n^3 cubic cells (4 n^3 atoms), rattled 0.05 Å, 300 K velocities (ASE units);
    for aimnet2 (organic elements): n^3 waters on a 3.1 Å grid, randomly turned."""
    from ase import Atoms
    from ase.build import bulk, molecule
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    rng = np.random.default_rng(0)
    if family == "aimnet2":
        atoms, w0 = Atoms(cell=np.eye(3) * n * 3.1, pbc=True), molecule("H2O")
        for ijk in np.ndindex(n, n, n):
            w = w0.copy()
            w.rotate(rng.uniform(0, 360), rng.normal(size=3) + 1e-3, center="COP")
            w.translate(np.array(ijk) * 3.1 + 1.55 - w.get_center_of_mass())
            atoms += w
    else:
        atoms = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat((n, n, n))
    atoms.positions += rng.normal(0.0, 0.05, atoms.positions.shape)
    atoms.wrap()
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=rng)
    Stationary(atoms)
    return atoms


#: our model keys per family (a file-only family takes --checkpoint)
KEYS = {"sevennet": ["model=sevennet", "model.name=7net-0"],
        "allegro": ["model=allegro", "model.random=true", "model.species=[Cu]", "model.num_scalar_features=64",
                    "model.num_tensor_features=32", "model.l_max=2", "model.r_max=5.0"],
        "mattersim": ["model=mattersim", "model.random=true"],
        "orb": ["model=orb", "model.random=true", "model.latent_dim=256", "model.mlp_hidden_dim=1024",
                "model.head_hidden_dim=256", "model.num_layers=5", "model.max_neighbors=20"],
        "uma": ["model=uma", "model.task=omat"], "metatomic": ["model=metatomic"], "aimnet2": ["model=aimnet2"]}


def _ours_keys(family: str, a=None) -> list[str]:
    keys = list(KEYS[family])
    if family in ("uma", "metatomic", "aimnet2"):
        if not (a and a.checkpoint):
            raise SystemExit(f"--family {family} needs --checkpoint FILE (a model file of the family)")
        keys.append(f"model.checkpoint={a.checkpoint}")
        keys += ["model.trust_code=true"] if family == "metatomic" else []
    return keys


def _our_model(a):
    """The model object ``model=<family>`` builds (for torch-sim's wrapper of the same weights)."""
    from shardmd.engine.config.compose import compose_config, to_container
    from shardmd.engine.config.terms import with_term_defaults
    from shardmd.models import build_model

    cfg = compose_config([*_ours_keys(a.family, a), "precision=float32", f"device={a.device}"])
    return build_model(with_term_defaults(to_container(cfg.model)), torch.float32, a.device)


def natoms(n: int, family: str) -> int:
    return 3 * n ** 3 if family == "aimnet2" else 4 * n ** 3


def _torchsim_model(family: str, a):
    import torch_sim.neighbors as tsn

    nl = getattr(tsn, a.ts_nl)
    dev, f32 = torch.device(a.device), torch.float32
    if family == "sevennet":
        from torch_sim.models.sevennet import SevenNetModel

        from shardmd.models.sevennet import _shipped_path

        return SevenNetModel(model=str(_shipped_path("7net-0")), device=dev, dtype=f32, neighbor_list_fn=nl)
    if family == "mattersim":   # mattersim's TorchSimWrapper takes a Potential (it reads .model.model_args)
        from mattersim.forcefield.potential import Potential
        from torch_sim.models.mattersim import MatterSimModel

        return MatterSimModel(model=Potential(_our_model(a).net, device=a.device), device=dev, dtype=f32)
    if family == "orb":   # orb-models 0.7: the radius and cap are the adapter's, not the network's
        from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter
        from torch_sim.models.orb import OrbModel

        ours = _our_model(a)
        return OrbModel(model=ours.net, atoms_adapter=ForcefieldAtomsAdapter(radius=ours.cutoff,
                        max_num_neighbors=ours.max_neighbors), device=dev, dtype=f32)
    if family == "allegro":   # nequip's torch-sim calculator on our model object, with nequip's own transforms
        from nequip.integrations.torchsim import NequIPTorchSimCalc
        from nequip.integrations.utils import basic_transforms

        m = _our_model(a)
        tf = basic_transforms(m.graph_model.metadata, m.cutoff, m.type_names, m.species)
        return NequIPTorchSimCalc(model=m.graph_model, device=dev, transforms=tf)
    if family == "uma":
        from torch_sim.models.fairchem import FairChemModel

        return FairChemModel(model=a.checkpoint, task_name="omat", device=dev)
    if family == "metatomic":
        from torch_sim.models.metatomic import MetatomicModel

        return MetatomicModel(model=a.checkpoint, device=dev)
    raise ValueError(f"torch-sim 0.6.2 has no wrapper of {family} here")


def _our_simulation(atoms, a, steps: int):
    """``python -m engine run model=<family> ...`` on ``atoms`` as a Simulation in this process,
    set up and started (float32, no output but a scratch file)."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    ov = [*_ours_keys(a.family, a), "precision=float32", f"device={a.device}", "trajectory.every=0", "thermo.every=0",
          "checkpoint.every=0", "quiet=true", f"dt={a.dt}", f"steps={steps}", "overwrite=true",
          f"output={tempfile.gettempdir()}/bench_family_peers_{os.getpid()}.h5"]
    sim = Simulation(compose_config(ov), state=State.from_atoms(atoms, dtype=torch.float32, device=a.device))
    sim.setup()
    sim.started = True
    return sim


def run_ours(atoms, a) -> dict:
    _fresh(a.device)
    sim = _our_simulation(atoms, a, a.warmup + a.steps)
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
                     timestep=a.dt * 1e-3)
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

    atoms = crystal(a.sizes[0], a.family)
    sim = _our_simulation(atoms, a, 1000)

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


def _sides(a) -> dict:
    return {"ShardMD": run_ours} if a.no_peer or a.family == "aimnet2" else SIDES


def table(a) -> None:
    print(f"# {a.family}, float32, {torch.cuda.get_device_name(0) if a.device.startswith('cuda') else 'CPU'}, "
          f"NVE {a.dt} fs, {a.steps} timed steps after {a.warmup}; torch {torch.__version__}\n"
          "| atoms | code | atom-steps/s | ours / it | peak GiB | E/atom eV | max abs dF from ours, eV/Å | note |\n"
          "|---:|---|---:|---:|---:|---:|---:|---|", flush=True)
    for n in a.sizes:
        atoms = crystal(n, a.family)
        base = None
        for name, fn in _sides(a).items():
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
    for side in _sides(a):
        best, failed = None, None
        for n in sorted(a.sizes):
            extra = ["--checkpoint", a.checkpoint] if a.checkpoint else []
            extra += ["--dt", str(a.dt)]
            r = subprocess.run([sys.executable, __file__, "--family", a.family, *extra, "--device", a.device, "--steps",
                                str(a.steps), "--warmup", str(a.warmup), "--ts-nl", a.ts_nl, "--sizes", str(n),
                                "--child", side], capture_output=True, text=True)
            fits = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("FITS ")]
            if r.returncode == 0 and fits:
                best = (natoms(n, a.family), float(fits[-1][1]), float(fits[-1][2]))
                continue
            lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            failed = (natoms(n, a.family), lines[-1][:100] if lines else f"exit {r.returncode}")
            break
        print(f"| {side} | {best[0] if best else '-'} | {f'{best[1]:.3g}' if best else '-'} | "
              f"{f'{best[2]:.1f}' if best else '-'} | {failed[0] if failed else '-'} | "
              f"{failed[1] if failed else 'all sizes ran'} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="sevennet", choices=list(KEYS))
    p.add_argument("--checkpoint", default=None, help="the model file (uma, metatomic, aimnet2)")
    p.add_argument("--no-peer", action="store_true", help="ours alone")
    p.add_argument("--dt", type=float, default=DT_FS, help="time step, fs (a random model with large forces: smaller)")
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
            r = SIDES[a.child](crystal(a.sizes[0], a.family), a)
        print(f"FITS {r['rate']:.6g} {r['peak']:.3f}", flush=True)
        return
    capacity(a) if a.capacity else profile(a) if a.profile else table(a)


if __name__ == "__main__":
    main()
