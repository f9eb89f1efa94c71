"""Which clone runs: the code Python imported against the editable install of this environment.

A clone used with ``PYTHONPATH=.`` (or run from its own root) imports its own ``shardmd/``
before any installed one; when this environment also holds an editable install of another
clone, two trees are in play and a user may be testing the one they did not edit. The
command line says so in one line (rank 0), naming both.
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse


def editable_root() -> Path | None:
    """The folder of this environment's editable install of shardmd (pip's direct_url.json), or None."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution("shardmd").read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    try:
        info = json.loads(text or "{}")
    except ValueError:
        return None
    url = urlparse(info.get("url", ""))
    if not info.get("dir_info", {}).get("editable") or url.scheme != "file":
        return None
    return Path(unquote(url.path)).resolve()


def running_root() -> Path:
    """The folder holding the ``shardmd/`` package that this process imported."""
    import shardmd

    return Path(shardmd.__file__).resolve().parent.parent


def second_clone_warning() -> str | None:
    """One line when the imported code is not the editable install's, else None."""
    installed, running = editable_root(), running_root()
    if installed is None or installed == running:
        return None
    return (f"Warning: this runs ShardMD from {running}, but this environment's editable install is "
            f"{installed}: the code of {running} runs (first on sys.path); to use one clone, run "
            f"pip install -e {running}, or leave PYTHONPATH and the working directory of {running}")
