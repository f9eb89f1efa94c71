"""``plot`` and ``info`` fit the run (engine/io/plot_panels.py, inspect_files.py), from real runs:
the conserved quantity's panel where a thermostat or barostat runs and the energy drift for NVE
alone; volume and density under npt, from the stored box and masses (checked with h5py); a
minimisation against its FIRE step with its energy and fmax (checked against the stored
forces), and ``info`` without MD keys for it.  The PNG's Description text lists the panels."""
import h5py
import numpy as np
import pytest
from conftest import cli_in_process
from PIL import Image

from shardmd.engine.io.inspect_files import plot_series

SMALL = ["model=lj", "system.repeat=[3,3,3]", "steps=40", "trajectory.every=10", "thermo.every=0",
         "thermo.progress=false", "threads=1", "quiet=true"]


def _plot(tmp_path, capfd, monkeypatch, name="run.h5"):
    r = cli_in_process(["plot", name, "p.png"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    desc = Image.open(tmp_path / "p.png").info["Description"]
    return [part.split(":")[0] for part in desc.split("; ")], desc


@pytest.mark.parametrize("integrator, want", [
    ("verlet", ["energy (eV)", "total-energy drift (eV/atom)", "temperature (K)", "pressure (bar)"]),
    ("nose-hoover", ["energy (eV)", "conserved energy (eV)", "temperature (K)", "pressure (bar)"]),
    ("langevin", ["energy (eV)", "conserved energy (eV)", "temperature (K)", "pressure (bar)"]),
    ("npt", ["energy (eV)", "conserved energy (eV)", "temperature (K)", "pressure (bar)", "volume (Å^3)",
             "density (g/cm^3)"]),
])
def test_md_panels_fit_the_integrator(tmp_path, capfd, monkeypatch, integrator, want):
    r = cli_in_process(["run", *SMALL, f"integrator={integrator}"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    labels, desc = _plot(tmp_path, capfd, monkeypatch)
    assert labels == want, desc
    panels = dict(plot_series(str(tmp_path / "run.h5")))
    with h5py.File(tmp_path / "run.h5") as f:
        t = f["particles/all/box/edges/time"][()] / 1000.0
        vol = np.abs(np.linalg.det(f["particles/all/box/edges/value"][()]))
        mass = f["particles/all/mass"][()].sum()
        cons = f["observables/conserved_energy/value"][()]
        etot = f["observables/total_energy/value"][()]
    if integrator != "verlet":
        np.testing.assert_array_equal(panels["conserved energy (eV)"]["conserved energy"][1], cons)
        assert np.abs(cons - etot).max() > 0   # the thermostat's energy is in it
    if integrator == "npt":
        tv, v = panels["volume (Å^3)"]["volume"]
        np.testing.assert_array_equal(tv, t)
        np.testing.assert_allclose(v, vol, rtol=1e-14)
        assert np.ptp(v) > 0   # the barostat moved the box
        rho = panels["density (g/cm^3)"]["density"][1]
        np.testing.assert_allclose(rho, mass / vol * 1.66053906660, rtol=1e-7)   # ASE's amu: CODATA 2014


def test_minimisation_plot_and_info(tmp_path, capfd, monkeypatch):
    from ase.build import bulk
    from ase.io import write

    a = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((3, 3, 3))
    a.rattle(0.1, seed=3)
    write(tmp_path / "start.extxyz", a)
    r = cli_in_process(["minimize", "model=lj", "system.file=start.extxyz", "trajectory.every=1", "minimize.fmax=1e-3",
                        "minimize.steps=30", "threads=1", "quiet=true"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    labels, desc = _plot(tmp_path, capfd, monkeypatch)
    assert labels == ["energy (eV)", "fmax (eV/Å)"], desc
    panels = dict(plot_series(str(tmp_path / "run.h5")))
    steps, e = panels["energy (eV)"]["potential energy"]
    with h5py.File(tmp_path / "run.h5") as f:
        frame_steps = f["particles/all/force/step"][()]
        forces = f["particles/all/force/value"][()] / 96.48533212331   # kJ/(mol Å) -> eV/Å
        assert set(f["particles/all/force/time"][()]) == {0.0}          # no time passes in a minimisation
    assert list(steps) == list(frame_steps) == list(range(len(steps))) and len(steps) > 5
    assert e[-1] < e[0]
    fs, fmax = panels["fmax (eV/Å)"]["fmax"]
    np.testing.assert_allclose(fmax, np.linalg.norm(forces, axis=2).max(axis=1), rtol=1e-7)  # CODATA 2014/2018
    r = cli_in_process(["info", "run.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "minimisation (FIRE) trajectory" in out and "minimize: FIRE  fmax=0.001  steps=30" in out, out
    assert "time:" not in out and "integrator" not in out and "T=" not in out and "temperature" not in out, out
    assert "  fmax: eV Angstrom-1; the largest atom's force of the FIRE step (minimisation)" in out, out


def test_md_info_keeps_its_keys(tmp_path, capfd, monkeypatch):
    r = cli_in_process(["run", *SMALL, "integrator=nose-hoover"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    r = cli_in_process(["info", "run.h5"], tmp_path, capfd, monkeypatch)
    assert "integrator: nose-hoover  dt=1.0 fs  T=100.0 K" in r.stdout and "time: 0.0400 ps" in r.stdout, r.stdout
    assert "minimisation" not in r.stdout and "  conserved_energy: eV; total energy +" in r.stdout, r.stdout
