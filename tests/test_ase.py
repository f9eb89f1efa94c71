"""The ASE calculator and ASE round trips, against ASE's own numerical and MD machinery."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.io import read, write
from ase.md.verlet import VelocityVerlet
from conftest import mpiexec_cmd, run_engine

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.h5md import read_frames, read_observables

HERE = Path(__file__).resolve().parent


def _triclinic_argon():
    a = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((3, 3, 3))
    a.rattle(0.1, seed=1)
    a.set_cell(a.cell.array @ np.array([[1, 0, 0], [0.12, 1, 0], [0.05, -0.1, 1]]), scale_atoms=True)
    return a


def _numerical_checks(atoms, calc, d_f, d_s, tol_f, tol_s, iatoms=None):
    from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress

    atoms.calc = calc
    f, s = atoms.get_forces(), atoms.get_stress()
    if iatoms is not None:
        f = f[iatoms]
    fn = calculate_numerical_forces(atoms, eps=d_f, iatoms=iatoms)
    sn = calculate_numerical_stress(atoms, eps=d_s)
    assert np.linalg.norm(f - fn) <= tol_f * np.linalg.norm(f)
    assert np.linalg.norm(s - sn) <= tol_s * np.linalg.norm(s)


def test_lj_numerical_forces_and_stress():
    # central differences: error ~ d^2/6 |E'''|; with d = 1e-4 Å and LJ curvature scales of
    # ~1 Å that is ~1e-9 relative, plus round-off ~1e-16 |E| / d ~ 1e-11: 1e-6 is generous
    _numerical_checks(_triclinic_argon(), ShardMDCalculator(model="lj"), 1e-4, 1e-6, 1e-6, 1e-6)


def test_mace_numerical_forces_and_stress(tmp_path):
    from shardmd.models.mace_random import make_random_mace

    model = make_random_mace(tmp_path / "m.model", elements=(29,), r_max=4.0)
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    a.rattle(0.05, seed=2)
    a.set_cell(a.cell.array @ np.array([[1, 0, 0], [0.1, 1, 0], [0.05, 0.0, 1]]), scale_atoms=True)
    # six atoms' forces (each atom's force depends on all neighbours, so any missing edge or
    # exchange term shows up there) and the full stress
    _numerical_checks(a, ShardMDCalculator(model="mace", checkpoint=str(model)), 1e-4, 1e-6, 1e-6, 1e-5,
                      iatoms=[0, 5, 11, 17, 23, 31])


def test_caching_and_changes():
    a = _triclinic_argon()
    calc = ShardMDCalculator(model="lj")
    a.calc = calc
    calls = []
    orig = calc.calculate
    calc.calculate = lambda *x, **k: (calls.append(1), orig(*x, **k))[1]
    e1 = a.get_potential_energy()
    a.get_forces()
    a.get_stress()
    assert len(calls) == 1  # cached
    a.positions[0, 0] += 0.01
    assert a.get_potential_energy() != e1 and len(calls) == 2
    b = a.repeat((1, 1, 2))  # atom count changes
    b.calc = calc
    assert abs(b.get_potential_energy() - 2 * a.get_potential_energy()) < 1e-9
    b.numbers[:5] = 36
    with pytest.raises(ValueError, match="Kr"):
        b.get_potential_energy()
    assert len(a.calc.get_property("energies", a)) == len(a)


def test_ase_verlet_equals_engine_verlet(tmp_path):
    from shardmd.engine.config import compose_config
    from shardmd.engine.simulation import Simulation
    from shardmd.engine.state import State

    a = _triclinic_argon()
    rng = np.random.default_rng(0)
    a.set_velocities(rng.normal(0, 0.02, (len(a), 3)))
    dt = 2.0
    ase_atoms = a.copy()
    ase_atoms.calc = ShardMDCalculator(model="lj")
    VelocityVerlet(ase_atoms, timestep=dt * units.fs).run(100)
    cfg = compose_config(["model=lj", f"dt={dt}", "steps=100", "quiet=true", "trajectory.every=0",
                          "thermo.every=0", "checkpoint.every=0", f"output={tmp_path / 'x.h5'}", "neighbor.skin=0.5"])
    sim = Simulation(cfg, state=State.from_atoms(a))
    sim.run()
    assert np.abs(sim.state.to_atoms(unwrapped=True).positions - ase_atoms.positions).max() < 1e-10  # id order


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ase_script_under_mpiexec(k, tmp_path):
    r = subprocess.run(mpiexec_cmd(k, [str(HERE / "mpi" / "ase_cases.py"), str(tmp_path)]),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    subprocess.run([sys.executable, str(HERE / "mpi" / "ase_cases.py"), str(tmp_path)], check=True, timeout=900)
    par, ser = np.load(tmp_path / f"results_{k}.npz"), np.load(tmp_path / "results_1.npz")
    assert bool(par["same"]) and int(par["world_size"]) == k  # identical on every rank; ASE sees MPI
    assert np.abs(par["forces"] - ser["forces"]).max() <= 1e-10 * np.abs(ser["forces"]).max()
    assert abs(float(par["energy"]) - float(ser["energy"])) <= 1e-10 * abs(float(ser["energy"]))
    assert np.abs(par["stress"] - ser["stress"]).max() <= 1e-10 * np.abs(ser["stress"]).max()
    assert np.abs(par["relaxed"] - ser["relaxed"]).max() < 1e-4
    log = (tmp_path / f"bfgs_{k}.log").read_text().splitlines()
    assert sum(line.startswith("BFGS:") and line.split()[1] == "0" for line in log) == 1  # written once


def test_convert_roundtrip(engine_cli, tmp_path):
    assert run_engine(["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "trajectory.every=10",
                       "quiet=true"], cwd=tmp_path).returncode == 0
    for out in ("out.extxyz", "out.traj"):
        r = engine_cli(["convert", "run.h5", out], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        frames, back = read_frames(tmp_path / "run.h5"), read(tmp_path / out, index=":")
        obs = read_observables(tmp_path / "run.h5")
        assert len(back) == len(frames) == 3
        for f, b, e in zip(frames, back, obs["potential_energy"][2]):
            assert np.allclose(b.positions, f.positions, atol=1e-8) and np.allclose(b.cell.array, f.cell.array)
            assert (b.numbers == f.numbers).all()
            assert np.allclose(b.get_forces(), f.get_forces(), atol=1e-8)
            assert abs(b.get_potential_energy() - e) < 1e-8


@pytest.mark.parametrize("fmt", ["extxyz", "cif", "vasp"])
def test_ase_formats_as_input(engine_cli, tmp_path, fmt):
    a = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((3, 3, 3))
    a.rattle(0.05, seed=3)
    if fmt == "extxyz":
        a.info["note"] = "made by test"
        a.arrays["tag2"] = np.arange(len(a))
    name = {"extxyz": "in.extxyz", "cif": "in.cif", "vasp": "POSCAR"}[fmt]
    write(tmp_path / name, a, format=fmt)
    r = engine_cli(["run", "model=lj", f"system.file={name}", "steps=0", "quiet=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    f = read_frames(tmp_path / "run.h5")[0]
    given = read(tmp_path / name)
    assert len(f) == len(given) and (f.numbers == given.numbers).all()
    wrapped = given.copy()
    wrapped.wrap()
    assert np.allclose(f.positions, wrapped.positions, atol=1e-6)
