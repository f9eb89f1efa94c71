"""The ASE calculator and ASE round trips, against ASE's own numerical and MD machinery."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ase import Atoms, units
from ase.build import bulk
from ase.io import read, write
from ase.md.verlet import VelocityVerlet
from conftest import mpiexec_cmd, run_engine

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.io.h5md import read_frames, read_observables

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


@pytest.mark.slow   # MACE by finite differences, ~15 s; LJ's twin stays in the fast tier
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


# -- what the calculator records ------------------------------------------------------------

ARKR = {"epsilon": {"Ar": 0.0104, "Kr": 0.0140}, "sigma": {"Ar": 3.40, "Kr": 3.65}}


def _props(atoms):
    """(energy, forces, stress or None) of ``atoms`` with its calculator."""
    return (atoms.get_potential_energy(), atoms.get_forces(),
            atoms.get_stress() if atoms.pbc.all() else None)


def _fresh(atoms, **kw):
    """The same properties from a new calculator: a fresh decomposition and list."""
    b = atoms.copy()
    b.calc = ShardMDCalculator(**kw)
    return _props(b)


def _assert_same(got, ref, tol=1e-12):
    (e, f, s), (e0, f0, s0) = got, ref
    assert abs(e - e0) <= tol * abs(e0), (e, e0)
    assert np.linalg.norm(f - f0) <= tol * np.linalg.norm(f0), np.linalg.norm(f - f0) / np.linalg.norm(f0)
    assert (s is None) == (s0 is None)
    if s0 is not None:
        assert np.linalg.norm(s - s0) <= tol * np.linalg.norm(s0), np.linalg.norm(s - s0) / np.linalg.norm(s0)


def test_parameters_recorded_by_trajectory_and_db(tmp_path):
    import ase.db
    from ase.io import Trajectory

    kw = {"model": "lj", "epsilon": {"Ar": 0.011, "Kr": 0.014}, "sigma": {"Ar": 3.3, "Kr": 3.6}, "cutoff": 7.5,
          "mixing": "geometric", "skin": 0.7}
    a = _triclinic_argon()
    a.numbers[:4] = 36
    a.calc = calc = ShardMDCalculator(**kw)
    want = {**kw, "shift": True, "pairs": {}, "precision": "float64", "device": "cpu", "domains": 1}
    assert calc.parameters == want and calc.todict() == want and calc.name == "shardmd"
    e = a.get_potential_energy()
    with Trajectory(tmp_path / "t.traj", "w") as traj:
        traj.write(a)
    back = read(tmp_path / "t.traj")
    assert back.calc.name == "shardmd" and back.calc.parameters == want
    assert back.get_potential_energy() == e
    with ase.db.connect(tmp_path / "t.db") as db:
        db.write(a)
    row = ase.db.connect(tmp_path / "t.db").get(1)
    assert row.calculator == "shardmd" and row.calculator_parameters == want and row.energy == e
    # the record makes the same calculator again (domains is a record only)
    again = a.copy()
    again.calc = ShardMDCalculator(**{**row.calculator_parameters, "domains": 7})
    assert again.get_potential_energy() == e


def test_mace_parameters_record_file_and_hash(tmp_path):
    import hashlib

    from ase.io import Trajectory

    from shardmd.models.mace_random import make_random_mace

    path = make_random_mace(tmp_path / "m.model", elements=(29,), r_max=4.0)
    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    a.rattle(0.05, seed=2)
    a.calc = calc = ShardMDCalculator(model="mace", checkpoint=str(path), skin=0.5)
    p = calc.todict()
    assert p["model"] == "mace" and p["checkpoint"] == str(Path(path).resolve()) and p["checkpoint_sha256"] == sha
    assert p["precision"] == "float64" and p["skin"] == 0.5 and p["domains"] == 1 and p["trust_pickle"] is False
    with Trajectory(tmp_path / "t.traj", "w") as traj:
        traj.write(a)
    assert read(tmp_path / "t.traj").calc.parameters == p
    ref = _props(a)
    a.positions[3] += [0.1, -0.05, 0.02]     # under skin/2: the list is reused
    assert calc.stats == {"builds": 1, "rebuilds": 0, "reuses": 0}
    _assert_same(_props(a), _fresh(a, **p))
    assert calc.stats["reuses"] == 1
    assert np.abs(a.get_forces() - ref[1]).max() > 1e-3
    with pytest.raises(ValueError, match="SHA-256"):
        ShardMDCalculator(**{**p, "checkpoint_sha256": "0" * 64})


def test_set_rebuilds_the_model():
    a = _triclinic_argon()
    a.calc = calc = ShardMDCalculator(model="lj")
    e = a.get_potential_energy()
    assert calc.set(cutoff=8.5) == {} and a.get_potential_energy() == e   # unchanged: nothing is reset
    assert calc.set(cutoff=6.0, skin=0.3) == {"cutoff": 6.0, "skin": 0.3}
    assert calc.parameters["cutoff"] == 6.0 and calc.model.cutoff == 6.0 and calc.results == {}
    _assert_same(_props(a), _fresh(a, model="lj", cutoff=6.0, skin=0.3))
    with pytest.raises(ValueError, match="model.cutoff"):
        calc.set(cutoff=-1.0)
    assert calc.parameters["cutoff"] == 6.0 and calc.model.cutoff == 6.0   # a refused set changes nothing
    assert calc.set(domains=4) == {}                                       # a record only
    with pytest.raises(TypeError, match="no parameter cutof"):
        ShardMDCalculator(model="lj", cutof=6.0)
    with pytest.raises(ValueError, match="model.epsilon"):
        ShardMDCalculator(model="lj", epsilon="strong")
    # a dict adds to the default one, as model.epsilon.Kr=... on the command line
    kr = ShardMDCalculator(model="lj", epsilon={"Kr": 0.014}, sigma={"Kr": 3.65})
    assert kr.parameters["epsilon"] == {"Ar": 0.0104, "Kr": 0.014} and kr.parameters["sigma"] == {"Ar": 3.4, "Kr": 3.65}
    with pytest.raises(ValueError, match="skin"):
        ShardMDCalculator(model="lj", skin=-1.0)


# -- the kept neighbour list ---------------------------------------------------------------

def test_list_reused_under_half_skin_and_rebuilt_over_it():
    a = _triclinic_argon()
    a.calc = calc = ShardMDCalculator(model="lj", skin=0.4)
    a.get_potential_energy()
    base = a.positions.copy()
    rng = np.random.default_rng(7)
    d = rng.normal(size=base.shape)
    d *= 0.199 / np.linalg.norm(d, axis=1).max()      # every atom moves, the farthest 0.199 Å
    a.positions = base + d
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats == {"builds": 1, "rebuilds": 0, "reuses": 1}
    a.positions[11] = base[11] + [0.0, 0.0, 0.1999]   # just under skin/2 from the build
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats == {"builds": 1, "rebuilds": 0, "reuses": 2}
    a.positions[11] = base[11] + [0.0, 0.0, 0.2001]   # just over
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats == {"builds": 1, "rebuilds": 1, "reuses": 2}
    a.positions[11] += [0.0, 0.0, 0.19]               # measured from the new build: reused
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats == {"builds": 1, "rebuilds": 1, "reuses": 3}
    # across the periodic boundary, unwrapped (as ASE's dynamics leave them), then wrapped by the user
    i = int(np.argmin(a.get_scaled_positions(wrap=False)[:, 0]))
    a.positions[i] -= 0.15 * a.cell[0] / np.linalg.norm(a.cell[0]) + a.cell[0] * a.get_scaled_positions()[i, 0]
    _assert_same(_props(a), _fresh(a, model="lj"))
    a.wrap()
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats["builds"] == 1 and calc.stats["rebuilds"] >= 2


def test_changes_that_build_afresh():
    a = _triclinic_argon()
    a.calc = calc = ShardMDCalculator(model="lj", **ARKR)
    a.get_potential_energy()
    builds = [1]

    def check(atoms):
        atoms.calc = calc
        _assert_same(_props(atoms), _fresh(atoms, model="lj", **ARKR))
        builds.append(calc.stats["builds"])

    a.numbers[[2, 9]] = 36                     # species, in place
    check(a)
    a.set_cell(a.cell.array * 1.01, scale_atoms=True)   # cell, atoms scaled with it
    check(a)
    a.cell[2, 2] += 0.3                        # cell, in place, atoms left
    check(a)
    a.pbc = [True, True, False]                # pbc: no stress now
    check(a)
    with pytest.raises(Exception, match="stress"):
        a.get_stress()
    a.pbc = True
    b = a + Atoms("Kr", positions=[a.cell.sum(axis=0) / 2 + 0.7])   # one atom more
    check(b)
    check(b[:-3])                              # fewer
    assert builds == [1, 2, 3, 4, 5, 6, 7]
    a.positions[0] += 0.01
    check(a)
    calc.reset()                               # forgets everything
    assert calc.results == {} and calc.atoms is None
    check(a)
    assert builds[-2:] == [8, 9]


def test_one_calculator_two_atoms_alternately():
    a = _triclinic_argon()
    b = a.copy()
    b.rattle(0.05, seed=9)                     # within skin/2 of a: the list serves both
    c = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 3, 3))
    c.rattle(0.1, seed=3)
    calc = ShardMDCalculator(model="lj")
    refs = {id(x): _fresh(x, model="lj") for x in (a, b, c)}
    for x in (a, b, a, b, c, a, c, c, b):
        x.calc = calc
        _assert_same(_props(x), refs[id(x)])
    assert calc.stats["reuses"] >= 2 and calc.stats["builds"] >= 4


def test_no_stale_result_after_in_place_moves():
    a = _triclinic_argon()
    a.calc = calc = ShardMDCalculator(model="lj")
    f0 = a.get_forces()
    a.positions[3] += [0.05, 0.0, 0.0]         # in place: ASE's copy of the atoms tells
    f1 = a.get_forces()
    assert np.abs(f1 - f0).max() > 1e-4
    _assert_same(_props(a), _fresh(a, model="lj"))
    a.positions[3] -= [0.05, 0.0, 0.0]         # back: the first result again, from the kept list
    assert np.linalg.norm(a.get_forces() - f0) <= 1e-12 * np.linalg.norm(f0)
    p = a.positions                            # the array itself, edited after the call
    a.get_potential_energy()
    p[5, 1] += 0.02
    assert calc.calculation_required(a, ["energy"])
    _assert_same(_props(a), _fresh(a, model="lj"))
    assert calc.stats["builds"] == 1


def test_md_with_rebuilds_equals_fresh_builds():
    a = _triclinic_argon()
    rng = np.random.default_rng(1)
    a.set_velocities(rng.normal(0, 0.03, (len(a), 3)))
    a.calc = calc = ShardMDCalculator(model="lj", skin=0.1)
    dyn = VelocityVerlet(a, timestep=4 * units.fs)
    for _ in range(6):
        dyn.run(5)
        _assert_same(_props(a), _fresh(a, model="lj", skin=0.1))
    assert calc.stats["builds"] == 1 and calc.stats["rebuilds"] >= 2 and calc.stats["reuses"] >= 10


def test_float32_reuse():
    a = _triclinic_argon()
    a.calc = calc = ShardMDCalculator(model="lj", precision="float32")
    a.get_forces()
    a.positions[4] += 0.2
    f, f0 = a.get_forces(), _fresh(a, model="lj", precision="float32")[1]
    assert calc.stats["reuses"] == 1 and np.linalg.norm(f - f0) <= 1e-5 * np.linalg.norm(f0)


def test_ase_verlet_equals_engine_verlet(tmp_path):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

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
@pytest.mark.slow   # ~25 s each; the calculator's one-rank checks stay in the fast tier
@pytest.mark.parametrize("k", [2])   # 2 ranks: 4 take the same paths at ~90 s more CPU
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
    # the kept list: every call as a new calculator's to round-off, on K ranks and on one, the
    # same decisions (reuse, rebuild, fresh) on both, and identical results on every rank
    assert bool(par["seq_same"]) and (par["seq_stats"] == ser["seq_stats"]).all()
    assert par["seq_stats"].tolist() == [[1, 0, 0], [1, 0, 1], [1, 1, 1], [1, 1, 2], [2, 1, 2], [3, 1, 2],
                                         [4, 1, 2]]
    assert par["seq_rel"].max() <= 1e-12 and ser["seq_rel"].max() <= 1e-12
    assert np.abs(par["seq_forces"] - ser["seq_forces"]).max() <= 1e-10 * np.abs(ser["seq_forces"]).max()
    assert np.abs(par["seq_energy"] - ser["seq_energy"]).max() <= 1e-10 * np.abs(ser["seq_energy"]).max()


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
