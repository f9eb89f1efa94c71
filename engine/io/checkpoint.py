"""Restart checkpoints (HDF5): everything needed to continue a run exactly.

File layout (``<output>.ckpt/step-<step>.h5``, units as attributes):

    attrs   kind="shardmd-checkpoint", format=1, code_version, step, time [fs], created,
            model_name, model_identity (sha256 of the model's parameters or file),
            config (run config, JSON: values written as ``${...}`` kept as written, with
            digests of the physics keys' resolved values), integrator (state dict, JSON)
    atoms/  positions [Å], images, velocities [Å/fs], masses [amu], numbers, ids,
            reference_positions [Å] (positions at the last neighbour rebuild)
            (id order, the run's float dtype: restarts continue bit for bit)
    box/    cell [Å] (3, 3), pbc (3,)
    inputs/ only for a model that declares inputs (engine/run/model_inputs.py): atoms/<name>
            (n, *F) per-atom values (e.g. charges [e], id order), system/<name> (1, *F)
    minimizer/  only for a relaxation (``python -m engine minimize``, engine/relax/base.py):
            attribute state (JSON: the method and its scalars), the method's arrays as
            datasets (the optimiser's history; velocities are FIRE's, not MD's)

Random numbers are counter-based (keyed by seed, step, stream and atom id): the seed and
the step are the whole generator state.

Crash safety: a checkpoint is written to a new temporary file in the same directory
(``.step-<step>.h5.<random>.tmp``, created with O_EXCL | O_NOFOLLOW, so a symlink planted
under a predictable name is never followed, and written through that descriptor only),
flushed and fsynced, then renamed over its final name (atomic on POSIX) and the directory is
fsynced; only then are checkpoints beyond the newest ``checkpoint.keep`` deleted.  A write
that fails (disk full, read-only, I/O error) removes its temporary file, deletes no older
checkpoint and raises a one-line OutputError (exit status 4).  A checkpoint directory or
final name that is a symlink (or not a directory / regular file) is refused, not followed.
Temporaries a killed writer left are ignored, and removed by a later run when they are ours
(name, owner, older than the process).  A reader therefore only ever sees complete files; a
file that fails to open, lacks a field or fails validation (``checkpoint_check``: shapes and
sizes from metadata before any array is read, then values, integrator state, fixed atoms) is
reported in one line naming the file, the field and the problem; ``restart=auto`` passes over
it to the next older one and says so in one line.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import time
from pathlib import Path

import h5py
import numpy as np

from shardmd.engine.errors import OneLineWarning, OutputError, UserError
from shardmd.engine.io.checkpoint_check import (
    inputs_layout,
    inputs_values_problem,
    layout_problem,
    minimizer_layout,
    minimizer_values_problem,
    parse_json,
    values_problem,
)
from shardmd.engine.io.safe_io import IO_ERRORS, fsync_dir, output_error

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


def model_identity_of(origin: dict) -> str:
    """sha256 naming a model by where it came from (``models.registry.model_origin`` or
    :func:`api_model_origin`): route, factory, arguments, the hashes of its files and the head a
    multi-head model runs (so a restart with another head is refused).  A shipped model built
    from the config keeps :func:`model_identity` of its config node (the head resolved in it)."""
    from shardmd.models.registry import MODELS

    route = str(origin.get("route"))
    if route in MODELS and "api" not in origin:
        args = dict(origin.get("arguments", {}))
        if origin.get("head") is not None:   # a multi-head model: the head it resolved to, given or not
            args["head"] = origin["head"]
        ck = args.get("checkpoint")   # model_identity hashes this file itself; any other file (nequip's
        ck = str(Path(str(ck)).resolve()) if ck and Path(str(ck)).is_file() else None   # config, weights)
        others = {p: h for p, h in origin.get("files", {}).items() if p != ck}
        if others:
            args["files_sha256"] = others
        return model_identity({"name": route, **args})
    return hashlib.sha256(json.dumps(origin, sort_keys=True, default=str).encode()).hexdigest()


def api_model_origin(model) -> dict:
    """The origin of a model object given to ``Simulation(model=...)``: its class, cutoff and
    the sha256 of its tensors (parameters, buffers and tensor attributes)."""
    import torch

    inner = getattr(model, "model", model) if type(model).__name__ == "DistributedModel" else model
    h = hashlib.sha256()
    tensors = dict(inner.state_dict()) if isinstance(inner, torch.nn.Module) else {}
    for k, v in sorted(vars(inner).items()) if hasattr(inner, "__dict__") else ():
        if isinstance(v, torch.Tensor):
            tensors.setdefault(k, v)
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
            for i, x in enumerate(v):
                tensors.setdefault(f"{k}.{i}", x)
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].detach().cpu().contiguous().numpy().tobytes())
    cls = type(inner)
    cutoff = getattr(inner, "cutoff", None)
    return {"route": f"api:{cls.__module__}.{cls.__qualname__}", "api": True,
            "cutoff": float(cutoff) if cutoff is not None else None, "tensors_sha256": h.hexdigest()}


#: temporary files of write_checkpoint: ``.step-<step>.h5.<random>.tmp`` (hidden, unpredictable)
_TMP_NAME = re.compile(r"^\.step-\d+\.h5\.[A-Za-z0-9_-]+\.tmp$")
#: temporaries older than this process (a killed writer's) may be removed
_PROCESS_START = time.time()


def write_checkpoint(directory: Path, step: int, time_fs: float, arrays: dict, cell: np.ndarray, pbc: np.ndarray,
                     config: dict, integrator: dict, model_name: str, model_id: str, code_version: str,
                     keep: int = 3, inputs: dict | None = None, minimizer: dict | None = None) -> Path:
    """Write atomically; return the final path.  ``arrays`` hold full per-atom data in id order;
    ``inputs``: the model's inputs, {"atoms": {name: (n, *F)}, "system": {name: (1, *F)}}
    (engine/run/model_inputs.py), written only when there are any; ``minimizer``: a
    relaxation's state, {"state": JSON-able dict, "arrays": {name: array}} (engine/relax/base.py).

    The file is written to a new temporary file in ``directory``, created exclusively
    (O_EXCL | O_NOFOLLOW) under an unpredictable name and written through that descriptor
    only; then flushed, fsynced, renamed over ``step-<step>.h5`` and the directory fsynced.
    Only then are checkpoints beyond the newest ``keep`` deleted.  A failure removes the
    temporary file, deletes nothing else and raises a one-line OutputError (exit status 4).
    A ``directory`` or final name that is a symlink, or not a directory / regular file, is
    refused with OutputError: nothing is written through a link.
    """
    directory = Path(directory)
    final = directory / f"step-{step:012d}.h5"
    older = "older checkpoints are kept"
    _prepare_dir(directory, final)
    _remove_stale_tmp(directory)
    tmp, fd = _create_tmp(directory, f".step-{step:012d}.h5.", ".tmp", final)
    try:
        with os.fdopen(fd, "w+b") as fo:
            with h5py.File(fo, "w") as f:  # HDF5 writes through our descriptor, never by name
                _fill_checkpoint(f, step, time_fs, arrays, cell, pbc, config, integrator, model_name, model_id,
                                 code_version, inputs, minimizer)
            fo.flush()
            os.fsync(fo.fileno())
        if final.is_symlink() or (os.path.lexists(final) and not final.is_file()):
            raise _refuse(final, "appeared as a symlink or non-file while the checkpoint was written")
        os.replace(tmp, final)  # replaces a directory entry; never writes through a link
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, IO_ERRORS):
            raise output_error("write checkpoint", final, exc, tail=older) from None
        raise
    try:
        fsync_dir(directory)
    except OSError as exc:
        raise output_error("make the checkpoint durable (fsync of its directory)", final, exc,
                           tail=older) from None
    # rotation only now that the new checkpoint is durable; unlink never follows a link
    for _, old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        if old.name != final.name:
            try:
                old.unlink(missing_ok=True)
            except OSError:
                pass  # an old checkpoint left over is harmless
    return final


def _fill_checkpoint(f: h5py.File, step, time_fs, arrays, cell, pbc, config, integrator, model_name, model_id,
                     code_version, inputs=None, minimizer=None) -> None:
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
    for kind, named in (inputs or {}).items():
        if named:
            sub = f.require_group("inputs").create_group(kind)
            for name, value in named.items():
                sub.create_dataset(name, data=np.asarray(value))
    if minimizer is not None:   # a relaxation's state: scalars as JSON, arrays as datasets (never pickled)
        g = f.create_group("minimizer")
        g.attrs["state"] = json.dumps(minimizer["state"])
        for name, value in minimizer["arrays"].items():
            g.create_dataset(name, data=np.asarray(value))


def _refuse(path: Path, what: str) -> OutputError:
    try:
        what += f" (to {os.readlink(path)!r})" if os.path.islink(path) else ""
    except OSError:
        pass
    return output_error("write checkpoint", path, None, reason=f"it {what}",
                        fix="ShardMD does not write checkpoints through links or over non-files: remove it "
                            "or choose another output=")


def _prepare_dir(directory: Path, final: Path) -> None:
    """Create ``directory`` if missing; refuse a symlink or a non-directory there, and a final
    name that is a symlink or not a regular file."""
    for _attempt in range(2):
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            try:
                directory.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(directory)
            except FileExistsError:
                continue  # someone made it meanwhile: check what it is
            except OSError as exc:
                raise output_error("create the checkpoint directory", directory, exc) from None
            continue
        except OSError as exc:
            raise output_error("use the checkpoint directory", directory, exc) from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(directory, "is a symlink")
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(directory, "exists and is not a directory")
        break
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise output_error("write checkpoint", final, exc) from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(final, "is a symlink")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(final, "exists and is not a regular file")


def _create_tmp(directory: Path, prefix: str, suffix: str, final: Path) -> tuple[Path, int]:
    """A new file in ``directory`` under an unpredictable name, created exclusively without
    following links (what ``tempfile.mkstemp`` does, but with the umask's permissions)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = directory / f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise output_error("write checkpoint", final, exc, tail="older checkpoints are kept") from None
    raise output_error("write checkpoint", final, None, reason="no free temporary name",
                       tail="older checkpoints are kept")


def _remove_stale_tmp(directory: Path) -> None:
    """Remove temporary files a killed writer left: ours by name and owner, regular files,
    last modified before this process started.  Anything else is left alone; errors are
    ignored (a leftover never blocks a write: every write uses a new name)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not _TMP_NAME.match(name):
            continue
        p = directory / name
        try:
            st = os.lstat(p)
            if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                    and st.st_mtime < _PROCESS_START):
                os.unlink(p)  # removes the entry itself, never a link's target
        except OSError:
            pass


def _fsync_dir(directory: Path) -> None:
    """fsync ``directory`` (see :func:`shardmd.engine.io.safe_io.fsync_dir`); raises OSError on EIO."""
    fsync_dir(directory)


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
    """Load a checkpoint; one-line UserError for anything that is not a complete, valid one.

    Validated before anything is allocated from it (:mod:`shardmd.engine.io.checkpoint_check`):
    the attributes, every dataset's shape and dtype from the file's metadata against the atom
    count, the arrays' total size against the memory this process can use; then the values
    (finite, in range), the integrator state and the fixed atoms."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"restart file {str(p)!r} does not exist; give a checkpoint (.ckpt/step-*.h5) or restart=auto")
    if not p.is_file():
        raise UserError(f"restart file {str(p)!r} is not a regular file; give a checkpoint (.ckpt/step-*.h5)")
    if not h5py.is_hdf5(p):
        raise UserError(f"restart file {str(p)!r} is not an HDF5 file (truncated or another format); "
                        "give a ShardMD checkpoint")
    try:
        with h5py.File(p, "r") as f:
            if f.attrs.get("kind") != KIND:
                what = "an H5MD trajectory" if "h5md" in f else "not a ShardMD checkpoint"
                raise UserError(f"restart file {str(p)!r} is {what}; restart from a checkpoint in "
                                f"{checkpoint_dir(p)}/ or {p.with_suffix('.ckpt')}/")
            problem = layout_problem(f, FORMAT)
            if problem:
                raise _unusable(p, problem)
            inputs, problem = inputs_layout(f, int(f["atoms/ids"].shape[0]))
            if problem:
                raise _unusable(p, problem)
            mini, problem = minimizer_layout(f)
            if problem:
                raise _unusable(p, problem)
            out = {k: f.attrs[k] for k in ("step", "time", "model_name", "model_identity", "code_version")}
            for k in ("model_name", "model_identity", "code_version"):
                out[k] = out[k].decode() if isinstance(out[k], bytes) else str(out[k])
            out["step"], out["time"] = int(out["step"]), float(out["time"])
            for k in ("config", "integrator"):
                out[k], problem = parse_json(f.attrs[k], k)
                if problem:
                    raise _unusable(p, problem)
            out["arrays"] = {name: f["atoms"][name][()] for name in ATOM_FIELDS}
            out["cell"] = f["box/cell"][()]
            out["pbc"] = f["box/pbc"][()]
            if inputs:
                out["inputs"] = {kind: {k: d[()] for k, d in named.items()} for kind, named in inputs.items()}
            if mini:
                state, problem = parse_json(mini["state"], "minimizer/state")
                if problem:
                    raise _unusable(p, problem)
                out["minimizer"] = {"state": state, "arrays": {k: d[()] for k, d in mini["sets"].items()}}
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, MemoryError) as exc:
        raise UserError(f"restart file {str(p)!r} is damaged or incomplete ({type(exc).__name__}); "
                        "use an older checkpoint or restart=auto") from None
    problem = (checkpoint_problem(out) or inputs_values_problem(out.get("inputs", {}))
               or (minimizer_values_problem(out["minimizer"]) if "minimizer" in out else None))
    if problem:
        raise _unusable(p, problem)
    return out


