"""Checks the model families' tests share (tests/test_sevennet.py, test_allegro.py,
test_mattersim.py, test_orb.py, test_uma.py, test_aimnet2.py; Payload also tests/test_safe_load.py):
a hostile pickle, a restart on two domains that must continue bit for bit, and the one-line
refusal that names the install command where the family's package is missing."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import run_engine

from shardmd.engine.io.h5md_read import read_frames


class Payload:
    """Pickles as ``call(*args)``: what a hostile file does when unpickled."""

    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def save_hostile(path: Path, marker: Path) -> Path:
    """A pickle at ``path`` that, if ever unpickled, creates ``marker``."""
    torch.save(Payload(os.system, (f"touch {shlex.quote(str(marker))}",)), path)
    return path


def assert_restart_bit_exact(base: list[str], cwd: Path) -> None:
    """``base`` (a run's arguments, frames every 5 steps) 20 steps straight == 10 + restart + 10:
    positions and velocities of every frame identical."""
    for args in (["steps=20", "output=straight.h5"], ["steps=10", "output=split.h5"],
                 ["steps=20", "output=split.h5", "restart=auto"]):
        r = run_engine([*base, *args], cwd=cwd, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    a = {f.info["step"]: f for f in read_frames(cwd / "straight.h5")}
    b = {f.info["step"]: f for f in read_frames(cwd / "split.h5")}
    assert sorted(a) == sorted(b) == [0, 5, 10, 15, 20]
    for s in a:
        assert np.array_equal(a[s].positions, b[s].positions), s
        assert np.array_equal(a[s].get_velocities(), b[s].get_velocities()), s


def assert_install_line(tmp_path, hidden: str | None, model_args: list[str], word: str, extra: str) -> None:
    """``python -m engine run <model_args>`` on 32 Cu atoms with the family's package ``hidden``
    from the interpreter (None: it is absent here anyway): exit status 2, no traceback, and the one
    line that names ``word`` gives ``pip install 'shardmd[<extra>]'``."""
    hide = f"sys.modules[{hidden!r}] = None; " if hidden else ""
    code = f"import sys; {hide}from shardmd.engine.cli.main import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "run", *model_args, "system.element=Cu", "system.lattice=fcc",
                        "system.a=3.61", "system.repeat=[2,2,2]", "steps=1", "output=r.h5"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if word in ln]
    assert len(lines) == 1 and f"pip install 'shardmd[{extra}]'" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
