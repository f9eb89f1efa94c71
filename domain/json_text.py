"""JSON text from files a user hands us, read without recursing into hostile nesting.

Layer: imports only the standard library; the engine's checkpoint checks and the spec loader use it.

``json.loads`` recurses once per bracket.  Text of 20,000 nested brackets reaches the
interpreter's recursion limit inside C code, and even a caught RecursionError there can
leave a dump on stderr as the process ends, so the nesting is measured first, in one pass.
"""
from __future__ import annotations

import json

MAX_DEPTH = 64   # specs and saved states nest 3 or 4 deep


def nesting_depth(text: str) -> int:
    """Deepest bracket nesting of ``text`` counted outside JSON strings, without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_bounded(text: str | bytes, max_depth: int = MAX_DEPTH):
    """``json.loads(text)``; ValueError (one line) for text nested deeper than ``max_depth``."""
    if isinstance(text, bytes):
        text = text.decode()
    if nesting_depth(text) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
