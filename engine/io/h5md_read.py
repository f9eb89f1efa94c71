"""Reading ShardMD trajectories stored in the H5MD 1.1 layout (see :mod:`shardmd.engine.io.h5md`).

This module also holds the layout constants and the row-validity rules shared with
the writer, so that the writer's crash repair and the reader agree exactly on which
rows of a file count.

Units in the file (each stated in a ``unit`` attribute, spelt as MDAnalysis reads them,
:mod:`shardmd.engine.io.h5md_units`): Å, fs, Å/fs, forces in kJ/(mol Å) (files of earlier
ShardMD versions: eV/Å), eV, K, eV/Å^3, amu.  The reader converts every field by its own
``unit`` attribute, so old and new files read alike.  Units of what the reader returns:
positions and cells in Å, forces in eV/Å, energies in eV, masses in amu,
``atoms.info["time_fs"]`` in fs, and velocities in ASE's own unit Å/(ASE time unit).

ASE velocities.  ASE's time unit is ``Å*sqrt(amu/eV)`` (about 10.18 fs) and
``ase.units.fs`` is the number of ASE time units in one femtosecond (about 0.0982).
A velocity ``v`` in Å/fs is ``v Å / (ase.units.fs t_ase)``, hence
``v_ase = v_A_per_fs / ase.units.fs`` (and ``v_A_per_fs = v_ase * ase.units.fs``).
The tests check this against a computation from CODATA constants.

Which rows count.  An element group ``{step, time, value}`` may be longer in one
dataset than another, or end in rows that were allocated but never written, when the
writing process was killed mid-frame.  A row counts if it lies within the shortest of
the three datasets, its step is >= 0 (the step fill value is -1), its time is finite
(the time fill value is NaN), and steps strictly increase up to it; the first row that
fails ends the valid prefix.  A *frame* counts only once its ``box/edges`` step, which the
writer writes last, is valid (see :func:`frame_extent`), so a frame whose writing was
interrupted is dropped as a whole.

Files that are not readable trajectories (a directory, an empty, truncated or non-HDF5
file, an HDF5 file of another layout, a checkpoint, a damaged file) raise
:class:`TrajectoryReadError`, one line naming the file; it is a ``ValueError`` and a
:class:`~shardmd.engine.errors.UserError` (``engine info`` prints it and exits 2); shapes
and sizes are checked from metadata before anything is read (:mod:`shardmd.engine.io.h5md_check`).  A
writer that hit a write error (disk full) never commits a frame whose data did not reach
the file, so every frame read from such a file is real (:mod:`shardmd.engine.io.h5md`).  An
observable that a killed writer left unreadable is left out with a one-line
:class:`TrajectoryDamageWarning` naming it (and listed by :func:`file_summary`); the
frames and the other observables read as usual.
"""
from __future__ import annotations

import os
import re
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from shardmd.domain.json_text import loads_bounded
from shardmd.engine.errors import OneLineWarning, UserError
from shardmd.engine.io.h5md_check import layout_problem
from shardmd.engine.io.h5md_live import check_settled, open_unlocked, retried, while_written
from shardmd.engine.io.h5md_units import (  # noqa: F401  (unit strings: re-exported for the writer)
    FIELD_ALIASES,
    FIELD_UNITS,
    LENGTH_UNIT,
    MASS_UNIT,
    OBSERVABLE_UNITS,
    SCALAR_FIELDS,
    TIME_UNIT,
    UnknownUnitError,
    element_factor,
    model_stress,
    to_engine,
    unit_of,
)

#: Per-atom time-dependent fields the writer knows, in their canonical order ("energy": the
#: model's per-atom potential energies, (n,) per frame, eV; the others are (n, 3)).
FIELDS: tuple[str, ...] = ("position", "image", "velocity", "force", "energy")
STEP_FILL = -1  # fill value of every `step` dataset: marks a row never written
PARTICLES = "/particles/all"


def observable_unit(name: str) -> str | None:
    """Unit string of a known observable: a registered one's (engine/observables/), else
    :data:`OBSERVABLE_UNITS`'s (``*_energy`` names are eV); None if unknown."""
    from shardmd.engine.observables.registry import h5md_unit

    return h5md_unit(name) or OBSERVABLE_UNITS.get(name) or ("eV" if name.endswith("_energy") else None)


