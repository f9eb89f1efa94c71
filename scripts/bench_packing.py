"""Random packing (engine/run/packing.py) speed: seconds to pack N argon atoms at packing
fractions up to the builder's limit, one process, printed as a table.

    .venv/bin/python scripts/bench_packing.py [--sizes 4000 32000]
"""
from __future__ import annotations

import argparse
import time

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.builders import build_atoms
from shardmd.engine.run.packing import unit_volume


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4000, 32000])
    ap.add_argument("--distances", type=float, nargs="+", default=[2.8, 3.0, 3.15])
    args = ap.parse_args()
    print(f"{'atoms':>8} {'density g/cm3':>14} {'min_distance Å':>15} {'fraction':>9} {'seconds':>8}")
    for n in args.sizes:
        for d in args.distances:
            cfg = compose_config(["model=lj", "system.lattice=random", f"system.count={n}", "system.density=1.3",
                                  f"system.min_distance={d}"])
            t = time.perf_counter()
            atoms = build_atoms(cfg.system, 1)
            dt = time.perf_counter() - t
            phi = n * unit_volume([[0.0, 0.0, 0.0]], d) / atoms.get_volume()
            print(f"{n:>8} {1.3:>14.2f} {d:>15.2f} {phi:>9.3f} {dt:>8.2f}")


if __name__ == "__main__":
    main()
