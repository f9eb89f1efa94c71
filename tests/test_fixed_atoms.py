"""Fixed atoms (engine/run/constraints.py): ASE FixAtoms in an input and fix.ids, against ASE.

References: ASE's own velocity Verlet with FixAtoms and the engine's ASE calculator (the same
forces, ASE's constraint handling), and ASE's ``Atoms.get_temperature`` for the degrees of
freedom (3 per fixed atom removed, no centre-of-mass 3: docs/minimize.md)."""
import h5py
import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.constraints import FixAtoms, FixBondLengths, FixCom
from ase.io import write
from ase.md.verlet import VelocityVerlet
from conftest import run_engine, run_in_process

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State

FIXED = [0, 3, 7, 20, 21, 22, 50, 101]   # scattered: every domain and both sort orders meet some


def _argon(seed=0):
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))   # 108 atoms
    a.rattle(0.05, seed=seed)
    return a


def _cfg(tmp_path, *extra):
    return compose_config(["model=lj", "quiet=true", "trajectory.every=0", "thermo.every=0", "threads=1",
                           "checkpoint.every=0", f"output={tmp_path / 'x.h5'}", "overwrite=true", *extra])


@pytest.mark.parametrize("integrator", ["verlet", "langevin", "nose-hoover", "csvr"])
def test_fixed_atoms_stay_and_temperature_is_ases(integrator, tmp_path):
    """FixAtoms of the input: the fixed atoms move by exactly 0.0 over 60 steps (with re-sorting
    at each of the 12 rebuilds: neighbor.check=false, every=5), their velocities stay 0.0, and the
    temperature is ASE's for the same atoms and constraint at the start (thermal velocities at
    exactly 120 K for 3 (N - k) dof) and at the end."""
    a = _argon()
    a.set_constraint(FixAtoms(indices=FIXED))
    cfg = _cfg(tmp_path, f"integrator={integrator}", "temperature=120", "steps=60", "neighbor.check=false",
               "neighbor.every=5")
    sim = Simulation(cfg, state=State.from_atoms(a))
    start = sim.atoms(unwrapped=True)
    start.set_constraint(FixAtoms(indices=FIXED))
    assert start.get_temperature() == pytest.approx(120.0, rel=1e-12)
    obs = sim.run()
    end = sim.atoms(unwrapped=True)
    assert sim.nl.n_builds >= 12
    assert np.array_equal(end.positions[FIXED], start.positions[FIXED])   # exactly 0.0
    assert not end.get_velocities()[FIXED].any()
    mobile = np.setdiff1d(np.arange(len(a)), FIXED)
    assert np.abs(end.positions[mobile] - start.positions[mobile]).max() > 0.05
    end.set_constraint(FixAtoms(indices=FIXED))
    assert obs["temperature"] == pytest.approx(end.get_temperature(), rel=1e-12)
    assert sim.integrator.degrees_of_freedom(len(a)) == 3 * (len(a) - len(FIXED))
    if integrator in ("nose-hoover", "csvr"):   # the thermostat counts the same dof
        assert sim.integrator.inner.degrees_of_freedom(len(a)) == 3 * (len(a) - len(FIXED))


def test_verlet_with_fixed_atoms_equals_ase(tmp_path):
    """Velocity Verlet with FixAtoms (some fixed atoms with velocities in the input: zeroed, as
    ASE's set_momenta does) against ASE's VelocityVerlet with the same constraint."""
    a = _argon(seed=1)
    a.set_velocities(np.random.default_rng(2).normal(0, 0.02, (len(a), 3)))
    a.set_constraint(FixAtoms(indices=FIXED))
    ref = a.copy()
    ref.set_velocities(a.get_velocities())   # ASE applies the constraint: fixed rows 0
    ref.calc = ShardMDCalculator(model="lj")
    VelocityVerlet(ref, timestep=2.0 * units.fs).run(100)
    sim = Simulation(_cfg(tmp_path, "dt=2.0", "steps=100", "neighbor.skin=0.5"), state=State.from_atoms(a))
    sim.run()
    got = sim.atoms(unwrapped=True)
    assert np.abs(got.positions - ref.positions).max() < 1e-10
    assert np.abs(got.get_velocities() - ref.get_velocities()).max() < 1e-10


