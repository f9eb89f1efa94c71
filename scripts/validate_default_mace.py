#!/usr/bin/env python
"""Validate ShardMD's default MACE model (models/data/cu_mace_small.model) against EMT.

  (a) test-split errors + parity plot  -> docs/default_model_parity.png
  (b) NVE (VelocityVerlet, 1 fs) of 256-atom fcc Cu started from Maxwell-Boltzmann at
      600 K: total-energy drift (linear fit, meV/atom/ps) and fluctuation (std)
  (c) Langevin at 1200 K, model and EMT from the same start, same thermostat seed:
      does each stay crystalline?  Criteria: adaptive common-neighbour analysis
      (fraction of atoms with 12 x (4,2,1) signature = fcc) on the last frames, and a
      Lindemann ratio (rms displacement from the starting lattice sites, centre of
      mass removed, over the nearest-neighbour distance)
  (d) CPU speed: ms per energy+forces call, 256 atoms, float64 and float32 (and EMT)

All numbers are written to scripts/data/mace_cu/validation.json and printed.

    python scripts/validate_default_mace.py                       # ~10-20 min on 2 cores
    python scripts/validate_default_mace.py --nve-steps 50 --langevin-steps 50   # smoke
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "data" / "cu_mace_small.model"
DATA = REPO / "scripts" / "data" / "mace_cu"
PARITY_PNG = REPO / "docs" / "default_model_parity.png"
A_EMT = 3.59  # EMT fcc Cu lattice constant at 0 K (energy minimum), A


def _train_module():
    spec = importlib.util.spec_from_file_location(
        "train_default_mace", REPO / "scripts" / "train_default_mace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_calc(model_path, dtype="float64"):
    import mace  # noqa: F401
    from mace.calculators import MACECalculator

    return MACECalculator(model_paths=str(model_path), device="cpu", default_dtype=dtype)


# --------------------------------------------------------------------------- structure
def acna_fcc_fraction(atoms) -> tuple[float, float]:
    """Adaptive common-neighbour analysis (Stukowski 2012), fcc and hcp fractions.

    For each atom the 12 nearest neighbours define a local cutoff
    rc = (1 + sqrt 2)/2 * mean(12 NN distances); each (i, j) pair gets the signature
    (common neighbours, bonds among them, longest bond chain).  fcc: 12 x (4,2,1);
    hcp: 6 x (4,2,1) + 6 x (4,2,2).
    """
    from ase.neighborlist import neighbor_list

    i_idx, d, vec = neighbor_list("idD", atoms, 4.5)
    n_fcc = n_hcp = 0
    order = np.argsort(i_idx, kind="stable")
    i_idx, d, vec = i_idx[order], d[order], vec[order]
    starts = np.searchsorted(i_idx, np.arange(len(atoms) + 1))
    for a in range(len(atoms)):
        s, e = starts[a], starts[a + 1]
        if e - s < 12:
            continue
        nn = np.argsort(d[s:e])[:12]
        v = vec[s:e][nn]
        rc = 0.5 * (1.0 + np.sqrt(2.0)) * d[s:e][nn].mean()
        bond = np.linalg.norm(v[:, None, :] - v[None, :, :], axis=-1) < rc
        np.fill_diagonal(bond, False)
        n421 = n422 = 0
        for j in range(12):
            common = np.flatnonzero(bond[j])
            if len(common) != 4:
                break
            sub = bond[np.ix_(common, common)]
            nb = int(sub.sum()) // 2
            if nb != 2:
                break
            # two bonds: disjoint -> longest chain 1 (421); sharing an atom -> 2 (422)
            if sub.sum(axis=1).max() == 1:
                n421 += 1
            else:
                n422 += 1
        else:
            if n421 == 12:
                n_fcc += 1
            elif n421 == 6 and n422 == 6:
                n_hcp += 1
    return n_fcc / len(atoms), n_hcp / len(atoms)


def lindemann(pos, ref, a_nn):
    disp = pos - ref
    disp -= disp.mean(axis=0)
    return float(np.sqrt((disp ** 2).sum(axis=1).mean()) / a_nn)


# --------------------------------------------------------------------------- (a)
def parity(res, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arr = res["_arrays"]
    fig, ax = plt.subplots(1, 3, figsize=(13.5, 4.4))
    panels = [
        (arr["e_ref"], arr["e_pred"], "energy (eV/atom)",
         f"RMSE {res['energy_rmse_meV_per_atom']:.2f} meV/atom"),
        (arr["f_ref"].ravel(), arr["f_pred"].ravel(), "force component (eV/Å)",
         f"RMSE {res['forces_rmse_meV_per_A']:.1f} meV/Å"),
        (1e3 * arr["s_ref"].ravel(), 1e3 * arr["s_pred"].ravel(), "stress component (meV/Å³)",
         f"RMSE {res['stress_rmse_meV_per_A3']:.2f} meV/Å³"),
    ]
    for axis, (x, y, label, txt) in zip(ax, panels):
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
        pad = 0.03 * (hi - lo)
        axis.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k-", lw=0.7)
        axis.scatter(x, y, s=6 if x.size > 100 else 18, alpha=0.5, lw=0)
        axis.set_xlabel(f"EMT {label}")
        axis.set_ylabel(f"MACE {label}")
        axis.set_title(txt, fontsize=10)
        axis.set_aspect("equal")
    fig.suptitle(f"cu_mace_small vs EMT, test split ({res['n_configs']} configs, "
                 f"{res['n_atoms']} atoms)", fontsize=11)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- (b)
def nve(calc, steps, seed, temp=600.0, rep=4, dt_fs=1.0):
    from ase import units
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
    from ase.md.verlet import VelocityVerlet

    atoms = bulk("Cu", "fcc", a=A_EMT, cubic=True).repeat(rep)
    MaxwellBoltzmannDistribution(atoms, temperature_K=temp, rng=np.random.default_rng(seed))
    Stationary(atoms)
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, dt_fs * units.fs)
    etot, temps = [], []

    def rec():
        etot.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())
        temps.append(atoms.get_temperature())

    dyn.attach(rec, interval=1)
    t0 = time.time()
    rec()
    dyn.run(steps)
    wall = time.time() - t0
    n = len(atoms)
    e = np.array(etot) / n * 1e3  # meV/atom
    t_ps = np.arange(len(e)) * dt_fs * 1e-3
    slope, icpt = np.polyfit(t_ps, e, 1)
    return {
        "atoms": n, "steps": steps, "dt_fs": dt_fs, "initial_T_K": temp,
        "drift_meV_per_atom_per_ps": float(slope),
        "fluctuation_std_meV_per_atom": float(np.std(e - (slope * t_ps + icpt))),
        "max_minus_min_meV_per_atom": float(e.max() - e.min()),
        "mean_T_K_second_half": float(np.mean(temps[len(temps) // 2:])),
        "wall_s": round(wall, 1),
    }


# --------------------------------------------------------------------------- (c)
def langevin(calc, steps, seed, temp=1200.0, rep=3, dt_fs=2.0, friction_per_fs=0.01,
             sample=100):
    from ase import units
    from ase.build import bulk
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    a = A_EMT * (1.0 + 1.0e-5 * (temp - 300.0))  # as in the training data
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(rep)
    ref = atoms.get_positions().copy()
    MaxwellBoltzmannDistribution(atoms, temperature_K=temp, rng=np.random.default_rng(seed))
    Stationary(atoms)
    atoms.calc = calc
    dyn = Langevin(atoms, dt_fs * units.fs, temperature_K=temp,
                   friction=friction_per_fs / units.fs, rng=np.random.default_rng(seed + 1),
                   fixcm=False)
    frames = []
    dyn.attach(lambda: frames.append(atoms.copy()), interval=sample)
    t0 = time.time()
    dyn.run(steps)
    wall = time.time() - t0
    a_nn = a / np.sqrt(2.0)
    last = frames[-max(1, len(frames) // 4):]  # last quarter of the run
    fcc = [acna_fcc_fraction(f)[0] for f in last]
    hcp = [acna_fcc_fraction(f)[1] for f in last]
    lind = [lindemann(f.get_positions(), ref, a_nn) for f in last]
    lind_series = [lindemann(f.get_positions(), ref, a_nn) for f in frames]
    temps = [f.get_temperature() for f in frames[len(frames) // 2:]]
    # the average structure over the last quarter: thermal noise averages out
    mean_pos = np.mean([f.get_positions() for f in last], axis=0)
    avg = frames[-1].copy()
    avg.set_positions(mean_pos)
    fcc_avg = acna_fcc_fraction(avg)[0]
    crystalline = bool(np.mean(lind) < 0.15 and fcc_avg > 0.5)
    return {
        "atoms": len(atoms), "steps": steps, "dt_fs": dt_fs, "T_K": temp,
        "lattice_A": a, "friction_per_fs": friction_per_fs,
        "sampled_every_steps": sample, "frames_analysed": len(last),
        "acna_fcc_fraction_instantaneous": float(np.mean(fcc)),
        "acna_hcp_fraction_instantaneous": float(np.mean(hcp)),
        "acna_fcc_fraction_time_averaged_positions": float(fcc_avg),
        "lindemann_ratio": float(np.mean(lind)),
        "lindemann_ratio_series": [round(x, 4) for x in lind_series],
        "mean_T_K_second_half": float(np.mean(temps)),
        "crystalline": crystalline,
        "criterion": "crystalline if Lindemann ratio (rms displacement from the starting "
                     "fcc sites / nn distance, last quarter) < 0.15 and a-CNA fcc fraction "
                     "of the time-averaged last-quarter positions > 0.5",
        "wall_s": round(wall, 1),
    }


# --------------------------------------------------------------------------- (d)
def speed(calc, rep=4, n=10):
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=A_EMT, cubic=True).repeat(rep)
    atoms.rattle(0.02, seed=1)
    atoms.calc = calc
    times = []
    for _ in range(n + 2):
        atoms.positions[0, 0] += 1e-4  # force a fresh calculation
        t0 = time.perf_counter()
        atoms.get_potential_energy()
        atoms.get_forces()
        times.append(time.perf_counter() - t0)
    times = np.array(times[2:]) * 1e3
    return {"atoms": len(atoms), "calls": n, "median_ms": float(np.median(times)),
            "min_ms": float(times.min())}


def speed_section(a):
    from ase.calculators.emt import EMT

    res = {
        "float64": speed(model_calc(a.model, "float64"), n=15),
        "float32": speed(model_calc(a.model, "float32"), n=15),
        "emt": speed(EMT()),
        "load_average_1min": round(__import__("os").getloadavg()[0], 2),
        "note": f"ms per energy+forces call via the ASE calculator, {a.threads} torch "
                "threads; on a shared machine other jobs can slow this several-fold",
    }
    for k in ("float64", "float32", "emt"):
        r = res[k]
        print(f"(d) speed {k}: median {r['median_ms']:.0f} ms, min {r['min_ms']:.0f} ms "
              f"per E+F call, 256 atoms", flush=True)
    return res


def main(argv=None):
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=DATA / "validation.json")
    p.add_argument("--png", type=Path, default=PARITY_PNG)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--nve-steps", type=int, default=1000)
    p.add_argument("--langevin-steps", type=int, default=2000)
    p.add_argument("--langevin-rep", type=int, default=3, help="3 -> 108 atoms")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--speed-only", action="store_true",
                   help="only redo (d) and update it in an existing --out JSON (e.g. when "
                        "the machine is idle: shared-machine timings vary several-fold)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from ase.calculators.emt import EMT

    out = {"model": str(a.model.relative_to(REPO)) if a.model.resolve().is_relative_to(REPO)
           else str(a.model), "date": _dt.datetime.now(_dt.timezone.utc)
           .replace(microsecond=0).isoformat(), "seed": a.seed, "torch_threads": a.threads}

    if a.speed_only:
        out = json.loads(a.out.read_text())
        out["speed_256_atoms"] = speed_section(a)
        out["speed_date"] = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
        a.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["speed_256_atoms"], indent=2))
        return

    t0 = time.time()
    res = _train_module().evaluate(a.model, a.data / "test.xyz")
    parity(res, a.png)
    res.pop("_arrays")
    out["test_errors"] = res
    print(f"(a) test: E RMSE {res['energy_rmse_meV_per_atom']:.2f} meV/atom "
          f"(MAE {res['energy_mae_meV_per_atom']:.2f}), F RMSE {res['forces_rmse_meV_per_A']:.1f}"
          f" meV/A (MAE {res['forces_mae_meV_per_A']:.1f}), S RMSE "
          f"{res['stress_rmse_meV_per_A3']:.3f} meV/A^3 -> {a.png}  ({time.time() - t0:.0f} s)",
          flush=True)

    calc = model_calc(a.model, "float64")
    out["nve_model"] = nve(calc, a.nve_steps, a.seed)
    out["nve_emt"] = nve(EMT(), a.nve_steps, a.seed)
    for k in ("nve_model", "nve_emt"):
        r = out[k]
        print(f"(b) {k}: drift {r['drift_meV_per_atom_per_ps']:+.3f} meV/atom/ps, "
              f"fluct {r['fluctuation_std_meV_per_atom']:.3f} meV/atom, "
              f"<T> {r['mean_T_K_second_half']:.0f} K ({r['wall_s']} s)", flush=True)

    out["langevin_model"] = langevin(calc, a.langevin_steps, a.seed, rep=a.langevin_rep)
    out["langevin_emt"] = langevin(EMT(), a.langevin_steps, a.seed, rep=a.langevin_rep)
    for k in ("langevin_model", "langevin_emt"):
        r = out[k]
        print(f"(c) {k}: {r['atoms']} atoms {r['steps']} x {r['dt_fs']} fs at {r['T_K']:.0f} K: "
              f"Lindemann {r['lindemann_ratio']:.3f}, a-CNA fcc {r['acna_fcc_fraction_instantaneous']:.2f}"
              f" (time-avg {r['acna_fcc_fraction_time_averaged_positions']:.2f}), <T> "
              f"{r['mean_T_K_second_half']:.0f} K -> crystalline={r['crystalline']} "
              f"({r['wall_s']} s)", flush=True)

    if not a.skip_speed:
        out["speed_256_atoms"] = speed_section(a)

    out["wall_s"] = round(time.time() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items()
                      if not k.startswith("langevin")}, indent=2))
    for k in ("langevin_model", "langevin_emt"):
        print(k, json.dumps({kk: vv for kk, vv in out[k].items()
                             if kk != "lindemann_ratio_series"}))


if __name__ == "__main__":
    main()
