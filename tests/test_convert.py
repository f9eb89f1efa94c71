"""``python -m engine convert`` into the formats other tools read, checked with those tools' own
readers: ASE's LAMMPS dump and data readers, MDAnalysis's XTC and DCD readers. A triclinic,
rotated cell makes the LAMMPS frame (a along x, b in the xy plane) differ from ours, so the
checks compare what a rotation keeps: the cell's lengths and angles, fractional coordinates,
and velocity and force magnitudes per atom."""
import numpy as np
import pytest
from ase.io import read
from faultkit import cli, one_line

from shardmd.engine.io.h5md import read_frames

STEPS = [0, 5, 10, 15, 20]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 20-step LJ run of a tilted, rotated argon crystal with frames every 5 steps."""
    from ase.build import bulk
    from ase.io import write

    d = tmp_path_factory.mktemp("convert")
    a = bulk("Ar", "fcc", a=5.26).repeat((4, 4, 4))     # the primitive (60-degree) cell
    a.rotate(30, "z", rotate_cell=True)
    a.rattle(0.05, seed=2)
    a.numbers[::5] = 36                                  # two species: types 1 and 2
    write(d / "tri.extxyz", a)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        from shardmd.engine.cli.main import main

        assert main(["run", "model=lj", "system.file=tri.extxyz", "steps=20", "trajectory.every=5",
                     "model.epsilon.Kr=0.014", "model.sigma.Kr=3.65", "temperature=80", "quiet=true"]) == 0
    return d


def _convert(run, tmp_path, capsys, monkeypatch, out, *extra):
    code, lines = cli(["convert", str(run / "run.h5"), out, *extra], tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    return tmp_path / out


def _same_frame(got, ref, tol):
    """Cell shape, fractional positions (mod 1) and per-atom |v|, |F| agree within ``tol``."""
    assert np.allclose(got.cell.cellpar(), ref.cell.cellpar(), atol=tol)
    d = got.get_scaled_positions(wrap=True) - ref.get_scaled_positions(wrap=True)
    assert np.abs(d - np.rint(d)).max() <= tol
    assert list(got.numbers) == list(ref.numbers)


def test_lammps_dump_reads_back_in_ase(run, tmp_path, capsys, monkeypatch):
    out = _convert(run, tmp_path, capsys, monkeypatch, "run.lammpstrj")
    ours, back = read_frames(run / "run.h5"), read(out, ":", format="lammps-dump-text")
    assert len(back) == len(ours) == len(STEPS)
    for f, b in zip(ours, back):
        _same_frame(b, f, 1e-8)
        np.testing.assert_allclose(np.linalg.norm(b.get_velocities(), axis=1),
                                   np.linalg.norm(f.get_velocities(), axis=1), rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(np.linalg.norm(b.get_forces(), axis=1), np.linalg.norm(f.get_forces(), axis=1),
                                   rtol=1e-7, atol=1e-12)
    assert out.read_text().count("ITEM: TIMESTEP\n") == len(STEPS)


def test_lammps_data_one_frame(run, tmp_path, capsys, monkeypatch):
    out = _convert(run, tmp_path, capsys, monkeypatch, "last.data", "frames=-1")
    back = read(out, format="lammps-data", atom_style="atomic", units="metal")
    ref = read_frames(run / "run.h5")[-1]
    _same_frame(back, ref, 1e-8)
    np.testing.assert_allclose(back.get_masses(), ref.get_masses(), rtol=1e-6)
    code, lines = cli(["convert", str(run / "run.h5"), "all.data"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(lines, "a LAMMPS data file holds one structure")


@pytest.mark.parametrize("ext, tol", [("xtc", 6e-3), ("dcd", 1e-4)])
def test_xtc_and_dcd_round_trip_through_mdanalysis(run, tmp_path, capsys, monkeypatch, ext, tol):
    """To the format's precision: XTC keeps 1e-3 nm, DCD float32; times in ps; every other
    frame (frames=::2)."""
    import warnings

    mda = pytest.importorskip("MDAnalysis")
    out = _convert(run, tmp_path, capsys, monkeypatch, f"run.{ext}", "frames=::2")
    ours = read_frames(run / "run.h5")[::2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe.empty(len(ours[0]), trajectory=False)
        u.load_new(str(out), format=ext.upper())
    assert u.trajectory.n_frames == len(ours) == 3
    for ts, f in zip(u.trajectory, ours):
        np.testing.assert_allclose(ts.dimensions, f.cell.cellpar(), atol=tol)
        assert ts.time == pytest.approx(f.info["time_fs"] / 1000.0, abs=1e-6)
        back = f.copy()
        back.positions = ts.positions     # in the LAMMPS frame: compare what a rotation keeps
        back.cell = ts.triclinic_dimensions
        d = back.get_scaled_positions(wrap=True) - f.get_scaled_positions(wrap=True)
        assert np.abs(d - np.rint(d)).max() * max(f.cell.lengths()) <= 2 * tol


@pytest.mark.parametrize("args, needle", [
    (["x.foo"], "cannot write the format of 'x.foo'"),
    (["x.data", "frames=7"], "frames=7 selects no frame"),
    (["x.extxyz", "frames=a:b"], "is not a frame selection"),
    (["x.extxyz", "every=2"], "usage: python -m engine convert"),
])
def test_bad_outputs_and_selections_are_one_line(run, tmp_path, capsys, monkeypatch, args, needle):
    code, lines = cli(["convert", str(run / "run.h5"), *args], tmp_path, capsys, monkeypatch)
    assert code == 2, lines
    one_line(lines, needle)
    assert not (tmp_path / args[0]).exists()