def _decode(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def valid_rows(group: h5py.Group) -> int:
    """Number of leading rows of element ``group`` ({step, time, value}) that count.

    See the module docstring: shortest dataset, step >= 0, finite time, steps strictly
    increasing.  Reads the whole step and time columns (8 bytes per row each).
    """
    n = min(group["step"].shape[0], group["time"].shape[0], group["value"].shape[0])
    if n == 0:
        return 0
    steps = group["step"][:n]
    times = group["time"][:n]
    ok = (steps >= 0) & np.isfinite(times)
    ok[1:] &= np.diff(steps) > 0
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else n


def frame_elements(particles: h5py.Group) -> dict[str, h5py.Group]:
    """The per-frame element groups present: fields in canonical order, then ``box``
    (the ``box/edges`` group; a fixed box stored as a plain dataset is not an element)."""
    out = {name: particles[name] for name in FIELDS if name in particles}
    edges = particles.get("box/edges")
    if isinstance(edges, h5py.Group):
        out["box"] = edges
    return out


def frame_extent(elements: dict[str, h5py.Group]) -> dict[str, int]:
    """Rows of each element that belong to committed frames.

    The writer writes the ``box/edges`` step of a frame last, after everything else of
    that frame is on disk, so it is the frame's commit record: a frame counts when its
    box step is valid, and a field's rows count up to the last committed box step.
    Without a time-dependent box (files from other writers) each element counts its own
    valid rows.
    """
    counts = {name: valid_rows(g) for name, g in elements.items()}
    if "box" not in elements:
        return counts
    nb = counts["box"]
    last = int(elements["box"]["step"][nb - 1]) if nb else None
    out = {}
    for name, c in counts.items():
        if last is None:
            out[name] = 0
        else:
            out[name] = int(np.searchsorted(elements[name]["step"][:c], last, side="right"))
    return out


def primary_field(elements: dict[str, h5py.Group]) -> str | None:
    """Element whose steps define the frames: ``box``, else the first field present."""
    for name in ("box", *FIELDS):
        if name in elements:
            return name
    return None


def read_config_group(f: h5py.File) -> dict | None:
    """The run configuration stored by the writer (``/parameters/config_json``), or None."""
    if "parameters" not in f or "config_json" not in f["parameters"]:
        return None
    return loads_bounded(_decode(f["parameters/config_json"][()]))


class TrajectoryReadError(UserError, ValueError):
    """A file that cannot be read as a trajectory: a directory, empty, truncated, not HDF5,
    an HDF5 file of another layout, or damaged.  One line naming the file (the CLI prints
    ``error: ...`` and exits 2)."""


_MISSING = re.compile(r"object '([^']*)' doesn't exist|Can't open attribute|attribute '([^']*)'")
#: what reading a broken or foreign file raises (h5py: OSError, RuntimeError, KeyError for a
#: missing object, ValueError/TypeError/IndexError for unexpected shapes and types)
_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError)


def _why(exc: BaseException) -> str:
    """Short reason a file could not be read."""
    text = " ".join(str(exc).split())
    if isinstance(exc, UnknownUnitError):
        return text
    if isinstance(exc, KeyError) or "doesn't exist" in text:
        m = _MISSING.search(text)
        name = next((g for g in m.groups() if g), None) if m else None
        return (f"an HDF5 file of another layout (no {name!r})" if name
                else "an HDF5 file of another layout (a required group, dataset or attribute is missing)")
    if "truncated file" in text:
        return "truncated (shorter than its HDF5 header says)"
    if "file signature not found" in text:
        return "not an HDF5 file"
    if isinstance(exc, OSError) and getattr(exc, "errno", None) and exc.strerror:
        return exc.strerror
    m = re.search(r"error message = '([^']*)'", text)
    if m:
        return m.group(1)
    if len(text) > 120:
        text = text[:117] + "..."
    return f"damaged or unreadable ({type(exc).__name__}: {text})"


@contextmanager
def _reading(path, what: str = "ShardMD trajectory"):
    """Turn failures while reading ``path`` into one-line TrajectoryReadErrors."""
    try:
        yield
    except TrajectoryReadError:
        raise
    except FileNotFoundError:
        raise TrajectoryReadError(f"{os.fspath(path)!r}: no such file") from None
    except _READ_ERRORS as exc:
        raise TrajectoryReadError(f"{os.fspath(path)!r} is not a readable {what}: {_why(exc)}") from None


