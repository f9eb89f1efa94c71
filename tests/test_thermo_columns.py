"""thermo.columns (engine/observables/columns.py) and groups (engine/observables/groups.py).

References are independent of the engine's observables: numpy on the trajectory's own arrays
(h5py), ASE's ``Atoms.get_temperature`` with ``FixAtoms`` for a group's degrees of freedom, ASE's
LAMMPS prism for lx/ly/lz of a triclinic cell, the amu and Å^3 in g and cm^3 for the density."""
import itertools
import subprocess
import sys

import h5py
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.lammps import Prism
from ase.constraints import FixAtoms
from conftest import cli_in_process

from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.observables import groups as groups_mod
from shardmd.engine.observables.builtin import _box_lengths
from shardmd.engine.observables.view import StateView
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State
from shardmd.integrators.units import EV_PER_A3_TO_BAR

RUN = ["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "thermo.every=10", "trajectory.every=10",
       "thermo.progress=false", "threads=1"]
ALL = ("step,time,temp,pe,ke,etotal,conserved,press,pxx,pyy,pzz,pxy,pxz,pyz,vol,density,lx,ly,lz,"
       "temp@top,ke@top")
G_PER_CM3 = 1.66053906660   # 1 amu / Å^3 (CODATA 2018 amu; 1 Å^3 = 1e-24 cm^3)


def _table(stdout: str) -> tuple[list[str], list[list[float]]]:
    lines = [ln.split() for ln in stdout.splitlines()]
    i = next(i for i, ln in enumerate(lines) if ln[:1] == ["Step"])
    rows = list(itertools.takewhile(lambda ln: ln and ln[0].isdigit(), lines[i + 1:]))
    return lines[i], [[float(x) for x in r] for r in rows]


def test_every_column_against_the_trajectory(tmp_path, capfd, monkeypatch):
    r = cli_in_process([*RUN, f"thermo.columns=[{ALL}]", "groups.top={ids: '0-9,50-59'}"], tmp_path, capfd,
                       monkeypatch)
    assert r.returncode == 0, r.stderr
    header, rows = _table(r.stdout)
    assert header == ["Step", "Time(ps)", "Temp(K)", "PotEng(eV)", "KinEng(eV)", "TotEng(eV)", "Conserved(eV)",
                      "Press(bar)", "Pxx(bar)", "Pyy(bar)", "Pzz(bar)", "Pxy(bar)", "Pxz(bar)", "Pyz(bar)",
                      "Volume(A3)", "Density(g/cm3)", "Lx(A)", "Ly(A)", "Lz(A)", "Temp@top(K)", "KinEng@top(eV)"]
    col = {h: np.array([row[i] for row in rows]) for i, h in enumerate(header)}
    assert list(col["Step"]) == [0, 10, 20]
    with h5py.File(tmp_path / "run.h5") as f:
        cell = f["particles/all/box/edges/value"][()]
        vel = f["particles/all/velocity/value"][()]                  # Å/fs
        mass = f["particles/all/mass"][()]
        stress = f["observables/stress/value"][()]                   # eV/Å^3
        etot = f["observables/total_energy/value"][()]
    vol = np.abs(np.linalg.det(cell))
    np.testing.assert_allclose(col["Volume(A3)"], vol, rtol=1e-6)
    np.testing.assert_allclose(col["Density(g/cm3)"], mass.sum() / vol * G_PER_CM3, rtol=1e-6)
    for k, axis in enumerate("xyz"):
        np.testing.assert_allclose(col[f"L{axis}(A)"], cell[:, k, k], rtol=1e-6)
    for a, b in ("xx", "yy", "zz", "xy", "xz", "yz"):
        i, j = "xyz".index(a), "xyz".index(b)
        np.testing.assert_allclose(col[f"P{a}{b}(bar)"], -stress[:, i, j] * EV_PER_A3_TO_BAR, atol=2e-3)
    np.testing.assert_allclose(col["Press(bar)"], (col["Pxx(bar)"] + col["Pyy(bar)"] + col["Pzz(bar)"]) / 3,
                               atol=2e-3)
    # NVE: the conserved quantity is the total energy
    np.testing.assert_allclose(col["Conserved(eV)"], etot, atol=1e-6)
    np.testing.assert_array_equal(col["Conserved(eV)"], col["TotEng(eV)"])
    # the group: 20 atoms, no fixed ones: 3 x 20 degrees of freedom
    top = np.r_[0:10, 50:60]
    ke = 0.5 * (mass[top, None] * vel[:, top] ** 2).sum(axis=(1, 2)) * 103.6426965   # amu Å^2/fs^2 -> eV
    np.testing.assert_allclose(col["KinEng@top(eV)"], ke, rtol=1e-5)
    np.testing.assert_allclose(col["Temp@top(K)"], 2 * ke / (3 * 20 * 8.617333262e-5), rtol=1e-5)


