"""Third-party readers open ShardMD's files: MDAnalysis's H5MD reader and ASE's
``ase.io.read`` (through the ``ase.ioformats`` entry point), compared field by field with
h5py's raw values converted by hand; starting a run from a frame of our own trajectory
(``system.file=run.h5``); ``convert`` of checkpoints; files written before the unit change.

Real readers, no mocks.  One small LJ run (32 atoms, 10 steps, 3 frames) is shared by the
module; the CLI runs in this process (``faultkit.cli``).
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import ase.io
import ase.units
import faultkit
import h5py
import numpy as np
import pytest
from ase.calculators.lj import LennardJones
from faultkit import cli

from shardmd.engine.cli.main import main
from shardmd.engine.io import h5md as h5md_mod
from shardmd.engine.io.h5md import H5MDWriter, read_frames
from shardmd.engine.io.h5md_units import FIELD_UNITS, KJ_PER_MOL_IN_EV

RUN = ["run", "model=lj", "system.repeat=[2,2,2]", "steps=10", "trajectory.every=5", "quiet=true"]
N_ATOMS, STEPS = 32, [0, 5, 10]


def one_line(code, lines, needle):
    assert code == 2, (code, lines)
    faultkit.one_line(lines, needle)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A directory holding the default output of a small run: run.h5, run.log, run.ckpt/."""
    d = tmp_path_factory.mktemp("readers")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        assert main(RUN) == 0
    return d


def raw(path) -> dict:
    """Every frame field as stored, with its unit string, read by plain h5py."""
    with h5py.File(path, "r") as f:
        p = f["particles/all"]
        out = {name: (p[f"{name}/value"][()], p[f"{name}/value"].attrs.get("unit"))
               for name in ("position", "velocity", "force", "box/edges")}
        out["image"] = (p["image/value"][()], None)
        out["time"] = (p["position/time"][()], p["position/time"].attrs["unit"])
        out["step"] = (p["position/step"][()], None)
        out["species"], out["mass"] = p["species"][()], p["mass"][()]
        out["pbc"] = [b.decode() if isinstance(b, bytes) else b for b in p["box"].attrs["boundary"]]
        out["epot"] = f["observables/potential_energy/value"][()]
        out["obs_step"] = f["observables/potential_energy/step"][()]
        out["units_module"] = dict(f["h5md/modules/units"].attrs)
    return out


def test_file_states_its_units(run_dir):
    """H5MD 1.1 units module, and unit strings MDAnalysis translates."""
    r = raw(run_dir / "run.h5")
    assert list(r["units_module"]["version"]) == [1, 0]
    assert r["units_module"]["system"] == b"ShardMD"
    assert {k: r[k][1] for k in ("position", "velocity", "force", "box/edges", "time")} == {
        "position": "Angstrom", "velocity": "Angstrom fs-1", "force": "kJ mol-1 Angstrom-1",
        "box/edges": "Angstrom", "time": "fs"}
    assert list(r["step"][0]) == STEPS


