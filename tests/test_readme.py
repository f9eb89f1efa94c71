"""The README's promises: every ```bash command and ```python block in it runs, its first two
commands are what CI runs, its key table is the schema's.

How the commands run (each README block in a folder of its own, its commands in order, with
this venv's ``python`` and ``mpiexec`` first on PATH):

- The first command (install + default run) runs its engine part verbatim,
  ``python -m engine run +model=mace +domains=8`` (slow tier), and its frames must hold
  mace-torch's own energies and forces; the install is CI's job. The
  second (install + pytest) is CI itself (``.ci/run``): checked to be identical, not run.
- ``python -m engine run`` commands get overrides appended that shorten them: ``steps=`` a
  hundredth of the command's own (or 10), and ``system.repeat=[4,4,4]`` (256 atoms) unless
  the command names the system. Sweeps, restarts and domain counts are kept as written.
- SLURM is not on CI: stand-ins on PATH run ``sbatch --array=A-B --wrap CMD`` as SLURM would
  (each array task in turn, with SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID set) and
  ``srun -n K CMD`` as ``mpiexec -n K CMD``.
- Files a block names are made first: ``my.extxyz`` (108 Ar atoms) and README's ```yaml
  blocks under the name in their first line (``# argon.yaml``).
- Commands with ``device=cuda`` carry the gpu marker (skipped without CUDA).
"""
import os
import re
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shardmd.engine.config.help import KEYS
from shardmd.engine.launch.parallel import find_mpiexec

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)\n```", TEXT, re.S)


def _commands(body: str) -> list[list[str]]:
    body = body.replace("\\\n", " ")
    return [argv for line in body.splitlines() if (argv := shlex.split(line, comments=True))]


def _readme_commands():
    return [body for lang, body in BLOCKS if lang == "bash"][:2]


def shortened(argv: list[str]) -> list[str]:
    """A README command as the test runs it (see the module's docstring)."""
    if argv[0] == "sbatch" and "--wrap" in argv:
        i = argv.index("--wrap") + 1
        return [*argv[:i], shlex.join(shortened(shlex.split(argv[i]))), *argv[i + 1:]]
    if not any(a == "engine" and argv[i + 1:i + 2] == ["run"] for i, a in enumerate(argv)):
        return argv
    steps = [int(a.split("=")[1]) for a in argv if re.fullmatch(r"\+*steps=\d+", a)]
    extra = [f"steps={max(1, steps[-1] // 100)}" if steps else "steps=10"]
    if not any(re.match(r"\+*(system\.(repeat|file)|config)=", a) for a in argv):
        extra.append("system.repeat=[4,4,4]")
    return argv + extra


STAND_INS = {
    "sbatch": f"""#!{sys.executable}
# stand-in for SLURM's sbatch: runs --wrap CMD once per --array task, in turn
import os, subprocess, sys
args = sys.argv[1:]
wrap = args[args.index("--wrap") + 1]
arr = next((a.split("=", 1)[1] for a in args if a.startswith("--array=")), "0")
lo, hi = (int(x) for x in (arr.split("-") + [arr])[:2])
for task in range(lo, hi + 1):
    env = dict(os.environ, SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID=str(task), SLURM_JOB_ID=str(4243 + task))
    code = subprocess.run(["bash", "-c", wrap], env=env).returncode
    if code:
        sys.exit(code)
""",
    "srun": f"""#!{sys.executable}
# stand-in for SLURM's srun: srun -n K CMD runs as mpiexec -n K CMD
import os, shutil, sys
args = sys.argv[1:]
n = "1"
if args and args[0] == "-n":
    n, args = args[1], args[2:]
# CMD resolved on this PATH, as srun does with the job's: some mpiexec builds (OpenMPI on the
# GPU image) put their own prefix first on the ranks' PATH, where `python` has no torch
args[0] = shutil.which(args[0]) or args[0]
mpiexec = {find_mpiexec()!r}
os.execv(mpiexec, [mpiexec, "-n", n, *args])
""",
}


@pytest.fixture(scope="module")
def block_dirs(tmp_path_factory):
    """One folder per README block (made on first use), and the environment commands run in."""
    from ase.build import bulk

    bin_dir = tmp_path_factory.mktemp("bin")
    # `python` in a README command is this interpreter: on some machines (the GPU image) the
    # `python` beside sys.executable or first on PATH is another one, without torch
    stand_ins = dict(STAND_INS, python=f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    for name, code in stand_ins.items():
        (bin_dir / name).write_text(code)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    dirs: dict[int, Path] = {}

    def get(i: int) -> Path:
        if i not in dirs:
            d = dirs[i] = tmp_path_factory.mktemp(f"block{i}")
            bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3)).write(d / "my.extxyz")
            for lang, body in BLOCKS:
                m = re.match(r"# (\S+\.ya?ml)\n", body)
                if lang == "yaml" and m:
                    (d / m.group(1)).write_text(body)
        return dirs[i]

    return get, env


def _cases():
    cases = []
    run_cmd, _ = _readme_commands()
    engine = run_cmd.rsplit("&& .venv/bin/", 1)[1].split()
    cases.append(pytest.param(0, engine, id="first command: " + shlex.join(engine),
                              marks=[pytest.mark.slow, pytest.mark.mpi]))
    bash = [body for lang, body in BLOCKS if lang == "bash"]
    for i, body in enumerate(bash[2:], start=2):
        for argv in _commands(body):
            # --cfg, --help, --version: a second each, and no earlier command's files needed
            cheap = any(a in ("--cfg", "--help", "--version") for a in argv)
            marks = [] if cheap else [pytest.mark.slow]
            if any(a.startswith("device=cuda") for a in shlex.split(" ".join(argv))):
                marks.append(pytest.mark.gpu)
            if any(a in ("mpiexec", "srun") or a.startswith("domains=") for a in argv):
                marks.append(pytest.mark.mpi)
            cases.append(pytest.param(i, argv, id=shlex.join(argv)[:90], marks=marks))
    return cases


@pytest.mark.parametrize("block, argv", _cases())
def test_readme_command_runs(block_dirs, block, argv):
    get, env = block_dirs
    if find_mpiexec() is None and any(a in ("mpiexec", "srun") or a.startswith(("domains=", "+domains="))
                                      for a in argv):
        pytest.skip("no mpiexec here (the GPU machine's image has no MPI): pip install mpich")
    argv = argv if block == 0 else shortened(argv)   # the default run as written: its 20 steps
    r = subprocess.run(argv, cwd=get(block), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr
    if block == 0:
        _holds_mace_calculators_forces(get(0))


def _holds_mace_calculators_forces(folder: Path) -> None:
    """The headline job (`+model=mace +domains=8`: the shipped model, the default Cu system,
    8 ranks) against mace-torch's own calculator: at the first and last frames (steps 0, 20) the
    trajectory's forces and the log's potential energy are those MACECalculator gives for the
    frame's positions (float64), total energy holds (NVE), and the atoms moved. (A 1-domain
    run of the same job cost ~45 s of CPU more; 8 and 1 domains giving the same trajectory bit
    for bit is test_decomposed_runs' for LJ, and MACE on 2 and 4 domains against the calculator
    is test_mace's.)"""
    import warnings

    from mace.calculators import MACECalculator

    from shardmd.engine.io.h5md import read_frames
    from shardmd.models.mace_files import DEFAULT_MODEL

    log = (folder / "run.log").read_text()
    assert "domains 8" in log
    thermo = {int(c[0]): (float(c[3]), float(c[5])) for c in (ln.split() for ln in log.splitlines())
              if len(c) >= 6 and c[0].isdigit()}          # step: (PotEng, TotEng), eV
    frames = read_frames(folder / "run.h5")
    assert [f.info["step"] for f in frames] == [0, 10, 20] and len(frames[0]) == 864
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(model_paths=str(DEFAULT_MODEL), device="cpu", default_dtype="float64")
    for f in frames[::2]:
        ref = f.copy()
        ref.calc = calc
        e, forces = ref.get_potential_energy(), ref.get_forces()
        # float64 sums in another order: ~1e-15 eV/Å apart (step 0, a perfect lattice, has no force)
        assert np.abs(f.get_forces() - forces).max() <= 1e-10 + 1e-8 * np.abs(forces).max(), f.info["step"]
        assert abs(thermo[f.info["step"]][0] - e) <= 2e-6, (f.info["step"], thermo[f.info["step"]], e)
    total = [v[1] for v in thermo.values()]
    assert max(total) - min(total) <= 1e-5 * len(frames[0])       # NVE: 0.005 eV over 20 steps here
    assert np.abs(frames[-1].positions - frames[0].positions).max() > 1e-3   # the atoms moved


PYTHON = [body for lang, body in BLOCKS if lang == "python"]


@pytest.mark.slow
@pytest.mark.parametrize("code", PYTHON, ids=[f"python block {i}" for i in range(len(PYTHON))])
def test_readme_python_block_runs(tmp_path, code):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


def test_readme_starts_with_two_commands_and_ci_runs_the_second():
    run, test = _readme_commands()
    assert TEXT.index(run) < 200
    assert "python -m engine run" in run and "pytest" in test
    assert "torch==2.13.0" in run and "torch==2.13.0" in test
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert lines[-1] == test
    # same tiers, same environment: CI sets nothing the README's command would not
    code = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "export " in ln or "=" in ln.split()[0]], code


def test_key_table_is_the_schemas():
    """README's table is made from the dataclasses (engine/config/schema.py, choices.py); regenerate with
    python -c "from shardmd.engine.config.help import readme_table; print(readme_table())"."""
    from shardmd.engine.config.help import readme_table

    start, end = "<!-- generated:", "<!-- end generated -->"
    block = TEXT[TEXT.index(start):TEXT.index(end)]
    assert block.split("\n", 1)[1].strip() == readme_table(), "README's key table differs from the schema"
    rows = re.findall(r"^\| `([^`]+)` \|", TEXT, re.M)
    assert [r for r in rows if r in KEYS or "." in r] == list(KEYS)


def test_key_table_check_catches_a_change(monkeypatch):
    """The table check fails when a dataclass's help or default changes."""
    import shardmd.engine.config.help as config

    monkeypatch.setitem(config.KEYS, "dt", ("2.0", "time step, fs"))
    assert config.readme_table() not in TEXT


def test_pyproject_pins_nothing():
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "==" not in deps and "mpich" not in deps and "openmpi" not in deps


def test_every_config_key_is_in_the_schema():
    from omegaconf import OmegaConf

    from shardmd.engine.config.compose import OPEN_MAPS, compose_config, group_options

    def leaves(node, prefix=""):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if OmegaConf.is_dict(v) and key not in OPEN_MAPS:
                yield from leaves(v, key + ".")
            else:
                yield key

    for model in group_options("model"):
        for integ in group_options("integrator"):
            cfg = compose_config([f"model={model}", f"integrator={integ}"])
            unknown = [k for k in leaves(cfg) if k not in KEYS and k not in ("model.name", "integrator.name")]
            assert not unknown, (model, integ, unknown)


def test_what_readme_says_of_model_mace_is_the_schemas():
    from shardmd.engine.config.compose import compose_config

    cfg = compose_config(["model=mace"])
    atoms = 4 * cfg.system.repeat[0] * cfg.system.repeat[1] * cfg.system.repeat[2]
    assert (cfg.system.element, cfg.system.lattice, atoms, cfg.temperature, cfg.steps) == ("Cu", "fcc", 864, 300, 20)
    assert "fcc Cu (864 atoms), 300 K and 20 steps" in " ".join(TEXT.split())


def test_readme_yaml_composes(tmp_path):
    """README's config file composes as it says (in this process, no run)."""
    import yaml

    from shardmd.engine.config.compose import compose_config

    (name, body), = [(re.match(r"# (\S+)\n", b).group(1), b) for lang, b in BLOCKS if lang == "yaml"]
    (tmp_path / name).write_text(body)
    want = yaml.safe_load(body)
    cfg = compose_config([f"config={tmp_path / name}"])
    assert cfg.model.name == "lj" and cfg.steps == want["steps"] and cfg.temperature == want["temperature"]
    assert dict(cfg.model.pairs["Ar-Kr"]) == want["model"]["pairs"]["Ar-Kr"]
    assert dict(cfg.model.epsilon) == want["model"]["epsilon"]
