"""The MACE call (energy, forces, virial) eager against compiled by torch.compile (inductor), one
process, the same neighbour list and positions:

    python3 scripts/bench_mace_compile.py --sizes 16 30 48 --calls 20 [--profile]

The shipped Cu model on rattled fcc Cu (4 n^3 atoms, a = 3.59 Å), float32 and cuEquivariance on
CUDA (float64 on the CPU). "compiled": the module built with e3nn's code generation off and its
registered blocks traced (mace-torch's own recipe for torch.compile), then ``torch.compile``:
``model.compile=true`` (models/mace_compile.py). Prints per size: ms per call (median), the ratio, the largest
differences of energy per atom and force against the eager call, and the compile time.
``--profile``: the eager call's 15 most expensive kernels (torch.profiler) at the first size.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def system(n: int, dev: str, dt):
    from ase.build import bulk

    a = bulk("Cu", "fcc", a=3.59, cubic=True).repeat((n, n, n))
    a.rattle(0.05, seed=1)
    return (torch.tensor(a.positions, dtype=dt, device=dev), torch.tensor(a.cell.array, dtype=dt, device=dev),
            torch.tensor(a.numbers, device=dev))


def model(dev: str, dt, compiled: bool, cueq):
    from shardmd.models.mace import MaceModel

    return MaceModel(dtype=dt, device=dev, cuda_graph=False, cueq=cueq, compile=compiled)


def timed(models, x, h, z, nl, calls: int, dev: str):
    """Median seconds per call of each model, the calls alternating (the same load for each),
    and each model's last output."""
    outs = [m.compute(x, h, (True,) * 3, z, nl) for m in models]
    times = [[] for _ in models]
    for _ in range(calls):
        for k, m in enumerate(models):
            _sync(dev)
            t = time.perf_counter()
            outs[k] = m.compute(x, h, (True,) * 3, z, nl)
            _sync(dev)
            times[k].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times], outs


def profile(m, x, h, z, nl) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.is_cuda else [])
    with prof(activities=acts) as p:
        for _ in range(3):
            m.compute(x, h, (True,) * 3, z, nl)
        _sync(x.device.type)
    key = "self_cuda_time_total" if x.is_cuda else "self_cpu_time_total"
    print(p.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))


def main() -> None:
    from shardmd.domain.neighbors import build_neighbor_list

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 30])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cueq", default="auto", help="auto (on CUDA when installed), true or false")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    dev = a.device
    dt = torch.float32 if dev == "cuda" else torch.float64
    cueq = {"true": True, "false": False}.get(a.cueq, "auto")
    eager = model(dev, dt, False, cueq)   # first: mace imported before e3nn (platform notes)
    comp = model(dev, dt, True, cueq)
    print(f"# MACE call eager vs torch.compile; {torch.cuda.get_device_name(0) if dev == 'cuda' else 'CPU'}, "
          f"{dt}, cuEquivariance {eager.cueq}, torch {torch.__version__}")
    print("| atoms | edges in r_max | eager ms | compiled ms | eager / compiled | max dE/atom eV | max dF eV/Å |"
          " compile s |\n|---|---|---|---|---|---|---|---|")
    for n in a.sizes:
        x, h, z = system(n, dev, dt)
        nl = build_neighbor_list(x, h, (True,) * 3, eager.cutoff + 1.0)
        if a.profile and n == a.sizes[0]:
            profile(eager, x, h, z, nl)
        t0 = time.perf_counter()
        comp.compute(x, h, (True,) * 3, z, nl)
        _sync(dev)
        t_compile = time.perf_counter() - t0
        (te, tc), (ref, out) = timed([eager, comp], x, h, z, nl, a.calls, dev)
        de = abs(float(out["energy"]) - float(ref["energy"])) / len(z)
        df = float((out["forces"] - ref["forces"]).abs().max())
        edges = int((torch.linalg.vector_norm(x[nl.centers()] - x[nl.neighbors.long()]
                                              - nl.shifts.to(dt) @ h, dim=1) < eager.cutoff).sum())
        print(f"| {len(z)} | {edges} | {te * 1e3:.2f} | {tc * 1e3:.2f} | {te / tc:.2f} | {de:.1e} | {df:.1e} | "
              f"{t_compile:.0f} |", flush=True)
        del nl, ref, out
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
