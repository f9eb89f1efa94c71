"""ASE I/O plugin: ``ase.io.read`` of ShardMD's own files (H5MD trajectories and restart
checkpoints), and the one function the engine itself uses to read them as structures.

Registered through ASE's ``ase.ioformats`` entry-point group (ASE >= 3.23 calls
``ase.io.formats.register_external_io_formats("ase.ioformats")`` when ``ase.io`` is imported;
pyproject.toml names :data:`h5md_format`, an ``ase.utils.plugins.ExternalIOFormat``).  The
format is ``shardmd-h5md`` with the extensions ``.h5`` and ``.h5md``, so once ShardMD is
installed::

    ase.io.read("run.h5", ":")        # every frame
    ase.io.read("run.h5")             # the last frame
    ase.io.read("run.ckpt/step-1000.h5")   # a checkpoint: one frame

ASE tries file signatures before extensions; no ASE format claims HDF5's signature, so an
``.h5``/``.h5md`` file reaches this reader, and other HDF5-based files (netCDF4 ``.nc``) keep
their own.  The format's name is ShardMD's, not "h5md": the reader reads this engine's
layout (``/particles/all`` with species and masses), not every H5MD file.

Atoms carry ASE units: positions and cell Å (cell rows are lattice vectors), ``pbc``,
``numbers``, masses amu, velocities in ASE's unit (Å/fs divided by ``ase.units.fs``), and,
where the file has them at that step, energy (``potential_energy``, eV), forces (eV/Å) and
per-atom energies (field ``energy``, eV: ``atoms.get_potential_energies()``) through a
``SinglePointCalculator``; ``info`` holds ``step``, ``time_fs`` and the step's
observables (``stress`` there includes the kinetic term, so it is not given to the
calculator, whose stress is the potential part).  See
:func:`shardmd.engine.io.h5md_read.read_frames`.  Importing this module costs only ASE's plugin
tuple: h5py and the readers load when a file is read.
"""
from __future__ import annotations

from typing import Iterator

from ase.utils.plugins import ExternalIOFormat

#: the entry point's object: '+S' = several images, needs a file name (HDF5 opens by path)
h5md_format = ExternalIOFormat(
    desc="ShardMD H5MD trajectory or restart checkpoint",
    code="+S",
    module="shardmd.engine.io.ase_io",
    ext=["h5md", "h5"],
)


def read_shardmd_h5md(filename: str, index=None) -> Iterator:
    """ASE's read function for format ``shardmd-h5md`` (a generator, one Atoms per frame).

    index: a slice over the frames (``ase.io.read`` turns an int i into ``slice(i, None)``
    and takes the first image); None: every frame.  Errors: one-line
    :class:`~shardmd.engine.errors.UserError` (a ValueError for trajectories) naming the file.
    """
    yield from iter_structures(filename, slice(None) if index is None else index)


def checkpoint_atoms(path: str):
    """The state of a restart checkpoint as ``ase.Atoms`` (id order, ASE units).

    Read with :func:`shardmd.engine.io.checkpoint.read_checkpoint` (HDF5 datasets only, checked
    field by field).  positions (n, 3) Å as stored (wrapped), cell (3, 3) Å, pbc (3,),
    masses amu, velocities Å/fs -> ASE, image flags in ``arrays["image"]``, ids in
    ``arrays["id"]``, ``info["step"]`` and ``info["time_fs"]``; a model's inputs, if the
    checkpoint holds any, as ``arrays["initial_charges"]`` (charges, e), other per-atom arrays by
    name and per-system values in ``info`` (``charge``, ``spin``).  A checkpoint holds no
    forces or energies, so no calculator is attached.
    """
    import ase
    import ase.units
    import numpy as np

    from shardmd.engine.io.checkpoint import read_checkpoint

    c = read_checkpoint(path)
    a = c["arrays"]
    order = np.argsort(a["ids"], kind="stable")
    atoms = ase.Atoms(numbers=np.asarray(a["numbers"])[order], positions=np.asarray(a["positions"], np.float64)[order],
                      cell=np.asarray(c["cell"], np.float64), pbc=np.asarray(c["pbc"], bool),
                      masses=np.asarray(a["masses"], np.float64)[order],
                      velocities=np.asarray(a["velocities"], np.float64)[order] / ase.units.fs)
    atoms.arrays["image"] = np.asarray(a["images"], np.int32)[order]
    atoms.arrays["id"] = np.asarray(a["ids"], np.int64)[order]
    atoms.info["step"] = int(c["step"])
    atoms.info["time_fs"] = float(c["time"])
    # a model's inputs (engine/run/model_inputs.py) where a structure file keeps them: charges as
    # the initial charges, other per-atom ones as arrays by name, per-system ones in info
    for name, v in c.get("inputs", {}).get("atoms", {}).items():
        atoms.arrays["initial_charges" if name == "charges" else name] = np.asarray(v)[order]
    for name, v in c.get("inputs", {}).get("system", {}).items():
        atoms.info[name] = np.asarray(v)[0].tolist()
    return atoms


def count_structures(path: str) -> tuple[str, int]:
    """(kind, number of frames) of a ShardMD file: ("trajectory", committed frames) or
    ("checkpoint", 1).  One-line UserError for anything else (see ``inspect_files``)."""
    from shardmd.engine.io.h5md_read import _Reader
    from shardmd.engine.io.inspect_files import _open_kind

    kind = _open_kind(path)
    if kind == "checkpoint":
        return kind, 1
    r = _Reader(path)
    try:
        return kind, len(r)
    finally:
        r.close()


def iter_structures(path: str, index: slice = slice(None)) -> Iterator:
    """Yield the frames ``index`` (a slice) of a trajectory, or the one structure of a
    checkpoint, as ``ase.Atoms``, reading one frame at a time."""
    from shardmd.engine.io.h5md_read import _Reader
    from shardmd.engine.io.inspect_files import _open_kind

    path = str(path)
    if _open_kind(path) == "checkpoint":
        if range(1)[index]:
            yield checkpoint_atoms(path)
        return
    r = _Reader(path)
    try:
        for i in range(len(r))[index]:
            yield r.frame(i)   # a running job's file: read again (h5md_live.py)
    finally:
        r.close()
