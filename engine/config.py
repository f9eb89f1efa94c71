"""Run configuration: normalise command-line spellings, compose with Hydra, validate.

Users type ``model=lj`` and ``+model=lj``, ``domains=8`` and ``+domains=8``; Hydra's grammar
accepts only one of each.  ``normalize_overrides`` rewrites every spelling into the one Hydra
needs, and rejects unknown keys with the closest valid key.  ``compose_config`` uses Hydra's
compose API (no ``@hydra.main``: no working-directory change, no output folders).
``validate`` checks every value and raises a one-line :class:`UserError`.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import shardmd.configs as _configs

from .errors import UserError

CONFIG_DIR = Path(_configs.__file__).resolve().parent
GROUPS = ("model", "integrator")
#: groups present in the defaults list (override without '+'); the others need '+'
DEFAULT_GROUPS = ("integrator",)
#: keys whose values are maps with free keys (e.g. per-element parameters)
OPEN_MAPS = ("model.epsilon", "model.sigma", "model.pairs")

#: every key users may set: (default shown in help, description).  README documents the same.
KEYS: dict[str, tuple[str, str]] = {
    "model": ("(required)", "model to run: " + "|".join(sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml")))),
    "integrator": ("verlet", "verlet (NVE) | langevin (BAOAB)"),
    "domains": ("1", "spatial domains = MPI ranks; under mpirun defaults to the launcher's rank count"),
    "grid": ("null", "domain grid [Px,Py,Pz] with Px*Py*Pz = domains; null = least ghost volume"),
    "steps": ("1000", "total step number to reach"),
    "dt": ("1.0", "time step in fs"),
    "temperature": ("100.0", "K: initial Maxwell-Boltzmann velocities and the Langevin target"),
    "seed": ("12345", "keys initial velocities and Langevin noise (counter-based, per atom id)"),
    "precision": ("float64", "float64 | float32"),
    "device": ("cpu", "cpu | cuda | cuda:N"),
    "threads": ("0", "torch CPU threads per rank; 0 = all cores (1 per rank under MPI)"),
    "output": ("run.h5", "H5MD trajectory file; the log file goes beside it (.log)"),
    "quiet": ("false", "no progress bar or thermo table on the terminal (the log keeps them)"),
    "overwrite": ("false", "a fresh run may replace an existing output file"),
    "restart.file": ("null",
                     "checkpoint to continue from (restart=PATH is the same); auto = newest beside output, else fresh"),
    "restart.allow_changes": ("false", "allow model/dt/integrator/temperature/seed/precision to differ on restart"),
    "checkpoint.every": ("1000", "steps between restart checkpoints (0: only at the end and on signals)"),
    "checkpoint.keep": ("3", "newest checkpoints kept in <output>.ckpt/"),
    "system.file": ("null", "any ASE-readable structure file; overrides the lattice builder"),
    "system.index": ("-1", "frame of a multi-frame structure file"),
    "system.lattice": ("fcc", "builder lattice: fcc | bcc | sc | hcp | diamond"),
    "system.element": ("Ar", "builder element symbol"),
    "system.a": ("5.26", "builder lattice constant, Å"),
    "system.repeat": ("[10,10,10]", "builder repeats of the cubic (or hcp) cell"),
    "system.pbc": ("[true,true,true]", "periodic axes (builder; files keep their own pbc)"),
    "system.velocities": ("auto", "auto (file's if present, else thermal) | thermal | file | zero"),
    "neighbor.skin": ("1.0", "Å added to the model cutoff for the Verlet list"),
    "neighbor.every": ("1", "check the skin criterion every N steps"),
    "neighbor.check": ("true", "false: rebuild every `neighbor.every` steps unconditionally"),
    "neighbor.deferred": ("auto", "read the skin check back only at scheduled steps, replaying "
                          "a window that missed a rebuild: auto (on CUDA) | true | false"),
    "neighbor.deferred_max": ("50", "most steps between deferred read-backs"),
    "neighbor.pipelined": ("auto", "post the deferred check's scheduled reads and settle them a step "
                           "later, so the GPU queue never drains: auto (on CUDA) | true | false"),
    "neighbor.sort": ("spatial", "atoms' memory order, set at every rebuild: spatial (neighbour-grid bins, "
                      "fast kernels) | id | none"),
    "health.max_step": ("1.0", "Å: an atom drifting farther in one step (|v| dt) stops the run (exit 3)"),
    "health.min_distance": ("0.5", "Å: atoms closer at the start are refused; 0 allows close contacts"),
    "trajectory.every": ("100", "steps between trajectory frames (0: none)"),
    "trajectory.fields": ("[position,image,velocity,force]", "per-atom fields written to each frame"),
    "thermo.every": ("100", "steps between thermo lines (0: first and last only)"),
    "thermo.progress": ("true", "progress bar with steps/s, ns/day and ETA"),
    "model.epsilon": ("{Ar: 0.0104}", "lj: per-species epsilon, eV"),
    "model.sigma": ("{Ar: 3.40}", "lj: per-species sigma, Å"),
    "model.cutoff": ("8.5", "lj: cutoff, Å"),
    "model.shift": ("true", "lj: shift the energy to zero at the cutoff"),
    "model.mixing": ("lorentz-berthelot", "lj: lorentz-berthelot | geometric"),
    "model.pairs": ("{}", "lj: explicit pair parameters {A-B: {epsilon, sigma}}"),
    "model.checkpoint": ("null", "mace: path to a mace-torch model file (default: shipped Cu model)"),
    "model.dtype": ("null", "mace: float32 | float64 (default: precision)"),
    "model.cueq": ("auto", "mace: cuEquivariance kernels: auto (on CUDA when installed) | true | false"),
    "model.trust_pickle": ("false", "mace: unpickle a model file outside the safe loader's allow-list "
                           "(runs any code the file holds: only for files you trust)"),
    "model.cuda_graph": ("auto", "mace: replay the call as a CUDA graph between neighbour rebuilds "
                         "(one domain on CUDA): auto (up to 50,000 atoms) | true | false"),
    "integrator.friction": ("0.01", "langevin: friction gamma in 1/fs"),
}

_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w.\-]*)(?:=(?P<value>.*))?$", re.S)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def _closest(key: str) -> str:
    candidates = list(KEYS)
    best = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if not best:
        leaf = key.split(".")[-1]
        by_leaf = {k.split(".")[-1]: k for k in candidates}
        m = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
        best = [by_leaf[m[0]]] if m else []
    return f"; did you mean '{best[0]}'?" if best else "; see `python -m engine --help` for the keys"


def normalize_overrides(args: list[str]) -> list[str]:
    """Rewrite users' spellings into Hydra overrides; reject unknown keys (one line)."""
    out: list[str] = []
    chosen: dict[str, str] = {}
    for arg in args:
        m = _OVERRIDE.match(arg.strip())
        if not m or m.group("value") is None:
            raise UserError(f"cannot read argument {arg!r}: write key=value, e.g. steps=1000")
        key, value = m.group("key"), m.group("value")
        if m.group("prefix") == "~":
            raise UserError(f"'{arg}': deleting keys is not supported; set {key}=... instead")
        if key == "restart":  # shorthand: restart=PATH|auto (also +restart=..., never a silent fresh start)
            key = "restart.file"
        if key in GROUPS:
            options = group_options(key)
            if value not in options:
                raise UserError(f"{key}={value!r} is not available; choose one of: {', '.join(options)}")
            chosen[key] = value
            continue
        out.append((key, value))
    overrides = [f"{'' if g in DEFAULT_GROUPS else '+'}{g}={v}" for g, v in chosen.items()]
    for key, value in out:
        if key in KEYS:
            group = key.split(".")[0]
            if group in GROUPS and group not in chosen and group not in DEFAULT_GROUPS:
                raise UserError(f"'{key}' needs a model: add model=<{'|'.join(group_options(group))}>")
            overrides.append(f"{key}={value}")
        elif any(key.startswith(p + ".") for p in OPEN_MAPS):
            overrides.append(f"++{key}={value}")
        else:
            raise UserError(f"unknown config key '{key}'{_closest(key)}")
    return overrides