def test_fix_ids_key_and_file_constraint_combine(tmp_path):
    """fix.ids adds to the file's FixAtoms; the run reads FixAtoms from an extxyz (move_mask)."""
    a = _argon()
    a.set_constraint(FixAtoms(indices=[0, 1]))
    write(tmp_path / "in.extxyz", a)
    sim = Simulation(_cfg(tmp_path, f"system.file={tmp_path / 'in.extxyz'}", "fix.ids=[5,1]", "steps=20"))
    x0 = sim.atoms().positions
    sim.run()
    assert sim.integrator.state_dict()["fixed_ids"] == [[0, 2], [5, 6]]
    x1 = sim.atoms().positions
    assert np.array_equal(x1[[0, 1, 5]], x0[[0, 1, 5]])
    assert not np.array_equal(x1[2], x0[2])


@pytest.mark.mpi
@pytest.mark.slow
def test_fixed_atoms_on_two_domains_and_restart_on_one(tmp_path):
    """A Langevin run on 2 domains (atoms migrate): fixed atoms at exactly their start in every
    frame; the checkpoint holds the fixed ids; a restart on 1 domain from the middle keeps them
    fixed and ends where the 2-domain run ended (Langevin's noise is keyed by atom id)."""
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((4, 3, 3))
    a.rattle(0.05, seed=4)
    a.set_constraint(FixAtoms(indices=FIXED))
    write(tmp_path / "in.extxyz", a)
    common = ["model=lj", "integrator=langevin", "temperature=400", "neighbor.skin=0.3", "threads=1",
              f"system.file={tmp_path / 'in.extxyz'}", "fix.ids=[2]", "quiet=true"]
    r = run_engine(["run", *common, "domains=2", "steps=60", "trajectory.every=10", "checkpoint.every=30",
                    "output=two.h5"], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    fixed = sorted([*FIXED, 2])
    with h5py.File(tmp_path / "two.h5") as f:
        pos = f["particles/all/position/value"][()]
    assert len(pos) == 7 and (np.abs(pos[:, fixed] - pos[0, fixed]) == 0).all()
    assert np.abs(pos[-1] - pos[0]).max() > 0.1
    ckpt = sorted((tmp_path / "two.ckpt").glob("*30*"))
    assert ckpt, list((tmp_path / "two.ckpt").iterdir())
    with h5py.File(ckpt[0]) as f:
        import json
        assert json.loads(f.attrs["integrator"])["fixed_ids"] == [[0, 1], [2, 4], [7, 8], [20, 23], [50, 51],
                                                                 [101, 102]]
    sim = Simulation(compose_config([*common, "steps=60", "trajectory.every=0", "checkpoint.every=0",
                                     f"restart={ckpt[0]}", f"output={tmp_path / 'one.h5'}"]))
    assert sim.state.step == 30
    sim.run()
    got = sim.atoms()
    assert np.abs(got.positions[fixed] - pos[0, fixed]).max() == 0.0
    d = got.positions - pos[-1]
    d -= np.round(d @ np.linalg.inv(got.cell.array)) @ got.cell.array
    assert np.abs(d).max() < 1e-9
    # a restart that would fix more atoms than the checkpoint's run did is refused
    with pytest.raises(UserError, match="fix.ids holds id 9"):
        Simulation(compose_config([*common[:-2], "fix.ids=[9]", "steps=60", f"restart={ckpt[0]}",
                                   f"output={tmp_path / 'three.h5'}", "quiet=true"]))


@pytest.mark.parametrize("extra,needle", [
    (["fix.ids=[3,500]"], "fix.ids holds id 500, but the system's ids are 0..107"),
    (["fix.ids=[3,3]"], "id 3 is given more than once"),
    (["fix.ids=[-1]"], "give a list of atom ids >= 0"),
    (["fix.ids=[0,1]", "FILE=all"], "every atom (108) is fixed"),
    (["FILE=bond"], "the input carries the ASE constraint FixBondLengths"),
])
def test_fixed_atoms_hostile(extra, needle, tmp_path, capfd, monkeypatch):
    a = _argon()
    extra = list(extra)
    if "FILE=all" in extra:
        a.set_constraint(FixAtoms(indices=range(2, len(a))))
    if "FILE=bond" in extra:
        a.set_constraint([FixAtoms(indices=[0]), FixBondLengths([(1, 2)])])
    extra = [e for e in extra if not e.startswith("FILE=")]
    write(tmp_path / "in.traj", a)
    code, lines = run_in_process(["run", "model=lj", "steps=1", f"system.file={tmp_path / 'in.traj'}", *extra],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_other_constraint_through_the_api_refused(tmp_path):
    a = _argon()
    a.set_constraint(FixCom())
    with pytest.raises(UserError, match="the input carries the ASE constraint FixCom") as e:
        Simulation(_cfg(tmp_path, "steps=1"), state=State.from_atoms(a))
    assert "\n" not in e.value.one_line()
