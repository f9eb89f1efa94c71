"""Run configuration: users' spellings in, a composed and checked ``DictConfig`` out.

The keys, types, defaults and help texts are the dataclasses of ``engine/config/schema.py``
(registered with Hydra's ConfigStore); everything here is derived from them: ``SCHEMA`` (each
key's default, help and check, per group choice), ``validate`` (each key's check), and the
one-line errors; engine/config/help.py makes ``--help`` and README's table from them.

Users type ``model=lj`` and ``+model=lj``, ``domains=8`` and ``+domains=8``, ``~grid``;
``normalize_overrides`` rewrites each into the one spelling Hydra needs (groups and schema keys
plain, per-species map entries with ``++``, ``~key`` of an optional key as ``key=null``) and
refuses unknown keys with the closest valid key.  Sweeps (``temperature=100,200``) pass
through for ``-m``.  ``compose_config`` composes with Hydra's config loader (no global state,
no output folders) and validates; the command line (engine/cli/main.py) runs Hydra's own run and
multirun on the same overrides.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import shardmd.configs as _configs
from shardmd.engine.config import schema
from shardmd.engine.errors import UserError

#: the folder of the shipped primary config (config.yaml: the schema's defaults, nothing else)
CONFIG_DIR = Path(_configs.__file__).resolve().parent
GROUPS = tuple(schema.GROUPS)
#: the fixed choices of each group (the open one, model=custom, is reached through a route)
GROUPS_OF = {g: [c for c in opts if c != schema.OPEN_CHOICES.get(g)] for g, opts in schema.GROUPS.items()}


def hydra_value(v: Any, spaced: bool = False) -> str:
    """``v`` as a command-line value Hydra reads back (``spaced``: as the README shows maps)."""
    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v, resolve=True)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        sep = ": " if spaced else ":"
        return "{" + (", " if spaced else ",").join(f"{k}{sep}{hydra_value(x, spaced)}" for k, x in v.items()) + "}"
    s = str(v)
    plain = re.fullmatch(r"[A-Za-z_/.][\w./@%+\-]*", s, re.ASCII)   # ASCII only: Hydra's unquoted characters
    if plain and s.lower() not in ("null", "true", "false", "inf", "nan"):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- the key table, from the dataclasses ---------------------------------------------------------
@dataclass(frozen=True)
class KeyInfo:
    path: str
    default: Any
    help: str
    check: schema.Check | None
    #: group choices that have this key, e.g. ("model=lj",); empty: every run has it
    owners: tuple[str, ...] = ()
    optional: bool = False   # may be null: ``~key`` resets it
    open_map: bool = False   # a map with free keys (per-species parameters)
    nested: bool = False     # an open map whose entries are themselves keyed (model.pairs.Ar-Kr.sigma)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _walk(cls: type, prefix: str = "", owner: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in ("defaults", "name") or f.name in GROUPS and not prefix:
            continue
        t, path = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(t):
            yield from _walk(t, path + ".", owner)
            continue
        args = typing.get_args(t)
        open_map = typing.get_origin(t) is dict
        yield KeyInfo(path, _default(f), f.metadata.get("help", ""), f.metadata.get("check"),
                      (owner,) if owner else (), optional=type(None) in args, open_map=open_map,
                      nested=open_map and dataclasses.is_dataclass(args[1]))


def _schema() -> tuple[dict[str, KeyInfo], dict[tuple[str, str], KeyInfo]]:
    """(path -> the key with every choice that has it as owners, (path, choice) -> that choice's
    own key): two choices of a group may share a key name (``model.cutoff``) with their own
    default, check and help."""
    out = {k.path: k for k in _walk(schema.ShardMD)}
    own: dict[tuple[str, str], KeyInfo] = {}
    for group, options in schema.GROUPS.items():
        for name, cls in options.items():
            for k in _walk(cls, group + ".", f"{group}={name}"):
                own[(k.path, k.owners[0])] = k
                out[k.path] = dataclasses.replace(k, owners=out[k.path].owners + k.owners) if k.path in out else k
    return out, own


SCHEMA: dict[str, KeyInfo]
_OWN: dict[tuple[str, str], KeyInfo]
SCHEMA, _OWN = _schema()


def key_info(path: str, active: set[str] | frozenset[str] = frozenset()) -> KeyInfo | None:
    """The key ``path`` as the active group choices (``{"model=lj", ...}``) define it."""
    info = SCHEMA.get(path)
    for owner in info.owners if info else ():
        if owner in active:
            return _OWN[(path, owner)]
    return info


def group_options(group: str) -> list[str]:
    """The choices a user names (the open one, model=custom, is reached by a route: docs/byo.md)."""
    return sorted(GROUPS_OF[group])


def _default_choices() -> dict[str, str | None]:
    out = {}
    for item in schema.ShardMD().defaults:
        if isinstance(item, dict):
            (group, choice), = item.items()
            out[group] = None if choice == "???" else choice
    return out


DEFAULT_CHOICES = _default_choices()


def _flat(node: Any, prefix: str = ""):
    """(dotted key, value) leaves of a plain mapping, OmegaConf maps and lists kept whole (and
    maps that are the value of a key, as ``system.charges={Na: 1.0}``)."""
    for k, v in node.items():
        if isinstance(v, dict) and f"{prefix}{k}" not in OPEN_MAPS and f"{prefix}{k}" not in SCHEMA:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


OPEN_MAPS = tuple(k for k, info in SCHEMA.items() if info.open_map)


#: keys ``~key`` may remove (reset to null), and maps whose single entries it may remove
REMOVABLE = tuple(k for k, i in SCHEMA.items() if i.optional)


# -- users' spellings -> Hydra overrides ----------------------------------------------------------
def _closest(key: str) -> str:
    candidates = [*GROUPS, *SCHEMA]
    best = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if not best:
        leaf = key.split(".")[-1]
        by_leaf = {k.split(".")[-1]: k for k in candidates}
        m = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
        best = [by_leaf[m[0]]] if m else []
    return f"; did you mean '{best[0]}'?" if best else "; see `python -m engine --help` for the keys"


def _map_of(key: str) -> str | None:
    """The open map ``key`` is an entry of (``model.epsilon.Kr`` -> ``model.epsilon``)."""
    return next((m for m in OPEN_MAPS if key.startswith(m + ".")), None)


def _removable_text() -> str:
    return (", ".join(REMOVABLE) + ", and single entries of " + ", ".join(OPEN_MAPS)
            + (f" (e.g. ~{OPEN_MAPS[0]}.Kr)" if OPEN_MAPS else ""))


def split_config_file(args: list[str]) -> tuple[Path | None, list[str]]:
    """``config=FILE.yaml`` (a config file of the user's, see README) and the other arguments."""
    rest, found = [], None
    for a in args:
        if re.match(r"^\+{0,2}config=", a):
            found = Path(a.split("=", 1)[1]).expanduser()
            if found.suffix not in (".yaml", ".yml") or not found.is_file():
                raise UserError(f"config={str(found)!r}: no such file; give a YAML file such as my_run.yaml "
                                "(README, 'Config files')")
        else:
            rest.append(a)
    return found, rest


def normalize_overrides(args: list[str]) -> list[str]:
    """Rewrite users' spellings into Hydra overrides; refuse unknown keys (one line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from shardmd.engine.config.path_values import parse_override

    parser = OverridesParser.create()
    out: list[str] = []
    open_groups = {g for g in schema.OPEN_CHOICES if _open_choice(g, args)}
    for arg in args:
        arg, o = parse_override(parser, arg)   # a file name Hydra reads only quoted: quoted (path_values.py)
        key = o.key_or_group
        value = arg.split("=", 1)[1] if "=" in arg else None
        if o.package is not None:
            raise UserError(f"'{arg}': '@package' overrides are not supported; write key=value")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            out.append(arg)   # Hydra's own settings: Hydra checks them
            continue
        if key == "restart":  # shorthand: restart=PATH|auto (also +restart=..., never a silent fresh start)
            key = "restart.file"
        if o.is_delete():
            out.append(_delete(arg, key))
        elif key in schema.OPEN_CHOICES and o.is_sweep_override() is False and str(o.value()) not in GROUPS_OF[key]:
            named = any(a.lstrip("+").startswith(f"{key}.name=") for a in args)   # as Hydra echoes it to ranks
            out += [f"{key}={value}"] if named and value == schema.OPEN_CHOICES[key] else _open_route(key, value)
        elif key in GROUPS:
            options = group_options(key)
            choices = list(o.sweep_string_iterator()) if o.is_sweep_override() and o.is_discrete_sweep() else \
                [] if o.is_sweep_override() else [str(o.value())]
            bad = [c for c in choices if c not in options]
            if bad:
                raise UserError(f"{key}={bad[0]!r} is not available; choose one of: {', '.join(options)}")
            out.append(f"{key}={value}")
        elif _factory_argument(key, open_groups):
            out.append(f"++{key}={value}")   # an argument of the model's factory (model.<key>=...)
        elif _map_of(key) and SCHEMA[_map_of(key)].nested:
            # model.pairs.Ar-Kr.sigma=3.5 as ++model.pairs={Ar-Kr: {sigma: 3.5}}: merged into the
            # entry (OmegaConf cannot force-add a path through a new entry of typed values)
            m = _map_of(key)
            if o.is_sweep_override():
                raise UserError(f"'{arg}': sweep whole entries instead, e.g. {m}={{Ar-Kr: {{...}}}},{{Ar-Kr: {{...}}}}")
            for part in reversed(key[len(m) + 1:].split(".")):
                value = f"{{{part}: {value}}}"
            out.append(f"++{m}={value}")
        elif key in OPEN_MAPS or _map_of(key):
            out.append(f"++{key}={value}")   # a new species is a new key of the map
        elif key in SCHEMA:
            out.append(f"{key}={value}")
        elif key.split(".")[0] in open_groups and "." in key:
            out.append(f"++{key}={value}")   # an argument of the model's factory (model.<key>=...)
        else:
            raise UserError(f"unknown config key '{key}'{_closest(key)}")
    return out


def _open_choice(group: str, args: list[str]) -> bool:
    """Whether the last ``group=`` among ``args`` picks the open choice (a route or a registered name)."""
    chosen = None
    for a in args:
        k, eq, v = a.lstrip("+").partition("=")
        if eq and k == group:
            chosen = v
    return chosen is not None and (chosen == schema.OPEN_CHOICES[group] or chosen not in GROUPS_OF[group])


def _open_route(group: str, value: str) -> list[str]:
    """``model=py:module:factory`` or ``model=<registered name>`` as the open choice with its name."""
    from shardmd.models.registry import is_route, registered_names

    names = registered_names()
    if value == schema.OPEN_CHOICES[group] or not (is_route(value) or value in names):
        raise UserError(f"{group}={value!r} is not available; choose one of: {', '.join(names)}, or "
                        f"{group}=py:module:factory for a model of yours (docs/byo.md)")
    return [f"{group}={schema.OPEN_CHOICES[group]}", f"{group}.name={hydra_value(value)}"]


def _delete(arg: str, key: str) -> str:
    if key in GROUPS:
        raise UserError(f"'{arg}': {key} cannot be removed; choose {key}=<{'|'.join(group_options(key))}>")
    if key in SCHEMA and SCHEMA[key].optional:
        return f"{key}=null"
    if _map_of(key):
        return f"~{key}"
    if key not in SCHEMA:
        raise UserError(f"unknown config key '{key}'{_closest(key)}")
    raise UserError(f"'{arg}': {key} cannot be removed, only set ({key}=...); keys that can be removed: "
                    f"{_removable_text()}")


def _factory_argument(key: str, open_groups: set[str]) -> bool:
    """Whether ``key`` (``model.<key>``) is an argument of an open choice's factory: the group's
    open choice is chosen and no key of that choice's own has this name (``model.cutoff`` of
    ``model=py:...`` is the factory's, not LJ's)."""
    group = key.split(".")[0]
    if group not in open_groups or "." not in key:
        return False
    info = SCHEMA.get(key) or SCHEMA.get(_map_of(key) or "")
    own = f"{group}={schema.OPEN_CHOICES[group]}"
    return info is None or bool(info.owners) and own not in info.owners


def _chosen(overrides: list[str], group: str) -> str | None:
    found = DEFAULT_CHOICES.get(group)
    for o in overrides:
        if o.startswith(f"{group}="):
            found = o.split("=", 1)[1]
    return found


def _wrong_group(key: str, overrides: list[str]) -> str | None:
    """The message for a key of another group choice (``integrator.friction`` under verlet)."""
    info = SCHEMA.get(key) or SCHEMA.get(_map_of(key) or "")
    if info is None or not info.owners:
        return None
    group = info.owners[0].split("=")[0]
    have = _chosen(overrides, group)
    if have is None and group == "model":
        return f"'{key}' needs a model: add model=<{'|'.join(group_options(group))}>"
    now = f" (this run has {group}={have})" if have else ""
    return f"{key} is a key of {' or '.join(info.owners)} only{now}: add {info.owners[0]}"


# -- composing ----------------------------------------------------------------------------------------
def search_path(config_dir: str | os.PathLike | None = None, extra_dirs: tuple = ()):
    """Hydra's search path: the primary config's folder (default: the shipped configs/), the
    schema (structured://), and ``--config-dir`` folders."""
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    primary = f"file://{Path(config_dir).resolve()}" if config_dir else "pkg://shardmd.configs"
    sp = create_config_search_path(primary)
    for d in extra_dirs:
        sp.prepend(provider="command-line", path=f"file://{Path(d).resolve()}",
                   anchor=SearchPathQuery(provider="schema"))
    return sp


def load(loader, config_name: str, overrides: list[str], multirun: bool = False,
         check_code: bool = True) -> DictConfig:
    """Compose with Hydra's config loader (the ``hydra`` node kept); errors as one line.
    ``check_code``: refuse anything the composed config would import or instantiate unless
    ``allow_code=true`` was given (engine/config/guard.py; its notes go to the log)."""
    from hydra.types import RunMode

    from shardmd.engine.config import guard as config_guard

    try:
        cfg = loader.load_configuration(config_name=config_name, overrides=list(overrides),
                                        run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN)
    except Exception as exc:  # noqa: BLE001 - Hydra and OmegaConf raise many kinds; each becomes one line
        raise composition_error(exc, overrides) from None
    if check_code:
        _from_shardmd(cfg)   # a file without ShardMD's keys also lacks its Hydra settings: say that first
        config_guard.set_policy(config_guard.allowed(),
                                config_guard.check(cfg, overrides, config_guard.allowed()))
    return cfg


def job_config(cfg: DictConfig) -> DictConfig:
    """The run's config from a loaded one: without Hydra's node, checked."""
    from omegaconf import open_dict, read_write

    if "hydra" in cfg:
        cfg = cfg.copy()
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]
    validate(cfg)
    return cfg


