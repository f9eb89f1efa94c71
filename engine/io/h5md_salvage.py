"""Rebuilding a trajectory that a killed writer left unsafe to append to, or setting aside
one it left unreadable (used by :class:`shardmd.engine.io.h5md.H5MDWriter` with ``mode="a"``).

When.  ``H5MDWriter(mode="a")`` never opens a file whose bytes reach past the
end-of-allocation address (EOA) stored in its superblock for writing (what a kill inside a
flush leaves: HDF5 would allocate over those bytes, which may be live metadata), nor gives
up on a file whose ``"r+"`` reopen fails while it still opens read-only: :func:`rebuild`
copies what the read-only view holds into a fresh file, and the writer appends to that.
Why, and how the states were found: docs/design.md, "Appending after a kill".

What is kept.  Every frame and observable row that counts for the reader and the writer's
own reopen (``frame_extent`` / ``valid_rows`` of :mod:`shardmd.engine.io.h5md_read`: the rows of
an interrupted frame are dropped, exactly as an append would drop them), every other group,
dataset and attribute (``/h5md``, ``/parameters``, species, masses, ids, units) as stored,
datasets with their dtype, chunk shape, fill value and attributes.  Values are copied bit
for bit.

The original file.  The rebuilt file is written to a new file created exclusively
(``mkstemp``) in the trajectory's directory, fsynced, checked (it is reopened and must hold
the rows written), given the original's permission bits, then renamed over the original
and the directory fsynced; a failure before the rename removes the new file and leaves the
original untouched.  When every row that counts was copied, the original holds nothing
more that any reader would count (only the interrupted frame's bytes), so it is replaced.
When something that counts could not be read (an element or observable whose data the
kill left unreadable: the frames from that point, or that observable's rows, are not in
the rebuilt file), the original is kept under ``<name>.damaged-<n>`` (a hard link, so no
copy and no time; it costs the original's disk space until it is deleted), following the
project's rule that nothing written before an error is lost.  Keeping it every time was
rejected: a kill while a frame is being written is the common case (about half of the
moments of a tight write loop leave ``EOF > EOA``), and each kept copy would cost a whole
trajectory of disk space for bytes that hold no complete frame.

Damaged past reading.  A kill while the writer creates the file or writes its first frame
(or first observable row) can leave a file that does not open read-only, or whose
``/particles/all`` or first rows HDF5 cannot read: 38 of the 96 kill moments of a
2-frame write, never one after the first frame's commit (tests/test_h5md_early_kill.py).
No frame of such a file counts, so :func:`rebuild` moves it to ``<name>.damaged-<n>``
(:func:`set_aside`: never deleted, never an existing name overwritten) and the writer
starts a new trajectory in its place; a file of 0 bytes (what a kill between the create
and HDF5's first write leaves) holds nothing and is started anew in place.  Which files
count as "ours, damaged" (:func:`damaged`): the first 8 bytes are the HDF5 signature (our
writer never writes a user block) and HDF5 failed to decode it (an error of the OS, such as
a permission or I/O error, says nothing about the bytes and keeps its one-line error).
Markers in the content (the creator name, our group names) were weighed and rejected: the
first writes of a new file (the superblock, then the species, mass and id arrays) carry
none of them, which are exactly the states to recover.  What keeps other files safe:
``mode="a"`` is a restart onto the run's own output=; a file that is not HDF5 (text, a
PDB that output= was pointed at) is refused as before, and so is an intact HDF5 file of
another layout (:class:`NotATrajectory`: ``/particles/all``, species, mass or box cleanly
absent, not unreadable); a damaged HDF5 file that was not ours after all loses nothing,
it is only renamed, and the run's log names the new name.
"""
from __future__ import annotations

import errno
import os
import re
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import h5py
import numpy as np

