"""What a file may make a reader allocate: the memory budget, and HDF5 dataset checks made from
metadata alone (shape, dtype, allocated storage), before any data is read.

A file is data from anywhere: a dataset's shape is a number in its header, and an empty
chunked dataset of (1e9, 3) rows costs a few bytes on disk but 24 GB once read.  Readers
(checkpoints, trajectories) therefore check every shape against the atom count and the total
against :func:`memory_budget` first, and say what they refuse in one line.

Sizes are bytes; the budget is what this process can still allocate: the smaller of the
memory the kernel reports available (``MemAvailable``) and what the process's own limits
(``RLIMIT_AS``, ``RLIMIT_DATA``) leave beyond what it already uses.
"""
from __future__ import annotations

import os
import resource

import h5py
import numpy as np


def _status_kib(key: str) -> int | None:
    """A ``kB`` line of /proc/self/status (VmSize, VmData); None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget() -> int:
    """Bytes this process can still allocate (module docstring); at least 64 MiB, so a small
    file always reads even where the kernel reports nothing."""
    candidates = [b for b in (_available_bytes(),) if b is not None]
    for limit, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            used = (_status_kib(key) or 0) * 1024
            candidates.append(soft - used)
    return max(min(candidates), 64 << 20) if candidates else 1 << 62


def gib(nbytes: float) -> str:
    """``nbytes`` for a message: ``1.5 GiB``, ``12.0 MiB``."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def budget_problem(nbytes: int, what: str, budget: int | None = None) -> str | None:
    """A one-line reason when reading ``nbytes`` bytes (``what``: e.g. "its atoms/ arrays")
    exceeds the budget; None when it fits."""
    budget = memory_budget() if budget is None else budget
    if nbytes <= budget:
        return None
    return (f"{what} need {gib(nbytes)} to load, more than the {gib(budget)} of memory this process can "
            "use (memory available, ulimit -v); use a machine with more memory or lift the process's limit")


def dataset(group: h5py.Group, name: str, cls=h5py.Dataset) -> h5py.Dataset | h5py.Group | str:
    """The dataset (or, with ``cls=h5py.Group``, group) ``name`` of ``group``, or a one-line
    reason it is not one (missing, of the other kind, a soft or external link: a link to
    another file is never followed).  Opens the object only: reads no data."""
    try:
        link = group.get(name, getlink=True)
        if link is None:
            return f"{name} is missing"
        if not isinstance(link, h5py.HardLink):
            return f"{name} is a link ({type(link).__name__}), not stored in this file"
        obj = group[name]
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        return f"{name} cannot be opened ({' '.join(str(exc).split())[:80]})"
    if not isinstance(obj, cls):
        return f"{name} is a {type(obj).__name__.lower()}, not a {cls.__name__.lower()}"
    return obj


def nbytes(d: h5py.Dataset) -> int:
    """Bytes reading all of ``d`` allocates (from its shape and dtype: metadata)."""
    return int(np.prod(d.shape, dtype=object) if d.shape else 1) * int(d.dtype.itemsize)


def shape_problem(d: h5py.Dataset, name: str, want: tuple, kinds: str) -> str | None:
    """A reason ``d`` does not have shape ``want`` (None entries: any length) and a dtype of
    one of numpy's ``kinds`` ("f", "iu", "b"...); None when it does."""
    shape = d.shape
    if shape is None or len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
        shown = ", ".join("any" if w is None else str(w) for w in want)
        return f"{name} has shape {shape}, expected ({shown}{',' if len(want) == 1 else ''})"
    if d.dtype.kind not in kinds or d.dtype.names is not None or d.dtype.subdtype is not None:
        return f"{name} has type {d.dtype}, expected {_KIND_NAMES.get(kinds, kinds)}"
    return None


_KIND_NAMES = {"f": "floating point", "iu": "integers", "biu": "booleans or integers", "fiu": "numbers"}


def unwritten_problem(d: h5py.Dataset, name: str) -> str | None:
    """A reason when ``d`` holds less stored data than its size without being compressed: a
    dataset that was declared but never written (reading it would allocate its whole shape of
    fill values).  Writers that write every value (checkpoints) always pass."""
    try:
        plist = d.id.get_create_plist()
        if plist.get_nfilters():   # compressed: stored size says nothing
            return None
        stored = d.id.get_storage_size()
    except (OSError, RuntimeError, ValueError):
        return None
    if stored < nbytes(d):
        return f"{name} of shape {d.shape} holds only {stored} bytes of data (it was never written)"
    return None
