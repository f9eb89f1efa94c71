"""The command line as users type it, in real subprocesses from a foreign working directory;
refusals, one-rank runs and the file commands through ``cli.main`` in this process
(``cli_here``: ~4 s of CPU less each, the same exit status, stdout and stderr)."""
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from ase.build import bulk
from ase.io import read, write
from conftest import cli_in_process

from shardmd.engine.io.h5md import read_frames

SMALL = ["system.repeat=[3,3,3]", "steps=20", "thermo.every=10", "trajectory.every=10"]


@pytest.fixture
def cli_here(capfd, monkeypatch):
    """engine_cli's call, answered by cli.main in this process (conftest.cli_in_process)."""
    return lambda args, cwd: cli_in_process(args, cwd, capfd, monkeypatch)


@pytest.fixture
def hostile_cwd(tmp_path):
    """A working directory holding a user's own models.py and domain/ package."""
    (tmp_path / "models.py").write_text("raise SystemExit('user models.py was imported')\n")
    (tmp_path / "domain").mkdir()
    (tmp_path / "domain" / "__init__.py").write_text("raise SystemExit('user domain/ was imported')\n")
    (tmp_path / "integrators.py").write_text("raise SystemExit('user integrators.py was imported')\n")
    return tmp_path


@pytest.mark.parametrize("spelling", [
    ["+model=lj"], ["model=lj"], ["model=lj", "domains=1"], ["+model=lj", "+domains=1"],
    ["model=lj", "integrator=langevin", "temperature=50", "seed=3", "dt=2.0"],
    ["++model=lj", "+integrator=verlet", "precision=float32", "output=sub/dir/x.h5"],
])
def test_spellings_run(engine_cli, cli_here, hostile_cwd, spelling):
    # the first spelling in a real subprocess from the hostile folder; the others through
    # cli.main here (what they test is Hydra's parsing, the same in either)
    run = engine_cli if spelling == ["+model=lj"] else cli_here
    r = run(["run", *spelling, *SMALL, "quiet=true"], cwd=hostile_cwd)
    assert r.returncode == 0, r.stderr
    out = next(a.split("=", 1)[1] for a in spelling + ["output=run.h5"] if a.startswith("output="))
    frames = read_frames(hostile_cwd / out)
    assert [f.info["step"] for f in frames] == [0, 10, 20]
    assert (hostile_cwd / out).with_suffix(".log").read_text().count("Step") == 1


