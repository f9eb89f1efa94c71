"""Structures for the Coulomb tests and an independent Ewald sum to compare model=coulomb with.

``reference_ewald`` is plain numpy float64, written from the textbook formulas with analytic
forces (no torch, no neighbour list, no code of models/coulomb.py): the real-space sum over
every pair and every periodic image within its own cutoff, the reciprocal sum over every k
vector within its own k cutoff, the self term and the neutralising background.  Its splitting
parameter is its own (converged to ~1e-12), so the test compares two different splittings of
the same lattice sum.
"""
from __future__ import annotations

import math

import numpy as np
from ase.build import bulk
from scipy.special import erfc

K = 14.399645          # e^2 / (4 pi eps0), eV·Å
A0 = 5.64              # NaCl lattice constant, Å
MADELUNG = 1.747565    # NaCl, per ion pair, in units of e^2 / (4 pi eps0 r0)
CUTOFF, SKIN = 8.0, 0.5


def nacl(repeat=(4, 4, 4)):
    """Rock salt NaCl, a = 5.64 Å (512 ions for 4 x 4 x 4: 22.56 Å, four 11.28 Å domains fit)."""
    return bulk("NaCl", "rocksalt", a=A0, cubic=True).repeat(repeat)


def rattled(repeat=(4, 4, 4), seed=7):
    """NaCl in a slightly sheared (triclinic) cell, every ion displaced by ~0.1 Å."""
    atoms = nacl(repeat)
    atoms.set_cell(atoms.cell[:] @ np.array([[1.0, 0.03, 0.0], [0.0, 1.0, 0.02], [0.01, 0.0, 1.0]]),
                   scale_atoms=True)
    atoms.rattle(0.1, seed=seed)
    return atoms


def charged(repeat=(4, 4, 4), seed=11):
    """Rattled NaCl with one Cl- taken out: net charge +1 e."""
    atoms = nacl(repeat)
    del atoms[[1]]
    atoms.rattle(0.05, seed=seed)
    return atoms


def madelung_energy(n_ions: int) -> float:
    """eV: the NaCl crystal's energy, -M e^2/(4 pi eps0 r0) per ion pair, r0 = a/2."""
    return -MADELUNG * K / (A0 / 2) * n_ions / 2


def reference_ewald(positions, cell, charges, alpha=0.32, tol=1e-13):
    """(energy eV, forces (n, 3) eV/Å) by an Ewald sum converged to ``tol``: real space within
    r_c = sqrt(-ln tol)/alpha, k space within 2 alpha sqrt(-ln tol), plus the self term and the
    background -pi Q^2/(2 V alpha^2)."""
    x = np.asarray(positions, dtype=np.float64)
    cell = np.asarray(cell, dtype=np.float64)
    q = np.asarray(charges, dtype=np.float64)
    n, s = len(x), math.sqrt(-math.log(tol))
    rc, kc = s / alpha, 2 * alpha * s
    vol = abs(np.linalg.det(cell))
    recip = 2 * np.pi * np.linalg.inv(cell).T
    widths = 1.0 / np.linalg.norm(np.linalg.inv(cell), axis=0)
    energy, forces = 0.0, np.zeros((n, 3))
    # real space: every image n of every pair (i, j), j != i in the home cell
    reach = [int(math.ceil(rc / w)) for w in widths]
    images = np.array([[a, b, c] for a in range(-reach[0], reach[0] + 1) for b in range(-reach[1], reach[1] + 1)
                       for c in range(-reach[2], reach[2] + 1)], dtype=np.float64) @ cell
    for shift in images:
        d = x[None, :, :] + shift - x[:, None, :]            # d[i, j] = x_j + shift - x_i
        r = np.linalg.norm(d, axis=2)
        mask = (r < rc) & (r > 1e-12)
        rs = np.where(mask, r, 1.0)
        qq = q[:, None] * q[None, :]
        energy += 0.5 * K * np.sum(np.where(mask, qq * erfc(alpha * rs) / rs, 0.0))
        # F_i = -dE/dx_i = -K sum_j q_i q_j [erfc/r^2 + 2 alpha/sqrt(pi) exp(-a^2 r^2)/r] d_ij / r
        g = np.where(mask, qq * (erfc(alpha * rs) / rs ** 2 + 2 * alpha / math.sqrt(math.pi)
                                 * np.exp(-(alpha * rs) ** 2) / rs) / rs, 0.0)
        forces -= K * np.einsum("ij,ijc->ic", g, d)
    # reciprocal space: one of each +-k, |k| < kc
    m = [int(math.ceil(kc / np.linalg.norm(b))) + 1 for b in recip]
    grid = np.array([[a, b, c] for a in range(0, m[0] + 1) for b in range(-m[1], m[1] + 1)
                     for c in range(-m[2], m[2] + 1)
                     if a > 0 or (a == 0 and b > 0) or (a == 0 and b == 0 and c > 0)], dtype=np.float64)
    kv = grid @ recip
    k2 = np.sum(kv * kv, axis=1)
    kv, k2 = kv[k2 < kc * kc], k2[k2 < kc * kc]
    for b in range(0, len(kv), 2048):   # blocks of k vectors: (n, 2048) temporaries
        kb, gb = kv[b:b + 2048], np.exp(-k2[b:b + 2048] / (4 * alpha * alpha)) / k2[b:b + 2048]
        phase = x @ kb.T
        cos, sin = np.cos(phase), np.sin(phase)
        c, sn = q @ cos, q @ sin
        energy += K * 4 * np.pi / vol * np.sum(gb * (c * c + sn * sn))
        forces += K * 8 * np.pi / vol * q[:, None] * ((sin * (gb * c) - cos * (gb * sn)) @ kb)
    energy -= K * alpha / math.sqrt(math.pi) * np.sum(q * q)
    energy -= K * np.pi * q.sum() ** 2 / (2 * vol * alpha * alpha)
    return energy, forces


def charges_of(atoms, table=None) -> np.ndarray:
    table = table or {"Na": 1.0, "Cl": -1.0}
    return np.array([table[s] for s in atoms.get_chemical_symbols()])
