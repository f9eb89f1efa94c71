"""File names on the command line as users type them: ``system.file=/tmp/dïr/ünï.extxyz``,
``output=résumé.h5``, ``output=T=300K.h5``, ``system.file=my file.extxyz`` (one shell word).

Hydra's override grammar reads an unquoted value made of ASCII letters, digits, spaces and
``_/-+.$%*@?|:~`` only; any other character (a non-ASCII letter, ``=``, ``#``, ``&``, ``!``, ...)
must be quoted for Hydra, inside the shell's quotes: ``"output='résumé.h5'"``.  For the keys
whose value is a path (:data:`PATH_KEYS`) the command line quotes such a value itself, so the
file name is read as written.  A value that also holds characters that mean something to Hydra
(``,`` a sweep, ``[]{}()`` lists, maps and calls, quotes, ``\\``, ``${`` an interpolation) is
left to Hydra, and the one-line error says how to quote it (:func:`how_to_quote`).
"""
from __future__ import annotations

import re

from shardmd.engine.errors import UserError

#: keys whose value is a file or folder name (``restart`` is ``restart.file``'s shorthand)
PATH_KEYS = ("output", "restart", "restart.file", "system.file", "minimize.structure", "model.checkpoint",
             "model.spec", "hydra.run.dir", "hydra.sweep.dir")

_HYDRA_SYNTAX = re.compile(r"[,\[\]{}()'\"\\]|\$\{")


def _split(arg: str) -> tuple[str, str, str] | None:
    """(the prefix up to and with ``=``, the key without ``+``, the value) of a path key's
    argument, else None."""
    key, eq, value = arg.partition("=")
    if not eq or key.lstrip("+") not in PATH_KEYS:
        return None
    return key + eq, key.lstrip("+"), value


def quoted(arg: str) -> str | None:
    """``arg`` with its value quoted for Hydra, when ``arg`` gives a key of :data:`PATH_KEYS` a
    file name without Hydra syntax (the caller tries this after Hydra could not read ``arg``);
    else None."""
    parts = _split(arg)
    if parts is None or not parts[2].strip() or _HYDRA_SYNTAX.search(parts[2]):
        return None
    return f"{parts[0]}'{parts[2]}'"


def how_to_quote(arg: str) -> str:
    """The fix for a path key's value Hydra cannot read (''  for other arguments)."""
    parts = _split(arg)
    if parts is None:
        return ""
    inner = parts[2].replace("\\", "\\\\").replace("'", "\\'")
    return f"a file name with such characters is quoted for Hydra inside the shell's quotes: \"{parts[1]}='{inner}'\""


def parse_override(parser, arg: str):
    """(``arg``, Hydra's Override of it): a path key's file name that Hydra reads only quoted is
    given quoted (:func:`quoted`); an argument Hydra cannot read is a one-line UserError."""
    from hydra.errors import HydraException

    try:
        return arg, parser.parse_override(arg)
    except HydraException as exc:
        again = quoted(arg)
        if again is not None:
            try:
                return again, parser.parse_override(again)
            except HydraException:
                pass
        why = str(exc).strip().splitlines()[0] if "=" in arg or arg.startswith("~") else ""
        fix = how_to_quote(arg) or "write key=value, e.g. steps=1000"
        raise UserError(f"cannot read argument {arg!r}: {why + '; ' if why else ''}{fix}") from None
