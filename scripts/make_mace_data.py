#!/usr/bin/env python
"""Reference data for ShardMD's default MACE model: copper with ASE's EMT potential.

Every configuration is labelled with ASE's EMT calculator (the only "ground truth" the
default model is trained to reproduce).  Groups (config_type in the extxyz header):

  bulk_md      fcc Cu, Langevin MD at 300-1500 K (32- and 108-atom cubic cells)
  strain       fcc Cu with the lattice compressed/expanded by up to +-4 %, MD at 300-900 K
  shear        triclinic cells: random symmetric strain (diag +-3 %, off-diag +-6 %) of
               the cubic cell, and 27-atom cells built from the rhombohedral primitive cell
  vacancy      1 or 2 vacancies in 32/108-atom cells, MD at 300-1200 K
  surface      (111), (100), (110) slabs (and a (111) slab with an adatom), 12 A vacuum
               gap along z, pbc=True in all three axes, MD at 300-900 K
  liquid       108/32-atom cells melted at 3500 K, then sampled at 2000-2500 K at a
               liquid-like density (lattice +3 %)
  rattle       large random displacements (sigma 0.08-0.15 A) of strained 32-atom cells
               (short-range repulsion, high forces)

Units and keys (mace's readers and ShardMD's agree on them):
  REF_energy   total potential energy of the configuration, eV (EMT's zero: fcc Cu at
               ~3.59 A is ~0; an isolated Cu atom is +3.51 eV)
  REF_forces   per-atom forces, eV/A
  REF_stress   stress, eV/A^3, Voigt-6 in ASE order (xx, yy, zz, yz, xz, xy), ASE sign
               convention (positive = tensile)

Determinism: every group draws from its own numpy Generator seeded with
SeedSequence([seed, group_index]); with the same --seed the three files are
bit-identical.  The split (default 80/10/10) is by whole configuration, shuffled with
the seed.  The printed data hash is SHA-256 over train.xyz, valid.xyz, test.xyz
concatenated in that order (also written to manifest.json with per-file hashes).

    python scripts/make_mace_data.py                 # -> scripts/data/mace_cu/
    python scripts/make_mace_data.py --seed 0 --out scripts/data/mace_cu
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import add_adsorbate, bulk, fcc100, fcc110, fcc111
from ase.calculators.emt import EMT
from ase.io import write
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import Stationary

try:  # ase >= 3.29
    from ase.md.velocitydistribution import thermalize_momenta as _thermalize
except ImportError:  # older ase
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as _thermalize

A_EMT = 3.59  # EMT's fcc Cu equilibrium lattice constant (A), energy minimum to 0.01 A
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "scripts" / "data" / "mace_cu"
FILES = ("train.xyz", "valid.xyz", "test.xyz")


# --------------------------------------------------------------------------- helpers
def labelled(atoms: Atoms, config_type: str, **info) -> Atoms:
    """A calculator-free copy carrying EMT's energy/forces/stress as REF_* keys."""
    calc = EMT()
    atoms = atoms.copy()
    atoms.calc = calc
    energy = float(atoms.get_potential_energy())
    forces = atoms.get_forces().copy()
    stress = atoms.get_stress(voigt=True).copy()
    out = Atoms(
        numbers=atoms.get_atomic_numbers(),
        positions=atoms.get_positions(),
        cell=atoms.get_cell(),
        pbc=atoms.get_pbc(),
    )
    out.info["config_type"] = config_type
    for k, v in info.items():
        out.info[k] = v
    out.info["REF_energy"] = energy
    out.info["REF_stress"] = stress
    out.arrays["REF_forces"] = forces
    return out


def md_snapshots(atoms: Atoms, temps, rng, n_snap, *, equil=150, every=25, dt_fs=2.0,
                 friction=0.02, pre=None):
    """Langevin MD with EMT; returns (T, snapshot) pairs.

    temps: temperature for the whole run, or a (T_pre, n_pre, T) tuple via `pre`.
    """
    atoms = atoms.copy()
    atoms.calc = EMT()
    snaps = []
    if pre is not None:  # e.g. melt at a high temperature first
        t_pre, n_pre = pre
        _thermalize(atoms, temperature_K=t_pre, rng=rng)
        Stationary(atoms)
        dyn = Langevin(atoms, dt_fs * units.fs, temperature_K=t_pre,
                       friction=friction / units.fs, rng=rng, fixcm=False)
        dyn.run(n_pre)
    else:
        _thermalize(atoms, temperature_K=temps, rng=rng)
        Stationary(atoms)
    dyn = Langevin(atoms, dt_fs * units.fs, temperature_K=temps,
                   friction=friction / units.fs, rng=rng, fixcm=False)
    dyn.run(equil)
    for _ in range(n_snap):
        dyn.run(every)
        snaps.append(atoms.copy())
    return snaps


