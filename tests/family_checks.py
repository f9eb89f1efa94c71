"""Checks the model families' tests share (tests/test_sevennet.py, test_allegro.py,
test_mattersim.py; Payload also tests/test_safe_load.py): a hostile pickle, and a restart on two
domains that must continue bit for bit."""
from __future__ import annotations

import os
import shlex
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
