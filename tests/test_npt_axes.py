"""NPT with one barostatted axis, or x and y together, the other axes fixed (integrator.couple=z,
x, y, xy): state for state against LAMMPS's ``fix npt ... z`` and ``x ... y ... couple xy``
(tests/data/lammps_npt_axes_lj4000.npz, made by scripts/lammps_reference_npt_axes.py: in.lj
argon, 4000 atoms, 100 steps), the fixed axes bit for bit unchanged, the conserved quantity
held, and the barostatted axis's pressure relaxing to the target."""
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from ase import Atoms
from conftest import run_in_process

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation
from shardmd.integrators.units import EV_PER_A3_TO_BAR

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "lammps_npt_axes_lj4000.npz"
sys.path.insert(0, str(HERE))
from test_npt import _lammps_overrides, _run_from  # noqa: E402


@pytest.mark.parametrize("couple", ["z", pytest.param("xy", marks=pytest.mark.slow)])
def test_one_axis_npt_matches_lammps(couple, tmp_path):
    """100 steps: positions and cell to <= 1e-6 Å, velocities and f_1 (its strain energy, the
    constant -P V0 / 2 per fixed axis, included) to round-off growth; the fixed axes as they were."""
    ref = np.load(DATA)
    box = float(ref["box"])
    sim, x, v, cell = _run_from(ref["x0"], ref["v0"], box, _lammps_overrides(ref, couple), tmp_path,
                                int(ref["steps"]))
    dx = np.abs(x - ref[f"{couple}_x"]).max()
    dcell = np.abs(cell - ref[f"{couple}_cell"]).max()
    dv = np.abs(v - ref[f"{couple}_v"]).max() / np.abs(ref[f"{couple}_v"]).max()
    de = abs(sim.integrator.conserved_energy() - float(ref[f"{couple}_fix_energy"]))
    print(f"{couple}: max |dx| = {dx:.3e} Å, max |dcell| = {dcell:.3e} Å, max |dv|/max|v| = {dv:.3e}, "
          f"|d f_1| = {de:.3e} eV")
    assert dx <= 1e-6 and dcell <= 1e-6, (dx, dcell)
    assert dv <= 1e-6 and de <= 1e-6 * abs(float(ref[f"{couple}_fix_energy"])), (dv, de)
    moving = [2] if couple == "z" else [0, 1]
    fixed = [i for i in range(3) if i not in moving]
    assert np.abs(np.diag(ref[f"{couple}_cell"])[moving] - box).min() > 0.3   # the barostat did act
    assert (np.diag(cell)[fixed] == box).all() and not cell[~np.eye(3, dtype=bool)].any()


# a 500-atom argon crystal under 2000 bar, a fast barostat
ARGS = ["model=lj", "system.repeat=[5,5,5]", "dt=2.0", "temperature=60", "integrator=npt",
        "integrator.pressure=2000", "integrator.pdamp=300", "integrator.tdamp=100", "thermo.every=0",
        "quiet=true", "checkpoint.every=0", "threads=1"]


def _conserved(couple, steps, tmp_path):
    """(K + U + the integrator's energy, eV; the cell (3, 3) Å) after ``steps`` steps."""
    sim = Simulation(compose_config([*ARGS, f"integrator.couple={couple}", f"steps={steps}", "trajectory.every=0",
                                     f"output={tmp_path / f'{couple}{steps}.h5'}"]))
    obs = sim.run()
    h = obs["potential_energy"] + obs["kinetic_energy"] + sim.integrator.conserved_energy()
    return h, sim.state.cell.numpy().copy()


@pytest.mark.parametrize("couple", ["x", "y", "z", "xy"])
def test_fixed_axes_stay_and_the_extended_energy_is_conserved(couple, tmp_path):
    """Over 300 steps the fixed axes' cell entries are bit for bit the start's while the others
    move; the extended energy (K + U + chains + barostat + P V) drifts by < 1e-3 of N kB T."""
    h1, c1 = _conserved(couple, 10, tmp_path)
    h2, c2 = _conserved(couple, 300, tmp_path)
    start = 5 * 5.26
    moving = {"x": [0], "y": [1], "z": [2], "xy": [0, 1]}[couple]
    fixed = [i for i in range(3) if i not in moving]
    assert (np.diag(c2)[fixed] == start).all() and not c2[~np.eye(3, dtype=bool)].any()
    assert np.abs(np.diag(c2)[moving] - start).min() > 1e-3
    if couple == "xy":
        assert c2[0, 0] == c2[1, 1]   # one strain rate for both
    n_kt = 500 * 8.617333262e-5 * 60.0
    assert abs(h2 - h1) < 1e-3 * n_kt, (h2 - h1) / n_kt


@pytest.mark.slow
def test_the_z_pressure_relaxes_to_the_target(tmp_path):
    """3000 steps (6 ps, 20 barostat periods) at a target of 6000 bar (the crystal starts near
    2300 bar): the time average of P_zz (the trajectory's stress, kinetic part included) over the
    last 2000 steps is the target within its noise, while P_xx, whose axis is held, stays far
    from it."""
    out = tmp_path / "z.h5"
    Simulation(compose_config([*ARGS, "integrator.couple=z", "integrator.pressure=6000", "steps=3000",
                               "trajectory.every=10", "trajectory.fields=[position]", f"output={out}"])).run()
    with h5py.File(out) as f:
        steps = f["observables/stress/step"][:]
        p = -f["observables/stress/value"][:] * EV_PER_A3_TO_BAR
    late = steps > 1000
    pzz, pxx = p[late, 2, 2], p[late, 0, 0]
    sem = pzz.reshape(10, -1).mean(axis=1).std(ddof=1) / np.sqrt(10)
    print(f"P_zz {pzz.mean():.1f} +- {sem:.1f} bar, P_xx {pxx.mean():.1f} bar (target 6000)")
    assert abs(pzz.mean() - 6000.0) < max(4 * sem, 50.0)
    assert abs(pxx.mean() - 6000.0) > 1000.0


@pytest.mark.fault
def test_a_tilted_cell_is_refused_for_one_axis_coupling(tmp_path, capfd, monkeypatch):
    a = Atoms("Ar4", scaled_positions=[[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]],
              cell=[[10.5, 0, 0], [1.0, 10.5, 0], [0, 0, 10.5]], pbc=True).repeat((2, 2, 2))
    a.write(tmp_path / "tilted.extxyz")
    code, lines = run_in_process(["run", "model=lj", "system.file=tilted.extxyz", "integrator=npt",
                                  "integrator.couple=z", "steps=1", "quiet=true", "threads=1"], tmp_path, capfd,
                                 monkeypatch)
    assert code == 2 and len(lines) == 1 and "integrator.couple=z needs an orthorhombic cell" in lines[0], lines