def test_terminal_output_has_thermo_and_rates(engine_cli, tmp_path):
    r = engine_cli(["run", "model=lj", *SMALL], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "TotEng(eV)" in r.stdout and "Press(bar)" in r.stdout
    assert "steps/s" in r.stderr and "ns/day" in r.stderr and "ETA" in r.stderr
    assert "atom-steps/s" in r.stdout


def test_quiet_prints_nothing_but_logs(engine_cli, tmp_path):
    r = engine_cli(["run", "model=lj", *SMALL, "quiet=true"], cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert "TotEng(eV)" in (tmp_path / "run.log").read_text()


def test_mace_and_domains_are_accepted_by_the_config(engine_cli, tmp_path):
    """`+model=mace +domains=8` parses; it fails with a one-line 'not available' message
    until those issues land (never a traceback, never an unknown-key error)."""
    r = engine_cli(["run", "+model=mace", "+domains=8", *SMALL], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    if r.returncode != 0:
        assert len(lines) == 1 and lines[0].startswith("error:") and "unknown" not in lines[0], r.stderr


@pytest.mark.parametrize("args, needle", [
    (["run", "model=lj", "tempreature=3"], "did you mean 'temperature'"),
    (["run", "model=lj", "+stpes=3"], "did you mean 'steps'"),
    (["run", "model=lj", "neighbor.skn=1"], "did you mean 'neighbor.skin'"),
    (["run"], "no model given"),
    (["run", "steps=10"], "lj"),
    (["run", "model=nope"], "choose one of"),
    (["run", "model=lj", "dt=-1"], "dt="),
    (["run", "model=lj", "steps=ten"], "steps="),
    (["run", "model=lj", "precision=half"], "float32 or float64"),
    (["run", "model=lj", "system.file=missing.xyz"], "missing.xyz"),
    (["run", "model=lj", "integrator=leapfrog"], "choose one of"),
    (["run", "model=lj", "system.element=Kr"], "Kr"),
    (["run", "model=lj", "trajectory.fields=[position,spin]"], "spin"),
    (["run", "model=lj", "steps=[1,2"], "cannot read"),
    (["run", "model=lj", "neighbor.pipelined=maybe"], "neighbor.pipelined"),
    (["run", "model=mace", "model.cuda_graph=maybe"], "model.cuda_graph"),
    (["fly"], "unknown command"),
    # forms that once gave Hydra's raw messages
    (["run", "model=lj", "integrator.friction=0.1"], "add integrator=langevin"),
    (["run", "model=mace", "model.cutoff=5"],
     "model.cutoff is a key of model=lj or model=morse or model=coulomb or model=d3 only (this run has model=mace)"),
    (["run", "model=lj", "~seed"], "keys that can be removed: grid"),
    (["run", "model=lj", "temperature=100,200"], "add -m (--multirun)"),
    (["run", "model=lj", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "model=lj", "model.pairs={Ar-Kr: {epsilon: 0.012, sigm: 3.5}}"], "model.pairs.Ar-Kr.sigm"),
])
def test_bad_input_is_one_line(cli_here, tmp_path, args, needle):
    r = cli_here(args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("maps", [
    ["model.pairs={Ar-Kr: {epsilon: 0.012, sigma: 3.5}}"],
    ["model.epsilon={Ar: 0.0104, Kr: 0.014}", "model.sigma={Ar: 3.40, Kr: 3.65}"],
    ["model.epsilon.Kr=0.014", "model.sigma.Kr=3.65", "model.pairs.Ar-Kr.epsilon=0.012", "model.pairs.Ar-Kr.sigma=3.5"],
])
def test_readme_map_forms_run(cli_here, tmp_path, maps):
    """README's map values (each one argument, as the shell passes a quoted one) compose and run."""
    import yaml

    r = cli_here(["run", "model=lj", *maps, "--cfg", "job"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    model = yaml.safe_load(r.stdout)["model"]
    assert model["epsilon"]["Ar"] == 0.0104 and model["sigma"]["Ar"] == 3.4
    for m in maps:
        key, value = m.split("=", 1)
        got = model
        for part in key.split(".")[1:]:
            got = got[part]
        assert got == (yaml.safe_load(value) if value.startswith("{") else float(value)), m
    r = cli_here(["run", "model=lj", *maps, *SMALL, "quiet=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_help(engine_cli, tmp_path):
    r = engine_cli(["--help"], cwd=tmp_path)
    assert r.returncode == 0
    for key in ("steps", "dt", "temperature", "neighbor.skin", "trajectory.every", "model.cutoff"):
        assert key in r.stdout


def test_import_engine_with_user_modules(hostile_cwd):
    code = "import engine, sys; sim = engine.Simulation; print(sim.__module__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=hostile_cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "shardmd.engine.run.simulation" in r.stdout


def test_structure_file_with_velocities(cli_here, tmp_path):
    atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((3, 3, 3))
    rng = np.random.default_rng(0)
    atoms.set_velocities(rng.normal(0, 0.01, (len(atoms), 3)))
    atoms.set_masses(np.full(len(atoms), 40.0))
    write(tmp_path / "in.extxyz", atoms)
    r = cli_here(["run", "model=lj", "system.file=in.extxyz", "steps=0", "quiet=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    f = read_frames(tmp_path / "run.h5")[0]
    given = read(tmp_path / "in.extxyz")  # extxyz stores momenta with 8 decimals
    assert np.allclose(f.get_velocities(), given.get_velocities(), rtol=1e-12, atol=1e-15)
    assert not np.allclose(f.get_velocities(), 0)
    assert np.allclose(f.get_masses(), 40.0)


def test_sigkill_mid_run_keeps_every_flushed_frame(tmp_path):
    """A real run killed with SIGKILL: the file opens with plain h5py and holds every frame
    whose thermo line reached the log (frames are written before their thermo line)."""
    p = subprocess.Popen([sys.executable, "-m", "engine", "run", "model=lj", "system.repeat=[3,3,3]",
                          "steps=1000000", "thermo.every=5", "trajectory.every=5", "quiet=true"],
                         cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = tmp_path / "run.log"
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.exists() and log.read_text().count("\n") > 12:
            break
        time.sleep(0.2)
    time.sleep(0.37)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    logged = [int(line.split()[0]) for line in log.read_text().splitlines()
              if line.strip() and line.split()[0].isdigit()]
    assert len(logged) > 8
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert f["particles/all/position/value"].shape[1] == 108
    steps = [fr.info["step"] for fr in read_frames(tmp_path / "run.h5")]
    assert set(logged) <= set(steps)
    assert steps == list(range(0, 5 * len(steps), 5))


def test_info_and_plot(cli_here, tmp_path):
    assert cli_here(["run", "model=lj", *SMALL, "quiet=true"], cwd=tmp_path).returncode == 0
    r = cli_here(["info", "run.h5"], cwd=tmp_path)
    assert r.returncode == 0 and "atoms: 108" in r.stdout and "frames: 3" in r.stdout and "model: lj" in r.stdout
    ck = sorted((tmp_path / "run.ckpt").iterdir())[-1]
    r = cli_here(["info", str(ck)], cwd=tmp_path)
    assert r.returncode == 0 and "checkpoint" in r.stdout and "step: 20" in r.stdout
    r = cli_here(["plot", "run.h5", "e.png"], cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    r = cli_here(["info", "missing.h5"], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
