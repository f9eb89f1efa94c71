"""MD validation of the shipped MACE model through the engine (issue: MACE across domains).

1. NVE, 4 domains vs 1 domain, same start (fcc Cu 4x4x2 = 128 atoms, 600 K, dt 1 fs,
   2,000 steps): total-energy drift per atom (linear fit) and fluctuation, for both runs.
2. Langevin at 600 K on 4 domains (fixed seed): block-averaged temperature vs target.

    python scripts/validate_mace_md.py [--steps 2000] [--out docs/mace_md_validation.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

COMMON = ["model=mace", "system.repeat=[4,4,2]", "temperature=600", "dt=1.0", "thermo.every=10",
          "trajectory.every=0", "checkpoint.every=0", "quiet=true", "neighbor.skin=0.5"]


def run(args, work: Path, name: str) -> np.ndarray:
    r = subprocess.run([sys.executable, "-m", "engine", "run", *COMMON, *args, f"output={work / name}.h5"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    rows = [ln.split() for ln in (work / f"{name}.log").read_text().splitlines() if ln.strip()[:1].isdigit()]
    return np.array([[float(x) for x in row[:6]] for row in rows])  # step, t(ps), T, PE, KE, Etot


def nve_stats(a: np.ndarray, n: int) -> dict:
    t_ps, e = a[:, 1], a[:, 5]
    slope = np.polyfit(t_ps, e, 1)[0]
    return {"drift_meV_per_atom_per_ps": 1e3 * slope / n, "etot_std_meV_per_atom": 1e3 * e.std() / n,
            "ke_std_meV_per_atom": 1e3 * a[:, 4].std() / n, "mean_T": float(a[:, 2].mean())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("docs/mace_md_validation.json"))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mace-md-"))
    n = 128
    res = {"atoms": n, "steps": a.steps, "work_dir": str(work)}
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def save(stage: str) -> None:  # partial results survive an interrupted run
        a.out.write_text(json.dumps(res, indent=2))
        print(f"[{stage}] done", flush=True)

    nve4 = run([f"steps={a.steps}", "domains=4"], work, "nve4")
    res["nve_4_domains"] = nve_stats(nve4, n)
    save("nve 4 domains")
    nve1 = run([f"steps={a.steps}"], work, "nve1")
    res["nve_1_domain"] = nve_stats(nve1, n)
    res["nve_max_etot_difference_eV"] = float(np.abs(nve4[:, 5] - nve1[:, 5]).max())
    save("nve 1 domain")
    lang = run([f"steps={a.steps}", "domains=4", "integrator=langevin", "integrator.friction=0.02", "seed=1"],
               work, "lang4")
    temps = lang[len(lang) // 5:, 2]  # drop the first fifth (equilibration)
    blocks = np.array([b.mean() for b in np.array_split(temps, 8)])
    sem = blocks.std(ddof=1) / np.sqrt(len(blocks))
    res["langevin_600K"] = {"mean_T": float(temps.mean()), "block_sem": float(sem),
                            "within_3_sigma": bool(abs(temps.mean() - 600) < 3 * sem)}
    save("langevin 4 domains")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
