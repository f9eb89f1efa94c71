"""I/O costs: a 1M-atom checkpoint, and trajectory + checkpoint overhead of an LJ run.

    python scripts/bench_io.py [--ckpt-atoms 1000000] [--lj-atoms 256000] [--steps 200]

1. Writes (atomically, fsynced) and reads back a checkpoint of ``--ckpt-atoms`` atoms.
2. Runs LJ (argon, float64, 1 rank) for ``--steps`` steps with trajectory frames (positions
   only) every 100 steps and a checkpoint at the end, reads the engine's own time split, and
   reports the I/O share for the schedule "frame every 100, checkpoint every 1,000 steps"
   (per-frame and per-checkpoint costs measured here, per-step cost measured here).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def bench_checkpoint(n: int, work: Path) -> tuple[float, float, float]:
    from shardmd.engine.io.checkpoint import read_checkpoint, write_checkpoint

    rng = np.random.default_rng(0)
    arrays = {"positions": rng.random((n, 3)) * 100, "reference_positions": rng.random((n, 3)) * 100,
              "velocities": rng.normal(size=(n, 3)), "masses": np.full(n, 39.948),
              "numbers": np.full(n, 18, dtype=np.int64), "ids": np.arange(n, dtype=np.int64),
              "images": np.zeros((n, 3), dtype=np.int32)}
    t = time.perf_counter()
    path = write_checkpoint(work / "ck", 1000, 1000.0, arrays, np.eye(3) * 100, np.ones(3, bool), {"model": {}},
                            {"name": "verlet"}, "lj", "x", "0", keep=1)
    tw = time.perf_counter() - t
    t = time.perf_counter()
    read_checkpoint(path)
    tr = time.perf_counter() - t
    return tw, tr, path.stat().st_size / 1e6


def bench_run(atoms: int, steps: int, work: Path) -> dict:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    n = max(1, round((atoms / 4) ** (1 / 3)))
    cfg = compose_config(["model=lj", f"system.repeat=[{n},{n},{n}]", f"steps={steps}", "trajectory.every=100",
                          "trajectory.fields=[position]", "thermo.every=100", f"checkpoint.every={steps}",
                          "quiet=true", "threads=1", f"output={work / 'io.h5'}", "overwrite=true"])
    sim = Simulation(cfg)
    sim.run()
    s = sim.summary
    frames = steps // 100
    return {"atoms": 4 * n**3, "steps": steps, "wall": s["wall_s"], "output": s.get("output", 0.0),
            "checkpoint": s.get("checkpoint", 0.0), "frames": frames}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-atoms", type=int, default=1_000_000)
    ap.add_argument("--lj-atoms", type=int, default=256_000)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardmd-io-"))
    tw, tr, mb = bench_checkpoint(a.ckpt_atoms, work)
    print(f"checkpoint of {a.ckpt_atoms} atoms: {mb:.1f} MB, write+fsync+rename {tw:.3f} s, read {tr:.3f} s")
    r = bench_run(a.lj_atoms, a.steps, work)
    per_frame = r["output"] / max(r["frames"], 1)
    per_ckpt = r["checkpoint"]
    per_step = (r["wall"] - r["output"] - r["checkpoint"]) / r["steps"]
    share = (10 * per_frame + per_ckpt) / (1000 * per_step + 10 * per_frame + per_ckpt)
    print(f"LJ {r['atoms']} atoms, {r['steps']} steps: loop {r['wall']:.2f} s, {per_step * 1e3:.1f} ms/step, "
          f"frame (positions) {per_frame * 1e3:.1f} ms incl. thermo gather, checkpoint {per_ckpt * 1e3:.1f} ms")
    print(f"| schedule | I/O share of run time |\n|---|---|\n| frame every 100, checkpoint every 1000 steps | "
          f"{100 * share:.2f} % |")


if __name__ == "__main__":
    main()
