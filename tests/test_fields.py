"""Per-atom energies in trajectories (``trajectory.fields=[..., energies]``), the drift panel of
``engine plot``, and ``engine info | head -1``.

Real files, real readers (h5py, ASE, MDAnalysis), real runs; the CLI runs in this process
(``faultkit.cli``) except where a real pipe is needed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import ase.io
import h5py
import numpy as np
import pytest
from faultkit import cli
from reference import lj_reference

from shardmd.engine.cli.main import main
from shardmd.engine.errors import OutputError, UserError
from shardmd.engine.io.h5md import H5MDWriter, file_summary, read_frames

ROOT = Path(__file__).resolve().parents[1]
FIELDS = "trajectory.fields=[position,image,velocity,force,energies]"
RUN = ["run", "model=lj", "system.repeat=[2,2,2]", "steps=10", "trajectory.every=5", "quiet=true"]
N_ATOMS, STEPS = 32, [0, 5, 10]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small LJ run with every field, energies included: run.h5."""
    d = tmp_path_factory.mktemp("fields")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        assert main([*RUN, FIELDS]) == 0
    return d


def _raw(path):
    with h5py.File(path, "r") as f:
        g = f["particles/all/energy"]
        return {"energy": g["value"][()], "unit": g["value"].attrs["unit"], "step": g["step"][()],
                "chunks": g["value"].chunks, "epot": f["observables/potential_energy/value"][()],
                "etot": f["observables/total_energy/value"][()], "etot_time": f["observables/total_energy/time"][()],
                "n": f["particles/all/species"].shape[0]}


# ---------------------------------------------------------------------- the engine writes them
def test_engine_writes_per_atom_energies(run_dir, tmp_path, capsys, monkeypatch):
    r = _raw(run_dir / "run.h5")
    assert r["unit"] == "eV" and r["energy"].shape == (len(STEPS), N_ATOMS) and list(r["step"]) == STEPS
    # they are the model's: per frame they add up to the potential energy observable
    np.testing.assert_allclose(r["energy"].sum(axis=1), r["epot"], rtol=1e-12)
    # ... in id order: the frame's per-atom LJ energies, recomputed from its positions by the
    # test suite's numpy reference (atoms of the warm lattice differ by ~1e-4 relative)
    frame = read_frames(run_dir / "run.h5", -1)[0]
    _, _, _, ref = lj_reference(frame.positions, frame.cell.array, frame.pbc, frame.numbers, [[0.0104]],
                                [[3.40]], {18: 0}, 8.5, True)
    np.testing.assert_allclose(frame.get_potential_energies(), ref, rtol=1e-10)
    assert np.ptp(ref) > 1e3 * 1e-10 * np.abs(ref).max()   # a permutation would fail


def test_two_domains_write_the_same_energies(tmp_path, capsys, monkeypatch):
    """Gathered from two ranks (each its owned atoms, in its own memory order), the energies come
    out in id order, as one domain writes them."""
    args = ["run", "model=lj", "system.repeat=[4,2,2]", "steps=10", "trajectory.every=5", "quiet=true",
            "trajectory.fields=[position,energies]"]
    for d in (1, 2):
        code, lines = cli([*args, f"domains={d}", f"output=d{d}.h5"], tmp_path, capsys, monkeypatch)
        assert code == 0, lines
    with h5py.File(tmp_path / "d1.h5", "r") as a, h5py.File(tmp_path / "d2.h5", "r") as b:
        e1, e2 = a["particles/all/energy/value"][()], b["particles/all/energy/value"][()]
        epot = b["observables/potential_energy/value"][()]
    assert e1.shape == e2.shape == (3, 64)
    np.testing.assert_allclose(e2, e1, rtol=0, atol=1e-12 * np.abs(e1).max())
    np.testing.assert_allclose(e2.sum(axis=1), epot, rtol=1e-12)


def test_info_lists_the_energy_field(run_dir, capsys, monkeypatch):
    monkeypatch.chdir(run_dir)
    capsys.readouterr()
    assert main(["info", "run.h5"]) == 0
    out = capsys.readouterr().out
    assert "fields: position, image, velocity, force, energy" in out, out
    assert file_summary(run_dir / "run.h5")["fields"] == ["position", "image", "velocity", "force", "energy"]


