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
    lines = [f"{path}: H5MD {s['h5md_version']} trajectory by {s['creator']} {s['creator_version']}",
             f"atoms: {s['n_atoms']}  frames: {s['n_frames']}  steps: {s['first_step']}..{s['last_step']}  "
             f"time: {(s['last_time_fs'] or 0) / 1000:.4f} ps  dtype: {s['dtype']}  pbc: {s['pbc']}",
             f"fields: {', '.join(s['fields'])}",
             "observables: " + ", ".join(f"{k} ({n})" for k, n in s["observables"].items())
             + "".join(f", {k} (unreadable: left out)" for k in s.get("unreadable_observables", ()))]
    return "\n".join(lines + _observable_lines(s) + _config_line(s["config"]))


def _observable_lines(s: dict) -> list[str]:
    """One line per observable of the file: its unit (the file's) and what the registry says of
    it; one the registry lacks (a user's, registered in the run's process) says where it came from."""
    from shardmd.engine.observables import registry

    modules = ((s["config"] or {}).get("observables") or {}).get("modules") or []
    out = []
    for name in s["observables"]:
        unit = s["units"].get(f"observables/{name}/value") or "no unit"
        known = registry._REGISTRY.get(name)
        if known is not None:
            what = f"{known.description or known.name} ({known.origin}; reduce {known.reduce}; {known.cost})"
        else:
            what = ("not built in: registered by the run's observables.modules=[" + ",".join(map(str, modules)) + "]"
                    if modules else "not built in: registered through the Python API")
        out.append(f"  {name}: {unit}; {what}")
    return out


def plot_series(path: str) -> list[tuple[str, dict[str, tuple]]]:
    """What ``plot`` draws: one ``(y label, {curve label: (time ps, values)})`` per panel.

    Panels: the registry's (engine/observables/): each observable of the file with a ``plot``
    label, values times its ``scale`` (the energies share "energy (eV)", pressure in bar), in
    the registry's order; after the energies the total-energy drift per atom,
    ``(E_total(t) - E_total(0)) / N`` in eV/atom (on the energy panel's ~N eV scale a drift of
    1e-5 eV/atom is invisible); then every other scalar observable of the file (a user's,
    registered in the run's process), labelled with the file's unit.  The built-in panels are
    kept when the file lacks their observables (empty), so that every plot has the same layout.
    """
    from shardmd.engine.io.h5md import file_summary, read_observables
    from shardmd.engine.observables import registry

    obs = read_observables(path)
    summary = file_summary(path)
    n_atoms = summary["n_atoms"]

    def curve(k, scale=1.0):
        steps, times, values = obs[k]
        return times / 1000.0, values * scale

    panels: dict[str, dict[str, tuple]] = {}
    for o in registry.registered():
        if not o.plot or o.shape != () or "trajectory" not in o.when:
            continue
        curves = panels.setdefault(o.plot, {})
        if o.name in obs:
            curves[o.name.replace("_", " ") if o.origin == "built-in" else o.name] = curve(o.name, o.scale)
        if o.name == "total_energy":   # the drift follows the energies
            drift = panels.setdefault("total-energy drift (eV/atom)", {})
            if o.name in obs and len(obs[o.name][2]) and n_atoms:
                t, e = curve(o.name)
                drift["(E_total - E_total(0)) / N"] = (t, (e - e[0]) / n_atoms)
    for name, (_, _, values) in obs.items():
        if name in registry._REGISTRY or values.ndim != 1:
            continue
        unit = summary["units"].get(f"observables/{name}/value")
        panels[f"{name} ({unit})" if unit else name] = {name: curve(name)}
    return list(panels.items())


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

    check_output_path(out, "plot output")
    panels = plot_series(path)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels) + 1), sharex=True)
    for ax, (label, curves) in zip(axes, panels):
        for name, (t, y) in curves.items():
            ax.plot(t, y, label=name)
        ax.set_ylabel(label)
        if curves:
            ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("time (ps)")
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
