"""What every family's model files need alike: a file's identity, a built model's identity, and
the name of the global a restricted unpickler refused (the one-line refusals of models/*.py)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch


def file_sha256(path: Path) -> str:
    """SHA-256 of the file at ``path``, read in blocks of 1 MiB."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(description, module: torch.nn.Module) -> str:
    """SHA-256 of a model built in memory (random weights): its ``description`` (JSON, keys
    sorted) and its weights in state-dict order."""
    h = hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode())
    for t in module.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


_GLOBAL_PATTERNS = (re.compile(r"GLOBAL (\S+) was not an allowed global"),
                    re.compile(r"unsupported GLOBAL (\S+) whose module \S+ is blocked"),
                    re.compile(r"unrecognized function (\S+)"),
                    re.compile(r"but got <class '([^']+)'>"))


def refused_global(message: str) -> str | None:
    """The global named in a torch ``UnpicklingError`` from the restricted unpickler, or None
    if the error is not a refusal (a corrupt or truncated file)."""
    for pat in _GLOBAL_PATTERNS:
        m = pat.search(message)
        if m:
            return m.group(1).rstrip(".,")
    return None