def test_ase_and_convert_read_energies(run_dir, tmp_path, capsys, monkeypatch):
    r = _raw(run_dir / "run.h5")
    frames = ase.io.read(str(run_dir / "run.h5"), ":")
    for k, a in enumerate(frames):
        assert np.array_equal(a.get_potential_energies(), r["energy"][k])   # eV stored, eV read: exact
        assert a.get_potential_energy() == r["epot"][k]
    code, lines = cli(["convert", str(run_dir / "run.h5"), "e.extxyz"], tmp_path, capsys, monkeypatch)
    assert code == 0 and lines == []
    back = ase.io.read(tmp_path / "e.extxyz", ":")
    assert len(back) == len(STEPS)
    np.testing.assert_allclose(back[-1].get_potential_energies(), r["energy"][-1], rtol=0, atol=1e-7)


def test_mdanalysis_opens_a_file_with_energies(run_dir):
    mda = pytest.importorskip("MDAnalysis")
    path = run_dir / "run.h5"
    with h5py.File(path, "r") as f:
        pos = f["particles/all/position/value"][()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(str(path), format="H5MD", topology_format="MINIMAL", n_atoms=N_ATOMS)
    assert u.trajectory.n_frames == len(STEPS)
    for k, ts in enumerate(u.trajectory):
        np.testing.assert_allclose(ts.positions, pos[k], rtol=1e-6, atol=1e-6)
        assert ts.data["step"] == STEPS[k]
    u.trajectory.close()


def test_field_spellings_in_the_config(tmp_path, capsys, monkeypatch):
    """energy and energies are one field; either is accepted, both at once (or any field twice) is
    refused in one line, as is a field the engine does not know."""
    code, lines = cli([*RUN, "steps=0", "trajectory.fields=[position,energy]", "output=a.h5"],
                      tmp_path, capsys, monkeypatch)
    assert code == 0, lines
    assert file_summary(tmp_path / "a.h5")["fields"] == ["position", "energy"]
    for fields, needle in (("[position,energies,energy]", "a field is named twice"),
                           ("[position,position]", "a field is named twice"),
                           ("[position,charges]", "unknown field(s) ['charges']")):
        code, lines = cli([*RUN, "steps=0", f"trajectory.fields={fields}", "output=b.h5"],
                          tmp_path, capsys, monkeypatch)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        assert not (tmp_path / "b.h5").exists()


class _NoEnergies:
    """An LJ model that returns no per-atom energies (as a model of yours may)."""

    name = "no-energies"

    def __init__(self, inner):
        self.inner, self.cutoff = inner, inner.cutoff

    def __getattr__(self, k):
        return getattr(self.inner, k)

    def compute(self, *args, **kw):
        out = dict(self.inner.compute(*args, **kw))
        out.pop("energies", None)
        return out


def test_model_without_energies_is_one_line(tmp_path, monkeypatch):
    import torch

    from shardmd.engine.run.simulation import Simulation
    from shardmd.models import build_model

    monkeypatch.chdir(tmp_path)
    lj = build_model({"name": "lj", "epsilon": {"Ar": 0.0104}, "sigma": {"Ar": 3.4}, "cutoff": 8.5}, torch.float64)
    sim = Simulation.from_args(["model=lj", "system.repeat=[2,2,2]", "steps=5", "quiet=true",
                                "trajectory.fields=[position,energies]"], model=_NoEnergies(lj))
    with pytest.raises(UserError) as e:
        sim.run()
    assert e.value.exit_code == 2
    msg = e.value.one_line()
    assert "\n" not in msg and "'no-energies'" in msg and "'energies'" in msg and "trajectory.fields" in msg, msg
    assert sim.state.step == 0   # refused at the first frame, before any step
    # without the field the same model runs
    sim = Simulation.from_args(["model=lj", "system.repeat=[2,2,2]", "steps=5", "quiet=true", "output=ok.h5"],
                               model=_NoEnergies(lj))
    sim.run()
    assert file_summary(tmp_path / "ok.h5")["n_frames"] == 2


# ---------------------------------------------------------------------- the writer: crash safety
def _system(n):
    return dict(species=[18] * n, masses=[39.948] * n, ids=np.arange(n) * 3 + 1, pbc=True)


def _frame(n, k):
    rng = np.random.default_rng(100 + k)
    return {"positions": rng.random((n, 3)) * 9, "energies": rng.normal(-0.08, 0.01, n)}


def test_writer_energy_field_roundtrip_and_repair(tmp_path):
    n, path = 9, tmp_path / "e.h5"
    with H5MDWriter(path, **_system(n), fields=("position", "energies"), dtype="float32") as w:
        assert w.fields == ("position", "energy")
        for k in range(3):
            w.write_frame(10 * k, 5.0 * k, np.eye(3) * 9, **_frame(n, k))
        with pytest.raises(ValueError, match=r"energy must have shape \(9,\)"):
            w.write_frame(30, 15.0, np.eye(3) * 9, positions=_frame(n, 3)["positions"], energies=np.zeros((n, 3)))
        with pytest.raises(ValueError, match="needs `energy`"):
            w.write_frame(30, 15.0, np.eye(3) * 9, positions=_frame(n, 3)["positions"])
    with h5py.File(path, "r+") as f:
        g = f["particles/all/energy"]
        assert g["value"].dtype == np.float32 and g["value"].chunks == (1024, n)
        assert np.array_equal(g["value"][()], np.stack([_frame(n, k)["energies"] for k in range(3)]).astype(np.float32))
        # a kill after phase 1 of frame 30: its rows written, its commit record (box step) not
        p = f["particles/all"]
        for name in ("position", "energy"):
            for ds, v in (("value", 1), ("time", 15.0), ("step", 30)):
                d = p[name][ds]
                d.resize((4, *d.shape[1:]))
                d[3] = v
    frames = read_frames(path)
    assert [a.info["step"] for a in frames] == [0, 10, 20]
    np.testing.assert_array_equal(frames[2].get_potential_energies(),
                                  _frame(n, 2)["energies"].astype(np.float32).astype(np.float64))
    with H5MDWriter(path, **_system(n), fields=("position", "energy"), mode="a") as w:
        assert w.n_frames == 3
        w.write_frame(30, 15.0, np.eye(3) * 9, **_frame(n, 30))
        w.truncate_after(20)
        w.write_frame(40, 20.0, np.eye(3) * 9, **_frame(n, 40))
    with h5py.File(path, "r") as f:
        assert list(f["particles/all/energy/step"][()]) == [0, 10, 20, 40]
    assert np.allclose(read_frames(path, -1)[0].get_potential_energies(), _frame(n, 40)["energies"], rtol=1e-7)


def test_restart_adds_the_energy_field(tmp_path):
    """A file without the field gets it from the next frame on; older frames read without it."""
    n, path = 6, tmp_path / "r.h5"
    with H5MDWriter(path, **_system(n), fields=("position",)) as w:
        w.write_frame(0, 0.0, np.eye(3) * 9, positions=_frame(n, 0)["positions"])
    with H5MDWriter(path, **_system(n), fields=("position", "energies"), mode="a") as w:
        w.write_frame(5, 5.0, np.eye(3) * 9, **_frame(n, 5))
    a, b = read_frames(path)
    assert a.calc is None
    assert np.array_equal(b.get_potential_energies(), _frame(n, 5)["energies"])


class _FailingSet:
    """A dataset whose writes fail as a full disk makes them fail (OSError ENOSPC)."""

    def __init__(self, d):
        self.d, self.shape = d, d.shape

    def resize(self, shape):
        self.d.resize(shape)
        self.shape = shape

    def __setitem__(self, k, v):
        raise OSError(28, "No space left on device")


def test_write_error_in_the_energy_field(tmp_path):
    """A failed write of the energy rows: one-line OutputError, the writer poisoned, the frame not
    committed, every earlier frame intact (the field goes through the same phase 1 as the others)."""
    n, path = 8, tmp_path / "w.h5"
    w = H5MDWriter(path, **_system(n), fields=("position", "energy"))
    for k in range(2):
        w.write_frame(k, float(k), np.eye(3) * 9, **_frame(n, k))
    w._sets["energy"]["value"] = _FailingSet(w._sets["energy"]["value"])
    with pytest.raises(OutputError) as e:
        w.write_frame(2, 2.0, np.eye(3) * 9, **_frame(n, 2))
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and "frames up to step 1 are intact" in msg
    assert w.failed is e.value
    with pytest.raises(OutputError):
        w.write_frame(3, 3.0, np.eye(3) * 9, **_frame(n, 3))
    w.close()
    frames = read_frames(path)
    assert [a.info["step"] for a in frames] == [0, 1]
    assert np.array_equal(frames[1].get_potential_energies(), _frame(n, 1)["energies"])


# ---------------------------------------------------------------------- plot: the drift panel
def test_plot_shows_the_total_energy_drift_per_atom(run_dir, tmp_path, capsys, monkeypatch):
    from shardmd.engine.io.inspect_files import plot_series

    r = _raw(run_dir / "run.h5")
    panels = dict(plot_series(str(run_dir / "run.h5")))
    assert list(panels) == ["energy (eV)", "total-energy drift (eV/atom)", "temperature (K)", "pressure (bar)"]
    ((label, (t, drift)),) = panels["total-energy drift (eV/atom)"].items()
    assert label == "(E_total - E_total(0)) / N"
    np.testing.assert_array_equal(t, r["etot_time"] / 1000.0)
    np.testing.assert_allclose(drift, (r["etot"] - r["etot"][0]) / r["n"], rtol=0, atol=1e-15)
    assert drift[0] == 0.0 and r["n"] == N_ATOMS
    np.testing.assert_array_equal(panels["energy (eV)"]["total energy"][1], r["etot"])
    code, lines = cli(["plot", str(run_dir / "run.h5"), "p.png"], tmp_path, capsys, monkeypatch)
    assert code == 0 and lines == [] and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------- info | head -1
def test_info_into_a_closed_pipe_is_quiet(run_dir):
    """The reader of stdout is gone before the first byte (a pipe whose read end is closed, the
    deterministic form of `| head -1`): no traceback, exit status 141 (128 + SIGPIPE) as Unix tools."""
    for args in (["info", "run.h5"], ["convert", "run.h5", "c.extxyz"]):
        r_fd, w_fd = os.pipe()
        os.close(r_fd)
        try:
            p = subprocess.run([sys.executable, "-m", "engine", *args], cwd=run_dir, stdout=w_fd,
                               stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(w_fd)
        assert p.stderr == "" and p.returncode == 141, (args, p.returncode, p.stderr)
    # through a shell and head: the first line, nothing on stderr (whether the write raced head or not)
    p = subprocess.run(f"{sys.executable} -m engine info run.h5 | head -1", shell=True, cwd=run_dir,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and p.stdout.startswith("run.h5: H5MD")
    assert len(p.stdout.splitlines()) == 1


# ---------------------------------------------------------------------- the writer: a real full disk
_FILL = """
import sys
import numpy as np
import shardmd.engine.io.h5md as h5md
from shardmd.engine.errors import OutputError

out, n, precheck = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if not precheck:  # reach HDF5's own ENOSPC instead of the free-space check
    h5md.free_bytes = lambda fd: None
w = h5md.H5MDWriter(out, species=[18] * n, masses=[39.948] * n, ids=np.arange(n), pbc=True,
                    fields=("position", "energies"))
for k in range(100000):
    rng = np.random.default_rng(k)
    try:
        w.write_frame(k, float(k), np.eye(3) * 30, positions=rng.random((n, 3)) * 30,
                      energies=rng.normal(-0.08, 0.01, n))
    except OutputError as exc:
        print(f"error: {exc}", flush=True)
        break
    print(f"wrote {k}", flush=True)
w.close()
"""


@pytest.mark.parametrize("precheck", [False, True], ids=["hdf5-enospc", "free-space-check"])
def test_energy_field_on_a_full_disk(tmp_path, precheck):
    """The writer with the energy field fills a 1 MiB tmpfs: one error line, no crash at exit, and
    every frame it reported is in the file with its energies, exact; nothing more is counted."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_faults", Path(__file__).parent / "test_write_faults.py")
    faults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faults)
    n = 2000
    with faults.tmpfs(tmp_path / "mnt", "1m") as mnt:
        out = mnt / "e.h5"
        r = subprocess.run([sys.executable, "-c", _FILL, str(out), str(n), str(int(precheck))],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr[-3000:])
        printed = [int(x.split()[1]) for x in r.stdout.splitlines() if x.startswith("wrote")]
        err = [x for x in r.stdout.splitlines() if x.startswith("error:")]
        assert printed and len(err) == 1 and "No space left on device" in err[0], r.stdout[-2000:]
        assert f"frames up to step {printed[-1]} are intact" in err[0]
        frames = read_frames(out)
        assert [a.info["step"] for a in frames] == printed
        for a in frames:
            rng = np.random.default_rng(a.info["step"])
            rng.random((n, 3))
            assert np.array_equal(a.get_potential_energies(), rng.normal(-0.08, 0.01, n))