def cubic(a=A_EMT, rep=2) -> Atoms:
    return bulk("Cu", "fcc", a=a, cubic=True).repeat(rep)


# --------------------------------------------------------------------------- groups
def g_bulk_md(rng):
    out = []
    for T in (300, 600, 900, 1200, 1500):
        # modest thermal expansion so the hot crystal is not under large pressure
        a = A_EMT * (1.0 + 1.0e-5 * (T - 300))
        for rep, n in ((2, 10), (3, 4)):
            for s in md_snapshots(cubic(a, rep), T, rng, n, every=25 if rep == 2 else 40):
                out.append(labelled(s, "bulk_md", T=T))
    return out


def g_strain(rng):
    out = []
    for scale in (0.96, 0.97, 0.98, 0.99, 1.01, 1.02, 1.03, 1.04):
        T = float(rng.choice([300, 600, 900]))
        for s in md_snapshots(cubic(A_EMT * scale, 2), T, rng, 3, equil=100):
            out.append(labelled(s, "strain", T=T, lattice_scale=scale))
    # a few isotropically strained 108-atom cells too
    for scale in (0.965, 1.035):
        for s in md_snapshots(cubic(A_EMT * scale, 3), 600.0, rng, 2, equil=100, every=40):
            out.append(labelled(s, "strain", T=600.0, lattice_scale=scale))
    return out


