"""``python -m engine info FILE`` and ``python -m engine plot FILE OUT.png``."""
from __future__ import annotations

from pathlib import Path

import h5py

from .errors import UserError


def _open_kind(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path!r}: no such file")
    if not h5py.is_hdf5(p):
        raise UserError(f"{path!r} is not an HDF5 file; give a trajectory (.h5) or a checkpoint")
    with h5py.File(p, "r") as f:
        if f.attrs.get("kind") == "shardmd-checkpoint":
            return "checkpoint"
        if "h5md" in f or "particles" in f:
            return "trajectory"
    raise UserError(f"{path!r} is neither a ShardMD trajectory nor a checkpoint")


def _config_line(cfg: dict | None) -> list[str]:
    if not cfg:
        return ["config: (none stored)"]
    model = cfg.get("model", {})
    integ = cfg.get("integrator", {})
    return [f"model: {model.get('name')}  " + ", ".join(f"{k}={v}" for k, v in model.items() if k != "name"),
            f"integrator: {integ.get('name')}  dt={cfg.get('dt')} fs  T={cfg.get('temperature')} K  "
            f"seed={cfg.get('seed')}  precision={cfg.get('precision')}  domains={cfg.get('domains')}",
            f"steps={cfg.get('steps')}  output={cfg.get('output')}"]


def info(path: str) -> str:
    kind = _open_kind(path)
    if kind == "checkpoint":
        from .checkpoint import read_checkpoint

        c = read_checkpoint(path)
        lines = [f"{path}: ShardMD restart checkpoint (code {c['code_version']})",
                 f"atoms: {len(c['arrays']['ids'])}  step: {c['step']}  time: {c['time'] / 1000:.4f} ps",
                 f"cell (Å): {c['cell'].tolist()}  pbc: {c['pbc'].tolist()}",
                 f"model identity: {c['model_name']} {c['model_identity'][:16]}"]
        return "\n".join(lines + _config_line(c["config"]))
    from .h5md import file_summary

    s = file_summary(path)
    lines = [f"{path}: H5MD {s['h5md_version']} trajectory by {s['creator']} {s['creator_version']}",
             f"atoms: {s['n_atoms']}  frames: {s['n_frames']}  steps: {s['first_step']}..{s['last_step']}  "
             f"time: {(s['last_time_fs'] or 0) / 1000:.4f} ps  dtype: {s['dtype']}  pbc: {s['pbc']}",
             f"fields: {', '.join(s['fields'])}",
             "observables: " + ", ".join(f"{k} ({n})" for k, n in s["observables"].items())]
    return "\n".join(lines + _config_line(s["config"]))


def plot(path: str, out: str) -> str:
    if _open_kind(path) != "trajectory":
        raise UserError(f"{path!r} is a checkpoint; plot a trajectory file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plot needs matplotlib: pip install matplotlib") from None
    from shardmd.integrators.units import EV_PER_A3_TO_BAR

    from .h5md import read_observables

    obs = read_observables(path)
    panels = [("energy (eV)", ["potential_energy", "kinetic_energy", "total_energy"]),
              ("temperature (K)", ["temperature"]), ("pressure (bar)", ["pressure"])]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for ax, (label, keys) in zip(axes, panels):
        for k in keys:
            if k in obs:
                steps, times, values = obs[k]
                scale = EV_PER_A3_TO_BAR if k == "pressure" else 1.0
                ax.plot(times / 1000.0, values * scale, label=k.replace("_", " "))
        ax.set_ylabel(label)
        ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("time (ps)")
    fig.suptitle(Path(path).name)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def convert(path: str, out: str) -> str:
    """Write every frame of an H5MD trajectory to ``out`` in any format ASE writes."""
    if _open_kind(path) != "trajectory":
        raise UserError(f"{path!r} is a checkpoint; convert a trajectory file")
    from ase.io import write

    from .h5md import read_frames

    frames = read_frames(path)
    if not frames:
        raise UserError(f"{path!r} holds no frames")
    try:
        write(out, frames)
    except Exception as exc:  # unknown format, unwritable path
        raise UserError(f"cannot write {out!r}: {exc}") from None
    return f"wrote {len(frames)} frames to {out}"
