"""Many small systems on one GPU, side by side in one process: our many-system run (one joined
MACE call per step, engine/batch/lockstep.py) against torch-sim's batched ``integrate``.

    python3 scripts/bench_batch_peers.py --cases 64x256 1024x64 --steps 20 --warmup 5

The shipped Cu model, float32, cuEquivariance on both sides (torch-sim gets the model converted by
mace-torch's own converter), rattled fcc Cu (a = 3.59 Å) at 300 K, NVE at 1 fs. Ours: a
``system.frames``-style run of every structure with ``batch.size`` = all of them, its rate timed
between joined model calls after ``--warmup`` (each call is one step of every system, the
systems' own Python included); its start-up is from the run's start to its first joined call.
torch-sim: ``ts.integrate`` with n_steps = warmup and warmup + steps, the difference timed (its
state set-up cancels); its start-up is one integrate of one step. Each neighbour-list function
torch-sim offers is a row of its own. Prints one table; numbers go to docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

A_CU = 3.59


def systems(count: int, atoms: int, seed: int = 0):
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    reps = {32: (2, 2, 2), 64: (2, 2, 4), 108: (3, 3, 3), 256: (4, 4, 4), 500: (5, 5, 5)}[atoms]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        a = bulk("Cu", "fcc", a=A_CU, cubic=True).repeat(reps)
        a.positions += rng.normal(0.0, 0.05, a.positions.shape)
        MaxwellBoltzmannDistribution(a, temperature_K=300, rng=rng)
        out.append(a)
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ours(frames, steps: int, warmup: int, device: str = "cuda", t0: float | None = None, each: bool = False,
         graph: str = "auto", integrator: str = "verlet", extra: tuple[str, ...] = ()) -> dict:
    """``t0``: the wall time to count the start-up from (a fresh process's launch), else the
    run's start; ``each``: every system steps its own arrays (the joined set off); ``extra``:
    more settings (``--set``)."""
    from shardmd.engine.batch import joined as joined_mod
    from shardmd.engine.batch.run import batch_run
    from shardmd.engine.config.compose import compose_config
    from shardmd.models import mace as mace_mod

    calls = []
    batch, joined = mace_mod.MaceModel.compute_batch, mace_mod.MaceModel.compute_joined

    def timed(self, items):   # the first forces of the systems that join
        _sync()
        calls.append((time.perf_counter(), sum(int(i[0].shape[0]) for i in items)))
        return batch(self, items)

    spent = []   # each joined call's own time (the model), s

    def timed_joined(self, graph, x, **kw):   # a step of the systems in flight as one array set
        _sync()
        t = time.perf_counter()
        calls.append((t, int(x.shape[0])))
        out = joined(self, graph, x, **kw)
        _sync()
        spent.append(time.perf_counter() - t)
        return out

    mace_mod.MaceModel.compute_batch, mace_mod.MaceModel.compute_joined = timed, timed_joined
    usable = joined_mod.usable
    if each:
        joined_mod.usable = lambda members, model: False
    try:
        with tempfile.TemporaryDirectory() as d:
            cfg = compose_config(["model=mace", f"model.cuda_graph={graph}", f"device={device}", "precision=float32",
                                  f"steps={warmup + steps + 1}",
                                  "trajectory.every=0", "checkpoint.every=0", "thermo.every=0", "quiet=true",
                                  f"batch.size={len(frames)}", "system.frames=all", f"output={d}/b.h5",
                                  f"integrator={integrator}", "temperature=300", *extra])
            t0 = time.perf_counter() - (0.0 if t0 is None else time.time() - t0)
            batch_run(cfg, None, "run", structures=frames)
    finally:
        mace_mod.MaceModel.compute_batch, mace_mod.MaceModel.compute_joined = batch, joined
        joined_mod.usable = usable
    n = sum(len(a) for a in frames)
    full = [(t, k) for t, k in calls if k == n]
    timed_calls = full[warmup:]
    rate = n * (len(timed_calls) - 1) / (timed_calls[-1][0] - timed_calls[0][0])
    model = sum(spent[warmup:-1]) / (timed_calls[-1][0] - timed_calls[0][0]) if len(spent) > warmup + 1 else None
    return {"rate": rate, "startup": full[0][0] - t0,
            "note": f"{len(calls)} joined calls" + (f", model call {100 * model:.0f} % of a step" if model else "")}


def torchsim(frames, steps: int, warmup: int, nl_name: str, t0: float | None = None) -> dict:
    t_launch = None if t0 is None else time.perf_counter() - (time.time() - t0)
    import torch_sim as ts
    import torch_sim.neighbors as tsn
    from torch_sim.models.mace import MaceModel as TSMace

    from shardmd.models.mace import load_mace, resolve_checkpoint, to_cueq

    dev = torch.device("cuda")
    t0 = time.perf_counter()
    flavor = None
    for get in (lambda: ts.integrators.MdFlavor("nve"), lambda: ts.Integrator.nve, lambda: "nve"):
        try:
            flavor = get()
            break
        except Exception:  # noqa: BLE001 - the API of one torch-sim version or another
            continue

    def integrate(k: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        ts.integrate(system=frames, model=model, integrator=flavor, n_steps=k, temperature=300.0, timestep=0.001)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    # its fastest route first: mace-torch's torch-sim model converting to cuEquivariance itself
    # (enable_cueq), then our converted module, then plain e3nn; the first that steps is timed
    tried = []
    for route in ("enable_cueq", "converted", "e3nn"):
        try:
            plain = load_mace(resolve_checkpoint(None), dev, torch.float32, trust_pickle=True)
            module = to_cueq(plain, dev) if route == "converted" else plain
            model = TSMace(model=module, device=dev, dtype=torch.float32, compute_forces=True, compute_stress=False,
                           neighbor_list_fn=getattr(tsn, nl_name), **({"enable_cueq": True} if route == "enable_cueq"
                                                                      else {}))
            startup = integrate(1) + (time.perf_counter() - t0)   # build and convert the model, one step
            break
        except Exception as exc:  # noqa: BLE001 - the next route; the note says why this one failed
            tried.append(f"{route}: {type(exc).__name__}: {' '.join(str(exc).split())[:60]}")
            traceback.print_exc()
    else:
        raise RuntimeError("; ".join(tried))
    if t_launch is not None:   # from the process's launch: imports included
        startup = time.perf_counter() - t_launch
    # rate from the difference of two calls (each call's own set-up cancels); one call before them
    # is discarded: after our compiled side ran in this process, the first call here took longer
    # than the second (a negative rate at 64 x 256 on the H100)
    integrate(warmup)
    t1, t2 = integrate(warmup), integrate(warmup + steps)
    n = sum(len(a) for a in frames)
    return {"rate": n * steps / (t2 - t1), "startup": startup,
            "note": f"torch-sim {ts.__version__}, {nl_name}, {route}" + (f" ({'; '.join(tried)})" if tried else "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["64x256", "1024x64"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--nl", nargs="*", default=["alchemiops_nl_n2", "alchemiops_nl_cell_list", "vesin_nl_ts",
                                               "torchsim_nl", "torch_nl_linked_cell"])
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of our side")
    p.add_argument("--each", action="store_true",
                   help="also our side with each system's own arrays (engine/batch/joined.py off): what one "
                        "array set gains")
    p.add_argument("--startup", action="store_true",
                   help="also each side's start-up in a fresh process (imports, model, first step), first case")
    p.add_argument("--graph", default="auto", help="our model.cuda_graph (auto: up to 50,000 atoms a call)")
    p.add_argument("--profile", action="store_true",
                   help="also our side of the first case under cProfile: where its start-up and steps go")
    p.add_argument("--integrator", default="verlet", choices=["verlet", "langevin", "nose-hoover", "csvr"],
                   help="our side's integrator (torch-sim's side runs nve)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more settings for our side, e.g. model.compile=true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:   # one side's start-up in this fresh process, launched at BENCH_T0
        count, atoms = (int(x) for x in a.cases[0].split("x"))
        t0 = float(os.environ["BENCH_T0"])
        fn = ours if a.child == "ShardMD" else torchsim
        r = fn(systems(count, atoms), 1, 0, a.device, t0=t0) if a.child == "ShardMD" else \
            fn(systems(count, atoms), 1, 1, a.child, t0=t0)   # its integrate takes no 0-step call
        print(f"STARTUP {r['startup']:.3f}", flush=True)
        return
    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"# {where}; shipped MACE Cu, float32, cuEquivariance; ours {a.integrator}, torch-sim nve, 1 fs; "
          f"{a.steps} timed steps after {a.warmup}")
    print("| systems x atoms | code | atom-steps/s | start-up to the first step, s | ours / it | note |\n"
          "|---|---|---|---|---|---|")
    for case in a.cases:
        count, atoms = (int(x) for x in case.split("x"))
        frames = systems(count, atoms)
        rows = []
        for name, fn in [("ShardMD", lambda f=frames: ours(f, a.steps, a.warmup, a.device, graph=a.graph,
                                                integrator=a.integrator, extra=a.set))] + [
                ("ShardMD, each system's arrays", lambda f=frames: ours(f, a.steps, a.warmup, a.device, each=True,
                                                                        graph=a.graph, integrator=a.integrator,
                                                                        extra=a.set))
                for _ in range(a.each)] + [
                ("torch-sim", lambda f=frames, nl=nl: torchsim(f, a.steps, a.warmup, nl)) for nl in a.nl]:
            try:
                r = fn()
            except Exception as exc:  # noqa: BLE001 - one row says why, the others go on
                r = {"rate": float("nan"), "startup": float("nan"),
                     "note": f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"}
                traceback.print_exc()
            torch.cuda.empty_cache()
            rows.append((name, r))
        base = rows[0][1]["rate"]
        for name, r in rows:
            ratio = base / r["rate"] if r["rate"] == r["rate"] and r["rate"] > 0 else float("nan")
            print(f"| {count} x {atoms} | {name} | {r['rate']:.3g} | {r['startup']:.1f} | "
                  f"{'' if name == 'ShardMD' else f'{ratio:.2f}'} | {r['note']} |", flush=True)
    if a.startup:
        fresh_startup(a)
    if a.profile:
        profile(a)


def profile(a) -> None:
    """Our side of the first case under cProfile: the 25 functions of ours (shardmd) and of the
    model package with the largest cumulative time."""
    import cProfile
    import pstats

    count, atoms = (int(x) for x in a.cases[0].split("x"))
    frames = systems(count, atoms)
    prof = cProfile.Profile()
    prof.runcall(ours, frames, a.steps, a.warmup, a.device)
    print(f"\n# cProfile of our side, {count} x {atoms}, {a.warmup} + {a.steps} steps (cumulative s)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(r"shardmd|mace/|torch/autograd", 25)


def fresh_startup(a) -> None:
    """Each side's start-up from a fresh process's launch to its first step (the interpreter,
    the imports, the model's build and conversion, the systems' set-up), twice each, the
    smaller kept (the first launch may warm the file cache for both)."""
    print("\n| systems x atoms | code | start-up from launch, s (fresh process) | ours / it |\n|---|---|---|---|")
    sides = ["ShardMD", *a.nl[:1]]
    got = {}
    for side in sides:
        best = float("nan")
        for _ in range(2):
            env = dict(os.environ, BENCH_T0=repr(time.time()))
            r = subprocess.run([sys.executable, __file__, "--child", side, "--cases", a.cases[0], "--device",
                                a.device], capture_output=True, text=True, env=env)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("STARTUP ")]
            if lines:
                v = float(lines[-1].split()[1])
                best = v if best != best else min(best, v)
            else:
                print(r.stderr[-2000:], file=sys.stderr)
        got[side] = best
    for side in sides:
        name = "ShardMD" if side == "ShardMD" else f"torch-sim ({side})"
        ratio = "" if side == "ShardMD" else f"{got['ShardMD'] / got[side]:.2f}"
        print(f"| {a.cases[0]} | {name} | {got[side]:.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
