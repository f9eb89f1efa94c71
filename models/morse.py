"""Morse pair potential in plain PyTorch: the readable reference pair model.

    U(r) = D [exp(-2 a (r - r0)) - 2 exp(-a (r - r0))]   (- U(r_c) when ``shift``)   for r < r_c

One species pair shares one (D, a, r0) here: the model shows the contract
(models/contract.py) and how a pair potential declares its decomposition, with nothing tuned.
The fast pair model is the Lennard-Jones Warp kernel (models/lj.py, models/lj_kernels.py).

What it computes, from the full neighbour list (every pair appears as (i, j) and (j, i)):

    ======== ======== ===== =====================================================
    output   shape    unit  definition
    ======== ======== ===== =====================================================
    energy   ()       eV    sum over edges of U(r_ij) / 2
    energies (n,)     eV    e_i = sum over edges (i, j) of U(r_ij) / 2
    forces   (n, 3)   eV/Å  F_i = sum over edges (i, j) of U'(r_ij) d_ij / r_ij
    virial   (3, 3)   eV    W = -sum over edges of U'(r_ij) d_ij (x) d_ij / (2 r_ij)
    ======== ======== ===== =====================================================

with d_ij = x_j + shift_ij - x_i (Å) and U'(r) = 2 a D [exp(-a (r - r0)) - exp(-2 a (r - r0))].
The force on i takes the whole pair's force from i's own edges only, so every output of
atom i is a sum over the edges that i receives: that is why the spec below can hand each
domain the edges of its own atoms (a receiver-owned list with the neighbours' positions in
a halo) and sum energy and virial over ranks (``SPEC_PAIR_HALO``; docs/distributed.md).
"""
from __future__ import annotations

import math

import torch

from shardmd.domain.api import SPEC_PAIR_HALO

SPEC_MORSE = SPEC_PAIR_HALO.replace(name="morse", description="Morse pair potential on a receiver-owned full "
                                    "list, direct forces, halo storage")


class Morse:
    """Morse pair potential (one parameter set for every pair of atoms).

    D:      well depth, eV (> 0)
    a:      inverse width, 1/Å (> 0)
    r0:     equilibrium distance, Å (> 0)
    cutoff: r_c, Å (> 0)
    shift:  subtract U(r_c), so the energy is continuous at the cutoff
    """

    distribution_spec = SPEC_MORSE

    def __init__(self, D: float, a: float, r0: float, cutoff: float, shift: bool = True):
        for name, value in (("D", D), ("a", a), ("r0", r0), ("cutoff", cutoff)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"model.{name}={value!r} is invalid: give a finite number > 0")
        self.D, self.a, self.r0, self.cutoff, self.shift = float(D), float(a), float(r0), float(cutoff), bool(shift)
        self.u_cut = self._pair(torch.tensor(self.cutoff, dtype=torch.float64))[0].item() if shift else 0.0

    def _pair(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(U(r) eV, U'(r) eV/Å) for distances r (Å), unshifted."""
        e1 = torch.exp(-self.a * (r - self.r0))
        return self.D * (e1 * e1 - 2 * e1), 2 * self.a * self.D * (e1 - e1 * e1)

    def compute(self, positions, cell, pbc, numbers, nl) -> dict[str, torch.Tensor]:
        """positions (n, 3) Å, cell (3, 3) Å, pbc (3,), numbers (n,), nl: the neighbour list."""
        i, j = nl.edge_index()
        d = positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)
        r = d.norm(dim=1)
        inside = (r < self.cutoff) & (r > 0)
        r_safe = torch.where(inside, r, torch.ones_like(r))   # no 0/0 outside: masked below
        u, du = self._pair(r_safe)
        u = torch.where(inside, u - self.u_cut, torch.zeros_like(u))
        g = torch.where(inside, du / r_safe, torch.zeros_like(du))[:, None] * d   # U'(r) d / r, eV/Å

        energies = positions.new_zeros(positions.shape[0]).index_add_(0, i, 0.5 * u)
        forces = positions.new_zeros(positions.shape).index_add_(0, i, g)
        virial = -0.5 * (g.unsqueeze(2) * d.unsqueeze(1)).sum(0)
        return {"energy": energies.sum(), "energies": energies, "forces": forces, "virial": virial}


__all__ = ["SPEC_MORSE", "Morse"]