def _open(path) -> h5py.File:
    """Open read-only without HDF5 file locking, so a file a running job holds open can be
    inspected (the writer flushes after every frame, so flushed frames are consistent).

    Raises TrajectoryReadError for a missing file, a directory, an empty, truncated or
    non-HDF5 file.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        raise TrajectoryReadError(f"{p!r} is a directory, not a trajectory file")
    if not os.path.exists(p):
        raise TrajectoryReadError(f"{p!r}: no such file")
    if os.path.isfile(p) and os.path.getsize(p) == 0:
        raise TrajectoryReadError(f"{p!r} is an empty file (0 bytes), not a trajectory")
    with _reading(p):
        return open_unlocked(p)


class TrajectoryDamageWarning(OneLineWarning):
    """A trajectory that reads, with a part left out because HDF5 cannot read it (a killed
    writer's damage): one line naming the file, the part and HDF5's reason."""


def _read_observables(f: h5py.File, path, stacklevel: int) -> tuple[dict[str, tuple], list[str]]:
    """Every observable, and the names of those left out: listed in ``/observables`` but HDF5
    cannot open or read them (a killed writer's damage; an OS error stays the file's error),
    each said in a one-line :class:`TrajectoryDamageWarning`."""
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    broken: list[str] = []
    obs = f["observables"] if "observables" in f else {}
    for name in obs:
        try:
            g = obs[name]
            if not isinstance(g, h5py.Group) or not {"step", "time", "value"} <= set(g):
                continue
            n = valid_rows(g)
            out[name] = (g["step"][:n].astype(np.int64),
                         g["time"][:n].astype(np.float64) * to_engine("time", unit_of(g["time"])), g["value"][:n])
        except (KeyError, OSError, RuntimeError) as exc:
            text = " ".join(str(exc).split()).strip("'\"")
            if (isinstance(exc, OSError) and exc.errno) or re.search(r"errno = [1-9]", text):
                raise   # the OS failed to read the file: the file's error, not this group's
            m = re.search(r"\(([^()]*)\)\W*$", text)
            warnings.warn(f"{os.fspath(path)!r}: observable {name!r} cannot be read "
                          f"({m.group(1) if m else text}); it is left out", TrajectoryDamageWarning,
                          stacklevel=stacklevel)
            broken.append(name)
    return out, broken


class _Reader:
    """Holds an open file and the frame table; builds one ``ase.Atoms`` per frame."""

    def __init__(self, path):
        self.path = os.fspath(path)
        retried(self.path, self._load)   # a running job's file: read again (h5md_live.py)

    def _load(self, again: int = 0) -> None:
        if again and getattr(self, "f", None) is not None:
            self.f.close()
        self.f = _open(self.path)
        try:
            with _reading(self.path):
                self._setup()
        except BaseException:
            self.f.close()
            raise

    def _setup(self) -> None:
        if PARTICLES not in self.f:
            what = ("a ShardMD restart checkpoint, not a trajectory"
                    if self.f.attrs.get("kind") == "shardmd-checkpoint"
                    else f"an HDF5 file but not an H5MD trajectory (no {PARTICLES})")
            raise TrajectoryReadError(f"{self.path!r} is {what}")
        problem = layout_problem(self.f, PARTICLES)   # shapes and sizes first: nothing read yet
        if problem:
            raise TrajectoryReadError(f"{self.path!r} is not a readable ShardMD trajectory: {problem}")
        p = self.f[PARTICLES]
        self.numbers = p["species"][()].astype(np.int64)
        self.masses = p["mass"][()].astype(np.float64)
        self.ids = p["id"][()].astype(np.int64) if "id" in p else None
        boundary = [_decode(b) for b in p["box"].attrs["boundary"]]
        self.pbc = np.array([b == "periodic" for b in boundary], dtype=bool)
        self.elements = frame_elements(p)
        edges = p.get("box/edges")
        self.fixed_cell = np.zeros((3, 3))
        if isinstance(edges, h5py.Dataset):  # a fixed box (other writers)
            e = edges[()].astype(np.float64) * to_engine("length", unit_of(edges))
            self.fixed_cell = np.diag(e) if e.ndim == 1 else e
        # value factors to Å, Å/fs, eV/Å from each element's own `unit` (old and new spellings)
        self.factor = {n: element_factor(g, n) for n, g in self.elements.items()}
        extent = frame_extent(self.elements)
        self.steps = {n: self.elements[n]["step"][:c].astype(np.int64) for n, c in extent.items()}
        self.primary = primary_field(self.elements)
        if self.primary is None:
            self.frame_steps = np.zeros(0, np.int64)
            self.frame_times = np.zeros(0)
        else:
            self.frame_steps = self.steps[self.primary]
            g = self.elements[self.primary]
            self.frame_times = g["time"][: len(self.frame_steps)].astype(np.float64) * to_engine(
                "time", unit_of(g["time"]))
        #: observables listed in the file but left out, unreadable (a warning said each)
        self.observables, self.unreadable_observables = _read_observables(self.f, self.path, 5)
        check_settled(self, TrajectoryReadError)   # a running job's file: every field up to the last frame

    def __len__(self) -> int:
        return len(self.frame_steps)

    def _row(self, name: str, step: int, at_or_before: bool = False) -> int | None:
        steps = self.steps.get(name)
        if steps is None or len(steps) == 0:
            return None
        i = int(np.searchsorted(steps, step, side="right")) - 1
        if i < 0 or (not at_or_before and steps[i] != step):
            return None
        return i

    def atoms(self, i: int):
        """The ``i``-th frame as ``ase.Atoms`` (see :func:`read_frames`)."""
        import ase
        import ase.units
        from ase.calculators.singlepoint import SinglePointCalculator

        step = int(self.frame_steps[i])
        arrays: dict[str, np.ndarray] = {}
        for name in FIELDS:
            r = self._row(name, step)
            if r is not None:
                arrays[name] = self._value(name, r)
        r = self._row("box", step, at_or_before=True)
        cell = self._value("box", r) if r is not None else self.fixed_cell
        n = len(self.numbers)
        positions = arrays["position"] if "position" in arrays else np.zeros((n, 3))
        velocities = None
        if "velocity" in arrays:
            velocities = arrays["velocity"] / ase.units.fs  # Å/fs -> ASE
        atoms = ase.Atoms(numbers=self.numbers, positions=positions, cell=cell, pbc=self.pbc,
                          masses=self.masses, velocities=velocities)
        if "image" in arrays:
            atoms.arrays["image"] = arrays["image"].astype(np.int32)
        if self.ids is not None:
            atoms.arrays["id"] = self.ids.copy()
        atoms.info["step"] = step
        atoms.info["time_fs"] = float(self.frame_times[i])
        results: dict = {}
        for name, (osteps, _, ovals) in self.observables.items():
            j = int(np.searchsorted(osteps, step))
            if j < len(osteps) and osteps[j] == step:
                v = ovals[j]
                if name == "stress" and np.shape(v) == (3, 3) and "velocity" in arrays and atoms.cell.rank == 3:
                    # a calculator result, not also in info (extxyz refuses both); an open cluster has no volume
                    results["stress"] = model_stress(atoms, np.asarray(v, dtype=np.float64))
                    continue
                atoms.info[name] = float(v) if np.ndim(v) == 0 else np.array(v)
                if name == "potential_energy":
                    results["energy"] = float(v)
        results.update({k: arrays[f] for k, f in (("forces", "force"), ("energies", "energy")) if f in arrays})
        if results:
            atoms.calc = SinglePointCalculator(atoms, **results)
        return atoms

    def frame(self, i: int):
        """:meth:`atoms` ``i``, the file opened afresh and read again while a running job writes it."""
        def attempt(again: int):
            if again:
                self._load(again)
            with _reading(self.path):
                return self.atoms(i)
        return retried(self.path, attempt)

    def _value(self, name: str, row: int) -> np.ndarray:
        """Row ``row`` of element ``name`` as float64 in the engine's unit (image: as stored)."""
        v = self.elements[name]["value"][row]
        if name == "image":
            return v
        v = v.astype(np.float64)
        f = self.factor[name]
        return v if f == 1.0 else v * f  # unit 1: the stored bits, unchanged

    def close(self) -> None:
        self.f.close()


def _select(n: int, index: int | slice | Sequence[int]) -> list[int]:
    if isinstance(index, slice):
        return list(range(n))[index]
    if isinstance(index, (int, np.integer)):
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"frame index {i} out of range for {n} frames")
        return [i % n]
    return [list(range(n))[int(i)] for i in index]


