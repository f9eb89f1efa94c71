"""Writers of ``python -m engine convert`` that ASE lacks or would misname: LAMMPS dump and data
files, XTC and DCD (MDAnalysis's writers). Each takes frames one at a time (``ase.Atoms`` in ASE
units, as :func:`shardmd.engine.io.ase_io.iter_structures` yields them).

LAMMPS wants a cell with a along x and b in the xy plane (its "prism"); a general cell is rotated
into that frame (ASE's ``Prism``), positions, velocities and forces with it, so distances and the
cell's shape are kept and only the orientation changes. Units are LAMMPS's ``metal``: Å, Å/ps,
eV/Å, amu; types are numbered by element in order of atomic number (``type_map``).

============ ======================================================================================
``.lammpstrj`` LAMMPS dump text (``ITEM: ATOMS id type element x y z [vx vy vz] [fx fy fz]``), every
``.dump``      frame; OVITO, ASE (``lammps-dump-text``) and LAMMPS's ``read_dump`` read it
``.data``      LAMMPS data (``atom_style atomic``, masses, velocities), one frame: ``read_data``
``.lmp``
``.xtc``       GROMACS XTC (positions, ~1e-3 nm), MDAnalysis's writer
``.dcd``       CHARMM/NAMD DCD (positions, float32), MDAnalysis's writer
============ ======================================================================================
"""
from __future__ import annotations

import numpy as np

#: extension -> (format name, one frame only)
FORMATS = {".lammpstrj": ("lammps-dump", False), ".dump": ("lammps-dump", False), ".data": ("lammps-data", True),
           ".lmp": ("lammps-data", True), ".xtc": ("xtc", False), ".dcd": ("dcd", False)}


def type_map(numbers) -> dict[int, int]:
    """{atomic number: LAMMPS type (1, 2, ...)} in order of atomic number."""
    return {int(z): k + 1 for k, z in enumerate(sorted(set(int(z) for z in numbers)))}


def lammps_frame(atoms) -> dict:
    """The frame in LAMMPS's prism: ``lengths`` (xhi, yhi, zhi), ``tilts`` (xy, xz, yz) Å,
    ``positions`` Å (wrapped into the cell), ``velocities`` Å/ps, ``forces`` eV/Å or None."""
    from ase import units
    from ase.calculators.lammps import Prism

    prism = Prism(atoms.cell.array, pbc=atoms.pbc)
    xhi, yhi, zhi, xy, xz, yz = prism.get_lammps_prism()
    out = {"lengths": (xhi, yhi, zhi), "tilts": (xy, xz, yz),
           "positions": prism.vector_to_lammps(atoms.positions, wrap=True),
           "velocities": prism.vector_to_lammps(atoms.get_velocities()) * units.fs * 1000.0, "forces": None}
    results = getattr(atoms.calc, "results", {}) if atoms.calc is not None else {}
    if results.get("forces") is not None:
        out["forces"] = prism.vector_to_lammps(np.asarray(results["forces"]))
    return out


class DumpWriter:
    """LAMMPS dump text, frame by frame, into an open text file ``fh``."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, atoms) -> None:
        from ase.data import chemical_symbols

        f = lammps_frame(atoms)
        (xhi, yhi, zhi), (xy, xz, yz) = f["lengths"], f["tilts"]
        # the bounding box of the tilted cell, as LAMMPS writes it
        xlo_b, xhi_b = min(0.0, xy, xz, xy + xz), xhi + max(0.0, xy, xz, xy + xz)
        ylo_b, yhi_b = min(0.0, yz), yhi + max(0.0, yz)
        bc = " ".join("pp" if p else "ff" for p in atoms.pbc)
        types = type_map(atoms.numbers)
        ids = atoms.arrays.get("id", np.arange(len(atoms)))
        cols = ["id", "type", "element", "x", "y", "z", "vx", "vy", "vz"]
        data = [f["positions"], f["velocities"]]
        if f["forces"] is not None:
            cols += ["fx", "fy", "fz"]
            data.append(f["forces"])
        values = np.hstack(data)
        w = self.fh.write
        w(f"ITEM: TIMESTEP\n{int(atoms.info.get('step', 0))}\nITEM: NUMBER OF ATOMS\n{len(atoms)}\n")
        w(f"ITEM: BOX BOUNDS xy xz yz {bc}\n{xlo_b:.10f} {xhi_b:.10f} {xy:.10f}\n{ylo_b:.10f} {yhi_b:.10f} "
          f"{xz:.10f}\n0.0 {zhi:.10f} {yz:.10f}\n")
        w("ITEM: ATOMS " + " ".join(cols) + "\n")
        for k in np.argsort(ids, kind="stable"):
            z = int(atoms.numbers[k])
            w(f"{int(ids[k]) + 1} {types[z]} {chemical_symbols[z]} " + " ".join(f"{v:.10g}" for v in values[k])
              + "\n")


def write_data(path: str, atoms) -> None:
    """One frame as a LAMMPS data file (atom_style atomic, units metal, masses and velocities)."""
    from ase.data import chemical_symbols
    from ase.io import write

    order = [chemical_symbols[z] for z in type_map(atoms.numbers)]
    write(path, atoms, format="lammps-data", atom_style="atomic", units="metal", masses=True, velocities=True,
          specorder=order, parallel=False)


class MDAnalysisWriter:
    """XTC or DCD through MDAnalysis's writer: positions in LAMMPS's prism frame (the cell as
    lengths and angles), time in ps. DCD keeps one time step for the file, not a time per
    frame: its writer starts at the second frame, with the first two frames' interval."""

    def __init__(self, path: str, fmt: str, n_atoms: int):
        import MDAnalysis as mda

        self.path, self.fmt, self.n_atoms = path, fmt.upper(), n_atoms
        self.universe = mda.Universe.empty(n_atoms, trajectory=True)
        self.writer = mda.Writer(path, n_atoms=n_atoms, format=self.fmt) if self.fmt != "DCD" else None
        self._held = None

    def write(self, atoms) -> None:
        if self.writer is None:   # DCD: wait for the second frame's time
            if self._held is None:
                self._held = atoms
                return
            self._open_dcd(float(atoms.info.get("time_fs", 0.0)) - float(self._held.info.get("time_fs", 0.0)))
        self._write(atoms)

    def _open_dcd(self, dt_fs: float) -> None:
        import MDAnalysis as mda

        self.writer = mda.Writer(self.path, n_atoms=self.n_atoms, format="DCD", dt=max(dt_fs, 1e-9) / 1000.0)
        held, self._held = self._held, None
        self._write(held)

    def _write(self, atoms) -> None:
        f = lammps_frame(atoms)
        ts = self.universe.trajectory.ts
        ids = atoms.arrays.get("id", np.arange(len(atoms)))
        ts.positions = f["positions"][np.argsort(ids, kind="stable")]
        ts.dimensions = atoms.cell.cellpar()
        ts.time = float(atoms.info.get("time_fs", 0.0)) / 1000.0
        self.writer.write(self.universe.atoms)

    def close(self) -> None:
        if self.writer is None and self._held is not None:   # a one-frame DCD
            self._open_dcd(1000.0)
        if self.writer is not None:
            self.writer.close()
