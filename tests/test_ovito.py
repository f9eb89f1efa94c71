"""OVITO's Python module (``pip install ovito``; ~500 MB with its PySide6, so not in the test
extra: ``-m ovito`` runs it where it is installed, else it is skipped with the reason) opens
``convert``'s LAMMPS dump with our frame count, ids, cell, positions and velocities."""
import numpy as np
import pytest
from conftest import cli_in_process

from shardmd.engine.io.h5md import read_frames

pytestmark = pytest.mark.ovito


def test_ovito_opens_the_lammps_dump(tmp_path, capfd, monkeypatch):
    ovito_io = pytest.importorskip("ovito.io", reason="the ovito package (PyPI) is not installed")
    r = cli_in_process(["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "trajectory.every=10", "quiet=true",
                        "threads=1"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    r = cli_in_process(["convert", "run.h5", "out.lammpstrj"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    ours = read_frames(tmp_path / "run.h5")
    pipeline = ovito_io.import_file(str(tmp_path / "out.lammpstrj"))
    assert pipeline.source.num_frames == len(ours) == 3
    for k, a in enumerate(ours):
        data = pipeline.compute(k)
        ids = np.asarray(data.particles["Particle Identifier"])
        order = np.argsort(ids)
        assert np.array_equal(ids[order], np.arange(1, len(a) + 1))   # LAMMPS ids: ours + 1
        # the dump has every atom wrapped into the box; ours are wrapped at neighbour rebuilds only
        d = (np.asarray(data.particles.positions)[order] - a.positions) @ np.linalg.inv(a.cell.array)
        np.testing.assert_allclose((d - np.round(d)) @ a.cell.array, 0.0, rtol=0, atol=1e-8)
        assert np.abs(np.round(d)).max() <= 1
        np.testing.assert_allclose(np.asarray(data.cell[...])[:, :3].T, a.cell.array, rtol=0, atol=1e-8)
        v = np.asarray(data.particles["Velocity"])[order]   # metal units: Å/ps
        np.testing.assert_allclose(v, a.get_velocities() * 1000 * 0.09822694788464063, rtol=1e-7, atol=1e-9)
