"""``model.compile=true``: the mace-torch module compiled by ``torch.compile`` (inductor).

Layer: a helper of models/mace.py; imports torch, mace-torch and e3nn only.

mace-torch's own recipe (mace/tools/compile.py) is followed: the module is built with e3nn's
TorchScript code generation off (dynamo cannot trace into scripted code), so it is loaded and
converted to cuEquivariance inside :func:`building`, and the blocks mace-torch registers for it
(symmetric contraction, activations) are traced by ``torch.fx`` (``simplify``). The engine's own
work around the module (edge vectors, the energy sum, forces and virial from the edge gradient)
stays eager: it is a few tensor operations.

Shapes: the first call compiles for its shapes; a second shape (the next neighbour list has
other edge and atom counts) recompiles once with those sizes symbolic, and later lists reuse
that (torch.compile's automatic dynamic shapes). A call under decomposition breaks the graph at
each halo exchange (Python and collectives between the compiled pieces).

Two things outside the module are set, only when a model is compiled:

- e3nn 0.4's ``Irrep`` (a tuple ``(l, p)``) raises on ``len()``, which dynamo calls when it
  guards on a sequence; it is given tuple's answer (2), which nothing else relies on.
- inductor writes its generated code to ``/tmp/torchinductor_<user>`` and later imports and runs
  it from there: a name anyone on the machine can predict and create first. Unless the user
  chose ``TORCHINDUCTOR_CACHE_DIR``, it is pointed at a directory of this user's own
  (:func:`private_cache_dir`), created 0700 and checked to be ours and not a link.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import torch


@contextlib.contextmanager
def building():
    """Build (load, convert) a mace-torch module for torch.compile: e3nn code generation off."""
    from mace.tools.compile import disable_e3nn_codegen

    with disable_e3nn_codegen():
        yield


def compiler_problem(device: torch.device) -> str | None:
    """Why inductor could not build code here (one line), or None: it compiles C++ on the CPU
    (``CXX`` or g++) and, on CUDA, Triton's launcher in C (``CC``, cc, gcc or clang)."""
    names = ([os.environ.get("CC"), "cc", "gcc", "clang"] if device.type == "cuda"
             else [os.environ.get("CXX"), "g++", "c++", "clang++"])
    if any(n and shutil.which(n) for n in names):
        return None
    kind = "a C compiler (cc, gcc or clang; Triton's)" if device.type == "cuda" else "a C++ compiler (g++ or clang++)"
    return f"model.compile=true needs {kind} on this machine; install one or leave model.compile=false"


def compiled(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (built under :func:`building`) with its registered blocks traced, compiled."""
    import e3nn.o3._irreps as irreps
    from mace.tools.compile import simplify

    irreps.Irrep.__len__ = _irrep_len
    _use_private_cache()
    return torch.compile(simplify(module), dynamic=None)


def compile_built(mm) -> str | None:
    """Compile a built ``MaceModel`` in place (``compile='auto'``, chosen on by the engine): built
    again as ``compile=True`` builds it (its ``_build``: dynamo cannot trace the scripted code of
    the eager load), the recompute switches kept. Returns why it cannot (no compiler: it stays
    eager), else None. Before the first call: a captured CUDA graph would keep the eager module."""
    if mm.compiled:
        return None
    problem = compiler_problem(mm.device)
    if problem:
        return problem
    kept = mm._recompute
    mm.compiled = True
    mm._build()
    mm._recompute.on, mm._recompute.auto = kept.on, kept.auto
    # auto chose this, the user did not: a graph dynamo or inductor fails on runs eagerly
    # instead of ending the run (``true`` keeps torch's errors)
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    return None


def _use_private_cache() -> None:
    """TORCHINDUCTOR_CACHE_DIR to :func:`private_cache_dir` unless the user chose one; torch
    writes its predictable default there itself once inductor has run, so that value counts as
    not chosen."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(private_cache_dir())


def _irrep_len(self) -> int:
    return 2   # (l, p), as tuple.__len__


def private_cache_dir() -> Path:
    """``~/.cache/shardmd/inductor``, created 0700; if it cannot be ours (HOME not writable,
    a link, another owner, open to others), a fresh ``mkdtemp`` directory instead."""
    try:
        path = Path.home() / ".cache" / "shardmd" / "inductor"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="shardmd-inductor-"))