from shardmd.engine.errors import OutputError, UserError
from shardmd.engine.io.h5md_read import (
    PARTICLES,
    frame_elements,
    frame_extent,
    open_unlocked,
    valid_rows,
)
from shardmd.engine.io.h5md_setaside import (  # noqa: F401 - the set-aside names, here for the writer and tests
    FileBusy,
    Fresh,
    NotATrajectory,
    SetAsideError,
    Unreadable,
    _lock,
    _unique_damaged,
    damaged,
    empty_line,
    is_hdf5,
    set_aside,
)
from shardmd.engine.io.safe_io import IO_ERRORS, error_errno, fsync_dir, os_reason, output_error

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: what reading a damaged file may raise (h5py: OSError/RuntimeError; garbage metadata:
#: TypeError/ValueError/KeyError/IndexError)
READ_ERRORS = (*IO_ERRORS, TypeError, ValueError, KeyError, IndexError)
#: rows copied per read/write (bounded by bytes, see _copy_rows)
_BLOCK_BYTES = 64 * 1024 * 1024


def stored_eoa(path: str | os.PathLike) -> int | None:
    """Absolute end-of-allocation address in the superblock of the HDF5 file at ``path``
    (superblock at offset 0, versions 0-3), None when it cannot be parsed."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return None
    if len(head) < 48 or head[:8] != _SIGNATURE:
        return None
    version = head[8]
    if version in (0, 1):  # base, free-space info, EOF, driver info (v1: 4 more bytes first)
        size_of_offsets, at = head[13], (24 if version == 0 else 28)
    elif version in (2, 3):  # base, superblock extension, EOF, root object header
        size_of_offsets, at = head[9], 12
    else:
        return None
    if size_of_offsets != 8:
        return None
    base, _, eoa = struct.unpack_from("<QQQ", head, at)
    return base + eoa


def tail_past_eoa(path: str | os.PathLike) -> tuple[int, int] | None:
    """(file size, stored EOA) when the file extends past its superblock's EOA, else None."""
    eoa = stored_eoa(path)
    if eoa is None:
        return None
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    return (size, eoa) if size > eoa else None


@dataclass
class Salvage:
    """What :func:`rebuild` did."""

    frames: int                      # frames in the rebuilt file
    frames_before: int               # frames the read-only view of the original counted
    observable_rows: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)   # what counted but could not be read
    kept_original: str | None = None  # path of the original's bytes, when kept

    def line(self, path: str, why: str) -> str:
        """The one-line report."""
        of = f" of {self.frames_before}" if self.frames_before != self.frames else ""
        msg = (f"trajectory {path!r} was rebuilt before appending ({why}): kept {self.frames}{of} "
               f"complete frame{'s' if self.frames_before != 1 else ''}")
        if self.observable_rows:
            msg += f" and {sum(self.observable_rows.values())} observable rows"
        if self.lost:
            msg += f"; could not read {', '.join(self.lost)}"
        if self.kept_original:
            msg += f"; the original's bytes are kept in {self.kept_original!r}"
        else:
            msg += "; the bytes dropped held no complete frame"
        return msg


def _like(dst_parent: h5py.Group, name: str, src: h5py.Dataset, rows: int | None) -> h5py.Dataset:
    """An empty copy of dataset ``src`` (dtype, chunks, maxshape, fill value), with
    ``rows`` rows along axis 0 when given (resizable datasets), else src's shape."""
    shape = src.shape if rows is None else (rows, *src.shape[1:])
    kw = {}
    if src.chunks is not None:
        kw["chunks"] = src.chunks
        kw["maxshape"] = src.maxshape
    if src.dtype.kind in "biuf":
        kw["fillvalue"] = src.fillvalue
    return dst_parent.create_dataset(name, shape=shape, dtype=src.dtype, **kw)


def _copy_attrs(src, dst) -> None:
    for k, v in src.attrs.items():
        dst.attrs.create(k, v, dtype=src.attrs.get_id(k).dtype)


def _copy_rows(src: h5py.Dataset, dst: h5py.Dataset, rows: int) -> int:
    """Copy rows [0, rows) of ``src`` into ``dst`` in blocks of whole chunks; return how many
    leading rows were copied (fewer than ``rows`` when one could not be read)."""
    per_row = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * src.dtype.itemsize)
    block = max(1, _BLOCK_BYTES // per_row)
    if src.chunks:
        block = max(src.chunks[0], block - block % src.chunks[0])
    done = 0
    while done < rows:
        stop = min(rows, done + block)
        try:
            data = src[done:stop]
        except READ_ERRORS:  # find the first row that cannot be read
            for r in range(done, stop):
                try:
                    v = src[r]
                except READ_ERRORS:
                    return r
                dst[r] = v
            data = None
        if data is not None:
            dst[done:stop] = data
        done = stop
    return done


def _copy_static(src: h5py.Group, dst: h5py.Group, skip: set[str], lost: list[str]) -> None:
    """Copy groups, datasets and attributes below ``src`` except the paths in ``skip``; an
    object that cannot be read is left out and its path added to ``lost``."""
    _copy_attrs(src, dst)
    for name in src:
        path = f"{src.name.rstrip('/')}/{name}"
        if path in skip:
            continue
        try:
            link = src.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink):
                dst[name] = h5py.SoftLink(link.path)
                continue
            if isinstance(link, h5py.ExternalLink):
                dst[name] = h5py.ExternalLink(link.filename, link.path)
                continue
            child = src[name]
            if isinstance(child, h5py.Group):
                _copy_static(child, dst.create_group(name), skip, lost)
                continue
            if not isinstance(child, h5py.Dataset):
                continue
            if child.shape is None:  # a null dataspace (attributes only)
                d = dst.create_dataset(name, data=h5py.Empty(child.dtype))
            else:
                d = _like(dst, name, child, None)
                if child.size:
                    d[()] = child[()]
            _copy_attrs(child, d)
        except READ_ERRORS as exc:
            if error_errno(exc) is not None:  # an OS error: of the new file
                raise
            if name in dst:
                del dst[name]
            lost.append(path)


