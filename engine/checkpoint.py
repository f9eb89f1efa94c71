"""Restart checkpoints (HDF5): everything needed to continue a run exactly.

File layout (``<output>.ckpt/step-<step>.h5``, units as attributes):

    attrs   kind="shardmd-checkpoint", format=1, code_version, step, time [fs], created,
            model_name, model_identity (sha256 of the model's parameters or file),
            config (resolved run config, JSON), integrator (state dict, JSON)
    atoms/  positions [Å], images, velocities [Å/fs], masses [amu], numbers, ids,
            reference_positions [Å] (positions at the last neighbour rebuild)
            (id order, the run's float dtype: restarts continue bit for bit)
    box/    cell [Å] (3, 3), pbc (3,)

Random numbers are counter-based (keyed by seed, step, stream and atom id): the seed and
the step are the whole generator state.

Crash safety: a checkpoint is written to ``.tmp``, flushed and fsynced, then renamed over
its final name (atomic on POSIX) and the directory is fsynced; the newest ``checkpoint.keep``
are kept.  A reader therefore only ever sees complete files; a file that fails to open or
lacks a field is reported in one line (and skipped by ``restart=auto``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import h5py
import numpy as np

from .errors import UserError

KIND = "shardmd-checkpoint"
FORMAT = 1
ATOM_FIELDS = ("positions", "images", "velocities", "masses", "numbers", "ids", "reference_positions")
_NAME = re.compile(r"^step-(\d+)\.h5$")


def checkpoint_dir(output: str | Path) -> Path:
    p = Path(output)
    return p.with_name(p.stem + ".ckpt")


def model_identity(model_cfg: dict) -> str:
    """sha256 of the model's parameters (and of its weights file, when it has one)."""
    h = hashlib.sha256(json.dumps(model_cfg, sort_keys=True, default=str).encode())
    ck = model_cfg.get("checkpoint")
    if ck and Path(str(ck)).is_file():
        with open(ck, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def write_checkpoint(directory: Path, step: int, time_fs: float, arrays: dict, cell: np.ndarray, pbc: np.ndarray,
                     config: dict, integrator: dict, model_name: str, model_id: str, code_version: str,
                     keep: int = 3) -> Path:
    """Write atomically; return the final path.  ``arrays`` hold full per-atom data in id order."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:012d}.h5"
    tmp = final.with_suffix(".h5.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update({
            "kind": KIND, "format": FORMAT, "code_version": code_version, "step": int(step),
            "time": float(time_fs), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model_name": model_name, "model_identity": model_id,
            "config": json.dumps(config, default=str), "integrator": json.dumps(integrator),
        })
        g = f.create_group("atoms")
        units = {"positions": "angstrom", "velocities": "angstrom fs-1", "masses": "amu",
                 "reference_positions": "angstrom"}
        for name in ATOM_FIELDS:
            d = g.create_dataset(name, data=arrays[name])
            if name in units:
                d.attrs["unit"] = units[name]
        b = f.create_group("box")
        b.create_dataset("cell", data=cell).attrs["unit"] = "angstrom"
        b.create_dataset("pbc", data=np.asarray(pbc, dtype=bool))
        f.flush()
        os.fsync(f.id.get_vfd_handle())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for old in sorted(list_checkpoints(directory))[:-keep] if keep > 0 else []:
        old[1].unlink(missing_ok=True)
    return final


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in ``directory`` (unsorted validity)."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def read_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint; one-line UserError for anything that is not a complete one."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"restart file {str(p)!r} does not exist; give a checkpoint (.ckpt/step-*.h5) or restart=auto")
    if not h5py.is_hdf5(p):
        raise UserError(f"restart file {str(p)!r} is not an HDF5 file (truncated or another format); "
                        "give a ShardMD checkpoint")
    try:
        with h5py.File(p, "r") as f:
            if f.attrs.get("kind") != KIND:
                what = "an H5MD trajectory" if "h5md" in f else "not a ShardMD checkpoint"
                raise UserError(f"restart file {str(p)!r} is {what}; restart from a checkpoint in "
                                f"{checkpoint_dir(p)}/ or {p.with_suffix('.ckpt')}/")
            out = {k: f.attrs[k] for k in ("step", "time", "model_name", "model_identity", "code_version")}
            out["step"], out["time"] = int(out["step"]), float(out["time"])
            out["config"] = json.loads(f.attrs["config"])
            out["integrator"] = json.loads(f.attrs["integrator"])
            out["arrays"] = {name: f["atoms"][name][()] for name in ATOM_FIELDS}
            out["cell"] = f["box/cell"][()]
            out["pbc"] = f["box/pbc"][()]
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"restart file {str(p)!r} is damaged or incomplete ({type(exc).__name__}); "
                        "use an older checkpoint or restart=auto") from None
    return out


def newest_valid(directory: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint in ``directory`` that loads completely (older ones as fallback)."""
    for _, p in reversed(list_checkpoints(directory)):
        try:
            return p, read_checkpoint(p)
        except UserError:
            continue
    return None


#: config keys whose change alters the physics of a continued run
PHYSICS_KEYS = ("model", "dt", "integrator", "temperature", "seed", "precision")


def physics_changes(old: dict, new: dict) -> list[str]:
    return [k for k in PHYSICS_KEYS if json.dumps(old.get(k), sort_keys=True, default=str)
            != json.dumps(new.get(k), sort_keys=True, default=str)]
