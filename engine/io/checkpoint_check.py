"""Validation of a restart checkpoint (layout in :mod:`shardmd.engine.io.checkpoint`), in two passes.

1. :func:`layout_problem`, from HDF5 metadata only, before any array is read: every attribute
   is there, scalar and of its type (step an integer >= 0, time a finite number, format one
   this version reads, the names and JSON texts strings); every ``atoms/`` and ``box/`` dataset
   is a dataset of the shape the atom count (the length of ``atoms/ids``) gives and of its
   dtype kind; the arrays together fit :func:`~shardmd.engine.io.read_limits.memory_budget`; and
   each was written (a declared, empty dataset would read as its whole shape of fill values).
2. :func:`values_problem`, on the loaded arrays and the parsed JSON: finite positions,
   velocities, masses > 0 and cell; unique ids in 0..2^40; atomic numbers 1-118; image flags in int32;
   a non-singular periodic cell; the integrator state (:func:`integrator_problem`): a known
   integrator name, every number finite and of its type, the chains as long as they say, and
   the fixed-atom ranges bounded, existing and not every atom
   (:func:`fixed_ranges_problem`).

The optional ``inputs/`` group (a model's declared inputs: ``inputs/atoms/<name>`` per atom,
``inputs/system/<name>`` per system) passes the same two steps: :func:`inputs_layout` (names,
shapes (n, *F) and (1, *F), floating point, size, written) and :func:`inputs_values_problem`
(finite).

Each returns None or one line naming the field and the problem (the reader adds the file).
"""
from __future__ import annotations

import json
import math
import re

import h5py
import numpy as np

from shardmd.domain.json_text import MAX_DEPTH, nesting_depth
from shardmd.engine.io.read_limits import budget_problem, dataset, nbytes, shape_problem, unwritten_problem
from shardmd.integrators import INTEGRATOR_NAMES

#: per-atom datasets of ``atoms/``: (shape with None for the atom count, numpy dtype kinds)
ATOM_LAYOUT = {
    "positions": ((None, 3), "f"), "images": ((None, 3), "iu"), "velocities": ((None, 3), "f"),
    "masses": ((None,), "f"), "numbers": ((None,), "iu"), "ids": ((None,), "iu"),
    "reference_positions": ((None, 3), "f"),
}
BOX_LAYOUT = {"cell": ((3, 3), "f"), "pbc": ((3,), "biu")}
#: atom ids lie below this (the spatial sort key is cell * (max id + 1) + id, in int64)
MAX_ID = 2 ** 40
#: root attributes: name -> "int", "num" or "str"
ATTRS = {"format": "int", "step": "int", "time": "num", "model_name": "str", "model_identity": "str",
         "code_version": "str", "config": "str", "integrator": "str"}


def layout_problem(f: h5py.File, max_format: int) -> str | None:
    """Metadata pass (module docstring) of an open checkpoint; reads only attributes."""
    for name, kind in ATTRS.items():
        problem = _attr_problem(f.attrs, name, kind)
        if problem:
            return problem
    if int(f.attrs["format"]) > max_format or int(f.attrs["format"]) < 1:
        return (f"attribute format is {int(f.attrs['format'])}; this version reads formats 1..{max_format} "
                "(a newer ShardMD wrote it: restart with that version)")
    sets = {}
    for group, layout in (("atoms", ATOM_LAYOUT), ("box", BOX_LAYOUT)):
        g = dataset(f, group, h5py.Group)
        if isinstance(g, str):
            return g
        for name in layout:
            d = dataset(g, name)
            if isinstance(d, str):
                return f"{group}/{d}"
            sets[f"{group}/{name}"] = d
    ids = sets["atoms/ids"]
    if ids.shape is None or len(ids.shape) != 1 or ids.shape[0] < 1:
        return f"atoms/ids has shape {ids.shape}, expected (n,) with n >= 1 atoms"
    n = int(ids.shape[0])
    for key, d in sets.items():
        group, name = key.split("/")
        want, kinds = (ATOM_LAYOUT if group == "atoms" else BOX_LAYOUT)[name]
        want = tuple(n if w is None else w for w in want)
        problem = shape_problem(d, key, want, kinds)
        if problem:
            return problem + ("" if group == "box" else f" ({n} atoms, the length of atoms/ids)")
    problem = budget_problem(sum(nbytes(d) for d in sets.values()), f"its arrays ({n} atoms)")
    if problem:
        return problem
    for key, d in sets.items():
        problem = unwritten_problem(d, key)
        if problem:
            return problem
    return None