def _unusable(p: Path, problem: str) -> UserError:
    return UserError(f"restart file {str(p)!r} is not a usable checkpoint: {problem}; "
                     "use an older checkpoint or restart=auto")


def checkpoint_problem(ck: dict) -> str | None:
    """What makes a loaded checkpoint unusable (None: nothing): every field is checked before
    any of it is used, since a file may be damaged, edited or not ours (shapes and types here,
    for a dict not read by :func:`read_checkpoint`; values: ``checkpoint_check.values_problem``)."""
    a = ck["arrays"]
    if ck["step"] < 0 or not np.isfinite(ck["time"]):
        return f"step {ck['step']} / time {ck['time']} out of range"
    ids = np.asarray(a["ids"])
    n = ids.shape[0] if ids.ndim == 1 else -1
    if n < 1:
        return "it holds no atoms (or ids of the wrong shape)"
    for name in ATOM_FIELDS:
        want = (n, 3) if name in ("positions", "images", "velocities", "reference_positions") else (n,)
        arr = np.asarray(a[name])
        if arr.shape != want:
            return f"atoms/{name} has shape {arr.shape}, expected {want}"
        kind = "iu" if name in ("images", "numbers", "ids") else "f"
        if arr.dtype.kind not in kind:
            return f"atoms/{name} has type {arr.dtype}"
    cell, pbc = np.asarray(ck["cell"]), np.asarray(ck["pbc"])
    if cell.shape != (3, 3) or cell.dtype.kind not in "fiu" or pbc.shape != (3,):
        return "box/cell must be a finite (3, 3) array and box/pbc three booleans"
    try:
        return values_problem(ck)
    except RecursionError:
        return "the integrator state is nested too deeply"