def read_frames(path, index: int | slice | Sequence[int] = slice(None)) -> list:
    """Read frames of an H5MD trajectory as a list of ``ase.Atoms``.

    ``index``: a slice (default: all frames), an int (a one-element list is returned) or a
    sequence of ints; negative indices count from the end.  Each Atoms carries: ``cell`` (3, 3) Å
    (rows), ``pbc``, ``numbers``, ``masses`` (amu), wrapped ``positions`` (Å), image flags in
    ``atoms.arrays["image"]`` (int32, (n, 3)), global ids in ``atoms.arrays["id"]``, velocities
    in ASE units (``v_A_per_fs / ase.units.fs``), and, when stored at that step, forces (eV/Å),
    per-atom energies (eV, field ``energy``), the ``potential_energy`` observable (eV) and, with
    velocities, the model's stress (eV/Å³; ``get_stress(include_ideal_gas=True)`` is the stored
    ``stress``) as a ``SinglePointCalculator``'s results.  ``atoms.info`` holds ``step`` (int),
    ``time_fs`` (float) and every other observable recorded at the same step under its own name.
    Frames interrupted by a crash are left out (see the module docstring).
    """
    r = _Reader(path)
    try:
        return [r.frame(i) for i in _select(len(r), index)]
    finally:
        r.close()


