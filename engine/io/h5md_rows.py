"""The rows a trajectory grows by: :class:`FrameRows`, the part of
:class:`~shardmd.engine.io.h5md.H5MDWriter` that appends frames and observables (after a
free-space check) and cuts them back on restart. Its attributes are the writer's (see its
docstring); every write goes through the writer's ``_io`` guard, so an I/O error poisons the
writer and never commits a partial row."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import h5py
import numpy as np

from shardmd.engine.io.bitround import bitround
from shardmd.engine.io.h5md_layout import (
    ROW_CHUNK,
    _create_element,
    _new_chunk_row,
    _resize,
    field_shape,
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
from shardmd.engine.io.safe_io import (
    free_bytes,
)


class FrameRows:
    """Appending frames and observables to an open trajectory (mixed into H5MDWriter)."""

    #: the values' filter (gzip, lzf) of elements created here; H5MDWriter sets its own
    compression: str | None = None
    #: mantissa bits kept of the per-atom float fields (None: all); see engine/io/bitround.py
    keep_bits: int | None = None

    def _space_needed(self, rows_and_chunking) -> int:
        """Bytes a write of row ``rows[name]`` of each element may allocate in the file."""
        need = self.SPACE_MARGIN
        for row, chunking in rows_and_chunking:
            for chunk_rows, nbytes in chunking:
                if row % chunk_rows == 0:
                    need += nbytes
        return need

    def _check_space(self, need: int, what: str) -> None:
        """Poison and raise before writing anything when the file system is nearly full."""
        if self._fd is None:
            return
        free = free_bytes(self._fd)
        if free is not None and free < need:
            raise self._poison(what, None, fix="free space or choose another output=", reason=(
                f"No space left on device ({free / 1024:.0f} KiB free, the next write may need "
                f"{need / 1024:.0f} KiB)"))

    @staticmethod
    def _append(sets: Mapping[str, h5py.Dataset], row: int, datasets: Sequence[tuple[str, Any]]) -> None:
        """Extend the named datasets of one element to ``row + 1`` rows and write ``row``."""
        for ds, v in datasets:
            d = sets[ds]
            d.resize((row + 1, *d.shape[1:]))
            d[row] = v

    def write_frame(self, step: int, time: float, cell: np.ndarray | Sequence,
                    positions: np.ndarray | None = None, images: np.ndarray | None = None,
                    velocities: np.ndarray | None = None,
                    forces: np.ndarray | None = None, energies: np.ndarray | None = None) -> None:
        """Append one frame and flush the file.

        step: MD step, strictly larger than the last frame's.  time: fs.
        cell: (3, 3) Å, rows are the lattice vectors (triclinic allowed).
        positions: (n, 3) Å, wrapped.  images: (n, 3) integer image flags (stored int32).
        velocities: (n, 3) Å/fs.  forces: (n, 3) eV/Å.  energies: (n,) eV (field "energy").
        Arrays follow the order of ``ids``.  Every field in ``fields`` is required; arrays
        for fields not in ``fields`` are ignored.  Raises OutputError if the frame could
        not be written (it then does not count; earlier frames stay intact).
        """
        f = self._check_open()
        step, time = int(step), float(time)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not after the last frame's step {self._last_step}"
                             " (use truncate_after to rewrite a trajectory's end)")
        cell_a = np.asarray(cell, dtype=np.float64)
        if cell_a.shape != (3, 3):
            raise ValueError(f"cell must have shape (3, 3), got {cell_a.shape}")
        given = {"position": positions, "image": images, "velocity": velocities, "force": forces,
                 "energy": energies}
        arrays = {}
        for name in self.fields:
            a = given[name]
            if a is None:
                raise ValueError(f"write_frame needs `{name}` (it is in fields={self.fields})")
            a = np.asarray(a)
            if a.shape != field_shape(name, self.n_atoms):
                raise ValueError(f"{name} must have shape {field_shape(name, self.n_atoms)}, got {a.shape}")
            if name == "image":
                if a.dtype.kind not in "iu" and not np.array_equal(a, np.rint(a)):
                    raise ValueError("images must be integers")
                a = a.astype(np.int32)
            else:
                if self._scale[name] != 1.0:
                    a = a.astype(np.float64) * self._scale[name]
                if self.keep_bits is not None:
                    a = bitround(a.astype(self._sets[name]["value"].dtype), self.keep_bits)
            arrays[name] = a
        what = f"frame at step {step}"
        self._check_space(self._space_needed((self._rows[n], self._chunking[n]) for n in (*arrays, "box")),
                          what)
        with self._io(what):
            # phase 1: everything of the frame except the box step (the commit record)
            for name, a in arrays.items():
                self._append(self._sets[name], self._rows[name],
                             (("value", a), ("time", time), ("step", step)))
            box, row = self._sets["box"], self._rows["box"]
            cell_s = cell_a if self._scale.get("box", 1.0) == 1.0 else cell_a * self._scale["box"]
            self._append(box, row, (("value", cell_s.astype(self.dtype)), ("time", time)))
            f.flush()
            # phase 2: commit (reached only when every write and the flush above succeeded)
            self._append(box, row, (("step", step),))
            f.flush()
        for name in (*arrays, "box"):
            self._rows[name] += 1
        self._last_step = step

    def write_observables(self, step: int, time: float, values: Mapping[str, Any],
                          units: Mapping[str, str] | None = None) -> None:
        """Append one row to each named observable and flush.

        values: {name: float or array}, e.g. potential_energy/kinetic_energy/total_energy
        (eV), temperature (K), pressure (eV/Å^3), stress ((3, 3) eV/Å^3).  Each name gets
        its own group ``/observables/<name>/{step, time, value}`` (float64), created on first
        use with the value's shape, which later rows must keep.  time: fs.  units: unit
        strings for names the writer does not know (known: the registered observables' and
        ``OBSERVABLE_UNITS``).
        The step must be larger than that observable's last step.  Raises OutputError as
        :meth:`write_frame` does.
        """
        f = self._check_open()
        if not self.observables_enabled:
            raise ValueError("this writer was created with observables=False")
        step = int(step)
        items = []
        for name, v in values.items():
            a = np.asarray(v, dtype=np.float64)
            sets = self._obs_sets.get(name)
            if sets is not None:
                if a.shape != sets["value"].shape[1:]:
                    raise ValueError(f"observable {name!r} has shape {sets['value'].shape[1:]}, "
                                     f"got {a.shape}")
                n = self._obs_rows[name]
                if n:
                    last = int(sets["step"][n - 1])
                    if step <= last:
                        raise ValueError(f"step {step} is not after observable {name!r}'s last "
                                         f"step {last}")
            items.append((name, a))
        what = f"observables at step {step}"
        self._check_space(self._space_needed(
            (self._obs_rows[name], self._obs_chunking[name]) if name in self._obs_sets
            else (0, [(ROW_CHUNK, ROW_CHUNK * 8 * (2 + a.size))]) for name, a in items), what)
        with self._io(what):
            rows = []
            for name, a in items:
                if name not in self._obs:
                    unit = (units or {}).get(name) or observable_unit(name)
                    g = _create_element(f.require_group("observables"), name, a.shape, np.float64, unit,
                                        (ROW_CHUNK, *a.shape), self.compression)
                    self._obs[name] = g
                    self._obs_sets[name] = {ds: g[ds] for ds in ("step", "time", "value")}
                    self._obs_chunking[name] = [_new_chunk_row(d) for d in self._obs_sets[name].values()]
                    self._obs_rows[name] = 0
                rows.append((self._obs_sets[name], self._obs_rows[name], a))
            for sets, row, a in rows:  # phase 1: values and times
                self._append(sets, row, (("value", a), ("time", float(time))))
            f.flush()
            for sets, row, _ in rows:  # phase 2: steps, which make the rows count
                self._append(sets, row, (("step", step),))
            f.flush()
        for name, _ in items:
            self._obs_rows[name] += 1

    def truncate_after(self, step: int) -> None:
        """Drop every frame and observable row with step > ``step`` (restart from ``step``).

        Datasets are shrunk (HDF5 does not return the space to the file system).
        """
        f = self._check_open()
        step = int(step)
        groups = dict(self._elements)
        groups.update({f"observables/{k}": g for k, g in self._obs.items()})
        with self._io(f"truncate after step {step}"):
            for key, g in groups.items():
                n = valid_rows(g)
                keep = int(np.searchsorted(g["step"][:n], step, side="right"))
                _resize(g, keep)
                if key in self._rows:
                    self._rows[key] = keep
                else:
                    self._obs_rows[key.split("/", 1)[1]] = keep
            self._last_step = self._box_last_step()
            f.flush()
