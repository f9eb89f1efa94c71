"""The conserved column (thermo.columns=[...,conserved]): K + U + the energy the integrator's
thermostat or barostat exchanged stays constant while the total energy moves by far more.

A physics check of the column, not of its presence: 108 LJ argon atoms start from a perfect
lattice at a temperature and pressure they are not at (a = 5.3 Å, 90 K: the crystal expands
under npt and its kinetic energy halves into the lattice before the thermostat refills it), so
the total energy changes by ~1 eV; the conserved quantity, read from the thermo table's values,
drifts less than 1e-4 of its value (NHC and MTK over 10,000 steps)."""
import numpy as np
import pytest

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation


def _run(tmp_path, integrator, steps, *extra):
    cfg = compose_config(["model=lj", "system.repeat=[3,3,3]", "system.a=5.3", f"integrator={integrator}",
                          "temperature=90", "dt=2.0", f"steps={steps}", "thermo.every=50", "trajectory.every=0",
                          "checkpoint.every=0", "quiet=true", "threads=1", f"output={tmp_path / 'c.h5'}",
                          "thermo.columns=[step,temp,etotal,conserved,vol,density]", *extra])
    sim = Simulation(cfg)
    rows = []
    sim.reporter.thermo = lambda step, t, obs: rows.append(
        (obs["total_energy"], obs["conserved_energy"], obs["volume"], obs["density"]))
    sim.run()
    return np.array(rows)


def _check(rows, bound=1e-4):
    etot, cons = rows[:, 0], rows[:, 1]
    drift = np.abs(cons - cons[0]).max() / abs(cons[0])
    assert drift < bound, drift
    # the column is not the total energy: that moved by far more than the conserved one drifted
    assert np.ptp(etot) > 0.5 and np.ptp(etot) > 1000 * np.abs(cons - cons[0]).max(), (np.ptp(etot), drift)


@pytest.mark.slow   # 10,000 steps each: ~20 s (nose-hoover) and ~60 s (npt) on one core
@pytest.mark.parametrize("integrator, extra", [("nose-hoover", []), ("npt", []),
                                               ("npt", ["integrator.couple=tri"])])
def test_nhc_and_mtk_conserve_over_10k_steps(tmp_path, integrator, extra):
    rows = _run(tmp_path, integrator, 10_000, *extra)
    _check(rows)
    if integrator == "npt":   # the barostat acted, and the density column is the mass over the volume column
        assert np.ptp(rows[:, 2]) > 0.05 * rows[0, 2]
        np.testing.assert_allclose(rows[:, 3] * rows[:, 2], rows[0, 3] * rows[0, 2], rtol=1e-12)


@pytest.mark.parametrize("integrator", ["nose-hoover", "npt", "csvr", "langevin"])
def test_every_thermostat_conserves_over_1k_steps(tmp_path, integrator):
    _check(_run(tmp_path, integrator, 1000))


def test_verlet_conserved_is_the_total_energy(tmp_path):
    rows = _run(tmp_path, "verlet", 100)
    np.testing.assert_array_equal(rows[:, 1], rows[:, 0])