def compose_config(args: list[str]) -> DictConfig:
    """Normalise ``args`` (key=value strings; ``config=FILE.yaml`` starts from a file of yours;
    ``allow_code=true`` lets the files run code, engine/config/guard.py), compose with Hydra and
    validate."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from shardmd.engine.config import guard as config_guard

    allow, args = config_guard.split_allow_code(list(args))
    file, rest = split_config_file(args)
    overrides = normalize_overrides(rest)
    config_guard.set_policy(allow)
    config_guard.check_searchpath(file, overrides, allow)
    loader = ConfigLoaderImpl(config_search_path=search_path(file.parent if file else None))
    return job_config(load(loader, file.stem if file else "config", overrides))


def composition_error(exc: Exception, overrides: list[str]) -> UserError:
    """One line for anything Hydra or OmegaConf refuse while composing."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    msg = " ".join(str(exc).split())
    cause = exc.__cause__ or exc.__context__
    full_key = getattr(cause, "full_key", None) or ""
    if "You must specify 'model'" in msg:
        return UserError(f"no model given: add model=<name>, one of: {', '.join(group_options('model'))}")
    if isinstance(cause, ValidationError) and full_key:
        key = full_key if full_key in SCHEMA else (_map_of(full_key) or full_key)
        given = next((o.split("=", 1)[1] for o in reversed(overrides)
                      if o.lstrip("+~").split("=")[0] in (full_key, key)), getattr(cause, "value", "?"))
        info = key_info(key, _active_in(overrides))
        fix = info.check.fix if info and info.check and info.check.fix else "see python -m engine --help"
        return UserError(f"{full_key}={given!r} is invalid: {fix}")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key == "allow_code":
        return UserError("allow_code is read from the command line only, never from a config file: remove it "
                         "from the file and give allow_code=true on the command line if you trust the file")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        wrong = _wrong_group(full_key, overrides)
        if wrong:
            return UserError(wrong)
        if _map_of(full_key):
            m = _map_of(full_key)
            return UserError(f"{full_key}: not a valid entry of {m}; {SCHEMA[m].check.fix}")
        return UserError(f"unknown config key '{full_key}'{_closest(full_key)}")
    if msg.startswith("Ambiguous value for argument"):
        arg = re.search(r"argument '([^']*)'", msg)
        return UserError(f"{arg.group(1) if arg else 'a value'} is a sweep: add -m (--multirun) to run one job "
                         "per value, or write a list as [a,b]")
    if msg.startswith("Could not delete from config"):
        k = re.search(r"'([^']*)'", msg)
        return UserError(f"'~{k.group(1) if k else ''}': there is no such entry to remove")
    if msg.startswith("Cannot find primary config"):
        return UserError(f"{msg.split('.')[0]}; give --config-path=DIR --config-name=NAME (or config=FILE.yaml)")
    return UserError(f"cannot compose the configuration: {msg}")