def test_mdanalysis_reads_default_output(run_dir, tmp_path):
    """MDAnalysis (convert_units=True, its default) gets positions (Å), velocities (Å/ps),
    forces (kJ/(mol Å)), box and time (ps) equal to h5py's values converted by hand."""
    mda = pytest.importorskip("MDAnalysis")
    from MDAnalysis.coordinates.H5MD import H5MDReader
    from MDAnalysis.lib.mdamath import triclinic_box

    path = run_dir / "run.h5"
    r = raw(path)
    ours = read_frames(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MDAnalysis's guessers warn about missing attributes
        u = mda.Universe(str(path), format="H5MD", topology_format="MINIMAL", n_atoms=N_ATOMS)
    reader = u.trajectory
    assert isinstance(reader, H5MDReader) and reader.convert_units
    assert reader.units == {"time": "fs", "length": "Angstrom", "velocity": "Angstrom/fs",
                            "force": "kJ/(mol*Angstrom)"}
    assert reader.n_frames == len(STEPS) == len(ours)
    for k, ts in enumerate(reader):
        pos, vel, frc = r["position"][0][k], r["velocity"][0][k], r["force"][0][k]
        # MDAnalysis keeps float32 arrays: compare at float32 resolution
        np.testing.assert_allclose(ts.positions, pos, rtol=1e-6, atol=1e-6)          # Å -> Å
        np.testing.assert_allclose(ts.velocities, vel * 1000.0, rtol=1e-6, atol=1e-9)  # Å/fs -> Å/ps
        np.testing.assert_allclose(ts.forces, frc, rtol=1e-6, atol=1e-9)              # native unit
        np.testing.assert_allclose(ts.forces * KJ_PER_MOL_IN_EV, ours[k].get_forces(), rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(ts.dimensions, triclinic_box(*r["box/edges"][0][k]), rtol=1e-6)
        np.testing.assert_allclose(ts.dimensions[:3], ours[k].cell.cellpar()[:3], rtol=1e-6)
        assert ts.time == pytest.approx(r["time"][0][k] / 1000.0, rel=1e-12)           # fs -> ps
        assert ts.data["step"] == STEPS[k]
        # observables: MDAnalysis takes row k of each observable as frame k's; the engine
        # writes them together with each frame, so the rows belong to the same steps
        assert r["obs_step"][k] == STEPS[k]
        assert ts.data["potential_energy"] == pytest.approx(r["epot"][k], rel=1e-12)
        # the frame interval, trajectory.every x dt in ps (without the ``dt`` observable MDAnalysis
        # says 1.0 ps whatever it is, and a diffusion coefficient from it is off by that factor)
        assert ts.dt == pytest.approx((r["time"][0][1] - r["time"][0][0]) / 1000.0, rel=1e-12)
    assert reader.dt == pytest.approx(r["time"][0][-1] / 1000.0 / (len(STEPS) - 1), rel=1e-12) and reader.dt != 1.0
    assert reader.totaltime == pytest.approx((r["time"][0][-1] - r["time"][0][0]) / 1000.0, rel=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # with a topology (names, elements) the trajectory is the second file; an .h5md
        # name is recognised without format=
        top = tmp_path / "top.pdb"
        ase.io.write(top, ours[0])
        u2 = mda.Universe(str(top), str(path), format="H5MD")
        (tmp_path / "run.h5md").symlink_to(path)
        u3 = mda.Universe(str(top), str(tmp_path / "run.h5md"))
    assert set(u2.atoms.names) == {"Ar"} and u2.trajectory.n_frames == len(STEPS)
    u3.trajectory[-1]
    np.testing.assert_allclose(u3.atoms.positions, r["position"][0][-1], rtol=1e-6, atol=1e-6)
    # MDAnalysis holds the file open (with HDF5's file lock): our readers still open it
    assert [a.info["step"] for a in read_frames(path)] == STEPS
    assert len(ase.io.read(str(path), ":")) == len(STEPS)
    for x in (u, u2, u3):
        x.trajectory.close()


def test_ase_reads_default_output(run_dir):
    """ase.io.read(..., ":") through the entry point: ASE units, energies, forces and stress."""
    from ase.io.formats import filetype

    path = run_dir / "run.h5"
    assert filetype(str(path)) == "shardmd-h5md"
    r = raw(path)
    frames = ase.io.read(str(path), ":")
    assert [a.info["step"] for a in frames] == STEPS
    for k, a in enumerate(frames):
        assert np.array_equal(a.positions, r["position"][0][k])
        np.testing.assert_allclose(a.get_velocities(), r["velocity"][0][k] / ase.units.fs, rtol=1e-15)
        np.testing.assert_allclose(a.get_forces(), r["force"][0][k] * KJ_PER_MOL_IN_EV, rtol=1e-15)
        assert np.array_equal(a.cell.array, r["box/edges"][0][k])
        assert list(a.pbc) == [b == "periodic" for b in r["pbc"]]
        assert np.array_equal(a.numbers, r["species"]) and np.array_equal(a.get_masses(), r["mass"])
        assert np.array_equal(a.arrays["image"], r["image"][0][k])
        assert a.get_potential_energy() == r["epot"][k]
        assert a.info["time_fs"] == r["time"][0][k]
        # the stress as a calculator's result: the model's part against ASE's own LennardJones
        # (the engine's argon defaults), and with ASE's kinetic term the stored observable
        ref = a.copy()
        ref.calc = LennardJones(epsilon=0.0104, sigma=3.4, rc=8.5, smooth=False)
        want = ref.get_stress()
        np.testing.assert_allclose(a.get_stress(), want, rtol=0, atol=1e-12 * np.abs(want).max())
        with h5py.File(path) as f:
            stored = f["observables/stress/value"][k]
        np.testing.assert_allclose(a.get_stress(include_ideal_gas=True, voigt=False), stored, rtol=0, atol=1e-15)
    last = ase.io.read(str(path))
    assert last.info["step"] == STEPS[-1] and np.array_equal(last.positions, frames[-1].positions)
    assert ase.io.read(str(path), 1).info["step"] == STEPS[1]


def test_ase_and_convert_read_checkpoints(run_dir, tmp_path, capsys, monkeypatch):
    from shardmd.engine.io.checkpoint import read_checkpoint

    ckpt = sorted((run_dir / "run.ckpt").glob("step-*.h5"))[-1]
    c = read_checkpoint(ckpt)
    order = np.argsort(c["arrays"]["ids"])
    a = ase.io.read(str(ckpt))
    assert a.info["step"] == c["step"] == STEPS[-1]
    assert np.array_equal(a.positions, c["arrays"]["positions"][order])
    np.testing.assert_allclose(a.get_velocities() * ase.units.fs, c["arrays"]["velocities"][order], rtol=1e-15)
    code, lines = cli(["convert", str(ckpt), "ck.extxyz"], tmp_path, capsys, monkeypatch)
    assert code == 0 and lines == []
    b = ase.io.read(tmp_path / "ck.extxyz")
    np.testing.assert_allclose(b.positions, a.positions, rtol=0, atol=1e-7)  # extxyz: 8 decimals
    assert np.array_equal(b.numbers, a.numbers) and np.allclose(b.cell.array, a.cell.array)


def test_run_starts_from_a_frame(run_dir, tmp_path, capsys, monkeypatch):
    """system.file=run.h5 system.index=1: the new run's first frame is that frame."""
    shutil.copy(run_dir / "run.h5", tmp_path / "run.h5")
    code, lines = cli(["run", "model=lj", "system.file=run.h5", "system.index=1", "steps=0",
                       "output=from.h5", "quiet=true"], tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    src, got = read_frames(tmp_path / "run.h5")[1], read_frames(tmp_path / "from.h5")[0]
    assert got.info["step"] == 0
    assert np.array_equal(got.cell.array, src.cell.array) and np.array_equal(got.numbers, src.numbers)
    # the first neighbour build folds atoms that had left the cell back in (image flags say
    # by how much); every other atom starts exactly where the frame has it
    img = got.arrays["image"]
    moved = np.any(img != 0, axis=1)
    assert np.array_equal(got.positions[~moved], src.positions[~moved])
    np.testing.assert_allclose(got.positions + img @ got.cell.array, src.positions, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.get_velocities(), src.get_velocities(), rtol=1e-14)  # system.velocities=auto
    # default index: the last frame
    code, lines = cli(["run", "model=lj", "system.file=run.h5", "steps=0", "output=last.h5", "quiet=true"],
                      tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    np.testing.assert_allclose(read_frames(tmp_path / "last.h5")[0].get_velocities(),
                               read_frames(tmp_path / "run.h5")[-1].get_velocities(), rtol=1e-14)


def _empty_trajectory(path):
    with H5MDWriter(path, species=[18, 18], masses=[39.948, 39.948], ids=[0, 1], pbc=True):
        pass


def _foreign_hdf5(path):
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(10))


def _truncated(path, src):
    data = Path(src).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("case, args, needle", [
    ("index", ["system.index=3"], "system.index=3 is out of range: 'in.h5' holds 3 frames; give 0..2 or -3..-1"),
    ("index", ["system.index=-4"], "system.index=-4 is out of range"),
    ("empty", [], "is a trajectory without frames"),
    ("foreign", [], "is an HDF5 file but neither a ShardMD trajectory nor a checkpoint"),
    ("truncated", [], "truncated"),
    ("same", ["output=in.h5", "overwrite=true"], "is also this run's output"),
])
def test_bad_start_files_are_one_line(run_dir, tmp_path, capsys, monkeypatch, case, args, needle):
    src = tmp_path / "in.h5"
    if case == "empty":
        _empty_trajectory(src)
    elif case == "foreign":
        _foreign_hdf5(src)
    elif case == "truncated":
        _truncated(src, run_dir / "run.h5")
    else:
        shutil.copy(run_dir / "run.h5", src)
    before = src.read_bytes()
    code, lines = cli(["run", "model=lj", "system.file=in.h5", "steps=0", "quiet=true",
                       *([] if case == "same" else ["output=out.h5"]), *args], tmp_path, capsys, monkeypatch)
    one_line(code, lines, needle)
    assert src.read_bytes() == before   # never touched


@pytest.fixture
def old_format(tmp_path, monkeypatch):
    """A trajectory as ShardMD wrote them before the unit change: the writer of today with the
    old unit strings (so forces are stored in eV/Å) and no units module."""
    old = {"position": "angstrom", "image": None, "velocity": "angstrom fs-1", "force": "eV angstrom-1"}
    monkeypatch.setattr(h5md_mod, "FIELD_UNITS", old)
    monkeypatch.setattr(h5md_mod, "LENGTH_UNIT", "angstrom")
    monkeypatch.setattr(h5md_mod, "write_units_module", lambda h5: None)
    rng = np.random.default_rng(7)
    n, path = 6, tmp_path / "old.h5"
    cell = np.diag([9.0, 9.5, 10.0])
    frames = [{"positions": rng.random((n, 3)) * 9, "images": np.zeros((n, 3), int),
               "velocities": rng.normal(0, 0.01, (n, 3)), "forces": rng.normal(0, 1, (n, 3))} for _ in range(2)]
    with H5MDWriter(path, species=[18] * n, masses=[39.948] * n, ids=range(n), pbc=True) as w:
        for k, fr in enumerate(frames):
            w.write_frame(k * 10, k * 10.0, cell, **fr)
            w.write_observables(k * 10, k * 10.0, {"potential_energy": -1.0 - k})
    monkeypatch.undo()
    with h5py.File(path, "r") as f:
        assert f["particles/all/force/value"].attrs["unit"] == "eV angstrom-1" and "modules" not in f["h5md"]
        assert np.array_equal(f["particles/all/force/value"][1], frames[1]["forces"])
    return path, cell, frames


def test_old_format_still_reads(old_format, tmp_path, capsys, monkeypatch):
    path, cell, frames = old_format
    got = read_frames(path)
    for a, fr in zip(got, frames):
        assert np.array_equal(a.get_forces(), fr["forces"])          # eV/Å stored, unit 1: exact
        assert np.array_equal(a.positions, fr["positions"])
        np.testing.assert_allclose(a.get_velocities() * ase.units.fs, fr["velocities"], rtol=1e-15)
    assert [a.info["step"] for a in ase.io.read(str(path), ":")] == [0, 10]
    code, lines = cli(["info", "old.h5"], tmp_path, capsys, monkeypatch)
    assert code == 0 and lines == []
    code, lines = cli(["convert", "old.h5", "old.extxyz"], tmp_path, capsys, monkeypatch)
    assert code == 0 and lines == []
    back = ase.io.read(tmp_path / "old.extxyz", ":")
    np.testing.assert_allclose(back[1].get_forces(), frames[1]["forces"], rtol=0, atol=1e-7)  # extxyz: 8 decimals
    # a restart appends to an old file in the units that file uses
    f3 = frames[1]["forces"] * 2
    with H5MDWriter(path, species=[18] * 6, masses=[39.948] * 6, ids=range(6), pbc=True, mode="a") as w:
        w.write_frame(20, 20.0, cell, positions=frames[1]["positions"], images=frames[1]["images"],
                      velocities=frames[1]["velocities"], forces=f3)
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["particles/all/force/value"][2], f3)
        assert f["particles/all/velocity/value"].attrs["unit"] == "angstrom fs-1"
    assert np.array_equal(read_frames(path, -1)[0].get_forces(), f3)


def test_new_format_forces_round_trip(tmp_path):
    """Forces given in eV/Å come back in eV/Å (through kJ/(mol Å) in the file, ~1e-16)."""
    rng = np.random.default_rng(3)
    n, f = 5, rng.normal(0, 1, (5, 3))
    assert FIELD_UNITS["force"] == "kJ mol-1 Angstrom-1"
    with H5MDWriter(tmp_path / "t.h5", species=[18] * n, masses=[39.948] * n, ids=range(n), pbc=True) as w:
        w.write_frame(0, 0.0, np.eye(3) * 8, positions=rng.random((n, 3)), images=np.zeros((n, 3)),
                      velocities=np.zeros((n, 3)), forces=f)
    with h5py.File(tmp_path / "t.h5", "r") as h:
        np.testing.assert_allclose(h["particles/all/force/value"][0] * KJ_PER_MOL_IN_EV, f, rtol=1e-15)
    np.testing.assert_allclose(read_frames(tmp_path / "t.h5")[0].get_forces(), f, rtol=1e-15, atol=0)


def test_unknown_unit_is_one_line(old_format, tmp_path, capsys, monkeypatch):
    path = old_format[0]
    with h5py.File(path, "r+") as f:
        f["particles/all/force/value"].attrs["unit"] = "hartree bohr-1"
    code, lines = cli(["convert", "old.h5", "x.extxyz"], tmp_path, capsys, monkeypatch)
    one_line(code, lines, "force unit 'hartree bohr-1' is not one ShardMD converts")


def test_run_starts_from_a_checkpoint(run_dir, tmp_path, capsys, monkeypatch):
    """A checkpoint is a structure too: its state starts a fresh run (index 0 or -1 only)."""
    ckpt = sorted((run_dir / "run.ckpt").glob("step-*.h5"))[-1]
    shutil.copy(ckpt, tmp_path / "ck.h5")
    code, lines = cli(["run", "model=lj", "system.file=ck.h5", "steps=0", "output=o.h5", "quiet=true"],
                      tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    src, got = ase.io.read(str(tmp_path / "ck.h5")), read_frames(tmp_path / "o.h5")[0]
    img = got.arrays["image"]
    np.testing.assert_allclose(got.positions + img @ got.cell.array, src.positions, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.get_velocities(), src.get_velocities(), rtol=1e-14)
    code, lines = cli(["run", "model=lj", "system.file=ck.h5", "system.index=1", "steps=0", "output=p.h5",
                       "quiet=true"], tmp_path, capsys, monkeypatch)
    one_line(code, lines, "system.index=1 is out of range: 'ck.h5' holds one structure")


def test_compressed_float32_trajectory_is_smaller_and_every_reader_opens_it(tmp_path, capsys, monkeypatch):
    """The shipped LJ run (model=lj, its defaults, 200 steps, a frame every 10) with
    trajectory.precision=float32 trajectory.compression=gzip: over 2x smaller than the default
    file (2.5x measured: float32 halves it, and gzip gets little more from float mantissas; the
    images and the observables' unfilled chunks go), and our reader, ASE and MDAnalysis read the
    same frames (float32 values)."""
    import warnings

    mda = pytest.importorskip("MDAnalysis")
    base = ["run", "model=lj", "steps=200", "trajectory.every=10", "thermo.every=0", "quiet=true"]
    for extra in (["output=plain.h5"], ["output=small.h5", "trajectory.precision=float32",
                                        "trajectory.compression=gzip"]):
        code, lines = cli([*base, *extra], tmp_path, capsys, monkeypatch)
        assert code == 0, lines
    plain, small = (tmp_path / "plain.h5").stat().st_size, (tmp_path / "small.h5").stat().st_size
    assert plain >= 2.2 * small, (plain, small)
    a, b = read_frames(tmp_path / "plain.h5"), read_frames(tmp_path / "small.h5")
    assert [f.info["step"] for f in a] == [f.info["step"] for f in b] == list(range(0, 201, 10))
    for fa, fb in zip(a, b):
        np.testing.assert_array_equal(fb.positions, fa.positions.astype(np.float32))
        np.testing.assert_allclose(fb.get_forces(), fa.get_forces(), rtol=1e-6, atol=1e-9)
    with h5py.File(tmp_path / "small.h5") as f:
        v = f["particles/all/position/value"]
        assert v.dtype == np.float32 and v.compression == "gzip"
    back = ase.io.read(str(tmp_path / "small.h5"), ":")
    assert len(back) == len(b) and np.array_equal(back[-1].positions, b[-1].positions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(str(tmp_path / "small.h5"), format="H5MD", topology_format="MINIMAL", n_atoms=len(b[0]))
    assert u.trajectory.n_frames == len(b)
    u.trajectory[-1]
    np.testing.assert_array_equal(u.atoms.positions, b[-1].positions.astype(np.float32))
    u.trajectory.close()
