"""Bring your own model, end to end: a model file of the user's own in a
working directory, on the CLI (``model=py:module:factory``) across domains, self-launched and
under mpiexec, against one domain; the entry-point route of the shipped models; a model
without a virial; restarts with another model; the Python API under a launcher; hostile
factories (one-line errors); and docs/byo.md's code, run as written.

Real processes where the route is the product (the CLI, mpiexec); in-process Simulations
for the cheap checks."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mpiexec_cmd

from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md import read_frames
from shardmd.engine.run.simulation import Simulation

ROOT = Path(__file__).resolve().parents[1]
BYO = (ROOT / "docs" / "byo.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)\n```", BYO, re.S)
#: the tutorial's model file (docs/byo.md, "1. Write the model")
MODEL_SRC = next(body for lang, body in BLOCKS if lang == "python" and body.startswith("# mymodel.py"))
SMALL = ["system.repeat=[3,3,3]", "quiet=true"]


def _env(cwd: Path) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _run(argv, cwd, timeout=300):
    return subprocess.run(argv, cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=timeout)


def _engine(args, cwd, timeout=300):
    return _run([sys.executable, "-m", "engine", "run", *args], cwd, timeout)


def _final_positions(path: Path) -> np.ndarray:
    return read_frames(str(path))[-1].positions


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A working directory holding the user's model file under a module name of its own (in-process
    runs import it; a fresh name per test keeps sys.modules from mixing them)."""
    name = f"usermodel_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(MODEL_SRC + HOSTILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, name
    sys.modules.pop(name, None)


HOSTILE = '''

def raises(**kw):
    raise RuntimeError("weights not found: /nowhere/w.pt")


class NoCutoff:
    def compute(self, positions, cell, pbc, numbers, nl):
        return {}


def no_cutoff():
    return NoCutoff()


class NaNForces(TinyMPNN):
    def compute(self, positions, cell, pbc, numbers, nl):
        out = super().compute(positions, cell, pbc, numbers, nl)
        return {"energy": out["energy"], "forces": positions.new_full((positions.shape[0], 3), float("nan"))}


def nan_forces():
    m = NaNForces()
    m.output_kinds = {"energy": "per_system", "forces": "per_point"}
    return m
'''


def _sim(args, **kw):
    return Simulation(compose_config(args), **kw)


# -- the CLI route across domains (acceptance) ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.mpi
def test_py_route_self_launched_and_mpiexec_match_one_domain(tmp_path):
    """The whole route of a user's model: the user's mymodel.py (make()) in a working directory of
    its own, outside the repository, `python -m engine run model=py:mymodel:make domains=4` and
    the same under `mpiexec -n 4` (the venv's), against domains=1: final positions after 30
    steps (float64) to 1e-10 Å, migrations included. One launch each (the tutorial's test runs
    the 2-domain pair)."""
    (tmp_path / "mymodel.py").write_text(MODEL_SRC)
    args = ["model=py:mymodel:make", *SMALL, "steps=30", "trajectory.every=30", "checkpoint.every=0",
            "temperature=300", "neighbor.skin=0.3"]   # a thin skin: rebuilds, so atoms migrate
    r1 = _engine([*args, "output=d1.h5"], tmp_path)
    assert r1.returncode == 0, r1.stderr
    r4 = _engine([*args, "output=d4.h5", "domains=4"], tmp_path)
    assert r4.returncode == 0, r4.stderr
    mpiexec = Path(sys.executable).parent / "mpiexec"
    assert mpiexec.exists(), "mpiexec of the venv (pip install mpich) is missing"
    rm = _run([str(mpiexec), "-n", "4", sys.executable, "-m", "engine", "run", *args, "output=m4.h5"], tmp_path)
    assert rm.returncode == 0, rm.stderr
    one = _final_positions(tmp_path / "d1.h5")
    for name in ("d4.h5", "m4.h5"):
        assert np.abs(_final_positions(tmp_path / name) - one).max() <= 1e-10, name
    log = (tmp_path / "d4.log").read_text()
    assert "model py:mymodel:make, factory mymodel:make" in log and "mymodel.py sha256" in log
    assert "domains 4" in log and "domains 4" in (tmp_path / "m4.log").read_text()
    moved = [int(m) for m in re.findall(r"(\d+) atom migrations", log)]
    assert moved and moved[-1] > 0, "the 30 steps moved no atom between domains: the test would not cover it"