# -- checking ----------------------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def _choice(group: str, name: str) -> str:
    """The group choice a node's ``name`` belongs to (a model route belongs to the open choice)."""
    return name if name in schema.GROUPS[group] or group not in schema.OPEN_CHOICES else schema.OPEN_CHOICES[group]


def _active_in(overrides: list[str]) -> set[str]:
    """The group choices a list of overrides makes (the defaults where it names none)."""
    chosen = {g: c for g, c in DEFAULT_CHOICES.items() if c is not None}
    for o in overrides:
        k, eq, v = o.lstrip("+").partition("=")
        if eq and k in GROUPS:
            chosen[k] = v
    return {f"{g}={_choice(g, c)}" for g, c in chosen.items()}


def _active(cfg: DictConfig) -> set[str]:
    return {f"{g}={_choice(g, cfg[g].name)}" for g in GROUPS
            if g in cfg and OmegaConf.is_dict(cfg[g]) and "name" in cfg[g]}


def _from_shardmd(cfg: DictConfig) -> None:
    top = [k for k in SCHEMA if "." not in k]
    if all(k in cfg for k in top) and "model" in cfg.keys() and OmegaConf.is_missing(cfg, "model"):
        raise UserError(f"no model given: add model=<name>, one of: {', '.join(group_options('model'))}")
    if any(k not in cfg for k in top) or any(g not in cfg for g in GROUPS):
        raise UserError("the configuration does not start from ShardMD's keys: a config file of yours needs "
                        "`defaults: [shardmd, _self_]` at its top (README, 'Config files')")


