"""What ``python -m engine plot`` draws, per run kind (engine/io/inspect_files.py draws it).

MD (time in ps on the x axis): the registry's panels (engine/observables/): each observable of
the file with a ``plot`` label, values times its ``scale`` (the energies share "energy (eV)",
pressure in bar), in the registry's order; the conserved quantity's panel only where a
thermostat or barostat runs (under verlet it is the total energy); after the energies, for NVE
(verlet) alone, the total-energy drift per atom ``(E_total(t) - E_total(0)) / N`` in eV/atom (a
thermostat exchanges energy, so a drift means nothing there); under npt the volume (Å^3, from
the stored box) and density (g/cm^3, with the stored masses); then every other scalar
observable of the file (a user's), labelled with the file's unit.

Minimisation (``python -m engine minimize``; the FIRE step on the x axis, its frames all at time
0): the energy (eV) and fmax (eV/Å, the largest force FIRE saw), and the volume when the cell
relaxed too.
"""
from __future__ import annotations

import numpy as np

#: integrators whose conserved quantity differs from the total energy
COUPLED = ("nose-hoover", "npt", "csvr", "langevin")


def run_kind(config: dict | None) -> str:
    """``minimize`` or ``md`` (a file written before the kind was stored: ``md``)."""
    return str((config or {}).get("run") or "md")


def _box(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, times fs, volumes Å^3) of the stored box's frames."""
    from shardmd.engine.io.h5md_read import PARTICLES, _open, valid_rows

    with _open(path) as f:
        g = f[f"{PARTICLES}/box/edges"]
        n = valid_rows(g)
        edges = g["value"][:n].astype(np.float64)
        return g["step"][:n], g["time"][:n], np.abs(np.linalg.det(edges)) if n else np.zeros(0)


def _masses(path) -> np.ndarray:
    from shardmd.engine.io.h5md_read import PARTICLES, _open

    with _open(path) as f:
        return f[f"{PARTICLES}/mass"][()]


def panels(path) -> tuple[str, list[tuple[str, dict[str, tuple]]]]:
    """(x label, [(y label, {curve label: (x, values)})]) of the trajectory ``path``."""
    from shardmd.engine.io.h5md import file_summary, read_observables

    summary = file_summary(path)
    obs = read_observables(path)
    if run_kind(summary["config"]) == "minimize":
        return "FIRE step", _minimisation(path, summary, obs)
    return "time (ps)", _md(path, summary, obs)


def _minimisation(path, summary, obs) -> list:
    out: list = []
    for name, label in (("potential_energy", "energy (eV)"), ("fmax", "fmax (eV/Å)")):
        out.append((label, {name.replace("_", " "): (obs[name][0], obs[name][2])} if name in obs else {}))
    if ((summary["config"] or {}).get("minimize") or {}).get("cell"):
        steps, _, vol = _box(path)
        out.append(("volume (Å^3)", {"volume": (steps, vol)}))
    return out


def _md(path, summary, obs) -> list:
    from shardmd.engine.observables import registry
    from shardmd.engine.observables.builtin import AMU_PER_A3_TO_G_PER_CM3

    config = summary["config"] or {}
    integrator = str((config.get("integrator") or {}).get("name") or "")
    n_atoms = summary["n_atoms"]

    def curve(k, scale=1.0):
        steps, times, values = obs[k]
        return times / 1000.0, values * scale

    out: dict[str, dict[str, tuple]] = {}
    for o in registry.registered():
        if not o.plot or o.shape != () or "trajectory" not in o.when:
            continue
        if o.name == "conserved_energy" and integrator not in COUPLED:
            continue
        curves = out.setdefault(o.plot, {})
        if o.name in obs:
            curves[o.name.replace("_", " ") if o.origin == "built-in" else o.name] = curve(o.name, o.scale)
        if o.name == "total_energy" and integrator not in COUPLED:   # the drift means something for NVE alone
            drift = out.setdefault("total-energy drift (eV/atom)", {})
            if o.name in obs and len(obs[o.name][2]) and n_atoms:
                t, e = curve(o.name)
                drift["(E_total - E_total(0)) / N"] = (t, (e - e[0]) / n_atoms)
    if integrator == "npt":
        _, times, vol = _box(path)
        out["volume (Å^3)"] = {"volume": (times / 1000.0, vol)}
        out["density (g/cm^3)"] = {"density": (times / 1000.0, _masses(path).sum() / vol * AMU_PER_A3_TO_G_PER_CM3)}
    for name, (_, _, values) in obs.items():
        if name in registry._REGISTRY or values.ndim != 1:
            continue
        unit = summary["units"].get(f"observables/{name}/value")
        out[f"{name} ({unit})" if unit else name] = {name: curve(name)}
    return list(out.items())
