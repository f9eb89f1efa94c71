"""Tests of the H5MD trajectory writer/reader (shardmd.engine.io.h5md)."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase.units
import h5py
import numpy as np
import pytest

from shardmd.engine.io.h5md import (
    H5MDWriter,
    file_summary,
    iter_frames,
    read_frames,
    read_observables,
)
from shardmd.engine.io.h5md_units import KJ_PER_MOL_IN_EV

HELPER = Path(__file__).parent / "helpers" / "h5md_writer_loop.py"
_spec = importlib.util.spec_from_file_location("h5md_writer_loop", HELPER)
loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(loop)

# CODATA 2014 (the constants ase.units uses by default), written out independently of ASE
AMU_KG = 1.660539040e-27
E_C = 1.6021766208e-19
A_PER_FS_IN_M_PER_S = 1e-10 / 1e-15


def random_system(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    species = rng.choice([1, 6, 8, 14], size=n)
    masses = rng.uniform(1.0, 30.0, size=n)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    return species, masses, ids


def random_frame(n: int, seed: int):
    rng = np.random.default_rng(seed)
    cell = np.array([[10.0, 0, 0], [2.5, 9.0, 0], [-1.5, 2.0, 11.0]]) + rng.normal(0, 0.1, (3, 3))
    return {
        "cell": cell,
        "positions": rng.random((n, 3)) @ cell,
        "images": rng.integers(-2, 3, size=(n, 3)),
        "velocities": rng.normal(0, 0.02, size=(n, 3)),
        "forces": rng.normal(0, 1.0, size=(n, 3)),
    }


def write(w: H5MDWriter, step: int, fr: dict, dt: float = 0.5) -> None:
    w.write_frame(step, step * dt, fr["cell"], positions=fr["positions"], images=fr["images"],
                  velocities=fr["velocities"], forces=fr["forces"])


def make_writer(path, n=20, seed=0, **kw) -> H5MDWriter:
    species, masses, ids = random_system(n, seed)
    kw.setdefault("pbc", [True, True, True])
    return H5MDWriter(path, species=species, masses=masses, ids=ids, **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_roundtrip_h5py_and_ase(tmp_path, dtype):
    n, path = 37, tmp_path / "traj.h5"
    species, masses, ids = random_system(n, 1)
    frames = {10 * k: random_frame(n, k) for k in range(6)}
    config = {"md": {"dt_fs": 0.5, "ensemble": "nvt"}, "seed": 3}
    with H5MDWriter(path, species=species, masses=masses, ids=ids, pbc=[True, False, True],
                    dtype=dtype, config=config, author="Tester") as w:
        for step, fr in frames.items():
            write(w, step, fr)
            w.write_observables(step, step * 0.5, {"potential_energy": -1.5 * step,
                                                   "temperature": 300.0 + step})
        assert w.n_frames == 6 and w.last_step == 50
    fdt = np.dtype(dtype)
    steps = np.array(list(frames))
    with h5py.File(path, "r") as f:
        assert list(f["h5md"].attrs["version"]) == [1, 1]
        assert f["h5md/author"].attrs["name"] == "Tester"
        assert f["h5md/creator"].attrs["name"] == "ShardMD"
        assert f["h5md/creator"].attrs["version"] == "0.1.0"
        p = f["particles/all"]
        assert np.array_equal(p["species"][()], species)
        assert np.array_equal(p["mass"][()], masses) and p["mass"].attrs["unit"] == "amu"
        assert p["id"].dtype == np.int64 and np.array_equal(p["id"][()], ids)
        box = p["box"]
        assert box.attrs["dimension"] == 3
        assert [b.decode() if isinstance(b, bytes) else b for b in box.attrs["boundary"]] == [
            "periodic", "none", "periodic"]
        edges = box["edges"]
        assert edges["value"].dtype == fdt and edges["value"].attrs["unit"] == "Angstrom"
        assert np.array_equal(edges["value"][()], np.stack([fr["cell"] for fr in frames.values()]).astype(fdt))
        assert np.array_equal(edges["step"][()], steps)
        units = {"position": "Angstrom", "velocity": "Angstrom fs-1", "force": "kJ mol-1 Angstrom-1"}
        keys = {"position": "positions", "image": "images", "velocity": "velocities", "force": "forces"}
        for name, key in keys.items():
            g = p[name]
            assert g["step"].dtype == np.int64 and np.array_equal(g["step"][()], steps)
            assert g["time"].dtype == np.float64 and np.array_equal(g["time"][()], steps * 0.5)
            assert g["time"].attrs["unit"] == "fs"
            v = g["value"]
            assert v.shape == (6, n, 3) and v.maxshape[0] is None and v.chunks is not None
            assert g["step"].maxshape == (None,) and g["time"].maxshape == (None,)
            want_dtype = np.dtype(np.int32) if name == "image" else fdt
            assert v.dtype == want_dtype
            assert v.attrs.get("unit") == units.get(name)
            want = np.stack([fr[key] for fr in frames.values()])
            if name == "force":  # given in eV/Å, stored in kJ/(mol Å) (the unit MDAnalysis reads)
                np.testing.assert_allclose(v[()], (want / KJ_PER_MOL_IN_EV).astype(want_dtype),
                                           rtol=2e-7 if dtype == "float32" else 1e-15)
            else:
                assert np.array_equal(v[()], want.astype(want_dtype))
        obs = f["observables"]
        assert obs["potential_energy/value"].attrs["unit"] == "eV"
        assert obs["temperature/value"].attrs["unit"] == "K"
        assert obs["temperature/time"].attrs["unit"] == "fs"
        assert json.loads(f["parameters/config_json"][()]) == config
        assert f["parameters/config/md"].attrs["ensemble"] == "nvt"

    atoms_list = read_frames(path)
    assert len(atoms_list) == 6
    for atoms, (step, fr) in zip(atoms_list, frames.items()):
        assert atoms.info["step"] == step and atoms.info["time_fs"] == step * 0.5
        assert np.array_equal(atoms.numbers, species)
        assert np.array_equal(atoms.get_masses(), masses)
        assert list(atoms.pbc) == [True, False, True]
        assert np.array_equal(atoms.cell[:], fr["cell"].astype(fdt).astype(np.float64))
        assert np.array_equal(atoms.positions, fr["positions"].astype(fdt).astype(np.float64))
        assert np.array_equal(atoms.arrays["image"], fr["images"])
        assert np.array_equal(atoms.arrays["id"], ids)
        np.testing.assert_allclose(atoms.get_forces(), fr["forces"], rtol=3e-7 if dtype == "float32" else 1e-15)
        assert atoms.get_potential_energy() == -1.5 * step
        assert atoms.info["temperature"] == 300.0 + step
        rtol = 1e-6 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(atoms.get_velocities() * ase.units.fs, fr["velocities"], rtol=rtol)
    assert [a.info["step"] for a in read_frames(path, slice(1, None, 2))] == [10, 30, 50]
    assert [a.info["step"] for a in read_frames(path, -1)] == [50]
    assert [a.info["step"] for a in read_frames(path, [0, 2])] == [0, 20]
    assert [a.info["step"] for a in iter_frames(path)] == list(frames)


def test_velocity_units_against_codata(tmp_path):
    n, path = 30, tmp_path / "v.h5"
    species, masses, ids = random_system(n, 2)
    fr = random_frame(n, 5)
    with H5MDWriter(path, species=species, masses=masses, ids=ids, pbc=True) as w:
        write(w, 0, fr)
    atoms = read_frames(path)[0]
    v = fr["velocities"]  # Å/fs
    ke_ev = 0.5 * np.sum(masses[:, None] * v**2) * AMU_KG * A_PER_FS_IN_M_PER_S**2 / E_C
    np.testing.assert_allclose(atoms.get_kinetic_energy(), ke_ev, rtol=1e-9)
    # ASE time unit = Å sqrt(amu/eV), in fs; an ASE velocity is Å per that unit
    t_ase_fs = 1e-10 * np.sqrt(AMU_KG / E_C) / 1e-15
    assert 10.0 < t_ase_fs < 10.4
    np.testing.assert_allclose(atoms.get_velocities(), v * t_ase_fs, rtol=1e-9)


def test_observables_roundtrip(tmp_path):
    path = tmp_path / "obs.h5"
    rng = np.random.default_rng(3)
    stress = rng.normal(size=(4, 3, 3))
    with make_writer(path, fields=("position",)) as w:
        for k in range(4):
            w.write_observables(5 * k, 2.5 * k, {"potential_energy": -k, "kinetic_energy": 0.5 * k,
                                                 "pressure": 1e-3 * k, "stress": stress[k],
                                                 "my_count": 7 * k},
                                units={"my_count": "1"})
        w.write_observables(20, 10.0, {"temperature": 310.0})  # a key may start late
        with pytest.raises(ValueError):
            w.write_observables(15, 7.5, {"potential_energy": 1.0})  # not after last step
        with pytest.raises(ValueError):
            w.write_observables(25, 12.5, {"stress": np.zeros(3)})  # shape changed
    obs = read_observables(path)
    assert set(obs) == {"potential_energy", "kinetic_energy", "pressure", "stress", "my_count",
                        "temperature"}
    s, t, v = obs["stress"]
    assert np.array_equal(s, [0, 5, 10, 15]) and np.array_equal(t, [0, 2.5, 5, 7.5])
    assert np.array_equal(v, stress)
    assert np.array_equal(obs["potential_energy"][2], [0, -1, -2, -3])
    assert np.array_equal(obs["temperature"][0], [20])
    with h5py.File(path, "r") as f:
        units = {k: f[f"observables/{k}/value"].attrs.get("unit") for k in obs}
    assert units == {"potential_energy": "eV", "kinetic_energy": "eV", "pressure": "eV Angstrom-3",
                     "stress": "eV Angstrom-3", "my_count": "1", "temperature": "K"}


def test_truncate_after_then_append(tmp_path):
    n, path = 15, tmp_path / "t.h5"
    with make_writer(path, n=n) as w:
        for k in range(10):
            write(w, 10 * k, random_frame(n, k))
            w.write_observables(10 * k, 5.0 * k, {"potential_energy": float(k)})
        w.truncate_after(40)
        assert w.n_frames == 5 and w.last_step == 40
        with pytest.raises(ValueError):
            write(w, 40, random_frame(n, 99))  # duplicate step refused
        for k in range(5, 12):
            write(w, 10 * k, random_frame(n, 100 + k))
            w.write_observables(10 * k, 5.0 * k, {"potential_energy": 100.0 + k})
    frames = read_frames(path)
    assert [a.info["step"] for a in frames] == list(range(0, 120, 10))
    for a in frames:
        k = a.info["step"] // 10
        seed = k if k < 5 else 100 + k
        assert np.array_equal(a.positions, random_frame(n, seed)["positions"])
        assert a.get_potential_energy() == (k if k < 5 else 100.0 + k)
    steps, times, vals = read_observables(path)["potential_energy"]
    assert np.array_equal(steps, np.arange(0, 120, 10)) and np.array_equal(times, steps * 0.5)
    with h5py.File(path, "r") as f:
        for name in ("position", "image", "velocity", "force", "box/edges"):
            g = f[f"particles/all/{name}"]
            assert g["step"].shape == g["time"].shape == (12,) and g["value"].shape[0] == 12
            assert np.array_equal(g["step"][()], np.arange(0, 120, 10))


def test_reopen_append_and_config(tmp_path):
    n, path = 12, tmp_path / "r.h5"
    cfg1 = {"run": {"steps": 100}, "name": "first"}
    with make_writer(path, n=n, config=cfg1) as w:
        for k in range(3):
            write(w, 10 * k, random_frame(n, k))
    with make_writer(path, n=n, mode="a") as w:  # config=None keeps the stored one
        assert w.n_frames == 3 and w.last_step == 20
        write(w, 30, random_frame(n, 3))
    assert file_summary(path)["config"] == cfg1
    cfg2 = {"run": {"steps": 200}, "name": "restart"}
    with make_writer(path, n=n, mode="a", config=cfg2) as w:
        write(w, 40, random_frame(n, 4))
    frames = read_frames(path)
    assert [a.info["step"] for a in frames] == [0, 10, 20, 30, 40]
    for k, a in enumerate(frames):
        assert np.array_equal(a.positions, random_frame(n, k)["positions"])
    assert file_summary(path)["config"] == cfg2
    with pytest.raises(ValueError):
        make_writer(path, n=n + 1, mode="a")
    with pytest.raises(ValueError):
        make_writer(path, n=n, seed=9, mode="a")  # different species/ids
    with make_writer(tmp_path / "new.h5", n=n, mode="a") as w:  # "a" creates a missing file
        assert w.n_frames == 0 and w.last_step is None


def test_config_nested_storage(tmp_path):
    path = tmp_path / "c.h5"
    cfg = {"model": {"name": "mace", "cutoff": np.float32(5.0), "layers": [64, 64],
                     "elements": ["H", "O"], "extra": None, "path": Path("/x/y.pt")},
           "md": {"nvt": {"tau_fs": 100.0, "on": True}}, "tags": [], "a/b": 1}
    with make_writer(path, config=cfg):
        pass
    got = file_summary(path)["config"]
    assert got["model"]["cutoff"] == 5.0 and got["model"]["path"] == "/x/y.pt"
    assert got["model"]["layers"] == [64, 64] and got["model"]["extra"] is None
    assert got["md"] == {"nvt": {"tau_fs": 100.0, "on": True}} and got["a/b"] == 1
    with h5py.File(path, "r") as f:
        c = f["parameters/config"]
        assert c["model"].attrs["name"] == "mace"
        assert list(c["model"].attrs["layers"]) == [64, 64]
        assert list(c["model"].attrs["elements"]) == ["H", "O"]
        assert c["md/nvt"].attrs["tau_fs"] == 100.0 and bool(c["md/nvt"].attrs["on"])


def test_fields_subset_and_validation(tmp_path):
    n, path = 10, tmp_path / "s.h5"
    fr = random_frame(n, 0)
    with make_writer(path, n=n, fields=("position", "image"), dtype="float32") as w:
        w.write_frame(0, 0.0, fr["cell"], positions=fr["positions"], images=fr["images"],
                      velocities=fr["velocities"])  # velocities not in fields: ignored
        with pytest.raises(ValueError):
            w.write_frame(1, 0.5, fr["cell"], positions=fr["positions"])  # images missing
        with pytest.raises(ValueError):
            w.write_frame(1, 0.5, fr["cell"], positions=fr["positions"][:5], images=fr["images"])
        with pytest.raises(ValueError):
            w.write_frame(1, 0.5, np.eye(2), positions=fr["positions"], images=fr["images"])
        with pytest.raises(ValueError):
            w.write_observables(1, 0.5, {"stress": np.eye(3)}) or w.write_observables(
                1, 0.5, {"stress": np.eye(2)})
        assert w.n_frames == 1
    s = file_summary(path)
    assert s["fields"] == ["position", "image"] and s["n_frames"] == 1 and s["dtype"] == "float32"
    a = read_frames(path)[0]
    assert a.calc is None and "momenta" not in a.arrays
    with pytest.raises(ValueError):
        make_writer(tmp_path / "x.h5", fields=("position", "spin"))
    with pytest.raises(ValueError):
        make_writer(tmp_path / "x.h5", dtype="int32")
    species, masses, _ = random_system(4)
    with pytest.raises(ValueError):
        H5MDWriter(tmp_path / "x.h5", species=species, masses=masses, ids=[1, 1, 2, 3], pbc=True)
    w = make_writer(tmp_path / "y.h5")
    w.close()
    w.close()
    with pytest.raises(ValueError):
        write(w, 0, random_frame(20, 0))


def test_file_summary(tmp_path):
    n, path = 8, tmp_path / "sum.h5"
    with make_writer(path, n=n, pbc=[True, True, False], config={"x": 1}) as w:
        for k in range(3):
            write(w, 100 + 10 * k, random_frame(n, k))
            w.write_observables(100 + 10 * k, 0.0 + k, {"temperature": 1.0})
    s = file_summary(path)
    assert (s["n_atoms"], s["n_frames"], s["first_step"], s["last_step"]) == (8, 3, 100, 120)
    assert s["fields"] == ["position", "image", "velocity", "force"]
    assert s["observables"] == {"temperature": 3} and s["config"] == {"x": 1}
    assert s["pbc"] == [True, True, False] and s["h5md_version"] == [1, 1]
    assert s["units"]["particles/all/velocity/value"] == "Angstrom fs-1"


def test_interrupted_frame_is_dropped_and_repaired(tmp_path):
    """Simulate the states a kill mid-frame can leave, and check reader and restart."""
    n, path = 9, tmp_path / "p.h5"
    with make_writer(path, n=n) as w:
        for k in range(3):
            write(w, 10 * k, random_frame(n, k))
    with h5py.File(path, "r+") as f:  # frame 30: all data written but its commit record
        p = f["particles/all"]
        for name in ("position", "image", "velocity", "force"):
            for ds, v in (("value", 1), ("time", 15.0), ("step", 30)):
                d = p[name][ds]
                d.resize((4, *d.shape[1:]))
                d[3] = v
        for ds in ("value", "time", "step"):  # box step extended but its chunk never written
            d = p["box/edges"][ds]
            d.resize((4, *d.shape[1:]))
        assert p["box/edges/step"][3] == -1 and np.isnan(p["box/edges/time"][3])
    assert [a.info["step"] for a in read_frames(path)] == [0, 10, 20]
    assert file_summary(path)["n_frames"] == 3
    with make_writer(path, n=n, mode="a") as w:
        assert w.n_frames == 3 and w.last_step == 20
        write(w, 30, random_frame(n, 3))
    frames = read_frames(path)
    assert [a.info["step"] for a in frames] == [0, 10, 20, 30]
    assert np.array_equal(frames[3].positions, random_frame(n, 3)["positions"])


def _kill_trial(path: Path, rnd: random.Random, n_atoms: int, mode: str = "w") -> list[int]:
    """Run the writer loop, SIGKILL it at a random moment, return the steps it reported."""
    proc = subprocess.Popen([sys.executable, str(HELPER), str(path), str(n_atoms), "float64", mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[1])
    target = rnd.randint(2, 25)
    printed: list[int] = []
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:
            if line.startswith("wrote"):
                printed.append(int(line.split()[1]))
                if len(printed) >= target:
                    break
            assert time.monotonic() < deadline, "writer loop too slow"
        time.sleep(rnd.uniform(0.0, 0.005))  # lands anywhere inside the next frames
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # read through the same buffered objects the loop above used: communicate() reads the
        # pipes' file descriptors directly and would skip lines already in their buffers
        rest, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"writer ended by itself: {err}"
    printed += [int(x.split()[1]) for x in rest.splitlines() if x.startswith("wrote")]
    return printed


def _check_after_kill(path: Path, printed: list[int], n_atoms: int) -> list[int]:
    with h5py.File(path, "r") as f:  # plain h5py opens the killed file
        f.visit(lambda name: None)
        assert f["particles/all/position/value"].shape[1:] == (n_atoms, 3)
    frames = read_frames(path)
    steps = [a.info["step"] for a in frames]
    assert steps[: len(printed)] == printed  # every reported frame, in order
    assert len(steps) - len(printed) in (0, 1)  # at most the frame being written at the kill
    for a in frames:
        d = loop.frame_data(a.info["step"], n_atoms)
        assert np.array_equal(a.positions, d["positions"])
        assert np.array_equal(a.cell[:], d["cell"])
        assert np.array_equal(a.arrays["image"], d["images"])
        np.testing.assert_allclose(a.get_velocities() * ase.units.fs, d["velocities"], rtol=1e-12)
        np.testing.assert_allclose(a.get_forces(), d["forces"], rtol=1e-15)  # via kJ/(mol Å) in the file
        assert a.get_potential_energy() == d["potential_energy"]
    return steps


def _one_kill_trial(path: Path, rnd: random.Random, n_atoms: int) -> None:
    printed = _kill_trial(path, rnd, n_atoms)
    assert printed, "no frame reported"
    steps = _check_after_kill(path, printed, n_atoms)
    # a restart appends after the last complete frame, without gaps or duplicates
    printed2 = _kill_trial(path, rnd, n_atoms, mode="a")
    assert printed2[0] == steps[-1] + loop.STRIDE
    steps2 = _check_after_kill(path, steps + printed2, n_atoms)
    assert np.all(np.diff(steps2) == loop.STRIDE)


def _kill_trials(tmp_path: Path, trials: int, seed: int, n_atoms: int = 1000) -> None:
    """``trials`` independent kill-and-append trials on their own files, two at a time (each
    is mostly a fresh writer process starting: the second core takes the next one). A trial's
    random moments come from its own generator, (seed, trial): the same draws whatever the
    order the two workers run them in."""
    from concurrent.futures import ThreadPoolExecutor

    def trial(k: int) -> None:
        _one_kill_trial(tmp_path / f"kill{k}.h5", random.Random(f"{seed}-{k}"), n_atoms)

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(trial, k) for k in range(trials)]:
            f.result()


def test_sigkill_writer_keeps_reported_frames(tmp_path):
    _kill_trials(tmp_path, trials=5, seed=20240611)


@pytest.mark.slow
def test_sigkill_writer_many(tmp_path):
    _kill_trials(tmp_path, trials=60, seed=7, n_atoms=int(os.environ.get("H5MD_KILL_ATOMS", 1000)))
