"""The cell's degrees of freedom of a FIRE relaxation: ASE's ``FrechetCellFilter`` (ase/filters.py,
ase/optimize/cellutil.py, ASE 3.29), its 3 x 3 algebra line for line, for engine/relax/minimize.py.

Why FrechetCellFilter and not UnitCellFilter: both move the atoms in the coordinates of the
undeformed cell, p = x F^-T (F the deformation gradient: cell = cell0 F^T), but the Frechet filter's
cell coordinates are the matrix log of F (times N, ``exp_cell_factor``) and its cell forces the
exact derivative of the energy along them (the Frechet derivative of expm), so energy and forces
stay consistent for any strain; UnitCellFilter's forces are consistent only to first order in the
strain, and ASE recommends the Frechet filter (``ExpCellFilter``'s successor) for relaxations.

With rows as lattice vectors (``x = f @ cell``), the engine's virial W (eV, sum r (x) f, global)
and a target pressure p (eV/Å^3), as ASE computes them from the stress s = -W / V:

    virial   = -V (s + p I) = W - p V I
    F        = solve(cell0, cell)^T,  L = logm(F)
    g        = virial inv(F^T)                                   (UnitCellFilter's cell gradient)
    G[m, n]  = sum( expm_frechet(L, E_mn) * g )                  (E_mn: 1 at (m, n))
    cell forces  = G / N,   atom forces  = f F                   (the filter's "forces", eV/Å)
    cell coordinates  c = logm(N F) N    (ASE: UnitCellFilter's N F, then logm, times N)
    a step c -> c + dc:  F' = expm((c + dc) / N) / N,  cell' = cell0 (I + (F' - I)^T),
                         x' = (x F^-T + dx) (I + (F' - I)^T)

The fixed point of the dilation is the origin.  Every rank computes these from the same global
numbers (virial, cell), so every rank holds the same cell.  Units: Å, eV, eV/Å^3.
"""
from __future__ import annotations

import numpy as np


class FrechetCell:
    """The cell part of ASE's FrechetCellFilter for one relaxation.  cell0: (3, 3) Å rows, the
    starting cell; n_atoms: the global atom count (ASE's default cell_factor and
    exp_cell_factor); pressure: eV/Å^3 (ASE's ``scalar_pressure``)."""

    def __init__(self, cell0: np.ndarray, n_atoms: int, pressure: float = 0.0):
        from scipy.linalg import expm, expm_frechet, logm

        self.expm, self.expm_frechet, self.logm = expm, expm_frechet, logm
        self.cell0 = np.array(cell0, dtype=np.float64)
        self.factor = float(n_atoms)   # ASE: cell_factor = exp_cell_factor = len(atoms)
        self.pressure = float(pressure)

    def deform_grad(self, cell: np.ndarray) -> np.ndarray:
        """F with cell = cell0 F^T (ASE's CellUtility.deform_grad)."""
        return np.linalg.solve(self.cell0, cell).T

    def coordinates(self, cell: np.ndarray) -> np.ndarray:
        """(3, 3): the filter's cell coordinates logm(N F) N (get_positions_frechet)."""
        return np.real(self.logm(self.factor * self.deform_grad(cell))) * self.factor

    def forces(self, virial: np.ndarray, cell: np.ndarray) -> np.ndarray:
        """(3, 3) eV/Å: the cell's generalized forces (get_forces_frechet, no mask); virial: the
        model's (3, 3) eV, W = sum r (x) f."""
        volume = abs(np.linalg.det(cell))
        vir = np.asarray(virial, dtype=np.float64) - np.diag([self.pressure * volume] * 3)
        f = self.deform_grad(cell)
        log_f = np.real(self.logm(f))
        grad = vir @ np.linalg.inv(f.T)
        out = np.zeros((3, 3))
        for m in range(3):
            for n in range(3):
                e = np.zeros((3, 3))
                e[m, n] = 1.0
                out[m, n] = np.sum(self.expm_frechet(log_f, e, compute_expm=False) * grad)
        return out / self.factor

    def step(self, cell: np.ndarray, dc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(new cell, A, B) after the cell coordinates move by dc (3, 3): the atoms' new positions
        are x' = (x A + dx) B, A = F^-T the old cell's map to the filter's coordinates, B = I + (F' - I)^T."""
        f = self.deform_grad(cell)
        f_new = self.expm((self.coordinates(cell) + dc) / self.factor) / self.factor
        b = np.eye(3) + (f_new - np.eye(3)).T
        return self.cell0 @ b, np.linalg.inv(f).T, b