def test_lx_ly_lz_are_lammps_prism_of_a_triclinic_cell():
    cell = np.array([[5.0, 0.0, 0.0], [1.3, 4.5, 0.0], [0.7, -1.1, 6.2]])
    rot = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]   # any orientation
    view = StateView({"cell": cell @ rot}, potential_energy=0.0, step=0, time=0.0, dof=0, n_atoms=0)
    xhi, yhi, zhi = Prism(cell @ rot).get_lammps_prism()[:3]
    np.testing.assert_allclose(_box_lengths(view), [xhi, yhi, zhi], rtol=1e-12)


def _argon():
    return bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))   # 108 atoms, ids = ASE's indices


def _cfg(tmp_path, *extra):
    return compose_config(["model=lj", "quiet=true", "trajectory.every=0", "thermo.every=0", "threads=1",
                           "checkpoint.every=0", f"output={tmp_path / 'x.h5'}", "overwrite=true", *extra])


def test_group_temperature_of_a_fixed_bottom_excludes_the_fixed_atoms(tmp_path):
    """fix.group=bottom holds 27 atoms; temp@lower (54 atoms, 27 of them fixed) and temp@top are
    ASE's temperatures of those atoms with their FixAtoms (3 dof per mobile atom)."""
    cfg = _cfg(tmp_path, "integrator=langevin", "temperature=150", "steps=40", "groups.bottom={ids: '0-26'}",
               "groups.lower={ids: '0-53'}", "groups.top={ids: [54, '55-107']}", "fix.group=bottom",
               "thermo.columns=[step,temp,temp@lower,temp@top,ke@bottom]")
    sim = Simulation(cfg, state=State.from_atoms(_argon()))
    sim.run()
    obs = sim.observables()
    atoms = sim.atoms()
    assert not atoms.get_velocities()[:27].any()
    lower = atoms[:54]
    lower.set_constraint(FixAtoms(indices=range(27)))
    assert obs["temperature@lower"] == pytest.approx(lower.get_temperature(), rel=1e-10)
    assert obs["temperature@top"] == pytest.approx(atoms[54:].get_temperature(), rel=1e-10)
    assert obs["kinetic_energy@bottom"] == 0.0
    atoms.set_constraint(FixAtoms(indices=range(27)))
    assert obs["temperature"] == pytest.approx(atoms.get_temperature(), rel=1e-10)


def test_groups_by_species_ids_and_index_files(tmp_path):
    ids = np.arange(10)
    numbers = np.array([29, 29, 79, 29, 79, 79, 29, 29, 29, 79])
    assert groups_mod.select("cu", {"species": ["Cu"]}, ids, numbers).tolist() == [0, 1, 3, 6, 7, 8]
    assert groups_mod.select("au", {"species": "Au", "ids": "0-5"}, ids, numbers).tolist() == [2, 4, 5]
    (tmp_path / "idx.ndx").write_text("[ System ]\n1 2 3 4 5 6 7 8 9 10\n[ Surface ]\n 8  9\n10 ; the top\n")
    got = groups_mod.select("Surface", {"file": str(tmp_path / "idx.ndx")}, ids, numbers)
    assert got.tolist() == [7, 8, 9]   # GROMACS numbers from 1
    got = groups_mod.select("s", {"file": str(tmp_path / "idx.ndx"), "section": "System"}, ids, numbers)
    assert got.tolist() == list(range(10))
    (tmp_path / "ids.txt").write_text("# mobile\n4\n2\n9 0\n")
    assert groups_mod.select("m", {"file": str(tmp_path / "ids.txt")}, ids, numbers).tolist() == [0, 2, 4, 9]


