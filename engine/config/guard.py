"""Config files are data: nothing a composed configuration names is imported or instantiated
unless the user opts in on the command line with ``allow_code=true``.

A config file (``config=FILE.yaml``, ``--config-path/--config-name``, a group file from a
config folder) comes from colleagues and papers.  Hydra would run code it names: callbacks
(``_target_``), logging handlers, filters and formatters (``()`` factories, ``class`` and
``ext://`` names are imported), another launcher or sweeper, a ``pkg://`` search path (the
package is imported while composing), ``hydra.job.env_set`` (``LD_PRELOAD``, ``PYTHONPATH``);
ShardMD itself would import a model route (``model.name: py:module:factory``) and unpickle
with ``model.trust_pickle: true``.  :func:`findings` lists each such thing of a composed
configuration; :func:`check` refuses the first in one line, or, with ``allow_code=true``,
returns one note per finding for the log.  The command line is the user's own: a model
route or ``model.trust_pickle=true`` given there is not code from a file.  ``observables.modules``
(modules that register observables, engine/observables/modules.py) needs the opt-in wherever it
is given: its only purpose is to import code.

``allow_code`` is read from the command line only (:func:`split_allow_code`); in a file it is
an unknown key.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from shardmd.engine.errors import UserError

#: the one opt-in (command line only)
ALLOW_KEY = "allow_code"
#: stdlib logging classes a ``hydra.job_logging`` / ``hydra.hydra_logging`` node may name
#: (stream output only: a file handler writes, or truncates, any path it is given)
LOGGING_CLASSES = frozenset({"logging.StreamHandler", "logging.NullHandler", "logging.Formatter", "logging.Filter"})
#: the ``ext://`` names a logging node may use
LOGGING_EXT = frozenset({"ext://sys.stdout", "ext://sys.stderr"})
_BASIC = {"launcher": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
          "sweeper": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}
FIX = f"remove it, or give {ALLOW_KEY}=true on the command line if you trust the file"


def split_allow_code(args: list[str]) -> tuple[bool, list[str]]:
    """``allow_code=true|false`` (the last one counts) and the other arguments."""
    allow, rest = False, []
    for a in args:
        m = re.fullmatch(r"\+{0,2}" + ALLOW_KEY + r"=(.*)", a)
        if m is None:
            rest.append(a)
            continue
        if m.group(1).lower() not in ("true", "false"):
            raise UserError(f"{a!r}: {ALLOW_KEY} takes true or false")
        allow = m.group(1).lower() == "true"
    return allow, rest


def _plain(node: Any) -> Any:
    """A plain container without resolving interpolations (an ``${oc.env:...}`` stays text)."""
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node


def _walk(node: Any, path: str = ""):
    """(dotted path, key, value) of every mapping entry below ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}" if path else str(k)
            yield p, str(k), v
            yield from _walk(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def _logging(name: str, node: Any) -> list[str]:
    out = []
    for path, k, v in _walk(node, f"hydra.{name}"):
        if k == "()":
            out.append(f"{path}={v} (a logging factory: it is called)")
        elif k == "class" and str(v) not in LOGGING_CLASSES:
            out.append(f"{path}={v} (a logging class outside {', '.join(sorted(LOGGING_CLASSES))}: it is imported "
                       "and built)")
        elif isinstance(v, str) and v.startswith("ext://") and v not in LOGGING_EXT:
            out.append(f"{path}={v} (an ext:// name: it is imported)")
    return out


def _hydra(h: dict) -> list[str]:
    out = [f"hydra.callbacks.{k} (a callback: Hydra instantiates it)" for k in (h.get("callbacks") or {})]
    for name in ("job_logging", "hydra_logging"):
        out += _logging(name, h.get(name))
    for kind, basic in _BASIC.items():
        target = (h.get(kind) or {}).get("_target_")
        if target != basic:
            out.append(f"hydra.{kind}._target_={target} (another {kind}: Hydra instantiates it)")
    out += [f"hydra.searchpath: {sp} (a package search path: it is imported)" for sp in (h.get("searchpath") or [])
            if not str(sp).startswith("file://")]
    out += [f"hydra.job.env_set.{k} (sets the job's environment, e.g. LD_PRELOAD or PYTHONPATH)"
            for k in ((h.get("job") or {}).get("env_set") or {})]
    for path, k, v in _walk(h, "hydra"):
        if k == "_target_" and path not in (f"hydra.{kind}._target_" for kind in _BASIC) \
                and not path.startswith("hydra.callbacks."):   # a callback is named once, above
            out.append(f"{path}={v} (a _target_: it is instantiated)")
    return out


def _given(overrides: list[str], key: str) -> bool:
    """Whether the command line sets ``key`` (Hydra applies the command line last)."""
    return any(o.lstrip("+").split("=", 1)[0] == key for o in overrides)


def findings(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """What a composed configuration (``hydra`` node included) would import or instantiate,
    one text per thing, naming its key; ``overrides``: the command line's (Hydra spelling)."""
    c = _plain(cfg)
    out = _hydra(c.get("hydra") or {}) if isinstance(c.get("hydra"), dict) else []
    job = {k: v for k, v in c.items() if k != "hydra"}
    out += [f"{path}={v} (a _target_: it is instantiated)" for path, k, v in _walk(job) if k == "_target_"]
    model = job.get("model") if isinstance(job.get("model"), dict) else {}
    name = model.get("name")
    if isinstance(name, str) and name.startswith("py:") and not _given(overrides, "model.name"):
        out.append(f"model.name={name} (a model route from a file: its module is imported)")
    if model.get("trust_pickle") is True and not _given(overrides, "model.trust_pickle"):
        out.append("model.trust_pickle=true (from a file: the model file is unpickled, which runs any code)")
    if model.get("trust_code") is True and not _given(overrides, "model.trust_code"):
        out.append("model.trust_code=true (from a file: the model file's TorchScript runs with this process's rights)")
    obs = job.get("observables") if isinstance(job.get("observables"), dict) else {}
    if obs.get("modules"):   # from the command line too: a module is code however it is named
        from shardmd.engine.observables.modules import refusal

        out.append(refusal(obs["modules"]))
    return out


def check(cfg: DictConfig, overrides: list[str], allow: bool) -> list[str]:
    """Refuse (one line, the first finding and how many more) unless ``allow``; with it, the
    log's notes: one line naming everything allowed (empty when there is nothing)."""
    found = findings(cfg, overrides)
    if not found:
        return []
    if not allow:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(f"the configuration would run code: {found[0]}{more}; {FIX}")
    return [f"Note: {ALLOW_KEY}=true allows code the configuration names: " + "; ".join(found)]


def check_searchpath(primary: Path | None, overrides: list[str], allow: bool) -> None:
    """Before composing: a ``pkg://`` search path of the primary config file (or the command
    line) is imported while Hydra composes, so it is refused first (``primary``: the user's
    primary YAML file, None for the shipped one)."""
    import yaml

    entries = []
    for o in overrides:
        if o.lstrip("+").startswith("hydra.searchpath="):
            entries += [e.strip(" '\"") for e in o.split("=", 1)[1].strip("[]").split(",") if e.strip()]
    if primary is not None and primary.is_file():
        try:
            data = yaml.safe_load(primary.read_text())
        except (yaml.YAMLError, UnicodeDecodeError, OSError):
            data = None   # Hydra reads it next and says what is wrong
        hydra = data.get("hydra") if isinstance(data, dict) else None
        sp = hydra.get("searchpath") if isinstance(hydra, dict) else None
        entries += [str(s) for s in sp] if isinstance(sp, list) else [str(sp)] if sp else []
    bad = [e for e in entries if not e.startswith("file://")]
    if bad and not allow:
        raise UserError(f"the configuration would run code: hydra.searchpath: {bad[0]} (a package search path: "
                        f"it is imported); {FIX}")


def primary_file(config_dir: Path | None, name: str) -> Path | None:
    """The user's primary config file, or None (the shipped one)."""
    if config_dir is None:
        return None
    p = Path(config_dir) / name
    return p if p.suffix in (".yaml", ".yml") else p.with_name(p.name + ".yaml")


# -- the run's policy: set by the command line (or compose_config), read where models are built
_POLICY: dict = {"allow": False, "notes": []}


def set_policy(allow: bool, notes: list[str] | None = None) -> None:
    """The process's opt-in (``allow_code``) and the notes its log gets."""
    _POLICY["allow"], _POLICY["notes"] = bool(allow), list(notes or [])


def allowed() -> bool:
    return _POLICY["allow"]


def log_notes(model: dict | None = None, shown: dict | None = None) -> list[str]:
    """The log's notes: what the configuration's allowed code is, and the modules a
    ``model.spec`` file may import (only under ``allow_code=true``).  ``model``: the resolved
    model node (its spec file is read); ``shown``: the node as stored (a spec written as an
    expression is named by its expression)."""
    notes = list(_POLICY["notes"])
    spec = (model or {}).get("spec")
    if _POLICY["allow"] and isinstance(spec, str) and spec:
        import json

        from shardmd.domain.spec import spec_modules

        try:
            mods = spec_modules(json.loads(Path(spec).read_text()))
        except (OSError, ValueError, AttributeError, TypeError):
            mods = []   # the spec's own check reports what is wrong with it
        if mods:
            named = (shown or {}).get("spec", spec)
            notes.append(f"Note: {ALLOW_KEY}=true allows model.spec={named} to import: {', '.join(mods)}")
    return notes