def _copy_element(src: h5py.Group, dst_parent: h5py.Group, name: str, rows: int) -> tuple[h5py.Group, int]:
    g = dst_parent.create_group(name)
    _copy_attrs(src, g)
    copied = rows
    for ds in ("step", "time", "value"):
        d = _like(g, ds, src[ds], rows)
        _copy_attrs(src[ds], d)
        copied = min(copied, _copy_rows(src[ds], d, rows))
    return g, copied


def _shrink(g: h5py.Group, rows: int) -> None:
    for ds in ("step", "time", "value"):
        d = g[ds]
        d.resize((rows, *d.shape[1:]))


def _build(src: h5py.File, dst: h5py.File) -> Salvage:
    """Copy the counted contents of ``src`` into the empty file ``dst``."""
    p = src[PARTICLES]
    elements = frame_elements(p)
    extent = frame_extent(elements)
    lost: list[str] = []
    obs_names = list(src["observables"]) if "observables" in src else []
    skip = {g.name for g in elements.values()} | {f"/observables/{n}" for n in obs_names}
    _copy_static(src, dst, skip, lost)
    missing = [f"{PARTICLES}/{n}" for n in ("species", "mass", "box") if n not in dst[PARTICLES]]
    if missing:   # listed but unreadable: damage; not there at all: another layout
        if missing[0] in lost:
            raise KeyError(f"{missing[0]} cannot be read")
        raise NotATrajectory(f"no {missing[0]}")
    # frames: every element's committed rows; a read failure cuts all of them at that frame
    dst_p = dst[PARTICLES]
    copied: dict[str, tuple[h5py.Group, int]] = {}
    for name, g in elements.items():
        parent = dst_p.require_group("box") if name == "box" else dst_p
        copied[name] = _copy_element(g, parent, "edges" if name == "box" else name, extent[name])
    steps = {n: g["step"][: extent[n]] for n, g in elements.items()}
    cut = None  # last step that every element could read
    for name, (_, n) in copied.items():
        if n < extent[name]:
            s = int(steps[name][n]) - 1  # frames before the unreadable row's step
            cut = s if cut is None else min(cut, s)
    if cut is not None:
        for name, (g, _) in copied.items():
            _shrink(g, int(np.searchsorted(steps[name], cut, side="right")))
        lost.append(f"frames from step {cut + 1}")
    box_rows = copied["box"][0]["step"].shape[0] if "box" in copied else None
    rows_obs: dict[str, int] = {}
    for name in obs_names:
        try:
            g = src["observables"][name]
            if not isinstance(g, h5py.Group) or not {"step", "time", "value"} <= set(g):
                continue  # not an observable element: as the reader, leave it out
            n = valid_rows(g)
            dg, got = _copy_element(g, dst.require_group("observables"), name, n)
        except READ_ERRORS as exc:
            if error_errno(exc) is not None:
                raise
            lost.append(f"observable {name!r}")
            if "observables" in dst and name in dst["observables"]:
                del dst["observables"][name]
            continue
        if got < n:
            _shrink(dg, got)
            lost.append(f"observable {name!r} rows from {got}")
        rows_obs[name] = got
    frames = box_rows if box_rows is not None else (
        max((n for _, n in copied.values()), default=0))
    before = extent.get("box", max(extent.values(), default=0))
    return Salvage(frames=int(frames), frames_before=int(before), observable_rows=rows_obs, lost=lost)