@pytest.mark.parametrize("spec, expect", [
    ({"file": "idx.ndx"}, "no section [ g ] in it (sections: System, Surface); give groups.g.section="),
    ({"ids": "0-20"}, "groups.g.ids: id 10 is not in the system (ids 0..9, 0-based)"),
    ({"species": ["Ar"]}, "groups.g selects no atom of this system"),
    ({"file": "missing.ndx"}, "groups.g.file=missing.ndx: cannot read it"),
    ({"file": "bad.txt"}, "groups.g.file=bad.txt: 'x7' is not an atom number"),
])
def test_bad_groups_are_one_line(tmp_path, monkeypatch, spec, expect):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "idx.ndx").write_text("[ System ]\n1 2\n[ Surface ]\n3\n")
    (tmp_path / "bad.txt").write_text("1\nx7\n")
    with pytest.raises(UserError) as e:
        groups_mod.select("g", spec, np.arange(10), np.full(10, 29))
    assert expect in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, expect", [
    (["thermo.columns=[step,nope]"], "error: thermo.columns: 'nope': unknown column; known: step, time, temp, pe, "
                                     "ke, etotal, conserved, press, vol, density, pxx"),
    (["thermo.columns=[temp@top]"], "error: thermo.columns: 'temp@top': no group 'top'; define it"),
    (["thermo.columns=[pe@top]", "groups.top={species: Ar}"],
     "'pe@top': potential_energy is a system-wide value (reduce none), not a sum over atoms"),
    (["thermo.columns=[press@top]", "groups.top={species: Ar}"], "'press@top': pressure needs volume, a system-wide"),
    (["thermo.columns=['temp[0]']"], "'temp[0]': temp is not a vector observable"),
    (["thermo.columns=[stress]"], "'stress': stress has shape (3, 3); name one value"),
    (["thermo.columns=[temp,temp]"], "'temp': named twice"),
    (["thermo.columns=['te mp']"], "thermo.columns=['te mp'] is invalid: 'te mp' is not a column name"),
    (["groups.top={colour: red}"], "is invalid: groups.top.colour is not a selector; use species, ids, file"),
    (["groups.top={ids: '5-2'}"], "groups.top.ids: the range '5-2' runs backwards"),
    (["fix.group=nope"], "error: fix.group=nope: no group 'nope'; define it"),
])
def test_bad_columns_and_groups_are_one_line(tmp_path, capfd, monkeypatch, args, expect):
    r = cli_in_process([*RUN, *args], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert expect in r.stderr, r.stderr
    assert not (tmp_path / "run.h5").exists()


@pytest.mark.mpi
def test_group_columns_on_two_domains_equal_one_domain(tmp_path):
    """Per-rank partial sums of a group, reduced: the thermo table of 2 domains is 1 domain's."""
    args = ["run", "model=lj", "system.repeat=[5,5,5]", "steps=20", "thermo.every=10", "trajectory.every=0",
            "thermo.progress=false", "threads=1", "groups.top={ids: '0-99,400-449'}", "groups.bot={species: Ar}",
            "thermo.columns=[step,temp,temp@top,ke@top,temp@bot]"]
    procs = [subprocess.Popen([sys.executable, "-m", "engine", *args, *extra], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for extra in (["output=d1.h5"], ["+domains=2", "output=d2.h5"])]
    outs = [pr.communicate(timeout=300) for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], [o[1] for o in outs]
    (h1, r1), (h2, r2) = (_table(o[0]) for o in outs)
    assert h1 == h2 == ["Step", "Temp(K)", "Temp@top(K)", "KinEng@top(eV)", "Temp@bot(K)"]
    np.testing.assert_allclose(r2, r1, rtol=1e-5)
    assert r1[-1][1] == pytest.approx(r1[-1][4] * 1500 / 1497, rel=1e-4)   # all 500 atoms: 3N vs 3N - 3 dof
