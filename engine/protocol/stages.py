"""The stages of a protocol (``stages: [...]``): each stage's configuration, checked up front.

A stage is a mapping: ``name`` (default ``stage<i>``), ``kind`` (``run``, the default, or
``minimize``), and any keys of the run's configuration (nested as in YAML) that the stage
changes: ``steps`` (this stage's own count), ``temperature`` (a number, or ``[start, stop]``
for a ramp over the stage), ``dt``, ``integrator`` (a name, or a mapping with ``name`` and its
keys), ``trajectory``, ``thermo``, ``checkpoint``, ``minimize``, ``seed``... The model, the
system, the domains, ``output`` and ``restart`` belong to the whole protocol.

Every stage's configuration is built and checked before the first stage runs; an error names
the stage by its index and name.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from shardmd.engine.errors import UserError

KINDS = ("run", "minimize")
#: keys of the whole protocol, not of a stage
PROTOCOL_KEYS = ("model", "system", "domains", "grid", "output", "restart", "stages", "device", "precision", "batch")


@dataclass(frozen=True)
class Stage:
    """One stage: ``index`` (0-based), ``name``, ``kind``, ``cfg`` (the run's configuration for
    it; ``cfg.steps`` is the stage's own length, made absolute when it starts), ``ramp``
    ((start, stop) K, or None), ``output`` (``X.<name>.h5`` for ``output=X.h5``)."""

    index: int
    name: str
    kind: str
    cfg: DictConfig
    ramp: tuple[float, float] | None
    output: str


def stage_output(output: str, name: str) -> str:
    p = Path(output)
    return str(p.with_name(f"{p.stem}.{name}{p.suffix}"))


def build(cfg) -> list[Stage]:
    """The stages of ``cfg.stages``, each configuration merged and checked (one-line UserError)."""
    raw = OmegaConf.to_container(cfg.stages, resolve=True)
    if not isinstance(raw, list) or not raw:
        raise UserError("stages must be a non-empty list of mappings, e.g. [{kind: minimize}, {steps: 1000}]")
    if cfg.system.get("frames") is not None or cfg.system.get("files"):
        raise UserError("stages with system.frames or system.files: a protocol runs one structure; give "
                        "system.file (or a builder) and run the protocol once per frame")
    stages, names = [], set()
    for i, entry in enumerate(raw):
        where = f"stages[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"{where} is {entry!r}, not a mapping; write each stage as {{name: heat, steps: 1000}}")
        entry = dict(entry)
        name = str(entry.pop("name", f"stage{i}"))
        if not name.replace("-", "").replace("_", "").isalnum() or name in names:
            raise UserError(f"{where}: name {name!r} must be unique and made of letters, digits, - or _")
        names.add(name)
        where = f"stages[{i}] ({name})"
        kind = entry.pop("kind", "run")
        if kind not in KINDS:
            raise UserError(f"{where}: kind={kind!r} is not a stage kind; use one of {', '.join(KINDS)}")
        taken = sorted(k for k in entry if k in PROTOCOL_KEYS)
        if taken:
            raise UserError(f"{where}: {taken[0]} belongs to the whole protocol, not to a stage; set it at the top")
        if kind == "minimize" and ("integrator" in entry or "temperature" in entry):
            key = "integrator" if "integrator" in entry else "temperature"
            raise UserError(f"{where}: a minimize stage has no {key}; move it to an MD stage (kind: run)")
        if kind == "run" and "minimize" in entry:
            raise UserError(f"{where}: minimize keys belong to a stage of kind: minimize")
        ramp = None
        temperature = entry.get("temperature")
        if isinstance(temperature, list):
            if len(temperature) != 2 or not all(isinstance(t, (int, float)) and t >= 0 for t in temperature):
                raise UserError(f"{where}: temperature={temperature} is neither a number nor [start, stop] in K "
                                "(each >= 0)")
            ramp = (float(temperature[0]), float(temperature[1]))
            entry["temperature"] = ramp[0]
        merged = _merged(cfg, entry, where)
        _check_kind(merged, kind, ramp, where)
        stages.append(Stage(i, name, kind, merged, ramp, stage_output(str(cfg.output), name)))
    return stages


def _check_kind(c: DictConfig, kind: str, ramp, where: str) -> None:
    """What a stage's kind excludes, said before the first stage runs: a temperature ramp needs a
    thermostat; a minimize stage's keys must fit together."""
    if ramp is not None and c.integrator.name == "verlet":
        raise UserError(f"{where}: a temperature ramp needs a thermostat (integrator langevin, nose-hoover, csvr "
                        "or npt); verlet has none")
    if kind == "minimize":
        from shardmd.engine.relax.minimize import check_method

        try:
            check_method(c.minimize)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None


def _merged(cfg, entry: dict, where: str) -> DictConfig:
    """``cfg`` with the stage's keys, checked as a configuration of its own."""
    from shardmd.engine.config.choices import INTEGRATORS
    from shardmd.engine.config.compose import validate

    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.stages = None
    integrator = entry.pop("integrator", None)
    try:
        if integrator is not None:
            spec = {"name": integrator} if isinstance(integrator, str) else dict(integrator)
            name = spec.get("name", c.integrator.name)
            if name not in INTEGRATORS:
                raise UserError(f"integrator={name!r} is not available; choose one of: {', '.join(INTEGRATORS)}")
            base = c.integrator if name == c.integrator.name else OmegaConf.structured(INTEGRATORS[name])
            node = OmegaConf.merge(base, spec)
            with open_dict(c):
                c.integrator = node
        c = OmegaConf.merge(c, entry)
        validate(c)
    except UserError as exc:
        raise UserError(f"{where}: {exc.one_line()}") from None
    except Exception as exc:  # noqa: BLE001 - OmegaConf's refusals of an unknown key or a wrong type: one line
        first = " ".join(str(exc).split("\n")[0].split())
        raise UserError(f"{where}: {first}; see python -m engine --help for the keys") from None
    return c
