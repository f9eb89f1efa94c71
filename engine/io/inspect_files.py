"""``python -m engine info FILE`` and ``plot FILE OUT.png`` (FILE: a trajectory or a restart
checkpoint); ``convert`` is engine/io/convert.py.

Errors are one line (the CLI prints ``error: ...``): an input that is missing, a directory,
empty, truncated, not HDF5, an HDF5 file that is neither a ShardMD trajectory nor a
checkpoint, or damaged gives a UserError (exit status 2); an output path that is a
directory or whose directory does not exist, or a format ASE/matplotlib cannot write, a
UserError too; a failed write of the output (disk full, read-only, I/O error) an
OutputError (exit status 4).  Outputs are written to a temporary file beside them and
renamed into place, so a failed write leaves an existing file of that name untouched.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import h5py
import numpy as np

from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md_live import open_unlocked, while_written
from shardmd.engine.io.h5md_read import _reading
from shardmd.engine.io.safe_io import check_output_path, output_error


@while_written   # a running job's file: read again (h5md_live.py)
def _open_kind(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{path!r} is a directory; give a trajectory (.h5/.h5md) or a checkpoint file")
    if not p.is_file():
        raise UserError(f"{path!r}: no such file")
    if p.stat().st_size == 0:
        raise UserError(f"{path!r} is an empty file (0 bytes); give a trajectory (.h5/.h5md) or a checkpoint")
    if not h5py.is_hdf5(p):
        raise UserError(f"{path!r} is not an HDF5 file; give a trajectory (.h5/.h5md) or a checkpoint")
    with _reading(path, "ShardMD trajectory or checkpoint"):  # truncated or damaged: one line
        with open_unlocked(str(p)) as f:
            if f.attrs.get("kind") == "shardmd-checkpoint":
                return "checkpoint"
            if "particles" in f:
                return "trajectory"
    raise UserError(f"{path!r} is an HDF5 file but neither a ShardMD trajectory nor a checkpoint")


def _write_atomically(out: str, write, fmt_name: str) -> None:
    """Call ``write(tmp_path)`` for a temporary file beside ``out``, then rename it to ``out``.

    Failures: OSError -> OutputError (exit 4), anything else (unknown format, bad data) ->
    UserError; the temporary file is removed and an existing ``out`` is left as it was.
    """
    p = check_output_path(out, "output")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise output_error("write", out, exc, option="output path") from None
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, out)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise output_error("write", out, exc, option="output path") from None
        if isinstance(exc, Exception) and not isinstance(exc, UserError):
            msg = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"cannot write {out!r} as {fmt_name}: {msg}") from None
        raise


def _config_line(cfg: dict | None, minimisation: bool = False) -> list[str]:
    """The stored configuration's model and dynamics (a minimisation's FIRE settings, no MD keys)."""
    if not cfg:
        return ["config: (none stored)"]
    model = cfg.get("model", {})
    integ = cfg.get("integrator", {})
    head = f"model: {model.get('name')}  " + ", ".join(f"{k}={v}" for k, v in model.items() if k != "name")
    if minimisation:
        m = cfg.get("minimize", {})
        return [head, "minimize: FIRE  " + "  ".join(f"{k}={m.get(k)}" for k in ("fmax", "steps", "maxstep", "cell")
                                                     if k in m)
                + (f"  pressure={m.get('pressure')} bar" if m.get("cell") else "")
                + f"  precision={cfg.get('precision')}  domains={cfg.get('domains')}",
                f"output={cfg.get('output')}"]
    return [head,
            f"integrator: {integ.get('name')}  dt={cfg.get('dt')} fs  T={cfg.get('temperature')} K  "
            f"seed={cfg.get('seed')}  precision={cfg.get('precision')}  domains={cfg.get('domains')}",
            f"steps={cfg.get('steps')}  output={cfg.get('output')}"]


def info(path: str) -> str:
    kind = _open_kind(path)
    with _reading(path):
        return _info(path, kind)


def _info(path: str, kind: str) -> str:
    if kind == "checkpoint":
        from shardmd.engine.io.checkpoint import read_checkpoint

        c = read_checkpoint(path)
        lines = [f"{path}: ShardMD restart checkpoint (code {c['code_version']})",
                 f"atoms: {len(c['arrays']['ids'])}  step: {c['step']}  time: {c['time'] / 1000:.4f} ps",
                 f"cell (Å): {c['cell'].tolist()}  pbc: {c['pbc'].tolist()}",
                 f"model identity: {c['model_name']} {c['model_identity'][:16]}"]
        return "\n".join(lines + _config_line(c["config"]))
    import warnings

    from shardmd.engine.io.h5md import file_summary
    from shardmd.engine.io.h5md_read import TrajectoryDamageWarning

    with warnings.catch_warnings():   # an unreadable observable is named in the summary below
        warnings.simplefilter("ignore", TrajectoryDamageWarning)
        s = file_summary(path)
    from shardmd.engine.io.plot_panels import run_kind

    minimisation = run_kind(s["config"]) == "minimize"
    span = "" if minimisation else f"time: {(s['last_time_fs'] or 0) / 1000:.4f} ps  "
    lines = [f"{path}: H5MD {s['h5md_version']} {'minimisation (FIRE) ' if minimisation else ''}trajectory by "
             f"{s['creator']} {s['creator_version']}",
             f"atoms: {s['n_atoms']}  frames: {s['n_frames']}  steps: {s['first_step']}..{s['last_step']}  "
             f"{span}dtype: {s['dtype']}  pbc: {s['pbc']}",
             f"fields: {', '.join(s['fields'])}",
             "observables: " + ", ".join(f"{k} ({n})" for k, n in s["observables"].items())
             + "".join(f", {k} (unreadable: left out)" for k in s.get("unreadable_observables", ()))]
    return "\n".join(lines + _observable_lines(s) + _config_line(s["config"], minimisation))


#: observables the engine writes without registering them
FILE_ONLY = {"fmax": "the largest atom's force of the FIRE step (minimisation)"}


def _observable_lines(s: dict) -> list[str]:
    """One line per observable of the file: its unit (the file's) and what the registry says of
    it; one the registry lacks (a user's, registered in the run's process) says where it came from."""
    from shardmd.engine.observables import registry

    modules = ((s["config"] or {}).get("observables") or {}).get("modules") or []
    out = []
    for name in s["observables"]:
        unit = s["units"].get(f"observables/{name}/value") or "no unit"
        known = registry._REGISTRY.get(name)
        if name in FILE_ONLY:
            what = FILE_ONLY[name]
        elif known is not None:
            what = f"{known.description or known.name} ({known.origin}; reduce {known.reduce}; {known.cost})"
        else:
            what = ("not built in: registered by the run's observables.modules=[" + ",".join(map(str, modules)) + "]"
                    if modules else "not built in: registered through the Python API")
        out.append(f"  {name}: {unit}; {what}")
    return out


def plot_series(path: str) -> list[tuple[str, dict[str, tuple]]]:
    """What ``plot`` draws: one ``(y label, {curve label: (x, values)})`` per panel, as the run's
    kind has them (engine/io/plot_panels.py: MD against time in ps, a minimisation against its
    FIRE step)."""
    from shardmd.engine.io.plot_panels import panels

    return panels(path)[1]


def plot(path: str, out: str) -> str:
    """Draw :func:`plot_series` of a trajectory to the image ``out`` (one panel each, shared time axis)."""
    if _open_kind(path) != "trajectory":
        raise UserError(f"{path!r} is a checkpoint; plot a trajectory file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plot needs matplotlib: pip install matplotlib") from None

    from shardmd.engine.io.plot_panels import panels as run_panels

    check_output_path(out, "plot output")
    xlabel, panels = run_panels(path)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels) + 1), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for ax, (label, curves) in zip(axes, panels):
        for name, (t, y) in curves.items():
            ax.plot(t, y, label=name)
        ax.set_ylabel(label)
        if label.startswith("fmax") and any(np.all(np.asarray(y) > 0) and len(y) for _, y in curves.values()):
            ax.set_yscale("log")   # FIRE's fmax falls by decades
        if curves:
            ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(Path(path).name)
    fig.tight_layout()
    fmt = Path(out).suffix[1:].lower() or matplotlib.rcParams["savefig.format"]
    try:
        # the panels and curves, also as the image's text (PNG tEXt, SVG desc): what it shows, in words
        meta = {"Description": "; ".join(f"{label}: {', '.join(c) or '-'}" for label, c in panels)} \
            if fmt in ("png", "svg") else None
        _write_atomically(out, lambda tmp: fig.savefig(tmp, dpi=110, format=fmt, metadata=meta), f"a {fmt!r} image")
    finally:
        plt.close(fig)
    return out
