"""The house rules that a test can hold: the package layout, import layers and no cycles
(import-linter, contracts in pyproject.toml) and the linter (ruff, rules in pyproject.toml), each shown to fail on a
planted violation so that a green run means something."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "domain", "models", "integrators", "configs")
BIN = Path(sys.executable).parent


def _tool(name):
    exe = BIN / name
    if not exe.exists():
        exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return str(exe)


def _view(tmp_path, packages=None):
    """The package with some folders replaced (by copies holding a planted violation):
    shardmd/<folder> linking to each folder, as shardmd/ in the repository does."""
    view = tmp_path / "view"
    (view / "shardmd").mkdir(parents=True)
    (view / "shardmd" / "__init__.py").write_text("")
    for p in PACKAGES:
        src = (packages or {}).get(p, ROOT / p)
        (view / "shardmd" / p).symlink_to(src, target_is_directory=True)
    return view


def _lint_imports(view):
    env = {"PYTHONPATH": str(view), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([_tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=view, env=env, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    """import-linter run plainly (no options) in the repository, on this clone's code."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
    assert "engine: cli | ase_calculator -> batch | protocol -> relax" in r.stdout and "no import cycles" in r.stdout


def test_the_package_is_the_repository_folders():
    """shardmd/<folder> links to each top-level folder: one tree, seen under two names."""
    for p in PACKAGES:
        link = ROOT / "shardmd" / p
        assert link.is_symlink() and link.resolve() == (ROOT / p).resolve(), link


def test_models_contract_names_every_domain_module_but_the_api():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    listed = set(next(c for c in cfg if c["id"] == "models-api")["forbidden_modules"])
    modules = {f"shardmd.domain.{p.stem}" for p in (ROOT / "domain").glob("*.py")
               if p.stem not in ("__init__", "api")}
    modules |= {f"shardmd.domain.{p.name}" for p in (ROOT / "domain").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == modules, f"add to / remove from the models-api contract: {sorted(modules ^ listed)}"


PLANTS = {  # what is planted: (folder, {file in it: its text}, the module the report must name)
    "model imports a domain internal": ("models", {"planted.py": "from shardmd.domain import halo\n"},
                                        "shardmd.models.planted"),
    "domain imports the engine": ("domain", {"planted.py": "from shardmd.engine import errors\n"},
                                  "shardmd.domain.planted"),
    "integrator imports the domain": ("integrators", {"planted.py": "import shardmd.domain.cell\n"},
                                      "shardmd.integrators.planted"),
    "engine's files import the run loop": ("engine", {"io/planted.py": "from shardmd.engine.run import state\n"},
                                           "shardmd.engine.io.planted"),
    "a cycle of two modules": ("integrators", {"planted_a.py": "from . import planted_b\n",
                                               "planted_b.py": "from . import planted_a\n"}, "planted_"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_import_contracts_catch_a_planted_violation(tmp_path, plant):
    folder, files, named = PLANTS[plant]
    copy = tmp_path / folder
    shutil.copytree(ROOT / folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in files.items():
        (copy / name).write_text(text)
    r = _lint_imports(_view(tmp_path, {folder: copy}))
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-2000:]
    assert named in r.stdout, r.stdout[-2000:]


def test_ruff_is_clean():
    r = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]


def test_ruff_catches_a_planted_bug(tmp_path):
    """An undefined name and a closure over a loop variable: pyflakes and bugbear are on."""
    bad = tmp_path / "engine_planted.py"
    bad.write_text("def f(xs):\n    out = []\n    for x in xs:\n        out.append(lambda: x)\n"
                   "    return undefined_name\n")
    r = subprocess.run([_tool("ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                        str(bad)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "F821" in r.stdout and "B023" in r.stdout