def g_shear(rng):
    out = []
    # cubic 32-atom cells with random symmetric strain
    for _ in range(16):
        eps = np.zeros((3, 3))
        eps[np.diag_indices(3)] = rng.uniform(-0.03, 0.03, 3)
        off = rng.uniform(-0.06, 0.06, 3)
        eps[0, 1] = eps[1, 0] = off[0]
        eps[0, 2] = eps[2, 0] = off[1]
        eps[1, 2] = eps[2, 1] = off[2]
        at = cubic(A_EMT, 2)
        at.set_cell(at.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
        T = float(rng.choice([300, 600, 900]))
        for s in md_snapshots(at, T, rng, 1, equil=100):
            out.append(labelled(s, "shear", T=T))
    # 27-atom triclinic (rhombohedral primitive) cells, slightly strained
    for _ in range(14):
        at = bulk("Cu", "fcc", a=A_EMT * rng.uniform(0.98, 1.02)).repeat(3)
        eps = rng.uniform(-0.02, 0.02, (3, 3))
        eps = 0.5 * (eps + eps.T)
        at.set_cell(at.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
        T = float(rng.choice([300, 600, 900, 1200]))
        for s in md_snapshots(at, T, rng, 1, equil=100):
            out.append(labelled(s, "shear", T=T))
    return out


def g_vacancy(rng):
    out = []
    for rep, nvac, temps, n in ((2, 1, (300, 600, 900, 1200), 5),
                                (3, 1, (600, 1200), 3),
                                (3, 2, (900,), 2)):
        for T in temps:
            at = cubic(A_EMT, rep)
            idx = rng.choice(len(at), size=nvac, replace=False)
            del at[sorted(int(i) for i in idx)]
            for s in md_snapshots(at, T, rng, n, every=25 if rep == 2 else 40):
                out.append(labelled(s, "vacancy", T=T))
    return out


def g_surface(rng):
    out = []
    slabs = {
        "111": fcc111("Cu", size=(3, 3, 4), a=A_EMT, vacuum=6.0, orthogonal=False),
        "100": fcc100("Cu", size=(3, 3, 4), a=A_EMT, vacuum=6.0),
        "110": fcc110("Cu", size=(3, 2, 6), a=A_EMT, vacuum=6.0),
    }
    for name, slab in slabs.items():
        slab.pbc = True  # vacuum gap of 12 A along z, > r_max
        for T in (300, 600, 900):
            for s in md_snapshots(slab, T, rng, 3, every=30):
                out.append(labelled(s, "surface", T=T, facet=name))
    ad = fcc111("Cu", size=(3, 3, 4), a=A_EMT, vacuum=6.0, orthogonal=False)
    add_adsorbate(ad, "Cu", 2.1, "fcc")
    ad.center(vacuum=6.0, axis=2)
    ad.pbc = True
    for T in (300, 600):
        for s in md_snapshots(ad, T, rng, 3, every=30):
            out.append(labelled(s, "surface", T=T, facet="111+adatom"))
    return out


def g_liquid(rng):
    out = []
    a_liq = A_EMT * 1.03
    for rep, temps, n in ((3, (2000, 2500), 6), (2, (2000, 2500), 5)):
        for T in temps:
            for s in md_snapshots(cubic(a_liq, rep), T, rng, n, equil=200, every=40,
                                  pre=(3500.0, 600)):
                out.append(labelled(s, "liquid", T=T))
    return out


def g_rattle(rng):
    out = []
    for _ in range(20):
        scale = rng.uniform(0.96, 1.04)
        at = cubic(A_EMT * scale, 2)
        sigma = rng.uniform(0.08, 0.15)
        at.positions += rng.normal(0.0, sigma, at.positions.shape)
        out.append(labelled(at, "rattle", lattice_scale=float(scale), sigma=float(sigma)))
    return out


GROUPS = (g_bulk_md, g_strain, g_shear, g_vacancy, g_surface, g_liquid, g_rattle)


def data_hash(folder: Path) -> tuple[str, dict]:
    total = hashlib.sha256()
    per = {}
    for name in FILES:
        b = (folder / name).read_bytes()
        total.update(b)
        per[name] = hashlib.sha256(b).hexdigest()
    return total.hexdigest(), per


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--split", type=float, nargs=3, default=(0.8, 0.1, 0.1),
                   metavar=("TRAIN", "VALID", "TEST"))
    args = p.parse_args(argv)
    t0 = time.time()

    configs = []
    for gi, group in enumerate(GROUPS):
        rng = np.random.default_rng(np.random.SeedSequence([args.seed, gi]))
        tg = time.time()
        got = group(rng)
        print(f"  {group.__name__[2:]:8s} {len(got):4d} configs "
              f"{sum(len(a) for a in got):6d} atoms  ({time.time() - tg:.1f} s)", flush=True)
        configs += got

    split_rng = np.random.default_rng(np.random.SeedSequence([args.seed, 1000]))
    order = split_rng.permutation(len(configs))
    n = len(configs)
    n_train = int(round(args.split[0] * n))
    n_valid = int(round(args.split[1] * n))
    parts = {
        "train.xyz": order[:n_train],
        "valid.xyz": order[n_train:n_train + n_valid],
        "test.xyz": order[n_train + n_valid:],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, idx in parts.items():
        sel = [configs[i] for i in sorted(idx)]
        write(args.out / name, sel, format="extxyz")
        kinds = {}
        for a in sel:
            kinds[a.info["config_type"]] = kinds.get(a.info["config_type"], 0) + 1
        summary[name] = {"configs": len(sel), "atoms": int(sum(len(a) for a in sel)),
                         "config_types": dict(sorted(kinds.items()))}

    digest, per = data_hash(args.out)
    e = np.array([a.info["REF_energy"] / len(a) for a in configs])
    f = np.concatenate([a.arrays["REF_forces"].ravel() for a in configs])
    manifest = {
        "generator": "scripts/make_mace_data.py",
        "reference": "ase.calculators.emt.EMT (Cu)",
        "seed": args.seed,
        "units": {"REF_energy": "eV (total per configuration)",
                  "REF_forces": "eV/A",
                  "REF_stress": "eV/A^3, Voigt-6 (xx, yy, zz, yz, xz, xy), ASE sign"},
        "emt_isolated_atom_energy_eV": 3.51,
        "sha256": digest,
        "sha256_note": "SHA-256 of train.xyz + valid.xyz + test.xyz concatenated in that order",
        "files_sha256": per,
        "splits": summary,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    print(f"{n} configs, {sum(len(a) for a in configs)} atoms -> {args.out}")
    for name, s in summary.items():
        size = (args.out / name).stat().st_size
        print(f"  {name:10s} {s['configs']:4d} configs {s['atoms']:6d} atoms "
              f"{size / 1e6:5.2f} MB  {s['config_types']}")
    print(f"energy/atom range {e.min():.3f} .. {e.max():.3f} eV, "
          f"|F| max {np.abs(f).max():.2f} eV/A, F rms {np.sqrt((f ** 2).mean()):.3f} eV/A")
    print(f"wall {time.time() - t0:.1f} s")
    print(f"SHA-256 (train+valid+test): {digest}")


if __name__ == "__main__":
    main()
