"""Groups of atoms: ``groups.<name>={species: [Cu]}``, ``{ids: "0-99,200"}`` or ``{file: idx.ndx}``.

A group is a fixed set of global atom ids (0-based, the input's order), chosen once at the start
from the full initial system, so it follows its atoms across domains (each rank finds its own
members by id).  Selectors, combined by intersection when several are given:

  species   element symbols, ``[Cu]`` or ``Cu``
  ids       ``"0-99,200"`` (inclusive ranges and single ids) or a list ``[0, 1, 2]``
  file      an index file: GROMACS ``.ndx`` (``[ name ]`` sections of 1-based atom numbers;
            ``section`` picks one, default the group's own name, else the file's only one),
            or one 0-based id per line (or several per line; ``#`` starts a comment)

Used by thermo columns (``temp@<name>``, engine/observables/columns.py), by ``fix.group``
(engine/run/constraints.py) and by observables (``view.group(name)``).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from shardmd.engine.errors import UserError

SELECTORS = ("species", "ids", "file")
_KEYS = (*SELECTORS, "section")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _as_list(v) -> list:
    if v is None:
        return []
    return [v] if isinstance(v, (str, int)) else list(v)


def parse_ids(v) -> list[int]:
    """``"0-99,200"`` or ``[0, 1]`` (or ``"0-4"`` entries inside a list) as a list of ids; ValueError
    naming the piece that is not an id or a range."""
    out: list[int] = []
    for item in _as_list(v):
        if isinstance(item, bool):
            raise ValueError(f"{item!r} is not an id")
        if isinstance(item, int):
            out.append(item)
            continue
        for piece in str(item).replace(" ", "").split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
            if not m:
                raise ValueError(f"{piece!r} is not an id or a range like 0-99")
            lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
            if hi < lo:
                raise ValueError(f"the range {piece!r} runs backwards")
            out.extend(range(lo, hi + 1))
    if any(i < 0 for i in out):
        raise ValueError("ids are >= 0 (0-based, the input's order)")
    return out


def spec_problem(name, spec) -> str | None:
    """None when ``groups.<name>`` is spelled right (the configuration's check), else the fix."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"group name {name!r} is not letters, digits and _"
    if not isinstance(spec, dict) or not spec:
        return (f"groups.{name} is not a selection; give e.g. {{species: [Cu]}}, {{ids: '0-99,200'}} or "
                "{file: idx.ndx}")
    unknown = [k for k in spec if k not in _KEYS]
    if unknown:
        return f"groups.{name}.{unknown[0]} is not a selector; use {', '.join(SELECTORS)} (and section with file)"
    if not any(k in spec for k in SELECTORS):
        return f"groups.{name} selects nothing; give one of {', '.join(SELECTORS)}"
    if "species" in spec:
        from ase.data import atomic_numbers

        bad = [s for s in _as_list(spec["species"]) if s not in atomic_numbers]
        if bad:
            return f"groups.{name}.species: {bad[0]!r} is not an element symbol"
    if "ids" in spec:
        try:
            parse_ids(spec["ids"])
        except ValueError as exc:
            return f"groups.{name}.ids: {exc}"
    if "file" in spec and not (isinstance(spec["file"], str) and spec["file"].strip()):
        return f"groups.{name}.file: give the path of an index file"
    if "section" in spec and "file" not in spec:
        return f"groups.{name}.section names a section of an index file; give file too"
    return None


def config_problem(groups) -> bool | str:
    """The schema's check of ``groups``: True, or the first problem."""
    for name, spec in (groups or {}).items():
        bad = spec_problem(name, spec)
        if bad:
            return bad
    return True


def read_index_file(path: str, section: str | None, group: str) -> list[int]:
    """0-based ids of an index file (module docstring); one-line UserError when it is unreadable,
    the section is missing or a token is not a number."""
    key = f"groups.{group}.file={path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{key}: cannot read it ({exc.strerror or exc}); give the path of an index file") from None
    except UnicodeDecodeError:
        raise UserError(f"{key}: not a text file; give a GROMACS .ndx or one id per line") from None
    lines = [ln.split("#", 1)[0].split(";", 1)[0].strip() for ln in text.splitlines()]
    sections: dict[str, list[str]] = {}
    current = None
    for ln in lines:
        m = re.fullmatch(r"\[\s*(.*?)\s*\]", ln)
        if m:
            current = m[1]
            sections.setdefault(current, [])
        elif ln:
            sections.setdefault(current, []).extend(ln.split())
    ndx = any(k is not None for k in sections)
    if ndx:
        names = [k for k in sections if k is not None]
        want = section or (group if group in sections else names[0] if len(names) == 1 else None)
        if want not in sections:
            raise UserError(f"{key}: no section [ {section or group} ] in it (sections: {', '.join(names)}); "
                            f"give groups.{group}.section=<one of them>")
        tokens, base = sections[want], 1   # GROMACS numbers atoms from 1
    else:
        if section is not None:
            raise UserError(f"{key}: a plain id list has no sections; drop groups.{group}.section")
        tokens, base = sections.get(None, []), 0
    try:
        ids = [int(t) - base for t in tokens]
    except ValueError:
        bad = next(t for t in tokens if not t.lstrip("-").isdigit())
        raise UserError(f"{key}: {bad!r} is not an atom number") from None
    if any(i < 0 for i in ids):
        raise UserError(f"{key}: atom numbers start at {base} in this {'.ndx' if ndx else 'id list'} file")
    return ids


def select(name: str, spec, ids: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """Sorted unique global ids of the group ``name`` in a system of atoms ``ids`` (n,) with atomic
    ``numbers`` (n,); one-line UserError for ids the system lacks or an empty group."""
    from ase.data import atomic_numbers

    bad = spec_problem(name, spec)
    if bad:
        raise UserError(bad)
    ids = np.asarray(ids, dtype=np.int64)
    chosen = np.unique(ids)
    if "species" in spec:
        z = [atomic_numbers[s] for s in _as_list(spec["species"])]
        chosen = np.intersect1d(chosen, ids[np.isin(np.asarray(numbers), z)])
    for sel in ("ids", "file"):
        if sel not in spec:
            continue
        given = np.asarray(parse_ids(spec["ids"]) if sel == "ids"
                           else read_index_file(str(spec["file"]), spec.get("section"), name), dtype=np.int64)
        missing = np.setdiff1d(given, ids)
        if missing.size:
            raise UserError(f"groups.{name}.{sel}: id {int(missing[0])} is not in the system (ids "
                            f"{int(ids.min())}..{int(ids.max())}, 0-based); give ids of this system")
        chosen = np.intersect1d(chosen, given)
    if chosen.size == 0:
        raise UserError(f"groups.{name} selects no atom of this system; check its selectors")
    return chosen


def resolve(groups, ids, numbers) -> dict[str, np.ndarray]:
    """``{name: sorted ids}`` of every configured group (``groups``: the config's mapping)."""
    return {str(name): select(str(name), dict(spec), ids, numbers) for name, spec in (groups or {}).items()}
