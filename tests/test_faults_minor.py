"""The smaller hostile inputs: unknown element names, file names Hydra's grammar cannot read
unquoted, a single atom under momentum-conserving integrators, a running job's trajectory read
while it is written, and ``minimize`` over an existing relaxed structure.

Each refusal is one line ``error: ...`` naming the file or key, the problem and the fix, exit
status 2, nothing written. Refusals decided before any rank starts run the CLI in this process
(``run_in_process``: the code a subprocess runs); the cases whose point is a real run (the file
names written and read back, one atom's thermo, the live reader) run real processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_engine, run_in_process

from shardmd.engine.io.h5md import read_frames, read_observables
from shardmd.engine.io.h5md_read import file_summary

pytestmark = pytest.mark.fault

SMALL = ["model=lj", "system.repeat=[3,3,3]", "quiet=true", "threads=1"]


def _one_error(lines: list[str], *needles: str) -> str:
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _argon(repeat: int = 3):
    from ase.build import bulk

    return bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)


# -- unknown element names in a structure file -----------------------------------------------------------
def _with_unknown(folder: Path, fmt: str, name: str) -> Path:
    """A two-atom structure whose first atom is called ``name``, in format ``fmt``."""
    if fmt == "extxyz":
        p = folder / "in.extxyz"
        p.write_text('2\nLattice="10 0 0 0 10 0 0 0 10" Properties=species:S:1:pos:R:3 pbc="T T T"\n'
                     f"{name} 0 0 0\nAr 3.8 0 0\n")
    elif fmt == "xyz":
        p = folder / "in.xyz"
        p.write_text(f"2\n\n{name} 0 0 0\nAr 3.8 0 0\n")
    else:   # VASP's POSCAR: the species line
        p = folder / "POSCAR"
        p.write_text(f"x\n1.0\n10 0 0\n0 10 0\n0 0 10\n{name} Ar\n1 1\nCartesian\n0 0 0\n3.8 0 0\n")
    return p


@pytest.mark.parametrize("fmt, name", [("extxyz", "Xx"), ("extxyz", "Cuu"), ("xyz", "Xx"), ("poscar", "Qq")])
def test_an_unknown_element_names_the_file_and_the_name(tmp_path, capfd, monkeypatch, fmt, name):
    p = _with_unknown(tmp_path, fmt, name)
    before = set(os.listdir(tmp_path))
    code, lines = run_in_process(["run", *SMALL, "steps=2", f"system.file={p}"], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, f"system.file={str(p)!r}", f"unknown element {name!r}", "chemical symbols, H to Og")
    assert set(os.listdir(tmp_path)) == before


def test_an_unknown_element_under_minimize_in_a_real_process(tmp_path):
    p = _with_unknown(tmp_path, "extxyz", "Cuu")
    r = run_engine(["minimize", *SMALL, f"system.file={p}"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    _one_error(r.stderr.strip().splitlines(), "in.extxyz", "unknown element 'Cuu'", "H to Og")
    assert sorted(os.listdir(tmp_path)) == ["in.extxyz"]


# -- file names Hydra's grammar reads only quoted ----------------------------------------------------
def test_non_ascii_spaces_and_equals_in_file_names_run_and_read_back(tmp_path):
    """``system.file=.../dïr x=1/ünï.extxyz`` and ``output=résumé T=1.h5`` as one shell word each,
    unquoted for Hydra: a run on two self-started ranks (which get the names through Hydra again)
    writes them, ``engine info`` reads them, a restart=auto continues them."""
    folder = tmp_path / "dïr x=1"
    folder.mkdir()
    atoms = _argon(5)
    atoms.write(folder / "ünï.extxyz")
    args = ["model=lj", "quiet=true", "threads=1", f"system.file={folder / 'ünï.extxyz'}", "output=résumé T=1.h5",
            "trajectory.every=2", "checkpoint.every=2"]
    r = run_engine(["run", *args, "steps=4", "domains=2"], cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    out = tmp_path / "résumé T=1.h5"
    frames = read_frames(out)
    assert [f.info["step"] for f in frames] == [0, 2, 4]
    assert np.allclose(frames[0].positions, atoms.positions, atol=1e-6)   # as the extxyz holds them
    assert (tmp_path / "résumé T=1.log").is_file() and list((tmp_path / "résumé T=1.ckpt").glob("step-*.h5"))
    r = run_engine(["info", str(out)], cwd=tmp_path)
    assert r.returncode == 0 and "frames: 3" in r.stdout, r.stderr
    r = run_engine(["run", *args, "steps=6", "restart=auto"], cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert [f.info["step"] for f in read_frames(out)] == [0, 2, 4, 6]


@pytest.mark.parametrize("arg, quoted", [("output=a,é.h5", "\"output='a,é.h5'\""),
                                         ("system.file=it's é.xyz", "\"system.file='it\\'s é.xyz'\"")])
def test_a_file_name_hydra_cannot_read_says_how_to_quote_it(tmp_path, capfd, monkeypatch, arg, quoted):
    """Characters that mean something to Hydra (a sweep's comma, a quote) are not quoted for the
    user: the line gives the quoted spelling."""
    code, lines = run_in_process(["run", *SMALL, "steps=2", arg], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, f"cannot read argument {arg!r}", "quoted for Hydra inside the shell's quotes", quoted)
    assert os.listdir(tmp_path) == []


# -- a single atom ------------------------------------------------------------------------------
def _one_atom(folder: Path, velocity=None) -> Path:
    from ase import Atoms

    a = Atoms("Ar", positions=[[1.0, 2.0, 3.0]], cell=[10, 10, 10], pbc=True)
    if velocity is not None:
        a.set_velocities([velocity])
    p = folder / "one.extxyz"
    a.write(p)
    return p


def test_one_atom_under_verlet_has_no_temperature(tmp_path):
    """3N - 3 = 0 degrees of freedom: no thermal velocity is drawn (the only motion would be the
    centre of mass's), and the temperature is 0 K in the log and the trajectory alike; a warning
    says why. Before: 100 K, the atom drifting."""
    p = _one_atom(tmp_path)
    r = run_engine(["run", "model=lj", "threads=1", f"system.file={p}", "steps=10", "temperature=100",
                    "thermo.every=5", "trajectory.every=5", "thermo.progress=false"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines()]
    assert len(lines) == 1 and lines[0].startswith("Warning: the structure holds 1 atom"), lines
    assert "temperature reads 0 K" in lines[0] and "integrator=langevin" in lines[0]
    frames = read_frames(tmp_path / "run.h5")
    assert [f.info["step"] for f in frames] == [0, 5, 10]
    for f in frames:
        assert np.array_equal(f.positions, [[1.0, 2.0, 3.0]]) and not f.get_velocities().any()
    obs = read_observables(tmp_path / "run.h5")
    assert list(obs["temperature"][2]) == [0.0, 0.0, 0.0] and list(obs["kinetic_energy"][2]) == [0.0, 0.0, 0.0]
    rows = [ln.split() for ln in (tmp_path / "run.log").read_text().splitlines() if ln.split()[:1] in (["0"], ["10"])]
    assert [row[2] for row in rows] == ["0.000", "0.000"], rows


def test_one_atom_keeps_the_velocity_it_was_given(tmp_path, capfd, monkeypatch):
    """NVE conserves the given momentum; it is kinetic energy, not temperature (dof 0)."""
    import ase.units

    p = _one_atom(tmp_path, velocity=[0.01 / ase.units.fs, 0, 0])   # 0.01 Å/fs
    code, lines = run_in_process(["run", "model=lj", "quiet=true", "threads=1", f"system.file={p}", "steps=10",
                                  "trajectory.every=10"], tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    last = read_frames(tmp_path / "run.h5")[-1]
    assert np.allclose(last.positions, [[1.1, 2.0, 3.0]], atol=1e-12)
    obs = read_observables(tmp_path / "run.h5")
    assert list(obs["temperature"][2]) == [0.0, 0.0] and min(obs["kinetic_energy"][2]) > 0


@pytest.mark.parametrize("integrator", ["nose-hoover", "csvr", "npt"])
def test_one_atom_under_a_momentum_conserving_thermostat_is_refused(tmp_path, capfd, monkeypatch, integrator):
    p = _one_atom(tmp_path)
    code, lines = run_in_process(["run", "model=lj", "quiet=true", "threads=1", f"system.file={p}", "steps=5",
                                  f"integrator={integrator}"], tmp_path, capfd, monkeypatch)
    assert code == 2
    _one_error(lines, f"integrator={integrator} with 1 atom", "3N - 3 = 0 degrees of freedom", "integrator=langevin")
    assert sorted(os.listdir(tmp_path)) == ["one.extxyz"]


def test_one_atom_under_langevin_has_three_degrees_of_freedom(tmp_path, capfd, monkeypatch):
    p = _one_atom(tmp_path)
    code, lines = run_in_process(["run", "model=lj", "quiet=true", "threads=1", f"system.file={p}", "steps=5",
                                  "integrator=langevin", "trajectory.every=5"], tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    assert read_observables(tmp_path / "run.h5")["temperature"][2][0] == pytest.approx(100.0)


# -- reading a running job's trajectory ----------------------------------------------------------------
def _check_frames(frames, every: int) -> None:
    steps = [f.info["step"] for f in frames]
    assert steps == sorted(set(steps)) and all(s % every == 0 for s in steps), steps
    for f in frames:
        assert len(f) == 108 and np.isfinite(f.positions).all() and np.isfinite(f.get_velocities()).all()
        assert np.isfinite(f.get_forces()).all() and "potential_energy" in f.info, f.info


def test_a_running_jobs_trajectory_reads_while_it_is_written(tmp_path):
    """A live writer (a frame every step, flushed each time) read over and over by this process
    (``read_frames``, ``read_observables``, ``file_summary``, every frame with ``iter_frames``)
    and by ``engine info``: every read gives committed, complete frames; a frame read live is
    bit for bit the frame the finished file holds; the writer ends with 0. HDF5 keeps no file
    consistent for a reader while another process writes it: reads that met the writer between
    two flushes failed before ("addr overflow"); they are read again now (engine/io/h5md_live.py)."""
    from shardmd.engine.io.h5md import iter_frames

    every, steps = 1, 1000
    out = tmp_path / "run.h5"
    writer = subprocess.Popen([sys.executable, "-m", "engine", "run", *SMALL, f"steps={steps}",
                               f"trajectory.every={every}", "thermo.every=10", "checkpoint.every=500"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[int, np.ndarray] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and writer.poll() is None:   # until some frames are in
            if out.exists() and os.path.exists(f"{out}.lock"):
                try:
                    if len(read_frames(out, slice(-1, None))) and file_summary(out)["n_frames"] >= 20:
                        break
                except Exception:  # noqa: BLE001 - the file is being created
                    pass
            time.sleep(0.05)
        assert writer.poll() is None, f"the writer ended ({writer.returncode}) first: {writer.stderr.read()}"
        info = subprocess.Popen([sys.executable, "-m", "engine", "info", str(out)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reads, counts = 0, []
        while writer.poll() is None:   # the whole life of the writer
            last = read_frames(out, slice(-3, None))
            _check_frames(last, every)
            obs = read_observables(out)
            summary = file_summary(out)
            assert summary["n_atoms"] == 108
            counts.append(summary["n_frames"])
            for name, (osteps, _, _) in obs.items():
                assert list(osteps) == sorted(set(osteps)), name
            if reads % 20 == 0:   # every frame, one at a time, from one open
                frames = list(iter_frames(out))
                _check_frames(frames, every)
                seen.update({f.info["step"]: f.positions.copy() for f in frames[::50]})
            seen.update({f.info["step"]: f.positions.copy() for f in last})
            reads += 1
        text, err = info.communicate(timeout=240)
        assert info.returncode == 0 and not err.strip(), err
        assert "atoms: 108" in text and "frames: " in text, text
        live_frames = int(text.split("frames: ")[1].split()[0])
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.wait(timeout=240) == 0, writer.stderr.read()
    final = read_frames(out)
    assert [f.info["step"] for f in final] == list(range(0, steps + 1, every))
    _check_frames(final, every)
    by_step = {f.info["step"]: f.positions for f in final}
    assert seen and all(np.array_equal(by_step[s], p) for s, p in seen.items())
    # the reads were of a file being written: it grew after them
    assert counts == sorted(counts) and counts[0] < len(final) and live_frames < len(final), (counts, live_frames)
    assert reads >= 3
    assert run_engine(["info", str(out)], cwd=tmp_path).returncode == 0


def test_other_hdf5_readers_open_a_running_jobs_file_without_the_lock(tmp_path):
    """docs/design.md: HDF5_USE_FILE_LOCKING=FALSE lets plain h5py (and MDAnalysis, which opens
    through it) open the file a running job holds; with the lock it is refused."""
    out = tmp_path / "run.h5"
    writer = subprocess.Popen([sys.executable, "-m", "engine", "run", *SMALL, "steps=1000000",
                               "trajectory.every=50", "thermo.every=0", "checkpoint.every=0"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    probe = "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); print(len(f['particles/all/box/edges/step']))"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and writer.poll() is None and not (
                out.exists() and os.path.exists(f"{out}.lock") and _frames_or_zero(out) >= 2):
            time.sleep(0.05)
        assert writer.poll() is None, writer.stderr.read()
        locked = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True)
        assert locked.returncode != 0 and "unable to lock file" in locked.stderr, locked
        env = {**os.environ, "HDF5_USE_FILE_LOCKING": "FALSE"}
        unlocked = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True, env=env)
        assert unlocked.returncode == 0 and int(unlocked.stdout) >= 2, unlocked
        assert writer.poll() is None
    finally:
        writer.terminate()
        assert writer.wait(timeout=600) == 75, writer.stderr.read()
    with h5py.File(out, "r") as f:
        assert "particles" in f


def _frames_or_zero(path: Path) -> int:
    try:
        return len(read_frames(path))
    except Exception:  # noqa: BLE001 - not there yet
        return 0


# -- minimize over an existing relaxed structure -------------------------------------------------------
@pytest.mark.parametrize("named", [True, False])
def test_minimize_refuses_an_existing_relaxed_structure_without_overwrite(tmp_path, named):
    """Another output, the same relaxed structure (named, or the default output name with
    .extxyz): refused naming the file and overwrite=true, the file untouched; with
    overwrite=true it is replaced."""
    keep = "5\nnot a structure, but the user's\n"
    target = tmp_path / ("relaxed.extxyz" if named else "relax.extxyz")
    target.write_text(keep)
    args = ["minimize", *SMALL, "minimize.steps=3", "output=relax.h5",
            *(["minimize.structure=relaxed.extxyz"] if named else [])]
    r = run_engine(args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    _one_error(r.stderr.strip().splitlines(), f"the relaxed structure {target.name!r}", "exists",
               "add overwrite=true", "minimize.structure")
    assert target.read_text() == keep and sorted(os.listdir(tmp_path)) == [target.name]
    r = run_engine([*args, "overwrite=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from ase.io import read

    assert len(read(target)) == 108
