"""The model families that cannot share the main environment, tested in their own.

sevenn 0.13 needs e3nn >= 0.5, which mace-torch 0.3.16 and nequip 0.6 (the ``mace`` and ``test``
extras) exclude; metatomic's tests need metatrain (a PET with random weights), which the main
environment does not carry (docs/models.md). This test makes the family's environment as docs/models.md
says (``pip install torch==2.13.0 mpich==5.0.2 -e ".[sevennet]" pytest pytest-xdist scipy``),
keeps it under ``SHARDMD_ENV_CACHE`` (default ``~/.cache/shardmd/envs``) keyed by this clone's
path, the requirements its install asks for and the Python version, so later runs reuse it, and runs the family's test
file there. So the README's test command (CI's) tests every extra.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

#: family -> (pip arguments of its environment, its test file[, packages uninstalled after: mattersim 1.2.3
#: requires torchvision and torchaudio, whose PyPI wheels do not load against torch 2.13's CPU build and break
#: its import; docs/models.md says the same to users])
EXTRAS = {
    "sevennet": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[sevennet]", "pytest", "pytest-xdist", "scipy"],
                 "tests/test_sevennet.py"),
    "metatomic": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[metatomic]", "metatrain", "pytest", "pytest-xdist",
                   "scipy"], "tests/test_metatomic.py"),
    "allegro": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[allegro]", "pytest", "pytest-xdist", "scipy"],
                "tests/test_allegro.py"),
    "mattersim": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[mattersim]", "pytest", "pytest-xdist", "scipy"],
                  "tests/test_mattersim.py", ("torchvision", "torchaudio")),
    "orb": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[orb]", "pytest", "pytest-xdist", "scipy"],
            "tests/test_orb.py"),
    "aimnet2": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[aimnet2]", "pytest", "pytest-xdist", "scipy"],
                "tests/test_aimnet2.py"),
    "uma": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[uma]", "pytest", "pytest-xdist", "scipy"],
            "tests/test_uma.py"),
}


def requirements(extra: str) -> list[str]:
    """What installing ``.[extra]`` asks of pip: the package's dependencies and the extra's (its
    own extras expanded), as pyproject.toml lists them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras, out, todo = project.get("optional-dependencies", {}), list(project.get("dependencies", [])), [extra]
    while todo:
        for req in extras.get(todo.pop(), []):
            inner = req.split("[", 1)[1].split("]", 1)[0] if req.startswith("shardmd[") else None
            todo += inner.split(",") if inner else []
            out += [] if inner else [req]
    return sorted(out)


def environment(name: str, pip_args: list[str], remove: tuple[str, ...] = ()) -> Path:
    """The family's virtual environment, made once per clone, requirements and Python version:
    keyed on what its install asks of pip (not on the whole pyproject.toml, whose every change
    would make all of them again); the package itself is installed editable, so its code is
    always this clone's."""
    extras = [a.split("[", 1)[1].rstrip("]") for a in pip_args if "[" in a]
    reqs = [r for e in extras for e2 in e.split(",") for r in requirements(e2)]
    key = hashlib.sha256("\n".join([str(ROOT), sys.version, *reqs, *pip_args, *remove]).encode()).hexdigest()[:16]
    base = Path(os.environ.get("SHARDMD_ENV_CACHE", Path.home() / ".cache" / "shardmd" / "envs"))
    env = base / f"{name}-{key}"
    if (env / "ready").is_file():
        return env
    base.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True, timeout=300)
    r = subprocess.run([str(env / "bin" / "pip"), "install", "-q", *pip_args], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, f"making the {name} environment failed:\n{r.stderr[-3000:]}"
    if remove:
        r = subprocess.run([str(env / "bin" / "pip"), "uninstall", "-q", "-y", *remove], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"uninstalling {remove} from the {name} environment failed:\n{r.stderr[-3000:]}"
    (env / "ready").write_text("pip install " + " ".join(pip_args) + "\n"
                               + (f"pip uninstall -y {' '.join(remove)}\n" if remove else ""))
    return env


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_the_family_passes_its_tests_in_its_own_environment(name):
    pip_args, test_file, *remove = EXTRAS[name]
    env = environment(name, pip_args, tuple(remove[0]) if remove else ())
    r = subprocess.run([str(env / "bin" / "python"), "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
                        "-n", "2", test_file], cwd=ROOT, capture_output=True, text=True, timeout=2400,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail.splitlines()[-1], tail   # it ran, not skipped
