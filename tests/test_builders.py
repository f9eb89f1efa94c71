"""The builder's random packings, alloys, vacancies and slabs (engine/run/builders.py), checked
with ASE: distances from ASE's own neighbour list (not the scipy tree the packing uses), densities
from ASE's masses and volume, slabs against ASE's ``fcc111`` and the analytic plane spacing, and
temperatures from ASE's ``get_temperature``."""
import math

import h5py
import numpy as np
import pytest
from ase.build import fcc111, molecule
from ase.io import read, write
from ase.neighborlist import neighbor_list
from conftest import run_engine, run_in_process

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.builders import build_atoms, species_counts
from shardmd.engine.run.simulation import Simulation

AMU_G = 1.66053906660e-24   # g per amu (CODATA 2018, as ASE's units)


def _system(*extra):
    return compose_config(["model=lj", "quiet=true", *extra]).system


def _closest(atoms, cutoff, unit=None):
    """The shortest distance (Å) between atoms of different units (ASE's neighbour list), or inf."""
    i, j, d = neighbor_list("ijd", atoms, cutoff)
    if unit is not None:
        d = d[unit[i] != unit[j]]
    return d.min() if len(d) else math.inf


LIQUID = ["system.lattice=random", "system.count=4000", "system.density=1.30", "system.min_distance=3.0",
          "system.composition={Ar: 0.8, Kr: 0.2}"]


def test_a_random_lj_liquid_of_4000_atoms_is_as_asked():
    """No pair closer than the minimum distance (periodic images too), the density (g/cm^3 from
    ASE's masses and cell volume) and the composition exactly as asked; one seed builds the same
    liquid, another seed another."""
    atoms = build_atoms(_system(*LIQUID), 7)
    assert len(atoms) == 4000 and atoms.pbc.all()
    assert _closest(atoms, 3.0) >= 3.0
    assert 3.0 <= _closest(atoms, 3.5) < 3.05    # packed close to the limit somewhere
    density = atoms.get_masses().sum() * AMU_G / (atoms.get_volume() * 1e-24)
    assert density == pytest.approx(1.30, rel=1e-12)
    assert atoms.symbols.formula.count() == {"Ar": 3200, "Kr": 800}
    frac = atoms.get_scaled_positions(wrap=False)
    assert frac.min() >= 0 and frac.max() < 1
    again = build_atoms(_system(*LIQUID), 7)
    assert np.array_equal(again.positions, atoms.positions) and np.array_equal(again.numbers, atoms.numbers)
    other = build_atoms(_system(*LIQUID, "system.seed=8"), 7)
    assert not np.allclose(other.positions, atoms.positions)


def test_the_random_liquid_runs_under_nvt(tmp_path):
    """The 4,000-atom LJ liquid runs 200 Nosé-Hoover steps at 100 K from its random start without a
    blow-up (exit 0, every frame finite), the thermostat bringing it back towards 100 K."""
    r = run_engine(["run", "model=lj", "model.epsilon.Kr=0.0140", "model.sigma.Kr=3.65", *LIQUID,
                    "integrator=nose-hoover", "temperature=100", "dt=2", "steps=200", "thermo.every=50",
                    "trajectory.every=100", "threads=2", "quiet=true", "output=liq.h5"], tmp_path)
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "liq.h5") as f:
        pos = f["particles/all/position/value"][:]
        temp = f["observables/temperature/value"][:]
    assert np.isfinite(pos).all() and pos.shape == (3, 4000, 3)
    assert 50 < temp[-1] < 400


def test_alloy_counts_are_exact():
    """The composition's counts on a crystal: the largest remainder rounding (sum exactly N, each
    within 1 of f N), on a seeded choice of sites; the lattice sites are those of the crystal."""
    atoms = build_atoms(_system("system.element=Cu", "system.a=3.61", "system.repeat=[3,3,3]",
                                "system.composition={Cu: 0.75, Au: 0.25}", "system.seed=3"))
    assert atoms.symbols.formula.count() == {"Cu": 81, "Au": 27}
    pure = build_atoms(_system("system.element=Cu", "system.a=3.61", "system.repeat=[3,3,3]"))
    assert np.array_equal(atoms.positions, pure.positions)
    assert atoms.get_masses()[atoms.numbers == 79] == pytest.approx(196.96657)
    # 32 sites in thirds: 10.67 each, the two sites left go to the first two symbols (ties)
    assert species_counts({"Ni": 1 / 3, "Al": 1 / 3, "Fe": 1 / 3}, 32) == {"Al": 11, "Fe": 11, "Ni": 10}
    for n in (1, 7, 100, 257):
        c = species_counts({"Cu": 0.6, "Au": 0.3, "Pd": 0.1}, n)
        assert sum(c.values()) == n and all(abs(c[k] - f * n) < 1 for k, f in (("Cu", .6), ("Au", .3), ("Pd", .1)))
    other = build_atoms(_system("system.element=Cu", "system.a=3.61", "system.repeat=[3,3,3]",
                                "system.composition={Cu: 0.75, Au: 0.25}", "system.seed=4"))
    assert not np.array_equal(other.numbers, atoms.numbers)


