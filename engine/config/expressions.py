"""Values a configuration takes from interpolations are stored as their expressions.

A value written as an interpolation (``${oc.env:VAR}``, ``${other.key}``, any resolver's
``${name:...}``) may resolve to what must not reach shared files: a token, a private folder, a
site's paths.  Every copy of the configuration the engine writes or prints (the log's
``Config:`` line, the trajectory's ``/parameters``, a checkpoint's ``config``, the model's
origin, the integrator state a checkpoint keeps) holds the expression, the ``${...}`` text as
written, in its place; the run itself uses the resolved values.  Plain values are stored as
they are.

A restart compares the physics keys (``checkpoint.PHYSICS_KEYS``) of a checkpoint with the new
run's.  For each physics key whose node holds an expression, the stored config carries, under
``resolved_digests``, a salted scrypt digest of the resolved node (its JSON): the new run's
resolved value is hashed with the stored salt and compared, so changing ``${oc.env:T}``'s
value between runs is a physics change, while the value cannot be read back from the file
(a random salt per run, and scrypt's cost: ~16 MiB and tens of ms a guess).
"""
from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationValidationError

from shardmd.engine.errors import UserError

#: the stored config's table of digests: physics key -> {"salt", "scrypt", "n", "r", "p"}
DIGESTS_KEY = "resolved_digests"
#: scrypt's cost (RFC 7914 interactive-login parameters): 16 MiB of memory per digest
_N, _R, _P = 1 << 14, 8, 1
#: the prefix of a model identity stored as a digest (``scrypt$<salt hex>$<digest hex>``)
_ID_PREFIX = "scrypt$"


def expression_paths(cfg: DictConfig | ListConfig, prefix: str = "") -> dict[str, str]:
    """Dotted path -> expression text of every node of ``cfg`` written as an interpolation
    (``system.repeat.0`` for a list's entry); nodes below an interpolation are not walked."""
    out: dict[str, str] = {}
    keys = range(len(cfg)) if isinstance(cfg, ListConfig) else list(cfg.keys())
    for k in keys:
        path = f"{prefix}{k}"
        if OmegaConf.is_interpolation(cfg, k):
            out[path] = str(cfg._get_node(k)._value())
            continue
        node = cfg._get_node(k)
        if isinstance(node, (DictConfig, ListConfig)) and not node._is_none() and not node._is_missing():
            out.update(expression_paths(node, path + "."))
    return out


def stored_config(cfg: DictConfig) -> dict:
    """``cfg`` as a plain dict, every interpolation as its expression text (nothing resolved)."""
    return OmegaConf.to_container(cfg, resolve=False)


def shown_value(cfg: DictConfig, path: str, value: Any) -> str:
    """``value`` of the key ``path`` for a message: a value written as an interpolation by its
    expression (what it resolves to may be a secret)."""
    paths = expression_paths(cfg)
    if holds_expression(paths, path):
        return f"{paths.get(path, 'an expression')!r} (its value not shown)"
    return repr(value)


def check_resolves(cfg: DictConfig, fix_of) -> None:
    """Resolve every interpolation of ``cfg``; one line naming the key and its expression if
    one fails, never the value it resolved to.  ``fix_of(key)``: what the key takes ('' if unknown)."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as exc:
        key = str(getattr(exc, "full_key", "") or "")
        expr = expression_paths(cfg).get(key)
        where = f"{key}={expr}" if expr else key or "the configuration"
        if isinstance(exc, InterpolationValidationError):   # its message holds the value
            fix = fix_of(key)
            raise UserError(f"{where}: the value it resolves to is not valid for {key or 'this key'} "
                            f"(not shown){'; ' + fix if fix else ''}") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{where} cannot be resolved: {first}") from None


def shown_checkpoint(paths: dict[str, str], path: str) -> str:
    """A checkpoint's ``path`` for messages and the log: by the expression of ``restart.file``
    or of ``output`` (whose folder restart=auto searched) where either was written as one."""
    if "restart.file" in paths:
        return paths["restart.file"]
    if "output" in paths:
        return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]} of output={paths['output']}"
    return path


def update_keeping_expression(cfg: DictConfig, key: str, fn) -> str | None:
    """``cfg[key] = fn(cfg[key])`` (``fn``: str -> str, e.g. a path put inside a folder); a value
    written as an interpolation stays one: where ``fn`` changes its resolved value, the node
    becomes ``fn`` of its expression text.  Returns that text (None: a plain value)."""
    if not OmegaConf.is_interpolation(cfg, key):
        cfg[key] = fn(cfg[key])
        return None
    expr = str(cfg._get_node(key)._value())
    if fn(cfg[key]) != cfg[key]:
        cfg[key] = expr = fn(expr)
    return expr


def holds_expression(paths: dict[str, str], key: str) -> bool:
    """Whether the node ``key`` (dotted) is, or holds, an expression of ``paths``."""
    return any(p == key or p.startswith(key + ".") for p in paths)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def _scrypt(data: bytes, salt: bytes) -> str:
    return hashlib.scrypt(data, salt=salt, n=_N, r=_R, p=_P, dklen=32).hex()


def new_salt() -> bytes:
    return secrets.token_bytes(16)


def digests(resolved: dict, paths: dict[str, str], keys, salt: bytes) -> dict:
    """``{key: digest entry}`` for each of ``keys`` whose node holds an expression of ``paths``:
    scrypt of the JSON of ``resolved[key]`` with ``salt`` (and the salt, the cost, for the
    comparison)."""
    return {k: {"scrypt": _scrypt(_json(resolved.get(k)), salt), "salt": salt.hex(), "n": _N, "r": _R, "p": _P}
            for k in keys if holds_expression(paths, k)}


def _entry_matches(entry: Any, value: Any) -> bool:
    """Whether ``value`` hashes to the stored ``entry``; an entry that is not one this module
    writes (edited, another cost) never matches: a restart then reports a change."""
    try:
        if (entry["n"], entry["r"], entry["p"]) != (_N, _R, _P):
            return False
        return secrets.compare_digest(_scrypt(_json(value), bytes.fromhex(entry["salt"])), str(entry["scrypt"]))
    except (KeyError, TypeError, ValueError):
        return False


def physics_changes(old: dict, new: dict, keys) -> list[str]:
    """The ``keys`` whose value differs between a stored config ``old`` (its expressions
    compared by digest) and the new run's resolved config ``new``."""
    table = old.get(DIGESTS_KEY)
    table = table if isinstance(table, dict) else {}
    return [k for k in keys
            if not (_entry_matches(table[k], new.get(k)) if k in table else _json(old.get(k)) == _json(new.get(k)))]