def rebuild(path: str | os.PathLike) -> Salvage | Fresh:
    """Rebuild trajectory ``path`` from its read-only view (see the module docstring); or,
    when it is damaged past reading (:func:`damaged`), move it aside and return
    :class:`Fresh` (the caller starts a new trajectory at ``path``).

    Raises FileBusy when another process holds the file (HDF5's lock); NotATrajectory for
    an intact HDF5 file of another layout; Unreadable when it cannot be read for a reason
    that is no evidence of damage (the OS's: permissions, I/O errors); OSError/RuntimeError
    from creating, writing, syncing or renaming the new file, or from moving the damaged
    one aside.  On any error the original is untouched and the new file removed.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        lock = _lock(path)
    except FileBusy:
        raise
    except OSError as exc:
        raise Unreadable(exc) from None
    try:
        try:
            try:
                src = open_unlocked(path)
            except READ_ERRORS as exc:
                raise Unreadable(exc) from None
            with src:
                _particles(src)
                return _rebuild_from(src, path, directory)
        except Unreadable as exc:
            if not damaged(path, exc.cause):
                raise
            reason = os_reason(exc.cause).strip("'\"")   # (a KeyError's text comes quoted)
            m = re.search(r"\(([^()]*)\)\W*$", reason)       # HDF5's own words, without h5py's
            reason = m.group(1) if m else reason
            try:
                return Fresh(set_aside(path), reason)
            except OSError as err:
                raise SetAsideError(reason) from err
    finally:
        os.close(lock)


def _particles(src: h5py.File) -> None:
    """NotATrajectory when ``/particles/all`` is cleanly absent (the links are listed and
    it is not among them), Unreadable when listing or opening it fails (damage)."""
    g = src
    for part in PARTICLES.strip("/").split("/"):
        try:
            present = part in g
            if present:
                g = g[part]
        except READ_ERRORS as exc:
            raise Unreadable(exc) from None
        if not present:
            raise NotATrajectory(f"no {PARTICLES}")


def _rebuild_from(src: h5py.File, path: str, directory: str) -> Salvage:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.rebuild-", suffix=".h5", dir=directory)
    os.close(fd)
    damaged = None
    try:
        with h5py.File(tmp, "w") as dst:
            try:
                report = _build(src, dst)
            except NotATrajectory:
                raise
            except READ_ERRORS as exc:
                # an errno is an OS failure of the new file (ENOSPC, EIO); anything else is
                # HDF5 failing to read the original's metadata
                if error_errno(exc) is None:
                    raise Unreadable(exc) from None
                raise
        with h5py.File(tmp, "r") as chk:  # the new file holds what was written
            got = frame_extent(frame_elements(chk[PARTICLES]))
            if got.get("box", report.frames) != report.frames:
                raise OSError(errno.EIO, "the rebuilt file does not read back", tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        if report.lost:
            damaged = _unique_damaged(path)
            os.link(path, damaged)
            report.kept_original = damaged
        os.replace(tmp, path)
    except BaseException:
        for leftover in (tmp, damaged):
            if leftover is not None:
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
        raise
    fsync_dir(directory)
    return report


def salvage(path: str, why: str, first: OutputError | None,
            busy: Callable[[], UserError]) -> tuple[str, str]:
    """:func:`rebuild` for ``H5MDWriter(mode="a")``: (the mode to open with, "a" or "w" when
    the file was moved aside, and the one-line report), or a one-line error with the file
    unchanged: ``busy()`` when another process holds it; UserError for an HDF5 file of
    another layout; ``first`` (the reopen's own error) or an OutputError naming the read
    failure when the OS cannot read it; an OutputError naming the OS reason when the new
    file cannot be written or the damaged one moved aside.
    """
    try:
        report = rebuild(path)
    except FileBusy:
        raise busy() from None
    except NotATrajectory as exc:
        raise UserError(f"trajectory {path!r} is an HDF5 file but not a ShardMD/H5MD trajectory "
                        f"({' '.join(str(exc).split())}); move it away or choose another output=") from None
    except Unreadable as exc:
        if first is not None:
            raise first from None
        raise output_error("reopen trajectory", path, exc.cause, fix="move it away or choose another output=",
                           tail=f"it does not open read-only either ({why})") from None
    except SetAsideError as exc:
        raise output_error("move damaged trajectory aside", path, exc.__cause__,
                           tail=f"the file was not changed; it cannot be read ({exc.reason})") from None
    except IO_ERRORS as exc:
        raise output_error("rebuild trajectory", path, exc,
                           tail=f"the file was not changed; it needed a rebuild: {why}") from None
    if isinstance(report, Fresh):
        return "w", report.line(path)
    return "a", report.line(path, why)
