"""Initial velocities of a state given through the Python API:
``Simulation(cfg, state=State.from_atoms(atoms))`` honours ``temperature`` and
``system.velocities`` exactly as the config path (a structure file) does."""
import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.io import write

from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State


@pytest.fixture(scope="module")
def argon(tmp_path_factory):
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))   # 108 atoms
    a.rattle(0.02, seed=5)
    path = tmp_path_factory.mktemp("api_v") / "ar.extxyz"
    write(path, a)
    return a, path


def _cfg(tmp_path, *extra):
    return compose_config(["model=lj", "quiet=true", "trajectory.every=0", "thermo.every=0", "threads=1",
                           "checkpoint.every=0", f"output={tmp_path / 'x.h5'}", "overwrite=true", *extra])


@pytest.mark.parametrize("integrator,dof_of", [("verlet", lambda n: 3 * n - 3), ("langevin", lambda n: 3 * n)])
def test_api_state_gets_the_config_paths_thermal_velocities(integrator, dof_of, argon, tmp_path):
    """No velocities in the state: thermal ones at temperature, the very velocities a run from the
    same structure as a file gets (same seeded generator), with kinetic energy dof kB T / 2
    (analytic, summed here with numpy)."""
    a, path = argon
    extra = [f"integrator={integrator}", "temperature=100", "seed=7", "steps=0"]
    api = Simulation(_cfg(tmp_path, *extra), state=State.from_atoms(a)).atoms()
    ref = Simulation(_cfg(tmp_path, *extra, f"system.file={path}")).atoms()
    assert np.array_equal(api.get_velocities(), ref.get_velocities())
    ke = 0.5 * float((api.get_masses()[:, None] * api.get_velocities() ** 2).sum())   # eV (ASE units)
    assert 2 * ke / (dof_of(len(a)) * units.kB) == pytest.approx(100.0, rel=1e-12)


def test_api_state_velocities_modes(argon, tmp_path):
    a, _ = argon
    v = np.random.default_rng(1).normal(0, 0.01, (len(a), 3))
    moving = a.copy()
    moving.set_velocities(v)
    kept = Simulation(_cfg(tmp_path, "steps=0"), state=State.from_atoms(moving)).atoms()
    assert np.abs(kept.get_velocities() - v).max() < 1e-15           # auto keeps given velocities
    zero = Simulation(_cfg(tmp_path, "steps=0", "system.velocities=zero"), state=State.from_atoms(moving)).atoms()
    assert not zero.get_velocities().any()
    thermal = Simulation(_cfg(tmp_path, "steps=0", "system.velocities=thermal", "temperature=50"),
                         state=State.from_atoms(moving)).atoms()
    assert thermal.get_temperature() * len(a) / (len(a) - 1) == pytest.approx(50.0, rel=1e-12)   # 3N-3 dof
    cold = Simulation(_cfg(tmp_path, "steps=0", "temperature=0"), state=State.from_atoms(a)).atoms()
    assert not cold.get_velocities().any()   # temperature=0 asked for: zero, as the config path
    with pytest.raises(UserError, match="system.velocities=file but the state given to Simulation has no "
                                        "velocities") as e:
        Simulation(_cfg(tmp_path, "steps=0", "system.velocities=file"), state=State.from_atoms(a))
    assert "\n" not in str(e.value)


def test_api_state_temperature_after_a_run(argon, tmp_path):
    """The issue's case: temperature=100 through the API no longer gives T ~ 0."""
    a, _ = argon
    sim = Simulation(_cfg(tmp_path, "temperature=100", "steps=20"), state=State.from_atoms(a))
    obs = sim.run()
    assert 30.0 < obs["temperature"] < 150.0
