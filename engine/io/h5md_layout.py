"""The H5MD file's building blocks (engine/io/h5md.py's writer uses them): chunking of
time-dependent elements and the run configuration stored under ``/parameters``.

Layout::

    /h5md                   attrs version=[1, 1]; groups author (name), creator (name, version),
                            modules/units (version=[1, 0], system="ShardMD")
    /particles/all/
        species (n,) int32, mass (n,) float64 [amu], id (n,) int64   (time-independent)
        position|image|velocity|force/{step, time, value}   value (frames, n, 3)
        energy/{step, time, value}                          value (frames, n) [eV], per-atom energies
        box/                attrs dimension=3, boundary=["periodic"|"none"]*3
            edges/{step, time, value}                       value (frames, 3, 3), rows = lattice vectors
    /observables/<name>/{step, time, value}                 value (rows,) or (rows, 3, 3)
    /parameters/config_json (JSON string, authoritative) and /parameters/config/... (nested
                            groups with scalar attributes, for browsing with h5ls/h5dump)

``step`` is int64 with fill value -1, ``time`` float64 [fs] with fill value NaN; all three
datasets of an element are chunked and resizable along the first axis (maxshape None).
Per-atom chunks hold whole frames (several small frames per chunk up to ~64 KiB; one
frame split along atoms when it exceeds 16 MiB); step/time/edges/observable chunks hold
1024 rows.  Data are not compressed by default, so a chunk that is rewritten in place (a frame
added to a partly filled chunk) keeps the same address and the same bytes for older frames;
``trajectory.compression`` filters every chunked dataset and the static arrays, and
``trajectory.keep_bits`` rounds the per-atom floats first (engine/io/bitround.py).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import h5py
import numpy as np

from shardmd.engine.io.h5md_read import SCALAR_FIELDS, STEP_FILL, TIME_UNIT

ROW_CHUNK = 1024  # rows per chunk of step/time/edges/observables
FRAME_CHUNK_BYTES = 64 * 1024  # per-atom chunks hold whole frames up to this size
MAX_CHUNK_BYTES = 16 * 1024 * 1024  # a larger frame is split along atoms


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)  # paths, enums, dtypes, ...


def _attr_value(v: Any) -> Any:
    """A value h5py can store as an attribute; anything else becomes its JSON text."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, np.ndarray)) and len(v) > 0:
        a = np.asarray(v)
        if a.ndim == 1 and a.dtype.kind in "biuf":
            return a
        if a.ndim == 1 and a.dtype.kind == "U":
            return np.array([str(x) for x in v], dtype=h5py.string_dtype())
    return json.dumps(v, default=_json_default)


def _store_nested(group: h5py.Group, config: Mapping) -> None:
    for key, v in config.items():
        name = str(key).replace("/", "\u2215")
        if name in ("", "."):
            name = f"_{name}"
        if isinstance(v, Mapping):
            _store_nested(group.create_group(name), v)
            continue
        value = _attr_value(v)
        try:
            group.attrs[name] = value
        except (ValueError, RuntimeError, TypeError):  # e.g. > 64 KiB attribute
            group.create_dataset(name, data=json.dumps(v, default=_json_default),
                                 dtype=h5py.string_dtype())


def _write_config(f: h5py.File, config: Mapping) -> None:
    params = f.require_group("parameters")
    for name in ("config_json", "config"):
        if name in params:
            del params[name]
    params.create_dataset("config_json", data=json.dumps(config, default=_json_default),
                          dtype=h5py.string_dtype())
    params["config_json"].attrs["format"] = "json"
    _store_nested(params.create_group("config"), config)


def libver(compression: str | None) -> tuple[str, str]:
    """HDF5 format bounds of a new trajectory: a compressed one in HDF5 1.10's format, whose
    chunk indexes are ~2 KiB smaller per dataset than 1.8's B-trees (readers need HDF5 >= 1.10)."""
    return ("v110", "latest") if compression else ("earliest", "latest")


def _create_element(parent: h5py.Group, name: str, shape: tuple[int, ...], dtype,
                    unit: str | None, chunks: tuple[int, ...], compression: str | None = None) -> h5py.Group:
    """Create an H5MD time-dependent element {step, time, value} with zero rows; ``compression``
    (gzip, lzf) filters the values (byte-shuffled first: neighbouring floats share exponents) and
    the step and time columns (a 1024-row chunk holding a few rows is ~8 KiB of fill otherwise)."""
    g = parent.create_group(name)
    g.create_dataset("step", shape=(0,), maxshape=(None,), dtype=np.int64,
                     chunks=(ROW_CHUNK,), fillvalue=STEP_FILL, compression=compression)
    t = g.create_dataset("time", shape=(0,), maxshape=(None,), dtype=np.float64,
                         chunks=(ROW_CHUNK,), fillvalue=np.nan, compression=compression)
    t.attrs["unit"] = TIME_UNIT
    dt = np.dtype(dtype)
    v = g.create_dataset("value", shape=(0, *shape), maxshape=(None, *shape), dtype=dt, chunks=chunks,
                         fillvalue=np.nan if dt.kind == "f" else 0, compression=compression, shuffle=bool(compression))
    if unit is not None:
        v.attrs["unit"] = unit
    return g


def field_shape(name: str, n: int) -> tuple[int, ...]:
    """Shape of one frame of per-atom field ``name``: (n,) for scalar fields (energy), else (n, 3)."""
    return (n,) if name in SCALAR_FIELDS else (n, 3)


def _atom_chunks(n: int, itemsize: int, width: int = 3) -> tuple[int, ...]:
    """Chunk shape of a per-atom field with ``width`` values per atom (1: a scalar field, (n,)
    per frame, whose chunks are (frames, atoms))."""
    per_atom = width * itemsize
    atoms = max(1, min(n, MAX_CHUNK_BYTES // per_atom))
    frames = max(1, min(ROW_CHUNK, FRAME_CHUNK_BYTES // (atoms * per_atom)))
    return (frames, atoms, 3) if width == 3 else (frames, atoms)


def _new_chunk_row(d: h5py.Dataset) -> tuple[int, int]:
    """(rows per chunk, bytes allocated when a row starts a new row of chunks) of ``d``."""
    chunks = d.chunks or d.shape
    n_chunks = 1
    for size, c in zip(d.shape[1:], chunks[1:]):
        n_chunks *= -(-size // c)
    return max(1, int(chunks[0])), n_chunks * int(np.prod(chunks, dtype=np.int64)) * d.dtype.itemsize


def _resize(g: h5py.Group, rows: int) -> None:
    for ds in ("value", "time", "step"):
        d = g[ds]
        d.resize((rows, *d.shape[1:]))
