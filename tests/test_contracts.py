"""The house rules that a test can hold: import layers (import-linter, contracts in
pyproject.toml) and the linter (ruff, rules in pyproject.toml), each shown to fail on a
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
    """The repository as the installed package sees it: shardmd/<folder> for each folder
    (the editable install maps them with a finder that import-linter cannot walk)."""
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


def test_import_contracts_hold(tmp_path):
    r = _lint_imports(_view(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_models_contract_names_every_domain_module_but_the_api():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    listed = set(next(c for c in cfg if c["id"] == "models-api")["forbidden_modules"])
    modules = {f"shardmd.domain.{p.stem}" for p in (ROOT / "domain").glob("*.py")
               if p.stem not in ("__init__", "api")}
    modules |= {f"shardmd.domain.{p.name}" for p in (ROOT / "domain").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == modules, f"add to / remove from the models-api contract: {sorted(modules ^ listed)}"


@pytest.mark.parametrize("plant", ["model imports a domain internal", "domain imports the engine",
                                   "integrator imports the domain"])
def test_import_contracts_catch_a_planted_violation(tmp_path, plant):
    folder, line = {"model imports a domain internal": ("models", "from shardmd.domain import halo\n"),
                    "domain imports the engine": ("domain", "from shardmd.engine import errors\n"),
                    "integrator imports the domain": ("integrators", "import shardmd.domain.cell\n")}[plant]
    copy = tmp_path / folder
    shutil.copytree(ROOT / folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "planted.py").write_text(line)
    r = _lint_imports(_view(tmp_path, {folder: copy}))
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-2000:]
    assert f"shardmd.{folder}.planted" in r.stdout


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
