"""Starting a run: fresh, from a checkpoint, or ``restart=auto`` (idempotent resubmission).

- ``restart.file=PATH`` (or ``restart=PATH``) continues from that checkpoint;
- ``restart=auto`` continues from the newest checkpoint in ``<output>.ckpt/`` that validates
  (``engine/io/checkpoint_check.py``; each newer one passed over is named with its reason in one
  ``Warning:`` line on stderr) if there is one, else starts fresh (replacing a partial output
  of a run that died before its first checkpoint), so resubmitting the same job script is idempotent;
- a fresh run never replaces an existing output file unless ``overwrite=true``;
- physics-changing differences from the checkpoint's config (model, dt, integrator,
  temperature, seed, precision) need ``restart.allow_changes=true``;
- ``steps`` is the total step number to reach, not the number of steps to add.

A checkpoint also stores each atom's position at the last neighbour rebuild.  The restarted
run rebuilds its ghosts and neighbour lists from those positions, so it has exactly the
lists, atom order and summation order of the uninterrupted run: continuation is bit-exact
on the same domain count whatever step the checkpoint was taken at.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from shardmd.engine.config.compose import to_container
from shardmd.engine.config.expressions import expression_paths, identity_matches, physics_changes, shown_checkpoint
from shardmd.engine.errors import CollectiveError, UserError
from shardmd.engine.io.checkpoint import (
    PHYSICS_KEYS,
    CheckpointSkipped,
    checkpoint_dir,
    model_identity,
    newest_valid,
    read_checkpoint,
)
from shardmd.engine.launch.parallel import env_rank
from shardmd.engine.run.state import State


def resolve(cfg, identity: str | None = None, label: str | None = None, record: dict | None = None) -> dict | None:
    """The checkpoint to continue from (loaded), or None for a fresh start; checks overwrite.

    identity: the run's model identity (``checkpoint.model_identity_of``); default: that of
    the config's model node.  Another model than the checkpoint's is refused unless
    ``restart.allow_changes``; record: the run's configuration as it stores it, resolved
    (``Simulation.record(stored=False)``; default: ``cfg``).  A checkpoint's physics keys that
    hold expressions are compared by their digests (engine/config/expressions.py)."""
    out = Path(cfg.output)
    spec = cfg.restart.file
    ckpt = None
    try:   # every rank reads the same files: an error is met alike everywhere
        if spec == "auto":
            skipped: list[str] = []
            found = newest_valid(checkpoint_dir(out), skipped)
            if env_rank() == 0:   # every rank reads the same files: rank 0 says it once
                for line in skipped:
                    warnings.warn(line, CheckpointSkipped, stacklevel=2)
            ckpt = found[1] if found else None
            if ckpt is not None:
                ckpt["path"] = str(found[0])
        elif spec:
            ckpt = read_checkpoint(spec)
            ckpt["path"] = str(spec)
    except UserError as exc:
        raise CollectiveError(str(exc)) from None
    if ckpt is None:
        if out.exists() and int(cfg.trajectory.every) > 0 and not cfg.overwrite and spec != "auto":
            raise CollectiveError(f"output {str(out)!r} exists; add overwrite=true to replace it, "
                                  "restart=auto to continue it, or choose another output=")
        return None
    # messages and the log name it by the expression of restart.file or output that found it
    ckpt["shown"] = shown_checkpoint(expression_paths(cfg), ckpt["path"])
    new = record or to_container(cfg)   # resolved: a stored expression's digest is compared with it
    if not cfg.restart.allow_changes:
        changed = physics_changes(ckpt["config"], new, PHYSICS_KEYS)
        if changed:
            raise CollectiveError(f"restart would change {', '.join(changed)} from the checkpoint "
                                  f"{ckpt['shown']}; add restart.allow_changes=true to accept that")
        if not identity_matches(ckpt["model_identity"], identity or model_identity(new["model"])):
            now = label or new["model"].get("name")
            raise CollectiveError(f"checkpoint {ckpt['shown']} was written with another model ({ckpt['model_name']}, "
                                  f"this run: {now}, or the same name with other arguments or files); use its "
                                  "model or add restart.allow_changes=true")
    if ckpt["step"] > int(cfg.steps):
        raise CollectiveError(f"checkpoint {ckpt['shown']} is at step {ckpt['step']}, past steps={cfg.steps}; "
                              "steps is the total step to reach: raise it")
    return ckpt


def state_from_checkpoint(ckpt: dict, dtype: torch.dtype, device) -> tuple[State, torch.Tensor | None]:
    """Full state (id order) of a checkpoint, and its positions of the last neighbour rebuild
    ((n, 3) Å, id order; None in a checkpoint without them)."""
    a = ckpt["arrays"]
    t = lambda x, dt=dtype: torch.as_tensor(np.asarray(x)).to(dtype=dt, device=device).contiguous()  # noqa: E731
    s = State(
        positions=t(a["positions"]), velocities=t(a["velocities"]),
        forces=torch.zeros(len(a["ids"]), 3, dtype=dtype, device=device), masses=t(a["masses"]),
        numbers=t(a["numbers"], torch.int64), ids=t(a["ids"], torch.int64),
        images=t(a["images"], torch.int32), cell=t(ckpt["cell"]),
        pbc=torch.as_tensor(np.asarray(ckpt["pbc"], dtype=bool), device=device),
        step=int(ckpt["step"]), time=float(ckpt["time"]),
        inputs={k: t(v) for k, v in ckpt.get("inputs", {}).get("atoms", {}).items()},
        system_inputs={k: t(v) for k, v in ckpt.get("inputs", {}).get("system", {}).items()},
    )
    return s, (t(a["reference_positions"]) if "reference_positions" in a else None)
