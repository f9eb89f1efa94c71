"""Validation of an H5MD trajectory's layout before the reader allocates anything from it
(:mod:`shardmd.engine.io.h5md_read`): metadata only, no data read.

Checked: ``/particles/all`` is a group of this file; ``species`` is (n,) integers (n: the atom
count), ``mass`` (n,) numbers, ``id`` (n,) integers; ``box`` carries a ``boundary`` attribute of
3 strings; each time-dependent element present ({step, time, value}) has 1-D integer steps,
1-D floating times and values of (rows, n, 3) (``position``, ``image``, ``velocity``,
``force``), (rows, n) (``energy``) or (rows, 3, 3) / (rows, 3) (``box/edges``), a fixed
``box/edges`` dataset (3,) or (3, 3); observables {step, time, value} 1-D steps and times.
What reading needs (the per-atom arrays, the step and time columns, one frame of each field,
every observable) must fit :func:`~shardmd.engine.io.read_limits.memory_budget`.

:func:`layout_problem` returns None or one line naming the dataset and the problem.
"""
from __future__ import annotations

import h5py
import numpy as np

from shardmd.engine.io.read_limits import budget_problem, dataset, nbytes, shape_problem

#: per-atom element value shapes after the rows axis (None: the atom count)
_VALUES = {"position": ((None, 3), "f"), "image": ((None, 3), "iu"), "velocity": ((None, 3), "f"),
           "force": ((None, 3), "f"), "energy": ((None,), "f")}


def layout_problem(f: h5py.File, particles: str) -> str | None:
    """Metadata pass (module docstring) over the open trajectory ``f`` whose particles group is
    at ``particles`` (e.g. ``/particles/all``)."""
    p = _group(f, particles)
    if isinstance(p, str):
        return p
    species = dataset(p, "species")
    if isinstance(species, str):
        return f"{particles}/{species}"
    problem = shape_problem(species, f"{particles}/species", (None,), "iu")
    if problem:
        return problem
    n = int(species.shape[0])
    need = nbytes(species)
    for name, kinds, optional in (("mass", "fiu", False), ("id", "iu", True)):
        if optional and name not in p:
            continue
        d = dataset(p, name)
        if isinstance(d, str):
            return f"{particles}/{d}"
        problem = shape_problem(d, f"{particles}/{name}", (n,), kinds)
        if problem:
            return problem + f" ({n} atoms, the length of species)"
        need += nbytes(d)
    box = _group(p, "box", f"{particles}/box")
    if isinstance(box, str):
        return box
    if "boundary" not in box.attrs or box.attrs.get_id("boundary").shape != (3,):
        return f"{particles}/box has no boundary attribute of 3 values"
    for name, (want, kinds) in _VALUES.items():
        if name in p:
            problem, size = _element_problem(p, name, f"{particles}/{name}", (None, *want), kinds, n)
            if problem:
                return problem
            need += size
    if "edges" in box:
        problem, size = _edges_problem(box, f"{particles}/box/edges")
        if problem:
            return problem
        need += size
    problem, size = _observables_problem(f)
    if problem:
        return problem
    return budget_problem(need + size, f"its atom arrays, step and time columns and observables ({n} atoms)")


def _group(parent: h5py.Group, name: str, shown: str | None = None) -> h5py.Group | str:
    g = dataset(parent, name, h5py.Group)
    return f"{shown or name}: {g}" if isinstance(g, str) else g


def _columns(g: h5py.Group, where: str) -> tuple[str | None, int]:
    """Problem with the step and time columns of element ``g``, and their bytes."""
    size = 0
    for col, kinds in (("step", "iu"), ("time", "f")):
        d = dataset(g, col)
        if isinstance(d, str):
            return f"{where}/{d}", 0
        problem = shape_problem(d, f"{where}/{col}", (None,), kinds)
        if problem:
            return problem, 0
        size += nbytes(d)
    return None, size


def _element_problem(p: h5py.Group, name: str, where: str, want: tuple, kinds: str, n: int):
    """(problem, bytes reading it needs: its columns and one frame of values)."""
    g = _group(p, name, where)
    if isinstance(g, str):
        return g, 0
    problem, size = _columns(g, where)
    if problem:
        return problem, 0
    v = dataset(g, "value")
    if isinstance(v, str):
        return f"{where}/{v}", 0
    problem = shape_problem(v, f"{where}/value", tuple(n if i > 0 and w is None else w for i, w in enumerate(want)),
                            kinds)
    if problem:
        return problem + f" ({n} atoms, the length of species)", 0
    return None, size + int(np.prod(v.shape[1:], dtype=object)) * 8   # one frame, read as float64


def _edges_problem(box: h5py.Group, where: str):
    link = box.get("edges", getlink=True)
    obj = box["edges"] if isinstance(link, h5py.HardLink) else None
    if isinstance(obj, h5py.Dataset):   # a fixed box (other writers)
        if obj.shape not in ((3,), (3, 3)) or obj.dtype.kind not in "fiu":
            return f"{where} has shape {obj.shape} and type {obj.dtype}, expected (3,) or (3, 3) numbers", 0
        return None, nbytes(obj)
    g = _group(box, "edges", where)
    if isinstance(g, str):
        return g, 0
    problem, size = _columns(g, where)
    if problem:
        return problem, 0
    v = dataset(g, "value")
    if isinstance(v, str):
        return f"{where}/{v}", 0
    if not (shape_problem(v, "", (None, 3, 3), "f") is None or shape_problem(v, "", (None, 3), "f") is None):
        return f"{where}/value has shape {v.shape} and type {v.dtype}, expected (rows, 3, 3) floating point", 0
    return None, size + 72


def _observables_problem(f: h5py.File) -> tuple[str | None, int]:
    """Observables are read whole: their columns and values count."""
    obs = f.get("observables", getlink=True)
    if obs is None:
        return None, 0
    g = _group(f, "observables")
    if isinstance(g, str):
        return g, 0
    size = 0
    for name in g:
        link = g.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            return f"observables/{name} is a link ({type(link).__name__}), not stored in this file", 0
        try:
            e = g[name]
        except (KeyError, OSError, RuntimeError):
            continue   # unreadable: the reader leaves it out with a warning
        if not isinstance(e, h5py.Group) or not {"step", "time", "value"} <= set(e):
            continue
        problem, cols = _columns(e, f"observables/{name}")
        if problem:
            return problem, 0
        v = dataset(e, "value")
        if isinstance(v, str):
            return f"observables/{name}/{v}", 0
        if not v.shape or v.dtype.kind not in "fiu":
            return f"observables/{name}/value has shape {v.shape} and type {v.dtype}, expected rows of numbers", 0
        size += cols + nbytes(v)
    return None, size
