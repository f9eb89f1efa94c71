"""The package layout: a clone works with ``PYTHONPATH=.`` (shardmd/ links to the top-level
folders), and a clone run beside this environment's editable install of another is named
in one line; modules stay small."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from shardmd.engine.cli.clone_check import editable_root


def _copy_of_the_clone(dest: Path) -> Path:
    """The files a fresh clone has (tracked and new, not ignored), symlinks kept as links."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split("\n")
    for name in filter(None, names):
        src, dst = ROOT / name, dest / name
        if not src.is_symlink() and not src.is_file():
            continue   # deleted in the work tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            dst.write_bytes(src.read_bytes())
    return dest


def _python(args, cwd, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_clone_runs_with_pythonpath_and_the_second_clone_is_named(tmp_path):
    clone = _copy_of_the_clone(tmp_path / "clone")
    r = _python(["-m", "engine", "--help"], cwd=clone, pythonpath=".")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage: python -m engine run" in r.stdout
    where = _python(["-c", "import shardmd.engine.run.simulation as s, engine; print(s.__file__); "
                     "print(engine.__file__)"], cwd=tmp_path, pythonpath=clone)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(line.startswith(str(clone)) for line in where.stdout.split()), where.stdout
    if editable_root() is None or editable_root() != ROOT.resolve():
        pytest.skip("this environment has no editable install of this clone (pip install -e .): "
                    "no second clone to name")
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("Warp CUDA warning")]
    assert len(lines) == 1 and lines[0].startswith("Warning: "), r.stderr
    assert str(clone.resolve()) in lines[0] and str(ROOT.resolve()) in lines[0]


def test_the_installed_clone_runs_without_a_warning(tmp_path):
    r = _python(["-m", "engine", "--help"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Warning" not in r.stderr, r.stderr


def test_no_module_is_over_500_lines():
    """Small files: a module that grows past 500 lines is split by idea (ours, not examples)."""
    long = {}
    for folder in ("engine", "domain", "models", "integrators", "configs", "scripts", "tests"):
        for p in (ROOT / folder).rglob("*.py"):
            n = len(p.read_text().splitlines())
            if n > 500:
                long[str(p.relative_to(ROOT))] = n
    assert not long, f"split these modules: {long}"
