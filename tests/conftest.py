import os
import subprocess
import sys
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