def _attr_problem(attrs, name: str, kind: str) -> str | None:
    if name not in attrs:
        return f"attribute {name} is missing"
    try:
        aid = attrs.get_id(name)
        if aid.shape not in ((), None) and aid.shape != (1,):
            return f"attribute {name} has shape {aid.shape}, expected a single value"
        value = attrs[name]
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        return f"attribute {name} cannot be read ({type(exc).__name__})"
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    if isinstance(value, np.generic):   # shown as 20.5, not np.float64(20.5)
        value = value.item()
    if kind == "str":
        if isinstance(value, bytes):
            try:
                value.decode()
            except UnicodeDecodeError:
                return f"attribute {name} is not UTF-8 text"
        elif not isinstance(value, str):
            return f"attribute {name} is {_type_name(value)}, expected text"
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"attribute {name} is {_type_name(value)}, expected {'an integer' if kind == 'int' else 'a number'}"
    if kind == "int" and not isinstance(value, (int, np.integer)):
        return f"attribute {name} is {value!r}, expected an integer"
    if not math.isfinite(float(value)) or (name == "step" and int(value) < 0) or (name == "time" and value < 0):
        return f"attribute {name} {value!r} is out of range (a finite number >= 0)"
    return None


def _type_name(value) -> str:
    return f"of type {type(value).__name__} ({str(value)[:40]!r})"


def parse_json(text, name: str) -> tuple[dict | None, str | None]:
    """(the JSON object in attribute ``name``, None) or (None, a one-line reason)."""
    if isinstance(text, bytes):
        text = text.decode()
    if isinstance(text, str) and nesting_depth(text) > MAX_DEPTH:
        return None, f"attribute {name} is JSON nested too deeply"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"attribute {name} is not JSON ({str(exc)[:60]})"
    except RecursionError:
        return None, f"attribute {name} is JSON nested too deeply"
    if not isinstance(value, dict):
        return None, f"attribute {name} is JSON {type(value).__name__}, expected an object"
    return value, None


def values_problem(ck: dict) -> str | None:
    """Values pass (module docstring) of a loaded checkpoint dict (read_checkpoint's keys)."""
    a = ck["arrays"]
    ids = np.asarray(a["ids"])
    n = int(ids.shape[0])
    for name in ATOM_LAYOUT:
        arr = np.asarray(a[name])
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return f"atoms/{name} holds non-finite values"
    if ids.min() < 0 or ids.max() >= MAX_ID or len(np.unique(ids)) != n:
        return f"atom ids are not unique non-negative numbers below 2^{MAX_ID.bit_length() - 1}"
    z = np.asarray(a["numbers"])
    if z.min() < 1 or z.max() > 118:
        return f"atomic numbers outside 1-118 (e.g. {int(z.max() if z.max() > 118 else z.min())})"
    if not (np.asarray(a["masses"]) > 0).all():
        return "masses must be > 0"
    im = np.asarray(a["images"])
    if im.size and (im.min() < np.iinfo(np.int32).min or im.max() > np.iinfo(np.int32).max):
        return "atoms/images holds image flags beyond the int32 range"
    cell, pbc = np.asarray(ck["cell"]), np.asarray(ck["pbc"])
    if not np.isfinite(cell).all():
        return "box/cell holds non-finite values"
    if pbc.astype(bool).any() and abs(np.linalg.det(cell)) < 1e-9:   # an all-open cell (a cluster) may be zero
        return "box/cell is singular"
    return integrator_problem(ck["integrator"], ids)


