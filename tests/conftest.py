import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_engine(args, cwd, timeout=300, env=None):
    """Run ``python -m engine <args>`` in a real subprocess; return CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=e)


@pytest.fixture
def engine_cli():
    return run_engine


def run_in_process(args, cwd, capfd, monkeypatch) -> tuple[int, list[str]]:
    """``python -m engine <args>`` through ``cli.main`` in this process: (exit status, stderr
    lines). The code a subprocess would run, without its start-up (torch, Warp: ~4 s of CPU
    each). ``capfd`` takes stderr at the file descriptor, so native libraries' writes count
    too; no traceback may appear. Python warnings, which a fresh interpreter would print to
    stderr under its default filters, come back as lines too (pytest would otherwise keep them).
    For one-rank runs and refusals decided before any rank starts; what needs a fresh process
    (bit-exact restarts, signals, MPI, import-time behaviour) uses run_engine."""
    from shardmd.engine.cli import main

    monkeypatch.chdir(cwd)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()             # the interpreter's default filters, not pytest's
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.simplefilter("default", append=True)
        code = main(list(args))
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("Warp CUDA warning")]
    return code, lines + [f"{w.category.__name__}: {w.message}" for w in caught]


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: run on the device machine (see README, GPU tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def mpiexec_cmd(n, args):
    """Command list running ``args`` (a python argv tail) on n real MPI ranks."""
    from shardmd.engine.parallel import launch_command

    cmd = launch_command(n, [])
    # launch_command ends with [python, -m, engine]: replace the tail by our own arguments
    return cmd[: cmd.index(sys.executable)] + [sys.executable, *args]
