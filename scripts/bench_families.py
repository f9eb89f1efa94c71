"""Each model family's step on the CPU (or one GPU), beside the package's own ASE calculator.

    python scripts/bench_families.py --atoms 1000 --families mace nequip        # the main environment
    python scripts/bench_families.py --families sevennet                        # sevenn's environment
    python scripts/bench_families.py --families metatomic --checkpoint pet.pt --trust-code
    python scripts/bench_families.py --families allegro --precision float64     # nequip-allegro's environment
    python scripts/bench_families.py --families mattersim --precision float32   # mattersim's environment
    python scripts/bench_families.py --families orb                             # orb-models' environment
    python scripts/bench_families.py --families uma --checkpoint uma.pt         # fairchem's environment
    python scripts/bench_families.py --families aimnet2 --checkpoint a2.pt      # aimnet's environment

fcc Cu (a = 3.61 Å, rattled 0.05 Å, periodic) of about --atoms atoms. For each family installed
here: the model as ``model=<family>`` builds it (the shipped MACE, a random NequIP, SevenNet-0
from sevenn's wheel, a metatomic file, a random Allegro or --checkpoint's), evaluated for energy,
forces and stress (i) through ShardMDCalculator (the engine's neighbour list and spec path, one
domain) and (ii) through the package's own calculator on the same weights; CPU seconds per call
(process time, median of --repeats after one warm-up) and the largest force difference. A family
that is missing or fails gets one row saying why.
"""
from __future__ import annotations

import argparse
import statistics
import time
import traceback

import numpy as np
import torch

A_CU = 3.61


def crystal(atoms: int):
    from ase.build import bulk

    n = max(1, round((atoms / 4) ** (1 / 3)))
    a = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat((n, n, max(1, round(atoms / (4 * n * n)))))
    a.rattle(0.05, seed=3)
    return a


def keys(family: str, a) -> dict:
    if family == "nequip":
        return {"species": ["Cu"]}
    if family == "metatomic" or (family == "allegro" and a.checkpoint):
        return {"checkpoint": a.checkpoint, "trust_code": a.trust_code}
    if family == "allegro":   # Allegro's architecture with random weights (models/allegro.py random_config)
        return {"random": True, "species": ["Cu"]}
    if family == "mattersim":   # M3GNet at MatterSim v1's default size (4 blocks, 128 units), random weights
        return {"checkpoint": a.checkpoint} if a.checkpoint else {"random": True}
    if family == "orb" and not a.checkpoint:   # orb-v3 direct at the released size, random weights
        return {"random": True, "latent_dim": 256, "mlp_hidden_dim": 1024, "head_hidden_dim": 256, "num_layers": 5,
                "max_neighbors": 20}
    if family in ("orb", "uma", "aimnet2"):   # a file (uma, aimnet2: tests/uma_cases.py, tests/aimnet2_cases.py)
        return {"checkpoint": a.checkpoint}
    return {}


def timed(calc, atoms, repeats: int) -> tuple[float, np.ndarray]:
    x = atoms.copy()
    x.calc = calc
    x.get_forces()
    x.get_stress()
    times = []
    for k in range(repeats):
        x.positions[0, 0] += 1e-4 * (k + 1)   # a new geometry each time: no cached results
        t = time.process_time()
        x.get_forces()
        x.get_stress()
        times.append(time.process_time() - t)
    return statistics.median(times), x.get_forces()


def row(family: str, a) -> str:
    from shardmd.engine.ase_calculator import ShardMDCalculator
    from shardmd.models.registry import build_model

    atoms = crystal(a.atoms)
    dtype = {"float32": torch.float32, "float64": torch.float64}[a.precision]
    ours = ShardMDCalculator(model=family, precision=a.precision, device=a.device, **keys(family, a))
    t_ours, f_ours = timed(ours, atoms, a.repeats)
    model = build_model({"name": family, **keys(family, a)}, dtype, a.device)
    if not hasattr(model, "ase_calculator"):   # MACE: mace-torch's own calculator on the same file
        from mace.calculators import MACECalculator

        own = MACECalculator(model_paths=str(model.path), device=a.device, default_dtype=a.precision)
    else:
        own = model.ase_calculator()
    t_own, f_own = timed(own, atoms, a.repeats)
    df = float(np.abs(f_ours - f_own).max())
    return (f"| {family} | {len(atoms)} | {a.precision} | {t_ours:.3g} | {t_own:.3g} | {t_ours / t_own:.2f} | "
            f"{df:.1e} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+",
                   default=["mace", "nequip", "sevennet", "metatomic", "allegro", "mattersim"])
    p.add_argument("--atoms", type=int, default=1000)
    p.add_argument("--precision", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint", default=None, help="model=metatomic: the exported .pt file; model=allegro: a "
                   ".ckpt or .nequip.zip; model=mattersim: a .pth")
    p.add_argument("--trust-code", action="store_true", help="model.trust_code=true (metatomic, an Allegro package)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"# fcc Cu, {a.device}, {a.threads} thread(s); CPU s per energy + forces + stress call, median of "
          f"{a.repeats}")
    print("| family | atoms | precision | ours, s | package's calculator, s | ours / it | max dF, eV/Å |\n"
          "|---|---|---|---|---|---|---|")
    for family in a.families:
        try:
            print(row(family, a), flush=True)
        except Exception as exc:  # noqa: BLE001 - one row says why, the others go on
            traceback.print_exc()
            print(f"| {family} | | | | | | {type(exc).__name__}: {' '.join(str(exc).split())[:100]} |", flush=True)


if __name__ == "__main__":
    main()