def compose_config(args: list[str], require_model: bool = True) -> DictConfig:
    """Normalise ``args`` (key=value strings), compose with Hydra and validate."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    overrides = normalize_overrides(args)
    if require_model and not any(o.lstrip("+").startswith("model=") for o in overrides):
        raise UserError(f"no model given: add model=<name>, one of: {', '.join(group_options('model'))}")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    except HydraException as exc:  # grammar errors, bad value syntax
        msg = str(exc).strip().splitlines()[0]
        raise UserError(f"cannot read the overrides: {msg}") from None
    validate(cfg)
    return cfg


# -- validation ---------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    """A finite number (inf and NaN are refused for every float key)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _need(cond: bool, key: str, value: Any, what: str) -> None:
    if not cond:
        raise UserError(f"{key}={value!r} is invalid: {what}")


def validate(cfg: DictConfig) -> None:
    """Check every value; raise a one-line UserError naming the key and the fix."""
    c = cfg
    _need(_is_int(c.domains) and c.domains >= 1, "domains", c.domains, "give a whole number >= 1")
    if c.grid is not None:
        g = list(c.grid) if OmegaConf.is_list(c.grid) else None
        _need(g is not None and len(g) == 3 and all(_is_int(x) and x >= 1 for x in g), "grid", c.grid,
              "give three whole numbers, e.g. [2,2,1]")
    _need(_is_int(c.steps) and c.steps >= 0, "steps", c.steps, "give a whole number >= 0")
    _need(_is_num(c.dt) and c.dt > 0, "dt", c.dt, "give a time step > 0 in fs")
    _need(_is_num(c.temperature) and c.temperature >= 0, "temperature", c.temperature, "give kelvin >= 0")
    _need(_is_int(c.seed) and 0 <= c.seed < 2**63, "seed", c.seed, "give a whole number >= 0")
    _need(c.precision in ("float32", "float64"), "precision", c.precision, "use float32 or float64")
    _need(isinstance(c.device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", c.device) is not None,
          "device", c.device, "use cpu, cuda or cuda:N")
    _need(_is_int(c.threads) and c.threads >= 0, "threads", c.threads, "give a whole number >= 0")
    _need(isinstance(c.output, str) and c.output.strip() != "", "output", c.output, "give a file name")
    _need(isinstance(c.quiet, bool), "quiet", c.quiet, "use true or false")
    _need(isinstance(c.overwrite, bool), "overwrite", c.overwrite, "use true or false")
    _need(c.restart.file is None or (isinstance(c.restart.file, str) and c.restart.file.strip() != ""),
          "restart.file", c.restart.file, "give a checkpoint path or auto")
    _need(isinstance(c.restart.allow_changes, bool), "restart.allow_changes", c.restart.allow_changes,
          "use true or false")
    _need(_is_int(c.checkpoint.every) and c.checkpoint.every >= 0, "checkpoint.every", c.checkpoint.every,
          "give a whole number >= 0")
    _need(_is_int(c.checkpoint.keep) and c.checkpoint.keep >= 1, "checkpoint.keep", c.checkpoint.keep,
          "give a whole number >= 1")
    s = c.system
    if s.file is not None:
        _need(isinstance(s.file, str), "system.file", s.file, "give a path")
        if not Path(s.file).is_file():
            raise UserError(f"system.file={s.file!r}: no such file; give the path of a structure file ASE can read")
    _need(_is_int(s.index), "system.index", s.index, "give a frame number (-1: last)")
    _need(s.lattice in ("fcc", "bcc", "sc", "hcp", "diamond"), "system.lattice", s.lattice,
          "use fcc, bcc, sc, hcp or diamond")
    from ase.data import atomic_numbers
    _need(isinstance(s.element, str) and s.element in atomic_numbers, "system.element", s.element,
          "give an element symbol such as Ar")
    _need(_is_num(s.a) and s.a > 0, "system.a", s.a, "give a lattice constant > 0 in Å")
    rep = list(s.repeat) if OmegaConf.is_list(s.repeat) else [s.repeat] * 3
    _need(len(rep) == 3 and all(_is_int(r) and r >= 1 for r in rep), "system.repeat", s.repeat,
          "give three whole numbers >= 1, e.g. [10,10,10]")
    pbc = list(s.pbc) if OmegaConf.is_list(s.pbc) else [s.pbc] * 3
    _need(len(pbc) == 3 and all(isinstance(p, bool) for p in pbc), "system.pbc", s.pbc,
          "give three booleans, e.g. [true,true,false]")
    _need(s.velocities in ("auto", "thermal", "file", "zero"), "system.velocities", s.velocities,
          "use auto, thermal, file or zero")
    n = c.neighbor
    _need(_is_num(n.skin) and n.skin >= 0, "neighbor.skin", n.skin, "give a skin >= 0 in Å")
    _need(_is_int(n.every) and n.every >= 1, "neighbor.every", n.every, "give a whole number >= 1")
    _need(isinstance(n.check, bool), "neighbor.check", n.check, "use true or false")
    _need(n.sort in ("spatial", "id", "none"), "neighbor.sort", n.sort, "use spatial, id or none")
    _need(n.deferred in ("auto", True, False), "neighbor.deferred", n.deferred, "use auto, true or false")
    _need(_is_int(n.deferred_max) and n.deferred_max >= 1, "neighbor.deferred_max", n.deferred_max,
          "give a whole number >= 1")
    _need(n.get("pipelined", "auto") in ("auto", True, False), "neighbor.pipelined", n.get("pipelined"),
          "use auto, true or false")
    h = c.health
    _need(_is_num(h.max_step) and h.max_step > 0, "health.max_step", h.max_step, "give a distance > 0 in Å")
    _need(_is_num(h.min_distance) and h.min_distance >= 0, "health.min_distance", h.min_distance,
          "give a distance >= 0 in Å (0: no check)")
    t = c.trajectory
    _need(_is_int(t.every) and t.every >= 0, "trajectory.every", t.every, "give a whole number >= 0")
    allowed = {"position", "image", "velocity", "force"}
    fields = list(t.fields) if OmegaConf.is_list(t.fields) else [t.fields]
    bad = [f for f in fields if f not in allowed]
    _need(not bad, "trajectory.fields", t.fields, f"unknown field(s) {bad}; use any of {sorted(allowed)}")
    _need(_is_int(c.thermo.every) and c.thermo.every >= 0, "thermo.every", c.thermo.every,
          "give a whole number >= 0")
    _need(isinstance(c.thermo.progress, bool), "thermo.progress", c.thermo.progress, "use true or false")
    i = c.integrator
    if i.name == "langevin":
        _need(_is_num(i.friction) and i.friction >= 0, "integrator.friction", i.friction,
              "give a friction >= 0 in 1/fs")
    if "model" in c:
        _validate_model(c.model)


def _validate_model(m: DictConfig) -> None:
    if m.name == "lj":
        for key in ("epsilon", "sigma"):
            v = m[key]
            ok = _is_num(v) and v > 0 if not OmegaConf.is_dict(v) else all(
                _is_num(x) and x > 0 for x in v.values())
            _need(ok, f"model.{key}", OmegaConf.to_container(v) if OmegaConf.is_dict(v) else v,
                  "give positive numbers per element, e.g. {Ar: 0.0104}")
        _need(_is_num(m.cutoff) and m.cutoff > 0, "model.cutoff", m.cutoff, "give a cutoff > 0 in Å")
        _need(isinstance(m.shift, bool), "model.shift", m.shift, "use true or false")
        _need(m.mixing in ("lorentz-berthelot", "geometric"), "model.mixing", m.mixing,
              "use lorentz-berthelot or geometric")
    elif m.name == "mace":
        _need(m.dtype in (None, "float32", "float64"), "model.dtype", m.dtype, "use float32 or float64")
        _need(m.get("cueq", "auto") in ("auto", True, False), "model.cueq", m.get("cueq"),
              "use auto, true or false")
        _need(isinstance(m.get("trust_pickle", False), bool), "model.trust_pickle", m.get("trust_pickle"),
              "use true or false")
        _need(m.get("cuda_graph", "auto") in ("auto", True, False), "model.cuda_graph", m.get("cuda_graph"),
              "use true, auto or false")


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def help_text() -> str:
    width = max(len(k) for k in KEYS)
    lines = [f"  {k:<{width}}  {d:<18} {desc}" for k, (d, desc) in KEYS.items()]
    return "\n".join(lines)
