"""Observables from the configuration: ``observables.modules=[mymod, pkg.mod:func]``.

Each entry is a module to import (its ``register_observable`` calls and decorators register
what it declares) or ``module:function``, which also checks that ``function`` is one of them.
A module is code, so the configuration guard refuses the key without ``allow_code=true``
(engine/config/guard.py); with it, the log notes what was imported.  The working directory
is importable, as for ``model=py:module:factory``.
"""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from shardmd.engine.errors import UserError
from shardmd.engine.observables import registry

KEY = "observables.modules"
_ENTRY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*)?")


def check_entry(entry) -> str | None:
    """None when ``entry`` is spelled as a module or module:function, else the fix."""
    if isinstance(entry, str) and _ENTRY.fullmatch(entry):
        return None
    return f"{entry!r} is not a module name or module:function (e.g. mymod or mymod:radius_of_gyration)"


def refusal(entries) -> str:
    """The guard's text for the key (one finding)."""
    return f"{KEY}=[{','.join(map(str, entries))}] (observable modules: they are imported)"


def load(entries, allow: bool) -> list[tuple[str, list[str]]]:
    """Import each entry's module; ``[(entry, names it registered)]``.  One-line errors: without
    ``allow``, a module that is missing or fails to import, a function that is not registered."""
    entries = [str(e) for e in entries or ()]
    if not entries:
        return []
    if not allow:
        raise UserError(f"the configuration would run code: {refusal(entries)}; give allow_code=true on the "
                        f"command line if you trust the modules, or remove {KEY}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))   # the working directory is importable, as with `python -c`
    out = []
    for entry in entries:
        bad = check_entry(entry)
        if bad:
            raise UserError(f"{KEY}: {bad}")
        module, _, attr = entry.partition(":")
        try:
            mod = importlib.import_module(module)
        except UserError as exc:   # a declaration the registry refused, already one line
            raise UserError(f"{KEY}={entry}: {exc}") from None
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise UserError(f"{KEY}={entry}: no module {module!r} in the working directory or on sys.path; run "
                                f"from the folder holding {module.replace('.', '/')}.py or install its package") \
                    from None
            raise UserError(f"{KEY}={entry}: importing {module} failed: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any error of the user's module becomes one line naming it
            msg = " ".join(str(exc).split())
            raise UserError(f"{KEY}={entry}: importing {module} failed: {type(exc).__name__}: {msg}; fix {module}") \
                from None
        names = [o.name for o in registry.registered() if o.origin.split(":")[0] == module]
        if attr:
            fn = getattr(mod, attr, None)
            obs = getattr(fn, "observable", None)
            if fn is None:
                raise UserError(f"{KEY}={entry}: {module} has no {attr!r}"
                                + (f"; its observables: {', '.join(names)}" if names else ""))
            if not isinstance(obs, registry.Observable) or registry._REGISTRY.get(obs.name) is not obs:
                raise UserError(f"{KEY}={entry}: {module}.{attr} is not a registered observable; decorate it with "
                                "@register_observable(...) (docs/observables.md)")
            names = [obs.name]
        elif not names:
            raise UserError(f"{KEY}={entry}: {module} registers no observable; call register_observable there "
                            "(docs/observables.md)")
        out.append((entry, names))
    return out