def iter_frames(path) -> Iterator:
    """Yield every frame as ``ase.Atoms`` (as :func:`read_frames`), reading one at a time."""
    r = _Reader(path)
    try:
        for i in range(len(r)):
            yield r.frame(i)
    finally:
        r.close()


@while_written
def read_observables(path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """All observables: ``{name: (steps (m,) int64, times (m,) float64 fs, values (m, ...))}``.

    Values are in the unit of the group's ``value`` dataset ``unit`` attribute (e.g. eV,
    K, eV/Å^3 for ``pressure`` and the (m, 3, 3) ``stress``).
    """
    with _open(path) as f, _reading(path):
        return _read_observables(f, path, 3)[0]


@while_written
def file_summary(path) -> dict[str, Any]:
    """Facts about a trajectory file, for an ``info`` command.

    Keys: ``n_atoms``, ``n_frames``, ``first_step``/``last_step`` (None without frames),
    ``first_time_fs``/``last_time_fs``, ``fields`` (per-atom fields present, canonical
    order), ``observables`` ({name: number of rows}), ``unreadable_observables`` (names
    listed but left out as unreadable, each also said in a :class:`TrajectoryDamageWarning`),
    ``units`` ({dataset path: unit}),
    ``pbc`` (3 bools), ``dtype`` (of positions or box edges), ``h5md_version``,
    ``author``, ``creator``, ``creator_version``, ``config`` (dict or None).
    """
    r = _Reader(path)
    try:
        with _reading(path):
            return _summary(r)
    finally:
        r.close()


def _summary(r: _Reader) -> dict[str, Any]:
    f = r.f
    steps, times = r.frame_steps, r.frame_times
    units: dict[str, str] = {}

    def visit(g: h5py.Group) -> None:   # as visititems, past objects HDF5 cannot open (left out)
        for name in g:
            try:
                if not isinstance(g.get(name, getlink=True), h5py.HardLink):
                    continue
                obj = g[name]
            except (KeyError, OSError, RuntimeError):
                continue
            if isinstance(obj, h5py.Group):
                visit(obj)
            elif isinstance(obj, h5py.Dataset) and "unit" in obj.attrs:
                units[obj.name.lstrip("/")] = str(_decode(obj.attrs["unit"]))

    visit(f)
    ref = r.elements.get("position", r.elements.get("box"))
    h5 = f["h5md"] if "h5md" in f else None
    return {
        "n_atoms": int(len(r.numbers)),
        "n_frames": int(len(steps)),
        "first_step": int(steps[0]) if len(steps) else None,
        "last_step": int(steps[-1]) if len(steps) else None,
        "first_time_fs": float(times[0]) if len(times) else None,
        "last_time_fs": float(times[-1]) if len(times) else None,
        "fields": [n for n in FIELDS if n in r.elements],
        "observables": {k: int(len(v[0])) for k, v in r.observables.items()},
        "unreadable_observables": list(r.unreadable_observables),
        "units": units,
        "pbc": [bool(b) for b in r.pbc],
        "dtype": str(ref["value"].dtype) if ref is not None else None,
        "h5md_version": [int(v) for v in h5.attrs["version"]] if h5 is not None else None,
        "author": _decode(h5["author"].attrs.get("name")) if h5 is not None and "author" in h5 else None,
        "creator": _decode(h5["creator"].attrs.get("name")) if h5 is not None and "creator" in h5 else None,
        "creator_version": (_decode(h5["creator"].attrs.get("version"))
                            if h5 is not None and "creator" in h5 else None),
        "config": read_config_group(f),
    }