class CheckpointSkipped(OneLineWarning):
    """``restart=auto`` passed over a checkpoint that does not validate: one line naming it and why."""


def newest_valid(directory: Path, skipped: list[str] | None = None) -> tuple[Path, dict] | None:
    """The newest checkpoint in ``directory`` that validates (older ones as fallback); None
    when there is none.  The reason for each newer one passed over is appended to ``skipped``
    (one line each).  Checkpoints present but none usable is an error, never a fresh start: a
    fresh start would replace the trajectory those checkpoints belong to."""
    found = list_checkpoints(directory)
    reasons = []
    for _, p in reversed(found):
        try:
            ck = read_checkpoint(p)
        except UserError as exc:
            reasons.append(exc.one_line())
            continue
        if skipped is not None:
            skipped.extend(f"restart=auto skipped {r}" for r in reasons)
        return p, ck
    if found:
        raise UserError(f"restart=auto: none of the {len(found)} checkpoint(s) in {str(directory)!r} can be "
                        f"used (newest: {reasons[0]}); nothing was changed. Restart from a good copy with "
                        "restart=PATH, or move the folder away and start fresh")
    return None


#: config keys whose change alters the physics of a continued run (compared by
#: engine/config/expressions.physics_changes: a key written as an expression by its digest)
PHYSICS_KEYS = ("model", "dt", "integrator", "temperature", "seed", "precision")

