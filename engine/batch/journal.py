"""The record of a many-system run: one row per finished system, kept as it happens.

Each rank appends its finished systems to ``<output stem>.systems/done.<rank>.csv`` (one row,
flushed and fsynced, per system), so a run killed mid-way knows what is done: ``restart=auto``
skips those and continues the rest (a system that was running resumes from its own
checkpoint, or starts again when it has none). At the end rank 0 writes ``<output
stem>.summary.csv``: every system in input order, the bad frames left out among them.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from shardmd.engine.errors import OutputError

#: the summary's columns (units in the names)
COLUMNS = ("system", "atoms", "status", "energy_eV", "volume_A3", "steps", "converged", "fmax_eV_per_A",
           "output", "note")


@dataclass(frozen=True)
class Row:
    """One system's line of the summary: ``system`` its frame index in the input; status ok,
    failed (the run of that system ended with an error: ``note``) or skipped (a bad frame)."""

    system: int
    atoms: int
    status: str
    energy_eV: float | str = ""
    volume_A3: float | str = ""
    steps: int | str = ""
    converged: bool | str = ""
    fmax_eV_per_A: float | str = ""
    output: str = ""
    note: str = ""


def _text(row: Row) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(
        [repr(v) if isinstance(v, float) else v for v in asdict(row).values()])
    return buf.getvalue()


def _parse(values: list[str]) -> Row:
    kw = dict(zip(COLUMNS, values))
    for name in ("system", "atoms"):
        kw[name] = int(kw[name])
    for name in ("energy_eV", "volume_A3", "fmax_eV_per_A"):
        kw[name] = float(kw[name]) if kw[name] else ""
    kw["steps"] = int(kw["steps"]) if kw["steps"] else ""
    kw["converged"] = {"True": True, "False": False}.get(kw["converged"], "")
    return Row(**kw)


def folder(output: str) -> Path:
    """``<output stem>.systems/``: the per-rank records of finished systems."""
    p = Path(output)
    return p.with_name(p.stem + ".systems")


def summary_path(output: str) -> Path:
    p = Path(output)
    return p.with_name(p.stem + ".summary.csv")


def system_output(output: str, index: int, width: int) -> str:
    """``X.<i>.h5`` for ``output=X.h5``: the frame index zero-padded to ``width`` digits."""
    p = Path(output)
    return str(p.with_name(f"{p.stem}.{index:0{width}d}{p.suffix}"))


class Journal:
    """This rank's append-only record of finished systems (every write error is fatal)."""

    def __init__(self, output: str, rank: int):
        self.path = folder(output) / f"done.{rank}.csv"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {str(self.path.parent)!r}: {exc.strerror or exc}") from None

    def add(self, row: Row) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(_text(row))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise OutputError(f"cannot record system {row.system} in {str(self.path)!r}: "
                              f"{exc.strerror or exc}") from None


def finished(output: str) -> dict[int, Row]:
    """Rows of every rank's record (a kill mid-write leaves a last line without its end: ignored)."""
    rows: dict[int, Row] = {}
    d = folder(output)
    if not d.is_dir():
        return rows
    for p in sorted(d.glob("done.*.csv")):
        text = p.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]
        for values in csv.reader(io.StringIO(complete)):
            if len(values) == len(COLUMNS):
                row = _parse(values)
                rows[row.system] = row
    return rows


def write_summary(output: str, rows: list[Row]) -> Path:
    """``<output stem>.summary.csv`` with ``rows`` in system order (written whole, then renamed)."""
    path = summary_path(output)
    tmp = path.with_name(path.name + f".part-{os.getpid()}")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(",".join(f.name for f in fields(Row)) + "\n")
            for row in sorted(rows, key=lambda r: r.system):
                fh.write(_text(row))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write the summary {str(path)!r}: {exc.strerror or exc}") from None
    return path