# integrator state keys (a state_dict of integrators/ plus the engine's): their types
_NUMBERS = ("dt", "temperature", "tdamp", "tau", "friction", "pressure", "pdamp", "vol0", "energy_change")
_COUNTS = {"chain": 0, "pchain": 0, "dof": 1, "n_atoms": 1, "seed": None}   # minimum (None: any integer)
#: list lengths: a count key plus an offset (eta_dot has a closing 0 after the chain), or a number
_CHAINS = {"eta": ("chain", 0), "eta_dot": ("chain", 1), "eta_dotdot": ("chain", 0), "etap": ("pchain", 0),
           "etap_dot": ("pchain", 1), "etap_dotdot": ("pchain", 0), "omega": 6, "omega_dot": 6, "mvv": 6}
#: what a thermostat's load_state_dict reads once the state says it holds a chain
_NEEDS = {"nose-hoover": ("t_current", ("chain", "eta", "eta_dot", "eta_dotdot", "dof")),
          "npt": ("n_atoms", ("couple", "pchain", "thermostat", "omega", "omega_dot", "etap", "etap_dot",
                              "etap_dotdot", "vol0"))}


def integrator_problem(d, ids: np.ndarray, where: str = "integrator state") -> str | None:
    """A reason the integrator state ``d`` (the ``integrator`` attribute, parsed) cannot be
    continued from, for a checkpoint of atoms ``ids``; None when it can."""
    if not isinstance(d, dict):
        return f"{where} is {type(d).__name__}, expected an object"
    name = d.get("name")
    if name not in INTEGRATOR_NAMES:
        return f"{where}: name {name!r} is not an integrator ShardMD knows ({', '.join(INTEGRATOR_NAMES)})"
    bad = _non_finite(d)
    if bad:
        return f"{where}: {bad} is not a finite number"
    for key in _NUMBERS:
        if key in d and not _is_num(d[key]) and not (key == "vol0" and d[key] is None):
            return f"{where}: {key} is {d[key]!r}, expected a number"
    if "t_current" in d and d["t_current"] is not None and not (_is_num(d["t_current"]) and d["t_current"] >= 0):
        return f"{where}: t_current is {d['t_current']!r}, expected a temperature >= 0 or null"
    for key, low in _COUNTS.items():
        if key in d and not (_is_int(d[key]) and (low is None or d[key] >= low)):
            return f"{where}: {key} is {d[key]!r}, expected an integer" + ("" if low is None else f" >= {low}")
    if _is_num(d.get("dt")) and d["dt"] <= 0:
        return f"{where}: dt is {d['dt']!r}, expected > 0"
    for key, length in _CHAINS.items():
        if key not in d or (key == "mvv" and d[key] is None):
            continue
        want = length if _is_int(length) else (d[length[0]] + length[1] if _is_int(d.get(length[0])) else None)
        v = d[key]
        if not isinstance(v, list) or not all(_is_num(x) for x in v) or (_is_int(want) and len(v) != want):
            return f"{where}: {key} must be a list of {want if _is_int(want) else 'n'} numbers"
    need_key, needed = _NEEDS.get(name, (None, ()))
    if need_key is not None and d.get(need_key) is not None:
        missing = [k for k in needed if k not in d]
        if missing:
            return f"{where}: {missing[0]} is missing (a {name} state with {need_key} needs it)"
    if "couple" in d and not isinstance(d["couple"], str):
        return f"{where}: couple is {d['couple']!r}, expected iso, aniso or tri"
    if name == "npt" and d.get("n_atoms") is not None and d["n_atoms"] != len(ids):
        return f"{where}: n_atoms is {d['n_atoms']}, but the checkpoint holds {len(ids)} atoms"
    if "thermostat" in d:
        inner = d["thermostat"]
        problem = integrator_problem(inner, ids, f"{where}: thermostat")
        if problem:
            return problem
    return _engine_keys_problem(d, ids, where)


