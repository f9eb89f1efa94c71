"""What the fault tests share: a small LJ run, the CLI run in this process, and the checks that
an error is one line and that what was written before it is intact."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from conftest import run_engine

from shardmd.engine.cli.main import main
from shardmd.engine.io.checkpoint import read_checkpoint
from shardmd.engine.io.h5md import read_frames

# one torch thread: the in-process runs' small ops do not wait on OpenMP workers (default: all cores)
SMALL = ["model=lj", "system.repeat=[3,3,3]", "quiet=true", "threads=1"]


def cli(args, cwd, capsys, monkeypatch) -> tuple[int, list[str]]:
    """Run the CLI in this process; (exit status, stderr lines)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [ln for ln in err.strip().splitlines() if not ln.startswith("Warp CUDA warning")]


def one_line(lines, needle):
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert needle in lines[0], (needle, lines[0])
    return lines[0]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_intact(folder: Path, output="run.h5", capsys=None, monkeypatch=None, damaged=()):
    """Every frame of the trajectory is finite, every checkpoint (but those named ``damaged``)
    loads, ``engine info`` reads both."""
    frames = read_frames(folder / output)
    assert frames and all(np.isfinite(f.positions).all() and np.isfinite(f.get_velocities()).all() for f in frames)
    ckpts = [p for p in sorted((folder / Path(output).with_suffix(".ckpt")).glob("step-*.h5")) if p.name not in damaged]
    for ck in ckpts:
        c = read_checkpoint(ck)
        assert np.isfinite(c["arrays"]["velocities"]).all()
    for f in [folder / output, *ckpts[-1:]]:
        r = run_engine(["info", str(f)], cwd=folder) if capsys is None else None
        if r is not None:
            assert r.returncode == 0 and "step" in r.stdout, r.stderr
        else:
            assert cli(["info", str(f)], folder, capsys, monkeypatch)[0] == 0
    return frames, ckpts


def engine_procs_in(cwd: Path) -> list[int]:
    """Processes running the engine in ``cwd`` (launcher, mpiexec, ranks)."""
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(p / "cwd") == str(cwd) and b"engine" in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except OSError:
            continue
    return out