def stored_identity(identity: str, salt: bytes) -> str:
    """A model identity (sha256 hex) as a checkpoint stores it for a model node holding an
    expression: salted scrypt of it, so the resolved value cannot be guessed through it."""
    return f"{_ID_PREFIX}{salt.hex()}${_scrypt(identity.encode(), salt)}"


def identity_matches(stored: str, identity: str) -> bool:
    """Whether a checkpoint's stored model identity names the model ``identity`` (sha256 hex)."""
    if not str(stored).startswith(_ID_PREFIX):
        return stored == identity
    try:
        salt, want = str(stored)[len(_ID_PREFIX):].split("$")
        return secrets.compare_digest(_scrypt(identity.encode(), bytes.fromhex(salt)), want)
    except ValueError:
        return False


def leaf(container: Any, path: str) -> Any:
    """The value at dotted ``path`` of a plain container (KeyError/IndexError if absent)."""
    for part in path.split("."):
        container = container[int(part)] if isinstance(container, list) else container[part]
    return container


def redact_origin(origin: dict, model_paths: dict[str, str], resolved_model: dict) -> dict:
    """A model's origin (``models.registry.model_origin``) with what came from expressions of
    the model node (``model_paths``: paths below ``model``, e.g. ``checkpoint``) in their
    expressions: the route, the arguments, and the names of files an argument named."""
    if not model_paths:
        return origin
    out = dict(origin)
    tops = {p.split(".")[0] for p in model_paths}
    if "name" in tops:
        out["route"] = model_paths.get("name", out["route"])
        out.pop("factory", None)   # named from the route
    args = json.loads(json.dumps(origin.get("arguments", {}), default=str))
    for p, expr in model_paths.items():
        parent, _, last = p.rpartition(".")
        try:
            node = leaf(args, parent) if parent else args
            node[int(last) if isinstance(node, list) else last] = expr
        except (KeyError, IndexError, TypeError, ValueError):
            pass   # not an argument (the name, the spec)
    out["arguments"] = args
    files: dict[str, str] = {}
    named = {}
    for p, expr in model_paths.items():
        try:
            v = leaf(resolved_model, p)
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if isinstance(v, str) and v:
            from pathlib import Path

            named[v] = expr
            try:
                named[str(Path(v).resolve())] = expr
            except (OSError, RuntimeError):
                pass
    for f, h in origin.get("files", {}).items():
        files[named.get(f, f)] = h
    out["files"] = files
    return out


#: integrator state keys that echo a config value (read by no ``load_state_dict``): the config key
_ECHOED = {"dt": "dt", "temperature": "temperature", "seed": "seed"}


def redact_state(state: dict, paths: dict[str, str]) -> dict:
    """An integrator's ``state_dict`` without the keys that only echo a config value written as
    an expression (dt, temperature, seed, ``integrator.<key>`` such as friction or pressure);
    the keys a restart reads (chain lengths, coupling) stay."""
    if not paths:
        return state
    keep = ("chain", "pchain", "couple", "name")
    out = {}
    for k, v in state.items():
        src = _ECHOED.get(k, f"integrator.{k}")
        if k not in keep and src in paths:
            continue
        out[k] = redact_state(v, paths) if isinstance(v, dict) else v
    return out
