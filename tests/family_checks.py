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


def evaluate_in_parts(model, atoms, count: int, skin: float = 0.5, by_layer: bool = False) -> dict:
    """``model``'s call on ``atoms`` (periodic, float64) made in ``count`` parts as ``subdomains``
    makes it (domain/subdomains.py; ``by_layer``: layer by layer, domain/layered_parts.py, each
    part one cutoff + skin of halo): energy, forces, virial, energies; every part has a halo."""
    from shardmd.domain.layered_parts import evaluate_by_layer
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.subdomains import build_part, evaluate_parts, owner_parts, part_grid

    x, cell, z = torch.tensor(atoms.positions), torch.tensor(atoms.cell.array), torch.tensor(atoms.numbers)
    pbc = (True, True, True)
    nl = build_neighbor_list(x, cell, torch.tensor(pbc), model.cutoff + skin)
    walk = 1 if by_layer else model.layers
    grid = part_grid(count, cell, pbc, walk * (model.cutoff + skin))
    owner = owner_parts(x, cell, pbc, grid)
    parts = [build_part(nl, torch.nonzero(owner == p).squeeze(1), walk, x.dtype) for p in range(count)]
    assert all(p.ids.numel() > p.n_counted for p in parts)   # each part has a halo
    if by_layer:
        return evaluate_by_layer(model, parts, x, cell, z, model.layers)
    return evaluate_parts(model, parts, x, cell, pbc, z)


def last_unwrapped(path: Path):
    """The last frame's unwrapped positions (n, 3) Å of an H5MD trajectory (ours, read by h5py)."""
    import h5py

    with h5py.File(path) as f:
        p = f["particles/all"]
        return p["position/value"][-1] + p["image/value"][-1] @ p["box/edges/value"][-1]


def run_ends(common: list[str], runs: dict, cwd: Path) -> dict:
    """Each run ``python -m engine <common> <runs[name]> output=<name>.h5`` (trajectory at its
    last step); name -> its last frame's unwrapped positions (n, 3) Å."""
    ends = {}
    for name, extra in runs.items():
        r = run_engine([*common, *extra, f"output={name}.h5"], cwd, timeout=900)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        ends[name] = last_unwrapped(cwd / f"{name}.h5")
    return ends