@pytest.mark.parametrize("vacancies, gone", [("5", 5), ("0.1", 11)])
def test_vacancies_remove_seeded_sites(vacancies, gone):
    """A count or a fraction (0.1 of 108: round(10.8) = 11) of the crystal's sites removed; the
    atoms left sit on the perfect crystal's sites, which sites is seeded."""
    cfg = ["system.repeat=[3,3,3]", f"system.vacancies={vacancies}"]
    atoms, pure = build_atoms(_system(*cfg), 1), build_atoms(_system("system.repeat=[3,3,3]"))
    assert len(atoms) == 108 - gone
    d = np.linalg.norm(atoms.positions[:, None] - pure.positions[None], axis=2).min(axis=1)
    assert d.max() == 0.0
    assert np.array_equal(build_atoms(_system(*cfg), 1).positions, atoms.positions)
    assert not np.array_equal(build_atoms(_system(*cfg), 2).positions, atoms.positions)


def test_a_packing_of_molecules_is_rigid_and_apart(tmp_path):
    """Water from an extxyz template: each copy a rotation of the template (its distances kept),
    no atoms of two molecules closer than the minimum distance, random orientations."""
    water = molecule("H2O")
    write(tmp_path / "water.xyz", water)
    atoms = build_atoms(_system("system.lattice=random", f"system.molecule={tmp_path / 'water.xyz'}",
                                "system.count=200", "system.density=0.9", "system.min_distance=2.0"), 5)
    assert len(atoms) == 600 and atoms.get_chemical_symbols()[:3] == ["O", "H", "H"]
    ref = water.get_all_distances()
    mols = atoms.positions.reshape(200, 3, 3)
    for m in mols:
        assert np.allclose(np.linalg.norm(m[:, None] - m[None], axis=2), ref, atol=1e-10)
    assert _closest(atoms, 2.0, np.repeat(np.arange(200), 3)) >= 2.0
    density = atoms.get_masses().sum() * AMU_G / (atoms.get_volume() * 1e-24)
    assert density == pytest.approx(0.9, rel=1e-12)
    oh = mols[:, 1] - mols[:, 0]
    assert np.abs(oh.mean(axis=0)).max() < 0.2   # orientations spread (a fixed one: |mean| ~ 0.97 Å)


def test_a_slab_is_ases_fcc111_and_its_fixed_layers_stay(tmp_path):
    """Cu(111) by Miller index: as many atoms per plane and the same plane spacing (a/sqrt 3) and
    vacuum as ASE's fcc111; the lowest 2 planes are FixAtoms, and a Langevin run (Morse Cu) keeps
    exactly those atoms where they were while the others move."""
    keys = ["model=morse", "system.miller=[1,1,1]", "system.a=3.61", "system.repeat=[2,2,4]",
            "system.vacuum=8", "system.fixed_layers=2", "system.pbc=[true,true,false]"]
    atoms = build_atoms(compose_config(keys).system)
    ref = fcc111("Cu", size=(4, 4, 4), a=3.61, vacuum=8.0)
    assert len(atoms) == len(ref) == 64
    z, zr = np.sort(np.unique(atoms.positions[:, 2].round(6))), np.sort(np.unique(ref.positions[:, 2].round(6)))
    assert np.allclose(np.diff(z), 3.61 / math.sqrt(3), atol=1e-9) and np.allclose(np.diff(zr), np.diff(z))
    assert atoms.cell[2, 2] == pytest.approx(ref.cell[2, 2], abs=1e-9)
    fixed = atoms.constraints[0].get_indices()
    assert set(fixed) == set(np.flatnonzero(atoms.positions[:, 2] < z[2] - 0.1)) and len(fixed) == 32
    cfg = compose_config([*keys, "integrator=langevin", "temperature=300", "steps=40", "quiet=true",
                          "trajectory.every=0", "thermo.every=0", "threads=1", "checkpoint.every=0",
                          f"output={tmp_path / 's.h5'}"])
    sim = Simulation(cfg)
    start = sim.atoms(unwrapped=True)
    sim.run()
    end = sim.atoms(unwrapped=True)
    assert np.array_equal(end.positions[fixed], start.positions[fixed])
    mobile = np.setdiff1d(np.arange(64), fixed)
    assert np.abs(end.positions[mobile] - start.positions[mobile]).max() > 0.01


