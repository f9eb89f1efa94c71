"""What the health checks (engine/run/health.py) cost per step: the skin check alone against the
skin check with the health measure folded into its read-back, beside a whole MD step.

    python scripts/bench_health.py                       # LJ on the CPU, 4k and 32k atoms
    python scripts/bench_health.py --device cuda --atoms 256000 4000000

Per step the engine reads the skin criterion back once (CPU default: every step; on a GPU the
deferred check reads at scheduled steps only). The health measure (max |v| dt, NaN -> inf) is
one more reduction whose result rides in the same read-back, so the number of host reads is
unchanged; this prints the time each costs (minimum over repeats, after a warm-up).
"""
from __future__ import annotations

import argparse
import time

import torch

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.health import max_speed, step_measure
from shardmd.engine.run.simulation import Simulation


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeat: int) -> float:
    """Minimum wall seconds of one call (each call synchronised: the read-back's real cost)."""
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def measure(atoms: int, device: str, repeat: int) -> dict:
    n = max(1, round((atoms / 4) ** (1 / 3)))
    cfg = compose_config(["model=lj", f"system.repeat=[{n},{n},{n}]", "system.a=5.719", f"device={device}",
                          "threads=1", "quiet=true", "trajectory.every=0", "checkpoint.every=0", "thermo.every=0",
                          "output=/tmp/bench_health.h5", "overwrite=true", "neighbor.deferred=false"])
    sim = Simulation(cfg)
    sim.setup()
    sim.started = True
    for _ in range(5):
        sim.step()
    s, d, dt = sim.state, sim.domain, sim.integrator.dt
    skin_only = timed(lambda: d.comm.any(d.nl.needs_rebuild(s.positions, s.cell)), device, repeat)
    with_health = timed(lambda: d.check(s, dt), device, repeat)
    measure_only = timed(lambda: step_measure(s.velocities, dt), device, repeat)
    step = timed(sim.step, device, max(3, repeat // 10))
    # what folding max_speed into a running maximum every step would cost the host (the deferred
    # check measures at its read-backs only instead: nothing per step)
    running = torch.zeros((), dtype=s.velocities.dtype, device=s.velocities.device)
    _sync(device)
    t = time.perf_counter()
    for _ in range(repeat):
        running = torch.maximum(running, max_speed(s.velocities))
    launch = (time.perf_counter() - t) / repeat
    _sync(device)
    sim.close()
    return {"atoms": s.n_atoms, "skin": skin_only, "both": with_health, "measure": measure_only, "step": step,
            "deferred": launch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atoms", type=int, nargs="+", default=[4000, 32000])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=50)
    a = ap.parse_args()
    print(f"LJ (in.lj density), {a.device}; minimum of {a.repeat} synchronised calls each")
    print("| atoms | skin check (µs) | skin check + health (µs) | health measure alone (µs) | MD step (ms) "
          "| added per checked step | max speed folded every step: host time (µs; not done) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.atoms:
        r = measure(n, a.device, a.repeat)
        added = r["both"] - r["skin"]
        print(f"| {r['atoms']:,} | {1e6 * r['skin']:.1f} | {1e6 * r['both']:.1f} | {1e6 * r['measure']:.1f} "
              f"| {1e3 * r['step']:.2f} | {100 * added / r['step']:+.2f} % | {1e6 * r['deferred']:.1f} |")


if __name__ == "__main__":
    main()