@pytest.mark.slow
@pytest.mark.mpi
def test_python_api_under_mpiexec_builds_the_group_and_gathers(tmp_path):
    """No init_comm, no comm=, no domains=: the launcher's 2 ranks; sim.atoms() on rank 0 only."""
    (tmp_path / "mymodel.py").write_text(MODEL_SRC)
    (tmp_path / "api.py").write_text(
        "import numpy as np\n"
        "from shardmd.engine.config.compose import compose_config\n"
        "from shardmd.engine.run.simulation import Simulation\n"
        "import sys\n"
        "sim = Simulation(compose_config(['model=py:mymodel:make', 'system.repeat=[3,3,3]', 'quiet=true', "
        "'steps=10', 'output=' + sys.argv[1]]))\n"
        "sim.run()\n"
        "atoms = sim.atoms()\n"
        # one write per rank: print's pieces from two ranks interleave on an unbuffered stdout
        "sys.stdout.write(f'rank {sim.comm.rank} of {sim.comm.size} local {len(sim.state.ids)} '\n"
        "                 f'gathered {None if atoms is None else len(atoms)}\\n')\n"
        "if atoms is not None:\n"
        "    np.save(sys.argv[1] + '.npy', atoms.positions)\n")
    r1 = _run([sys.executable, "api.py", "one.h5"], tmp_path)
    assert r1.returncode == 0, r1.stderr
    r2 = _run(mpiexec_cmd(2, ["api.py", "two.h5"]), tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert "rank 0 of 2" in r2.stdout and "rank 1 of 2" in r2.stdout and "gathered None" in r2.stdout
    assert "gathered 108" in r2.stdout
    a, b = np.load(tmp_path / "one.h5.npy"), np.load(tmp_path / "two.h5.npy")
    assert np.abs(a - b).max() <= 1e-10


@pytest.mark.slow
def test_torchrun_is_two_ranks(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed in this environment")
    r = _run([str(torchrun), "--nproc-per-node", "2", "-m", "engine", "run", "model=lj", "system.repeat=[4,4,4]",
              "steps=3", "quiet=true"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "domains 2 (grid 2x1x1)" in (tmp_path / "run.log").read_text()


# -- the entry-point route -------------------------------------------------------------------------
def test_shipped_models_come_through_the_entry_point_group():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="shardmd.models")}
    assert eps["lj"] == "shardmd.models.registry:lj" and eps["mace"] == "shardmd.models.registry:mace"


def test_entry_point_lj_gives_the_trajectory_of_the_model_itself(tmp_path):
    """model=lj (through the entry point) against the same LJ object given to Simulation: same bits."""
    from shardmd.models.lj import LennardJones
    from shardmd.models.lj_op import LennardJonesOp

    base = ["model=lj", "system.repeat=[4,4,4]", "steps=10", "quiet=true", "trajectory.every=0",
            "checkpoint.every=0"]
    a = _sim([*base, f"output={tmp_path / 'a.h5'}"])
    a.run()
    b = _sim([*base, f"output={tmp_path / 'b.h5'}"],
             model=LennardJonesOp(LennardJones(epsilon={"Ar": 0.0104}, sigma={"Ar": 3.40}, cutoff=8.5)))
    b.run()
    assert np.array_equal(a.atoms().positions, b.atoms().positions)


def test_wrapped_model_is_accepted(user_dir):
    from shardmd.domain.api import SPEC_MPNN_HALO, DistributedModel

    tmp, name = user_dir
    mod = __import__(name)
    sim = _sim(["model=lj", *SMALL, "steps=2", "trajectory.every=0", "checkpoint.every=0", "output=w.h5"],
               model=DistributedModel(mod.make(), spec=SPEC_MPNN_HALO))
    sim.run()
    assert sim.model_origin["route"].startswith("api:") and "TinyMPNN" in sim.model_origin["route"]
    from shardmd.engine.io.checkpoint import newest_valid

    _, ck = newest_valid(tmp / "w.ckpt")   # the checkpoint names the model given, not the config's lj
    assert ck["config"]["model"]["name"] == sim.model_origin["route"] and ck["model_name"].startswith("api:")
    with pytest.raises(UserError, match="another model|change model"):   # a restart with the config's lj
        _sim(["model=lj", *SMALL, "steps=4", "restart=auto", "output=w.h5"])


def test_ase_calculator_takes_the_cli_routes(user_dir):
    """ShardMDCalculator(model="py:module:factory", **factory arguments): the engine's own model,
    the same energy and forces as the engine's step 0; its record makes the same calculator; a
    wrong argument is one line."""
    from ase.build import bulk
    from ase.io import read

    from shardmd.engine.ase_calculator import ShardMDCalculator

    tmp, name = user_dir
    rattled = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    rattled.rattle(0.1, seed=4)
    rattled.write(tmp / "ar.extxyz")
    sim = _sim([f"model=py:{name}:make", "model.features=4", "system.file=ar.extxyz", "quiet=true", "steps=0",
                "trajectory.every=0", "checkpoint.every=0", "output=c.h5"])
    sim.run(0)
    ref = sim.atoms()
    forces = sim.domain.gather(sim.state, ("forces",))["forces"]
    atoms = ref.copy()
    atoms.calc = calc = ShardMDCalculator(model=f"py:{name}:make", features=4, skin=0.5)
    assert abs(atoms.get_potential_energy() - float(sim.results["energy"])) <= 1e-12 * abs(float(sim.results["energy"]))
    assert np.abs(atoms.get_forces() - forces).max() <= 1e-12 * np.abs(forces).max()
    p = calc.todict()
    assert p["model"] == f"py:{name}:make" and p["features"] == 4 and "stress" not in calc.results
    again = ref.copy()
    again.calc = ShardMDCalculator(**p)
    assert again.get_potential_energy() == atoms.get_potential_energy()
    write_path = tmp / "t.traj"
    atoms.write(write_path)
    assert read(write_path).calc.parameters == p
    with pytest.raises(ValueError) as exc:
        ShardMDCalculator(model=f"py:{name}:make", width=3)
    assert "no parameter width" in str(exc.value) and "features" in str(exc.value) and "\n" not in str(exc.value)


# -- no virial ------------------------------------------------------------------------------------
def test_model_without_virial_runs_without_pressure_and_says_so_once(user_dir):
    tmp, name = user_dir
    sim = _sim([f"model=py:{name}:make", *SMALL, "steps=4", "thermo.every=1", "trajectory.every=2",
                "checkpoint.every=0", "output=nv.h5"])
    final = sim.run()
    assert final["pressure"] is None and final["stress"] is None and np.isfinite(final["total_energy"])
    log = (tmp / "nv.log").read_text()
    assert log.count("the model gives no virial") == 1
    rows = [ln for ln in log.splitlines() if re.match(r"\s+\d+\s+\d", ln)]
    assert len(rows) == 5 and all(ln.split()[6] == "-" for ln in rows)
    import h5py

    with h5py.File(tmp / "nv.h5") as f:
        assert "potential_energy" in f["observables"] and "pressure" not in f["observables"]


# -- identity and restarts -------------------------------------------------------------------------
def test_identity_in_header_checkpoint_and_restart_with_another_model_refused(user_dir):
    tmp, name = user_dir
    common = [*SMALL, "trajectory.every=2", "checkpoint.every=2", "output=r.h5"]
    _sim([f"model=py:{name}:make", "steps=2", *common]).run()
    log = (tmp / "r.log").read_text()
    assert f"model py:{name}:make, factory {name}:make" in log and f"{name}.py sha256" in log
    from shardmd.engine.io.checkpoint import newest_valid

    _, ck = newest_valid(tmp / "r.ckpt")
    assert ck["model_name"] == f"py:{name}:make" and "no LJ" not in log
    # the same model continues
    _sim([f"model=py:{name}:make", "steps=4", "restart=auto", *common]).run()
    # another model, or the same factory with other arguments, is refused in one line
    for other in (["model=lj"], [f"model=py:{name}:make", "model.features=4"]):
        with pytest.raises(UserError) as exc:
            _sim([*other, "steps=6", "restart=auto", *common])
        msg = str(exc.value)
        assert ("another model" in msg or "change model" in msg) and "restart.allow_changes=true" in msg
        assert "\n" not in msg
    # allowed on request (different factory arguments: same shapes would be needed for lj; use features)
    _sim([f"model=py:{name}:make", "model.features=4", "steps=6", "restart=auto", "restart.allow_changes=true",
          *common]).run()


# -- hostile ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("route, words", [
    ("py:nope_no_such_module:make", ["no module 'nope_no_such_module'", "working directory"]),
    ("py:os:getcwd", ["returned str, not a model", "compute("]),
    ("py:{m}:raises", ["the factory raised RuntimeError: weights not found", "fix the factory"]),
    ("py:{m}:no_cutoff", ["without a usable cutoff", "attribute cutoff"]),
    ("py:{m}:nothere", ["has no 'nothere'"]),
    ("py:{m}:torch", ["not callable"]),
])
def test_hostile_factories_are_one_line(user_dir, route, words):
    tmp, name = user_dir
    with pytest.raises(UserError) as exc:
        _sim([f"model={route.format(m=name)}", *SMALL, "steps=1", "output=h.h5"])
    msg = str(exc.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(UserError) as exc:
        compose_config(["model=schnet"])
    assert "lj, mace" in str(exc.value) and "py:module:factory" in str(exc.value)


def test_nan_forces_stop_the_run_with_status_3(user_dir):
    tmp, name = user_dir
    sim = _sim([f"model=py:{name}:nan_forces", *SMALL, "steps=3", "output=n.h5"])
    with pytest.raises(UserError) as exc:
        sim.run()
    assert exc.value.exit_code == 3 and "not finite" in str(exc.value)


def test_cli_errors_are_one_line_with_status_2(tmp_path):
    r = _engine(["model=py:nope_no_such_module:make", "steps=1"], tmp_path)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no module" in lines[0], r.stderr


# -- docs/byo.md runs as written -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.mpi
def test_byo_tutorial(tmp_path):
    """Every code block of docs/byo.md: files named in their first line are written, the bash
    commands run in order (this venv's python and mpiexec first on PATH), then the unnamed
    Python blocks run."""
    unnamed = []
    for lang, body in BLOCKS:
        first = body.splitlines()[0]
        m = re.fullmatch(r"# (\w+\.py)(:.*)?", first)
        if lang == "python" and m:
            (tmp_path / m.group(1)).write_text(body)
        elif lang == "python":
            unnamed.append(body)
    for lang, body in BLOCKS:
        if lang != "bash":
            continue
        for line in body.splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            if argv[0] == "python":
                argv[0] = sys.executable
            if argv[0] == "mpiexec":
                argv = mpiexec_cmd(int(argv[2]), [a for a in argv[4:]])
            r = _run(argv, tmp_path, timeout=600)
            assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    for i, code in enumerate(unnamed):
        (tmp_path / f"block{i}.py").write_text(code)
        r = _run([sys.executable, f"block{i}.py"], tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]


def test_factory_arguments_named_like_another_models_keys_reach_the_factory():
    """``model.cutoff`` or ``model.epsilon.Kr`` under ``model=py:...`` are the factory's arguments,
    not LJ's keys refused as "a key of model=lj or model=morse only"."""
    from shardmd.engine.config.compose import to_container

    cfg = compose_config(["model=py:mymodel:make", "model.cutoff=4.5", "model.epsilon.Kr=0.3",
                          "model.features=8", "steps=0"])
    node = to_container(cfg.model)
    assert (node["cutoff"], node["epsilon"], node["features"]) == (4.5, {"Kr": 0.3}, 8), node
    with pytest.raises(UserError, match="model.cutoff"):   # under LJ the key is LJ's, and checked
        compose_config(["model=lj", "model.cutoff=-1"])


def test_a_pretrained_name_routes_to_its_family(tmp_path, capfd, monkeypatch):
    """``model.name=7net-0`` is ``model=sevennet model.checkpoint=7net-0``; without sevenn installed
    (this environment: mace-torch's e3nn excludes it) the run says how to install it, in one line."""
    from conftest import cli_in_process

    from shardmd.models.registry import canonical

    assert canonical({"name": "7net-0", "dtype": "float32"}) == {"name": "sevennet", "checkpoint": "7net-0",
                                                                 "dtype": "float32"}
    assert canonical({"name": "mace"}) == {"name": "mace"}
    pytest.importorskip("mace")   # the main environment, where sevenn cannot be
    r = cli_in_process(["run", "model=sevennet", "model.name=7net-0", "system.lattice=fcc", "system.element=Cu",
                        "system.a=3.61", "system.repeat=[2,2,2]", "steps=1"], tmp_path, capfd, monkeypatch)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "pip install 'sevenn==0.13.0'" in lines[0], r.stderr