def validate(cfg: DictConfig) -> None:
    """Check every value; raise a one-line UserError naming the key and the fix (a value written
    as an interpolation by its expression: engine/config/expressions.py)."""
    from shardmd.engine.config.expressions import check_resolves, shown_value

    _from_shardmd(cfg)
    active = _active(cfg)
    check_resolves(cfg, lambda key: getattr((key_info(key, active) or key_info(_map_of(key) or "", active)
                                             or KeyInfo("", None, "", None)).check, "fix", ""))
    for path, info in SCHEMA.items():
        if info.owners and not active.intersection(info.owners):
            continue
        info = key_info(path, active)
        value = _plain(OmegaConf.select(cfg, path, throw_on_missing=False))
        fix = info.check(value) if info.check and not (value is None and info.optional) else None
        if fix:
            raise UserError(f"{path}={shown_value(cfg, path, value)} is invalid: {fix}")
    for path, _ in _flat(_plain(cfg)):   # keys added with ++ beside the schema (e.g. under another model)
        info = SCHEMA.get(path)
        if path in (f"{g}.name" for g in GROUPS) or info and (not info.owners or active.intersection(info.owners)):
            continue
        if any(path.startswith(f"{g}.") and f"{g}={c}" in active for g, c in schema.OPEN_CHOICES.items()):
            continue   # an argument of the model's factory
        raise UserError(_wrong_group(path, [f"{g}={_choice(g, cfg[g].name)}" for g in GROUPS])
                        or f"unknown config key '{path}'{_closest(path)}")


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


# -- what people read --------------------------------------------------------------------------------
def echo_line(cfg: DictConfig) -> str:
    """The configuration as one line of command-line overrides (the log's first line): values
    written as interpolations (``${oc.env:VAR}``) as their expressions, never resolved."""
    c = OmegaConf.to_container(cfg, resolve=False)
    parts = [f"{g}={c[g]['name']}" for g in GROUPS if isinstance(c.get(g), dict)]
    parts += [f"{k}={hydra_value(v)}" for k, v in _flat(c) if k not in (f"{g}.name" for g in GROUPS)]
    return "Config: " + " ".join(shlex.quote(p) for p in parts)
