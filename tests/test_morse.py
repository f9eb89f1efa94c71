"""models/morse.py, the plain reference pair model, against a brute-force float64 sum over
periodic images (tests/reference.py's pair arrays: numpy, no neighbour list of ours), finite
differences of that sum, and itself on 1 and 2 domains; and its config keys beside LJ's."""
from __future__ import annotations

import numpy as np
import pytest
from ase.build import bulk
from conftest import run_engine
from reference import pair_arrays

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.io.h5md import read_frames

P = {"D": 0.3429, "a": 1.3588, "r0": 2.866, "cutoff": 6.0}


def morse_reference(positions, cell, pbc, D, a, r0, cutoff, shift=True):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) by a sum over every ordered pair."""
    i, _, _, d = pair_arrays(positions, cell, pbc, cutoff)
    r = np.linalg.norm(d, axis=1)

    def u(x):
        e = np.exp(-a * (x - r0))
        return D * (e * e - 2 * e)

    e1 = np.exp(-a * (r - r0))
    du = 2 * a * D * (e1 - e1 * e1)
    energy = 0.5 * np.sum(u(r) - (u(cutoff) if shift else 0.0))
    g = (du / r)[:, None] * d
    forces = np.zeros((len(positions), 3))
    np.add.at(forces, i, g)
    return energy, forces, -0.5 * np.einsum("ea,eb->ab", g, d)


def _crystal(seed=3):
    atoms = bulk("Cu", "fcc", a=3.61).repeat((3, 3, 3))
    atoms.set_cell(atoms.cell[:] @ np.array([[1.0, 0.05, 0.0], [0.0, 1.0, 0.03], [0.02, 0.0, 1.0]]),
                   scale_atoms=True)   # triclinic
    atoms.rattle(0.08, seed=seed)
    return atoms


def test_energy_forces_stress_equal_a_brute_force_sum():
    atoms = _crystal()
    atoms.calc = ShardMDCalculator(model="morse", **P)
    e, f, w = morse_reference(atoms.positions, atoms.cell[:], atoms.pbc, **P)
    assert abs(atoms.get_potential_energy() - e) <= 1e-10 * abs(e)
    assert np.abs(atoms.get_forces() - f).max() <= 1e-10
    # ASE's stress (Voigt, eV/Å^3) is -virial / V
    stress = atoms.get_stress(voigt=False)
    assert np.abs(stress + w / atoms.get_volume()).max() <= 1e-12
    assert np.abs(atoms.get_potential_energies().sum() - e) <= 1e-10 * abs(e)


def test_forces_and_stress_are_derivatives_of_the_energy():
    """Central differences of the brute-force energy: -dE/dx and (1/V) dE/d(strain)."""
    atoms = _crystal(seed=5)
    atoms.calc = ShardMDCalculator(model="morse", **P)
    f, stress = atoms.get_forces(), atoms.get_stress(voigt=False)
    pos, cell, h = atoms.positions, atoms.cell[:], 1e-5

    def energy(p, c):
        return morse_reference(p, c, atoms.pbc, **P)[0]

    for k, axis in ((0, 0), (7, 1), (20, 2)):
        dp = np.zeros_like(pos)
        dp[k, axis] = h
        fd = -(energy(pos + dp, cell) - energy(pos - dp, cell)) / (2 * h)
        assert abs(fd - f[k, axis]) <= 1e-6
    for a, b in ((0, 0), (1, 2), (2, 1)):
        eps = np.eye(3)
        eps[a, b] += h
        up = energy(pos @ eps, cell @ eps)
        eps[a, b] -= 2 * h
        down = energy(pos @ eps, cell @ eps)
        fd = (up - down) / (2 * h) / atoms.get_volume()
        assert abs(fd - 0.5 * (stress[a, b] + stress[b, a])) <= 1e-7


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(ValueError, match=r"model\.D=-1\.0 is invalid"):
        ShardMDCalculator(model="morse", D=-1.0)


def test_same_key_keeps_its_own_default_check_and_help_per_model():
    """model.cutoff is a key of model=lj and of model=morse: each keeps its own default, its
    own check message and its own help text."""
    from shardmd.engine.config.compose import UserError, compose_config, validate
    from shardmd.engine.config.help import KEYS

    assert compose_config(["model=lj"]).model.cutoff == 8.5
    assert compose_config(["model=morse"]).model.cutoff == 6.0
    with pytest.raises(UserError, match="give a Morse cutoff > 0 in Å"):
        validate(compose_config(["model=morse", "model.cutoff=-1"]))
    with pytest.raises(UserError, match=r"give a cutoff > 0 in Å$"):
        validate(compose_config(["model=lj", "model.cutoff=-1"]))
    default, text = KEYS["model.cutoff"]
    assert "8.5" in default and "6.0" in default, default
    assert "lj: cutoff, Å" in text and "morse: cutoff, Å (Morse" in text, text


@pytest.mark.mpi
@pytest.mark.slow
def test_two_domains_give_the_one_domain_trajectory(tmp_path):
    common = ["model=morse", "system.repeat=[4,4,4]", "steps=30", "thermo.every=10", "trajectory.every=10",
              "checkpoint.every=0", "threads=1", "quiet=true"]
    for n in (1, 2):
        r = run_engine(["run", *common, f"domains={n}", f"output=d{n}.h5"], cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    one, two = read_frames(tmp_path / "d1.h5")[-1], read_frames(tmp_path / "d2.h5")[-1]
    assert one.info["step"] == two.info["step"] == 30
    assert np.abs(one.positions - two.positions).max() <= 1e-10
    assert np.abs(one.get_velocities() - two.get_velocities()).max() <= 1e-10
    assert np.abs(one.positions - read_frames(tmp_path / "d1.h5")[0].positions).max() > 1e-3   # atoms moved
