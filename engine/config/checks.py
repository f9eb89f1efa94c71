"""The checks and the field constructor the configuration schema is written with
(engine/config/schema.py, engine/config/choices.py): a key is one dataclass field made with
:func:`key`, its check a :class:`Check` (None when the value is fine, else the fix).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


# -- checks: each returns None when the value is fine, else the fix (what to give instead) --------
@dataclass(frozen=True)
class Check:
    """``test(value)`` is True (fine), False (say ``fix``) or a string (say that instead)."""

    test: Callable[[Any], bool | str]
    fix: str

    def __call__(self, value) -> str | None:
        try:
            ok = self.test(value)
        except (TypeError, AttributeError, KeyError, ValueError):   # the wrong shape (a string where a
            ok = False                                             # map goes, as an interpolation gives)
        return None if ok is True else (ok if isinstance(ok, str) else self.fix)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    """A finite number (inf and NaN are refused for every float key)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _same(v, option) -> bool:
    """``v == option`` without Python's 1 == True."""
    return type(v) is type(option) and v == option


def whole(lo: int, fix: str | None = None) -> Check:
    return Check(lambda v: _is_int(v) and v >= lo, fix or f"give a whole number >= {lo}")


def number(fix: str, *, gt: float | None = None, ge: float | None = None) -> Check:
    return Check(lambda v: _is_num(v) and (gt is None or v > gt) and (ge is None or v >= ge), fix)


def one_of(*options, fix: str | None = None) -> Check:
    words = ["null" if o is None else str(o).lower() for o in options]
    return Check(lambda v: any(_same(v, o) for o in options),
                 fix or "use " + (", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]))


FLAG = Check(lambda v: isinstance(v, bool), "use true or false")
#: how far a composition's fractions may sum from 1 (system.composition)
SUM_TOLERANCE = 1e-6
AUTO = one_of("auto", True, False)


def _triple(ok: Callable[[Any], bool], fix: str) -> Check:
    return Check(lambda v: v is not None and len(v) == 3 and all(ok(x) for x in v), fix)


def _per_species(v) -> bool:
    return len(v) > 0 and all(_is_num(x) and x > 0 for x in v.values())


def _charges(v) -> bool:
    """null, a map element -> finite number, or a list of finite numbers (one per atom)."""
    from ase.data import atomic_numbers

    if v is None:
        return True
    if hasattr(v, "items"):
        return len(v) > 0 and all(k in atomic_numbers and _is_num(q) for k, q in v.items())
    return not isinstance(v, (str, bytes)) and len(v) > 0 and all(_is_num(q) for q in v)


def _pairs(v) -> bool:
    return all(re.fullmatch(r"[A-Z][a-z]?-[A-Z][a-z]?", str(k)) and _is_num(p["epsilon"]) and p["epsilon"] > 0
               and _is_num(p["sigma"]) and p["sigma"] > 0 for k, p in v.items())


def _existing_file(v) -> bool | str:
    from shardmd.engine.io.safe_io import input_file_problem

    if v is None:
        return True
    bad = input_file_problem(v)
    return bad is None or f"{bad}; give the path of a structure file ASE can read"


def _element(v) -> bool:
    from ase.data import atomic_numbers

    return isinstance(v, str) and v in atomic_numbers


def _fields(v) -> bool | str:
    bad = [f for f in v if f not in TRAJECTORY_FIELDS and f not in MODEL_FIELDS]
    if bad:
        return f"unknown field(s) {bad}; use any of {[*TRAJECTORY_FIELDS, 'energies']}"
    names = [MODEL_FIELDS.get(f, f) for f in v]   # energies and energy are one field
    return len(set(names)) == len(names) or "a field is named twice; give each once"


def _text(fix: str, *, null: bool = False) -> Check:
    return Check(lambda v: (null and v is None) or (isinstance(v, str) and v.strip() != ""), fix)


TRAJECTORY_FIELDS = ("position", "image", "velocity", "force")   # the default; optional besides:
MODEL_FIELDS = {"energies": "energy", "energy": "energy"}   # per-atom energies the model returns, eV


def key(default: Any = MISSING, help: str = "", check: Check | None = None, *,
        factory: Callable[[], Any] | None = None):
    """One configuration key: its default, its help text (one sentence: --help and the README's
    table), and the check its value must pass (see ``shardmd.engine.config.compose.validate``)."""
    meta = {"help": help, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_frames(spec) -> slice:
    """``all`` -> every frame; ``START:STOP[:STEP]`` (Python's slice, parts optional, STEP > 0)."""
    text = str(spec).strip()
    if text == "all":
        return slice(None)
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"system.frames={spec!r}: give all or START:STOP:STEP")
    try:
        start, stop, step = ([int(p) if p.strip() else None for p in parts] + [None])[:3]
    except ValueError:
        raise ValueError(f"system.frames={spec!r}: give all or START:STOP:STEP with whole numbers") from None
    if step is not None and step <= 0:
        raise ValueError(f"system.frames={spec!r}: STEP must be > 0")
    return slice(start, stop, step)