def test_velocities_rescale_to_temperature(tmp_path):
    """system.velocities=rescale: the file's velocities times one factor, reading the target
    temperature (ASE's get_temperature, 3N dof as langevin counts them)."""
    atoms = build_atoms(_system("system.repeat=[3,3,3]"))
    rng = np.random.default_rng(0)
    atoms.set_velocities(rng.normal(size=(len(atoms), 3)) * 0.01)
    write(tmp_path / "v.extxyz", atoms)
    cfg = compose_config(["model=lj", f"system.file={tmp_path / 'v.extxyz'}", "system.velocities=rescale",
                          "temperature=77", "integrator=langevin", "steps=0", "quiet=true", "threads=1",
                          f"output={tmp_path / 'r.h5'}"])
    start = Simulation(cfg).atoms()
    assert start.get_temperature() == pytest.approx(77.0, rel=1e-12)
    ratio = start.get_velocities() / read(tmp_path / "v.extxyz").get_velocities()
    assert np.allclose(ratio, ratio[0, 0], rtol=1e-12)


HOSTILE = {
    "density": (LIQUID[:2] + ["system.density=3.0", "system.min_distance=3.0"],
                ["system.min_distance=3 Å fill", "random insertion fills at most 33%", "system.density <="]),
    "no packing": (["system.lattice=random", "system.count=100", "system.box=[10,10,10]", "system.min_distance=3"],
                   ["no packing can reach it"]),
    "sum": (["system.composition={Cu: 0.7, Au: 0.2}"], ["the fractions sum to 0.9"]),
    "element": (["system.composition={Cu: 0.5, Qq: 0.5}"], ["unknown element 'Qq'"]),
    "negative": (["system.composition={Cu: 1.5, Au: -0.5}"], ["the fraction of Au is -0.5"]),
    "miller": (["system.miller=[0,0,0]"], ["[0,0,0] names no plane"]),
    "vacuum": (["system.miller=[1,1,1]", "system.vacuum=1e20"], ["give a distance in [0, 10000] Å"]),
    "vacancies": (["system.repeat=[2,2,2]", "system.vacancies=40"], ["removes 40 of the 32 sites"]),
    "fraction": (["system.vacancies=1.5"], ["a fraction in [0, 1)"]),
    "two of three": (["system.lattice=random", "system.count=10"], ["needs two of system.count"]),
    "with file": (["system.file=x.extxyz", "system.vacancies=2"], ["system.vacancies is a builder key"]),
    "all fixed": (["system.miller=[1,0,0]", "system.repeat=[1,1,1]", "system.fixed_layers=2"],
                  ["fixes every atomic plane of the slab (it has 2)"]),
    "fixed without a slab": (["system.fixed_layers=2"], ["system.fixed_layers applies to a slab (system.miller)"]),
    "vacuum without a slab": (["system.vacuum=20"], ["system.vacuum applies to a slab", "drop system.vacuum"]),
}


@pytest.mark.fault
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bad_builder_input_is_one_line(case, tmp_path, capfd, monkeypatch):
    args, words = HOSTILE[case]
    write(tmp_path / "x.extxyz", build_atoms(_system("system.repeat=[2,2,2]")))
    code, lines = run_in_process(["run", "model=lj", "steps=0", "quiet=true", "threads=1", *args],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert all(w in lines[0] for w in words), lines
    assert not (tmp_path / "run.h5").exists()


@pytest.mark.fault
def test_a_sweep_checks_every_jobs_builder_before_the_first_runs(tmp_path, capfd, monkeypatch):
    """The second job's density is out of reach: one line, and no job ran (no folder)."""
    code, lines = run_in_process(["run", "model=lj", "steps=0", "quiet=true", "threads=1", *LIQUID[:2],
                                  "system.density=1.3,3.0", "system.min_distance=3.0", "-m", "hydra.sweep.dir=sw"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "random insertion fills at most 33%" in lines[0], lines
    assert not (tmp_path / "sw").exists()
