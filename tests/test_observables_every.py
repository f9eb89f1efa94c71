"""observables.every: rows of the trajectory's observables between frames (engine/run/output.py),
read back by h5py, our reader and MDAnalysis, whose time step stays the frame interval."""
import warnings

import h5py
import numpy as np
import pytest
from conftest import cli_in_process

from shardmd.engine.io.h5md import read_frames, read_observables

RUN = ["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "thermo.every=0", "trajectory.every=10",
       "thermo.progress=false", "threads=1", "dt=2.0"]


def test_observable_rows_between_frames_and_mdanalysis_dt(tmp_path, capfd, monkeypatch):
    r = cli_in_process([*RUN, "observables.every=4", "thermo.every=2"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    obs = read_observables(tmp_path / "run.h5")
    # every 4 steps, and with each frame (a reader pairing rows with frames never runs out)
    assert list(obs["potential_energy"][0]) == [0, 4, 8, 10, 12, 16, 20]
    np.testing.assert_allclose(obs["potential_energy"][1], 2.0 * obs["potential_energy"][0])   # fs
    assert list(obs["dt"][0]) == [0, 10, 20] and set(obs["dt"][2]) == {0.02}   # ps: the frame interval
    # each row is the thermo table's value at its step (a line every 2 steps)
    lines = [ln.split() for ln in r.stdout.splitlines()]
    i = next(i for i, ln in enumerate(lines) if ln[:1] == ["Step"])
    table = {int(ln[0]): float(ln[3]) for ln in lines[i + 1:] if ln and ln[0].isdigit()}
    np.testing.assert_allclose([table[s] for s in obs["potential_energy"][0]], obs["potential_energy"][2],
                               atol=1e-6)
    assert [f.info["step"] for f in read_frames(tmp_path / "run.h5")] == [0, 10, 20]
    mda = pytest.importorskip("MDAnalysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(str(tmp_path / "run.h5"), format="H5MD", topology_format="MINIMAL", n_atoms=108)
    assert u.trajectory.n_frames == 3 and u.trajectory.dt == pytest.approx(0.02, rel=1e-12)
    assert [ts.time for ts in u.trajectory] == pytest.approx([0.0, 0.02, 0.04])
    u.trajectory.close()


@pytest.mark.parametrize("every, rows", [(0, [0, 10, 20]), (30, [0, 10, 20]), (15, [0, 10, 15, 20])])
def test_observables_every_defaults_and_coarser_than_frames(tmp_path, capfd, monkeypatch, every, rows):
    r = cli_in_process([*RUN, f"observables.every={every}", "quiet=true"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "run.h5") as f:
        assert list(f["observables/temperature/step"][()]) == rows
        assert list(f["observables/dt/step"][()]) == [0, 10, 20]


def test_bad_observables_every_is_one_line(tmp_path, capfd, monkeypatch):
    r = cli_in_process([*RUN, "observables.every=-1"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "observables.every=-1 is invalid: give a whole number of steps >= 0" in r.stderr