def _engine_keys_problem(d: dict, ids: np.ndarray, where: str) -> str | None:
    """The keys the engine adds: the barostat's reference_cell (3 x 3) and grid (3 counts),
    and the fixed atoms' id ranges."""
    rc = d.get("reference_cell")
    if rc is not None and not (isinstance(rc, list) and len(rc) == 3
                               and all(isinstance(r, list) and len(r) == 3 and all(_is_num(x) for x in r)
                                       for r in rc)):
        return f"{where}: reference_cell must be 3 x 3 numbers"
    g = d.get("grid")
    if g is not None and not (isinstance(g, list) and len(g) == 3 and all(_is_int(x) and x >= 1 for x in g)):
        return f"{where}: grid must be 3 integers >= 1"
    if d.get("fixed_ids"):
        problem = fixed_ranges_problem(d["fixed_ids"], ids)
        if problem:
            return f"{where}: fixed_ids {problem}"
    elif "fixed_ids" in d and not isinstance(d["fixed_ids"], list):
        return f"{where}: fixed_ids is {d['fixed_ids']!r}, expected a list of [start, stop) id ranges"
    return None


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _non_finite(x, path: str = "") -> str | None:
    """The key path of the first non-finite float in a parsed JSON value (NaN, Infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return path or "a value"
    if isinstance(x, dict):
        items = x.items()
    elif isinstance(x, list):
        items = ((f"[{i}]", v) for i, v in enumerate(x))
    else:
        return None
    for k, v in items:
        sub = f"{path}{k}" if str(k).startswith("[") else (f"{path}.{k}" if path else str(k))
        found = _non_finite(v, sub)
        if found:
            return found
    return None


def fixed_ranges_problem(ranges, ids) -> str | None:
    """Why ``ranges`` (a checkpoint's ``fixed_ids``: [start, stop) pairs of integers, sorted,
    not overlapping) cannot be the fixed atoms of a system of atom ``ids`` ((n,) array); None
    when they can.  Checked without expanding the ranges: each must lie within the ids, every
    id it names must exist, and at least one atom must stay mobile (a run where nothing moves
    has no temperature; a fresh run refuses that set too)."""
    if not isinstance(ranges, list):
        return f"is {type(ranges).__name__}, expected a list of [start, stop) id ranges"
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    n, hi = len(ids), int(ids[-1]) + 1 if len(ids) else 0
    count, last = 0, None
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in r)):
            return f"holds {str(r)[:40]}, expected [start, stop) pairs of integers"
        a, b = r
        if not 0 <= a < b <= hi:
            return f"holds the range [{a}, {b}), outside the atom ids 0..{hi - 1}"
        if last is not None and a < last:
            return f"holds the range [{a}, {b}) out of order or overlapping the one before"
        inside = int(np.searchsorted(ids, b) - np.searchsorted(ids, a))
        if inside != b - a:
            return f"holds the range [{a}, {b}), which names {b - a - inside} id(s) no atom has"
        count, last = count + (b - a), b
    if count >= n:
        return f"fixes every atom ({n}): nothing would move (a fresh run refuses that too)"
    return None


#: a model input's name in ``inputs/`` (a Python identifier of 64 characters at most)
INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: most inputs of a kind, most features per row (a damaged file cannot ask for more)
MAX_INPUTS, MAX_FEATURES = 64, 4096


def inputs_layout(f: h5py.File, n: int) -> tuple[dict, str | None]:
    """({"atoms": {name: dataset}, "system": {name: dataset}}, None) for the optional
    ``inputs/`` group of an open checkpoint of ``n`` atoms ({} without one), else (None, a
    reason); metadata only: nothing is read."""
    if "inputs" not in f:
        return {}, None
    g = dataset(f, "inputs", h5py.Group)
    if isinstance(g, str):
        return None, g
    other = sorted(set(g.keys()) - {"atoms", "system"})
    if other:
        return None, f"inputs/{other[0][:40]!r} is not a kind of input (atoms, system)"
    out, total = {}, 0
    for kind, rows in (("atoms", n), ("system", 1)):
        if kind not in g:
            continue
        sub = dataset(g, kind, h5py.Group)
        if isinstance(sub, str):
            return None, f"inputs/{sub}"
        names = list(sub.keys())
        if len(names) > MAX_INPUTS:
            return None, f"inputs/{kind} holds {len(names)} inputs, more than {MAX_INPUTS}"
        out[kind] = {}
        for name in names:
            where = f"inputs/{kind}/{name[:40]!r}"
            if not INPUT_NAME.match(name):
                return None, f"{where} is not a valid input name (letters, digits, _)"
            d = dataset(sub, name)
            if isinstance(d, str):
                return None, f"inputs/{kind}/{d}"
            shape = d.shape
            if shape is None or not 1 <= len(shape) <= 2 or shape[0] != rows or (
                    len(shape) == 2 and not 1 <= shape[1] <= MAX_FEATURES):
                return None, (f"{where} has shape {shape}, expected ({rows},) or ({rows}, F)"
                              + (f" ({n} atoms, the length of atoms/ids)" if kind == "atoms" else ""))
            problem = shape_problem(d, where, tuple(shape), "f") or unwritten_problem(d, where)
            if problem:
                return None, problem
            total += nbytes(d)
            out[kind][name] = d
    problem = budget_problem(total, "its model inputs")
    return (None, problem) if problem else (out, None)


def inputs_values_problem(inputs: dict) -> str | None:
    """A reason the loaded model inputs ({"atoms": {name: array}, "system": ...}) cannot be
    used: non-finite values; None when they can."""
    for kind, arrays in inputs.items():
        for name, a in arrays.items():
            if not np.isfinite(np.asarray(a)).all():
                return f"inputs/{kind}/{name} holds non-finite values"
    return None


#: most datasets of the optional ``minimizer/`` group, and their most axes
MAX_MINIMIZER_SETS, MAX_MINIMIZER_AXES = 64, 3


def minimizer_layout(f: h5py.File) -> tuple[dict | None, str | None]:
    """({"state": the JSON text, "sets": {name: dataset}}, None) for the optional ``minimizer/``
    group of an open checkpoint (a relaxation's state: engine/relax/base.py; {} without one),
    else (None, a reason); metadata only: nothing is read.  Its meaning (shapes against the
    method and the atom count) is checked where it is used."""
    if "minimizer" not in f:
        return {}, None
    g = dataset(f, "minimizer", h5py.Group)
    if isinstance(g, str):
        return None, g
    problem = _attr_problem(g.attrs, "state", "str")
    if problem:
        return None, f"minimizer/ {problem}"
    names = list(g.keys())
    if len(names) > MAX_MINIMIZER_SETS:
        return None, f"minimizer/ holds {len(names)} datasets, more than {MAX_MINIMIZER_SETS}"
    sets, total = {}, 0
    for name in names:
        where = f"minimizer/{name[:40]!r}"
        if not INPUT_NAME.match(name):
            return None, f"{where} is not a valid name (letters, digits, _)"
        d = dataset(g, name)
        if isinstance(d, str):
            return None, f"minimizer/{d}"
        if d.shape is None or len(d.shape) > MAX_MINIMIZER_AXES:
            return None, f"{where} has shape {d.shape}, expected at most {MAX_MINIMIZER_AXES} axes"
        problem = shape_problem(d, where, tuple(d.shape), "fiu") or unwritten_problem(d, where)
        if problem:
            return None, problem
        total += nbytes(d)
        sets[name] = d
    problem = budget_problem(total, "its minimiser state")
    return (None, problem) if problem else ({"state": g.attrs["state"], "sets": sets}, None)


def minimizer_values_problem(mini: dict) -> str | None:
    """A reason the loaded minimiser state ({"state": dict, "arrays": {name: array}}) cannot
    be used: non-finite numbers; None when it can."""
    bad = _non_finite(mini["state"])
    if bad:
        return f"minimizer state {bad} is not a finite number"
    for name, a in mini["arrays"].items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return f"minimizer/{name} holds non-finite values"
    return None
