"""NPT's mean density against LAMMPS's over a long run (scripts/lammps_reference_npt.py
--density, tests/data/lammps_npt_density.npz). Apart from tests/test_npt.py, whose shared MPI
worlds keep that module on one pytest-xdist worker: this 100-s run can go to another."""
import sys
from pathlib import Path

import numpy as np
import pytest

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation
from shardmd.integrators.units import EV_PER_A3_TO_BAR, KB

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))


@pytest.mark.slow   # 12,000 steps of 500 atoms: ~100 s on one core
def test_npt_mean_density_matches_lammps(tmp_path):
    """NPT LJ argon (reduced T 1.5, P 3.0: a dense liquid; 500 atoms, pdamp 1 tau, 12,000 steps of
    0.005 tau, the first 2,000 dropped): our mean density within 0.5 % of LAMMPS's over the same
    run (scripts/lammps_reference_npt.py --density), each with its 10-block standard error.
    Independent samples (other velocities) of one ensemble: the means, not the states, agree."""
    from bench_lj import EPSILON, SIGMA, SKIN, units

    ref = np.load(HERE / "data" / "lammps_npt_density.npz")
    u = units()
    n_atoms = int(ref["n_atoms"])
    p_bar = float(ref["p_red"]) * EPSILON / SIGMA ** 3 * EV_PER_A3_TO_BAR
    args = ["model=lj", f"model.epsilon={{Ar:{EPSILON}}}", f"model.sigma={{Ar:{SIGMA}}}",
            f"model.cutoff={u['cutoff']!r}", "model.shift=false", f"neighbor.skin={SKIN * SIGMA!r}",
            "system.lattice=fcc", "system.element=Ar", f"system.a={u['a']!r}", "system.repeat=[5,5,5]",
            f"dt={u['dt_fs']!r}", f"temperature={float(ref['t_red']) * EPSILON / KB!r}", "seed=2024",
            "integrator=npt", f"integrator.pressure={p_bar!r}",
            f"integrator.pdamp={float(ref['pdamp_tau']) * u['tau_fs']!r}",
            f"integrator.tdamp={0.1 * u['tau_fs']!r}", f"steps={int(ref['total_steps'])}", "thermo.every=10",
            "trajectory.every=0", "checkpoint.every=0", "quiet=true", "threads=1", f"output={tmp_path / 'rho.h5'}"]
    sim = Simulation(compose_config(args))
    rows = []
    sim.reporter.thermo = lambda step, t, obs: rows.append((step, obs["volume"]))
    sim.run()
    steps, vol = np.array(rows).T
    rho = n_atoms * SIGMA ** 3 / vol[steps > int(ref["skip"])]
    means = np.array([b.mean() for b in np.array_split(rho, 10)])
    mean, sem = means.mean(), means.std(ddof=1) / np.sqrt(10)
    lmean, lsem = float(ref["mean"]), float(ref["sem"])
    rel = mean / lmean - 1
    print(f"mean reduced density: ours {mean:.5f} +- {sem:.5f}, LAMMPS {lmean:.5f} +- {lsem:.5f} "
          f"(10-block standard errors, {rho.size} samples each): {100 * rel:+.3f} % "
          f"+- {100 * np.hypot(sem, lsem) / lmean:.3f} %")
    assert abs(rel) < 0.005, rel
