"""HDF5 trajectories in the H5MD 1.1 layout: :class:`H5MDWriter` (the reader lives in
:mod:`shardmd.engine.io.h5md_read` and is re-exported here).

Units: length Å, time fs, velocity Å/fs, energy eV, temperature K, pressure and stress
eV/Å^3, mass amu, as the engine computes them; forces are given in eV/Å and stored in
kJ/(mol Å), the force unit MDAnalysis reads (:mod:`shardmd.engine.io.h5md_units`).  Every
value/time dataset carries a ``unit`` attribute, and ``/h5md/modules/units`` names the system.

The file's layout (groups, datasets, chunks, fill values) is described in
:mod:`shardmd.engine.io.h5md_layout`, which builds it.

Crash safety and write errors, in short (the findings behind them, HDF5 2.0 / h5py 3.16,
are in docs/design.md, "Trajectories: crash safety and write errors"):

* ``write_frame`` writes the frame's rows and flushes (phase 1), then writes the box
  ``edges`` step, the frame's commit record, and flushes again (phase 2); readers count a
  frame only up to the last committed box step (:func:`shardmd.engine.io.h5md_read.frame_extent`),
  and rows of an interrupted frame read as fill values (step -1, time NaN) at which they stop.
  ``write_observables`` does the same per observable. ``mode="a"`` shrinks every element to
  its committed rows first. Files use HDF5's default (earliest) format: no SWMR.
* ``mode="a"`` never opens for writing a file whose bytes reach past the end-of-allocation
  address in its superblock (what a kill inside a flush, or a failed write, leaves: HDF5
  would allocate over those bytes, which may be live metadata), nor gives up on one whose
  ``"r+"`` reopen fails while it still opens read-only: it rebuilds the file from its
  read-only view (every frame and observable row that counts) and appends to that, with a
  one-line :class:`TrajectoryRebuilt` warning (:mod:`shardmd.engine.io.h5md_salvage`).  A file
  damaged past reading (a kill in its first frame) goes to ``<name>.damaged-<n>``, and
  ``mode="a"`` starts a new one, said the same way.
* The file has no raw-data chunk cache and the writer holds its dataset handles, so every
  write fails inside the call that makes it. Any HDF5/OS error raises a one-line
  :class:`~shardmd.engine.errors.OutputError` (exit status 4) and poisons the writer: HDF5's
  file descriptor is replaced by a read-only one, so no commit record or metadata of the
  failed frame reaches the file; later calls raise the same error, ``close()`` is quiet.
* A free-space check (``fstatvfs``) before each frame stops before a write that would not
  fit; ``close()`` fsyncs once per run (no fsync per frame).
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from typing import Any, Iterable, Mapping, Sequence

import h5py
import numpy as np

from shardmd.engine.errors import OneLineWarning, OutputError, UserError
from shardmd.engine.io.h5md_layout import (
    ROW_CHUNK,
    _atom_chunks,
    _create_element,
    _new_chunk_row,
    _resize,
    _write_config,
    field_shape,
    libver,
)
from shardmd.engine.io.h5md_read import (  # noqa: F401  (re-exported reader API)
    FIELD_ALIASES,
    FIELD_UNITS,
    FIELDS,
    LENGTH_UNIT,
    MASS_UNIT,
    PARTICLES,
    STEP_FILL,
    TIME_UNIT,
    file_summary,
    frame_elements,
    frame_extent,
    iter_frames,
    observable_unit,
    primary_field,
    read_frames,
    read_observables,
    valid_rows,
)
from shardmd.engine.io.h5md_rows import FrameRows
from shardmd.engine.io.h5md_salvage import empty_line, is_hdf5, salvage, tail_past_eoa
from shardmd.engine.io.h5md_units import element_factor, write_units_module
from shardmd.engine.io.safe_io import (
    IO_ERRORS,
    check_output_path,
    fence_fd,
    os_reason,
    output_error,
)

__all__ = ["H5MDWriter", "TrajectoryRebuilt", "read_frames", "iter_frames", "read_observables",
           "file_summary"]


class TrajectoryRebuilt(OneLineWarning):
    """``H5MDWriter(mode="a")`` rebuilt a file a killed writer had left unsafe to append to
    (one line: why, and how many frames were kept; see :mod:`shardmd.engine.io.h5md_salvage`)."""


class H5MDWriter(FrameRows):
    """Append-only H5MD 1.1 trajectory writer (see the module docstring for the layout).

    Parameters
    ----------
    path: file to write.
    species: (n,) int atomic numbers.
    masses: (n,) float masses in amu.
    ids: (n,) int64 unique global atom ids, in the order every frame's arrays use.
    pbc: 3 bools (or one bool for all axes): periodic along each cell vector.
    dtype: float dtype ("float32" or "float64") of positions, velocities, forces, box edges;
    compression: gzip, lzf or None for those values, the step and time columns and the static
        arrays (a file appended to keeps its own); a compressed file is in HDF5 1.10's format.
    config: nested dict of the run configuration as stored (engine/run/record.py: interpolations
        as written), stored under ``/parameters``
        (JSON in ``config_json`` plus nested groups/attributes).  With ``mode="a"`` a given
        config replaces the stored one; None keeps it.
    fields: per-atom fields written every frame, a subset of
        ("position", "image", "velocity", "force", "energy"); "energies" is accepted for "energy"
        (per-atom potential energies, (n,) per frame, eV).
    observables: allow :meth:`write_observables` (creates the ``/observables`` group).
    author, creator, creator_version: stored in ``/h5md``.
    mode: "w" creates (truncating); "a" reopens an existing file to append (restarts) and
        creates it if missing.  On reopen, species/ids must match the file, trailing rows of
        an interrupted frame are dropped, and fields missing from the file are added
        (their groups start at the next frame).  A restart from a checkpoint at step S
        should then call ``truncate_after(S)``, which also drops observable rows written
        after S (they may lie beyond the last frame).  A file a killed writer left unsafe to
        reopen for writing is first rebuilt from its read-only view, one damaged past
        reading is moved to ``<path>.damaged-<n>`` and a new file started, an empty one
        started anew (``rebuilt`` then holds the one-line report, also given as a
        :class:`TrajectoryRebuilt` warning).

    Errors.  A path that is a directory, or whose directory does not exist, or (``mode="a"``)
    a file that is not HDF5 or an intact HDF5 file of another layout:
    :class:`~shardmd.engine.errors.UserError`.  ``mode="a"`` on a file the OS does not let
    us read, or whose rebuild or move cannot be written (the file is then unchanged): OutputError.
    Any OS/HDF5 failure while creating, writing, truncating, flushing or closing:
    :class:`~shardmd.engine.errors.OutputError` (exit status 4), one line with the path,
    the OS reason and the last intact step.  The first such failure poisons the writer
    (see "Write errors" in the module docstring): nothing more reaches the file, later
    calls raise the same error, and :meth:`close` closes without raising.
    """

    #: refuse a frame (before writing any of it) when the file system has less free space
    #: than it needs: the chunks it starts (a row inside an existing chunk needs no new
    #: space) plus this margin for HDF5 metadata (chunk index nodes, object headers)
    SPACE_MARGIN = 64 * 1024

    def __init__(self, path: str | os.PathLike, *, species: Sequence[int] | np.ndarray,
                 masses: Sequence[float] | np.ndarray, ids: Sequence[int] | np.ndarray,
                 pbc: bool | Sequence[bool], dtype: str | np.dtype = "float64",
                 config: Mapping | None = None,
                 fields: Iterable[str] = ("position", "image", "velocity", "force"),
                 observables: bool = True, author: str = "ShardMD user",
                 creator: str = "ShardMD", creator_version: str = "0.1.0",
                 mode: str = "w", compression: str | None = None) -> None:
        self.path = os.fspath(path)
        self._f: h5py.File | None = None
        self._failed: OutputError | None = None
        self.species = np.asarray(species, dtype=np.int32).reshape(-1)
        self.n_atoms = int(self.species.shape[0])
        self.masses = np.asarray(masses, dtype=np.float64).reshape(-1)
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.masses.shape != (self.n_atoms,) or self.ids.shape != (self.n_atoms,):
            raise ValueError(f"species, masses, ids must all have shape ({self.n_atoms},); got "
                             f"{self.masses.shape} and {self.ids.shape}")
        if len(np.unique(self.ids)) != self.n_atoms:
            raise ValueError("ids must be unique")
        self.pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)).copy()
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, not {self.dtype}")
        if compression not in (None, "none", "gzip", "lzf"):
            raise ValueError(f"compression must be gzip, lzf or none, not {compression!r}")
        self.compression = None if compression in (None, "none") else compression
        self.fields = tuple(FIELD_ALIASES.get(f, f) for f in fields)
        unknown = set(self.fields) - set(FIELDS)
        if unknown or len(set(self.fields)) != len(self.fields):
            raise ValueError(f"fields must be distinct names among {FIELDS}; got {self.fields}")
        self.observables_enabled = bool(observables)
        if mode not in ("w", "a"):
            raise ValueError(f"mode must be 'w' or 'a', not {mode!r}")
        check_output_path(self.path, "trajectory output")
        #: the one-line report when ``mode="a"`` had to rebuild the file or start anew (else None)
        self.rebuilt: str | None = None
        if mode == "a" and (not os.path.exists(self.path) or os.path.getsize(self.path) == 0):
            if os.path.exists(self.path):   # a kill as the file was created (h5md_salvage)
                self.rebuilt = empty_line(self.path)
            mode = "w"
        if mode == "a" and not is_hdf5(self.path):
            raise UserError(f"trajectory {self.path!r} exists but is not an HDF5 file (truncated or "
                            "another format); move it away or choose another output=")
        self._last_step: int | None = None
        self._fd: int | None = None
        self._open_failed: str | None = None
        if mode == "a":
            tail = tail_past_eoa(self.path)
            if tail is not None:  # a killed writer's bytes past the EOA: "r+" would allocate over them
                mode = self._salvage(f"{tail[0] - tail[1]} bytes past HDF5's end of allocation, left by a "
                                     "writer killed or failed mid-write, which an append would overwrite", None)
            else:
                try:
                    self.mode = mode
                    self._open(mode, config, author, creator, creator_version)
                    return
                except OutputError as exc:
                    if self._open_failed is None:
                        raise
                    self._failed, self._fd = None, None
                    mode = self._salvage(f"reopening it for append failed: {self._open_failed}", exc)
        self.mode = mode
        self._open(mode, config, author, creator, creator_version)
        if self.rebuilt:
            warnings.warn(self.rebuilt, TrajectoryRebuilt, stacklevel=2)

    def _open(self, mode: str, config, author, creator, creator_version) -> None:
        """Open (mode "w": create; "a": "r+") and set up the file; one-line errors.  When an
        "r+" open or its setup fails on an HDF5/OS error, ``_open_failed`` says why."""
        self._open_failed = None
        try:
            # rdcc_nbytes=0: no raw-data chunk cache, so every chunk write happens (and fails)
            # inside the call that makes it, never later in a dataset close whose error h5py
            # can only print ("Exception ignored in ObjectID.__dealloc__"); libver: h5md_layout.py
            self._f = h5py.File(self.path, "w" if mode == "w" else "r+", rdcc_nbytes=0, libver=libver(self.compression))
        except IO_ERRORS as exc:
            if "unable to lock file" in str(exc).lower():   # HDF5's lock: another process has it open
                raise self._busy() from None
            if mode == "a":
                self._open_failed = os_reason(exc)
            raise output_error("create trajectory" if mode == "w" else "reopen trajectory",
                               self.path, exc) from None
        self._fd = self._vfd_handle()
        try:
            with self._io("create" if mode == "w" else "reopen"):
                if mode == "w":
                    self._create(config, author, creator, creator_version)
                else:
                    try:
                        self._reopen(config)
                        self._f.flush()  # the reopen's first metadata flush
                    except TypeError as exc:  # metadata read back as garbage (a null dataspace)
                        self._open_failed = f"damaged metadata ({' '.join(str(exc).split())})"
                        raise self._poison("reopen", None, reason=self._open_failed,
                                           fix="move it away or choose another output=") from None
                    except IO_ERRORS as exc:
                        self._open_failed = os_reason(exc)
                        raise
                if mode == "w":
                    self._f.flush()
        except KeyError as exc:  # mode "a": our groups absent or unreadable (the salvage tells which)
            self._abandon()
            if mode != "a":
                raise
            self._open_failed = f"an object cannot be opened ({' '.join(str(exc).split())})"
            raise output_error("reopen trajectory", self.path, exc, reason=self._open_failed) from None
        except BaseException:
            self._abandon()
            raise

    def _busy(self) -> UserError:
        return UserError(f"output {self.path!r} is open in another running process (HDF5 file lock); "
                         "wait for that run to end or stop it, or choose another output=")

    def _salvage(self, why: str, first: OutputError | None) -> str:
        """Rebuild the file from its read-only view (:mod:`shardmd.engine.io.h5md_salvage`), or
        move it aside when it is damaged past reading, and report it in one line (``rebuilt``
        and a :class:`TrajectoryRebuilt` warning); return the mode to open with ("a", or "w").

        Errors, one line each, the file unchanged: another process holds it (UserError); an
        HDF5 file of another layout (UserError); it cannot be read for an OS reason (``first``,
        the reopen's own error, or one naming the read failure); the new file cannot be
        written or the damaged one moved (OutputError naming the OS reason).
        """
        mode, self.rebuilt = salvage(self.path, why, first, self._busy)
        return mode

    def _vfd_handle(self) -> int | None:
        try:
            fd = self._f.id.get_vfd_handle()
        except Exception:  # noqa: BLE001 - other drivers
            return None
        return fd if isinstance(fd, int) and fd >= 0 else None

    # ------------------------------------------------------------------ errors
    @contextmanager
    def _io(self, what: str):
        """Run HDF5 calls; an OS/HDF5 failure poisons the writer and raises OutputError."""
        if self._failed is not None:
            raise self._failed
        try:
            yield
        except IO_ERRORS as exc:
            raise self._poison(what, exc) from None

    def _poison(self, what: str, exc: BaseException | None, reason: str | None = None,
                fix: str | None = None, fence: bool = True) -> OutputError:
        """Record the first failure, fence the file descriptor, return the error to raise."""
        if self._failed is None:
            last = self._last_step
            intact = (f"frames up to step {last} are intact" if last is not None
                      else "no frame had been written")
            self._failed = output_error(f"write trajectory ({what})", self.path, exc, reason=reason,
                                        fix=fix, tail=intact)
            # nothing more may reach the file: no commit record, no metadata of the failed
            # frame at close.  Writes through HDF5's descriptor now fail with EBADF.
            if fence and self._fd is not None and self._f is not None:
                fence_fd(self._fd, self.path)
        return self._failed

    def _abandon(self) -> None:
        """Close the file, swallowing HDF5's errors (after a failure: the flush at close
        fails on the fenced descriptor, as intended)."""
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing after an error: the first error is the one reported
                pass

    @property
    def failed(self) -> OutputError | None:
        """The OutputError that poisoned this writer, None while it is healthy."""
        return self._failed

    # ------------------------------------------------------------------ setup
    def _create(self, config, author, creator, creator_version) -> None:
        f = self._f
        h5 = f.create_group("h5md")
        h5.attrs["version"] = np.array([1, 1], dtype=np.int32)
        h5.create_group("author").attrs["name"] = author
        c = h5.create_group("creator")
        c.attrs["name"] = creator
        c.attrs["version"] = creator_version
        write_units_module(h5)
        p = f.create_group(PARTICLES)
        static = {"compression": self.compression} if self.compression and self.n_atoms else {}
        p.create_dataset("species", data=self.species, **static)
        p.create_dataset("mass", data=self.masses, **static).attrs["unit"] = MASS_UNIT
        p.create_dataset("id", data=self.ids, **static)
        box = p.create_group("box")
        box.attrs["dimension"] = np.int32(3)
        box.attrs["boundary"] = np.array(["periodic" if b else "none" for b in self.pbc],
                                         dtype=h5py.string_dtype())
        _create_element(box, "edges", (3, 3), self.dtype, LENGTH_UNIT, (ROW_CHUNK, 3, 3), self.compression)
        for name in self.fields:
            self._create_field(name)
        if self.observables_enabled:
            f.create_group("observables")
        if config is not None:
            _write_config(f, config)
        self._load_state()

    def _create_field(self, name: str) -> None:
        dt = np.dtype(np.int32) if name == "image" else self.dtype
        shape = field_shape(name, self.n_atoms)
        _create_element(self._f[PARTICLES], name, shape, dt, FIELD_UNITS[name],
                        _atom_chunks(self.n_atoms, dt.itemsize, width=3 if len(shape) == 2 else 1), self.compression)

    def _reopen(self, config) -> None:
        f = self._f
        p = f[PARTICLES]
        if p["species"].shape != (self.n_atoms,):
            raise ValueError(f"{self.path} holds {p['species'].shape[0]} atoms, not {self.n_atoms}")
        if not np.array_equal(p["species"][()], self.species) or (
                "id" in p and not np.array_equal(p["id"][()], self.ids)):
            raise ValueError(f"species or ids differ from those stored in {self.path}")
        if "edges" in p["box"]:
            self.dtype = p["box/edges/value"].dtype  # keep the file's precision
        # drop rows of an interrupted frame / observable call
        elements = frame_elements(p)
        for name, rows in frame_extent(elements).items():
            _resize(elements[name], rows)
        if "observables" in f:
            obs = f["observables"]
            for name in obs:
                try:
                    g = obs[name]
                except KeyError as exc:  # listed but its header unreadable (a killed writer's)
                    raise OSError(f"observable {name!r} cannot be opened: "
                                  f"{' '.join(str(exc).split())}") from None
                _resize(g, valid_rows(g))
        for name in self.fields:
            if name not in p:
                self._create_field(name)
        if self.observables_enabled:
            f.require_group("observables")
        if config is not None:
            _write_config(f, config)
        self._load_state()

    def _load_state(self) -> None:
        p = self._f[PARTICLES]
        self._elements = frame_elements(p)
        # dataset handles stay open for the writer's life: no reopen per frame, and no
        # close of a dataset (which could write) outside a call that checks for errors
        self._sets = {n: {ds: g[ds] for ds in ("step", "time", "value")}
                      for n, g in self._elements.items()}
        self._rows = {n: valid_rows(g) for n, g in self._elements.items()}
        # engine unit -> the unit each element is stored in (a restart appends to an old file in
        # its own units: eV/Å forces there, kJ/(mol Å) in new files)
        self._scale = {n: 1.0 / element_factor(g, n) for n, g in self._elements.items()}
        self._last_step = self._box_last_step()
        self._obs: dict[str, h5py.Group] = {}
        self._obs_sets: dict[str, dict[str, h5py.Dataset]] = {}
        self._obs_rows: dict[str, int] = {}
        self._obs_chunking: dict[str, list[tuple[int, int]]] = {}
        if "observables" in self._f:
            for name, g in self._f["observables"].items():
                self._obs[name] = g
                self._obs_sets[name] = {ds: g[ds] for ds in ("step", "time", "value")}
                self._obs_chunking[name] = [_new_chunk_row(d) for d in self._obs_sets[name].values()]
                self._obs_rows[name] = valid_rows(g)
        # (chunk rows, bytes of the chunks one new chunk row allocates) of each element
        self._chunking = {n: [_new_chunk_row(d) for d in sets.values()] for n, sets in self._sets.items()}

    def _box_last_step(self) -> int | None:
        n = self._rows["box"]
        return int(self._sets["box"]["step"][n - 1]) if n else None

    # ------------------------------------------------------------------ writing
    @property
    def n_frames(self) -> int:
        """Number of frames in the file (rows of the first field, or of box/edges); after a
        write failure, the frames that are intact."""
        if self._failed is None:
            self._check_open()
        name = primary_field(self._elements)
        return self._rows[name] if name else 0

    @property
    def last_step(self) -> int | None:
        """Step of the last frame in the file, None when it has none."""
        return self._last_step

    def _check_open(self) -> h5py.File:
        if self._failed is not None:
            raise self._failed
        if self._f is None:
            raise ValueError(f"H5MDWriter for {self.path} is closed")
        return self._f

    def flush(self) -> None:
        """Flush HDF5 buffers to the OS (done after every frame anyway)."""
        f = self._check_open()
        with self._io("flush"):
            f.flush()

    def sync(self) -> None:
        """Flush, then fsync the file: frames so far survive an OS crash or power loss.

        About one disk sync (milliseconds); not done per frame.
        """
        f = self._check_open()
        with self._io("sync"):
            f.flush()
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        """Flush, fsync and close the file; further calls do nothing.

        Raises OutputError if that fails (the file is closed all the same).  After an
        earlier failure it only closes, swallowing HDF5's errors: the failure was already
        raised by the call that met it.
        """
        if self._f is None:
            return
        if self._failed is not None:
            self._abandon()
            return
        try:
            with self._io("close"):
                self._f.flush()
                if self._fd is not None:  # also reports write errors the OS deferred (NFS)
                    os.fsync(self._fd)
        except OutputError:
            self._abandon()
            raise
        f, self._f = self._f, None
        try:
            f.close()
        except IO_ERRORS as exc:
            raise self._poison("close", exc, fence=False) from None

    def __enter__(self) -> "H5MDWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None and self._failed is None:
            try:
                self.close()
            except OutputError:  # the exception already on its way wins
                pass
        else:
            self.close()

    def __repr__(self) -> str:
        if self._failed is not None:
            state = "failed"
        else:
            state = "closed" if self._f is None else f"{self.n_frames} frames"
        return f"H5MDWriter({self.path!r}, n_atoms={self.n_atoms}, {state})"
