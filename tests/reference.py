"""Independent NumPy references for the neighbour list and the Lennard-Jones model.

Written without looking at ``shardmd.domain`` / ``shardmd.models``: everything here is
float64, O(N^2 * images) and enumerates periodic images explicitly, so it is slow but
easy to check by eye.

Conventions (shared with the implementation's documented API):

* ``cell`` rows are the lattice vectors (Angstrom); ``positions`` are row vectors.
* An edge ``(i, j, S)`` means the vector ``r_ij = x[j] + S @ cell - x[i]``.
* Neighbour lists are FULL: ``(i, j, S)`` and ``(j, i, -S)`` both appear; self images
  ``(i, i, S != 0)`` appear when within the cutoff; the cutoff is strict (``r < rc``).
* ``virial = sum_pairs r_ij (x) f_ij`` with ``f_ij`` the force on ``j`` due to ``i``
  (= -V * stress in ASE's sign convention, = -dE/d(strain)).
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = [
    "pair_arrays",
    "brute_force_pairs",
    "mix_lorentz_berthelot",
    "lj_reference",
    "random_cell",
    "random_positions",
    "insert_positions",
    "min_pair_distance",
]


# --------------------------------------------------------------------------- pairs
def _as_inputs(positions, cell, pbc):
    pos = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    return pos, cell, pbc


def _image_ranges(pos, cell, pbc, cutoff):
    """Inclusive ranges of the lattice image index S_k, per axis, that can contain a pair.

    For a periodic axis k let b_k be the k-th reciprocal vector (column k of cell^-1,
    so b_k . a_l = delta_kl).  For r = x_j - x_i + S @ cell we have
    b_k . r = (f_j - f_i)_k + S_k with f the fractional coordinates, and
    |b_k . r| <= |b_k| |r|, hence |r| < rc requires |(f_j - f_i)_k + S_k| < rc |b_k|
    (1/|b_k| is the perpendicular width of the cell along k).  This bound is exact for
    any cell shape and for positions outside the cell; one extra image of margin is
    added on each side anyway.  Non-periodic axes only have S_k = 0.
    """
    ranges = [(0, 0), (0, 0), (0, 0)]
    if not pbc.any() or len(pos) == 0:
        return ranges
    inv = np.linalg.inv(cell)  # raises for a singular cell with a periodic axis
    frac = pos @ inv
    recip_norm = np.linalg.norm(inv, axis=0)
    for k in range(3):
        if not pbc[k]:
            continue
        f = frac[:, k]
        df_max = f.max() - f.min()  # max over (i, j) of f_j - f_i; min is -df_max
        reach = cutoff * recip_norm[k]
        lo = int(np.floor(-df_max - reach)) - 1
        hi = int(np.ceil(df_max + reach)) + 1
        ranges[k] = (lo, hi)
    return ranges


def pair_arrays(positions, cell, pbc, cutoff):
    """All ordered pairs within ``cutoff`` as arrays.

    Returns ``(i (E,), j (E,), S (E, 3) int, rvec (E, 3) float64)`` sorted by (i, j, S).
    """
    pos, cell, pbc = _as_inputs(positions, cell, pbc)
    n = len(pos)
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    ii, jj = ii.ravel(), jj.ravel()
    base = (pos[None, :, :] - pos[:, None, :]).reshape(-1, 3)  # x_j - x_i
    out_i, out_j, out_s, out_r = [], [], [], []
    ranges = _image_ranges(pos, cell, pbc, cutoff)
    for s in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges)):
        s = np.array(s, dtype=np.int64)
        rvec = base + s @ cell
        d2 = np.einsum("ij,ij->i", rvec, rvec)
        keep = np.sqrt(d2) < cutoff
        if not s.any():
            keep &= ii != jj
        if keep.any():
            k = np.nonzero(keep)[0]
            out_i.append(ii[k])
            out_j.append(jj[k])
            out_s.append(np.broadcast_to(s, (len(k), 3)))
            out_r.append(rvec[k])
    if not out_i:
        return (np.zeros(0, np.int64), np.zeros(0, np.int64),
                np.zeros((0, 3), np.int64), np.zeros((0, 3)))
    i = np.concatenate(out_i)
    j = np.concatenate(out_j)
    S = np.concatenate(out_s).astype(np.int64)
    r = np.concatenate(out_r)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    return i[order], j[order], S[order], r[order]


def brute_force_pairs(positions, cell, pbc, cutoff):
    """Set of all ordered pairs ``(i, j, (s0, s1, s2))`` with |x_j + S@cell - x_i| < cutoff,
    ``i != j or S != 0``; S_k = 0 on non-periodic axes.  Positions need not be wrapped."""
    i, j, S, _ = pair_arrays(positions, cell, pbc, cutoff)
    return {(int(a), int(b), tuple(int(x) for x in s)) for a, b, s in zip(i, j, S)}


def pair_distance(positions, cell, i, j, s):
    """float64 distance of one edge (helper for tolerance checks)."""
    pos = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    return float(np.linalg.norm(pos[j] + np.asarray(s, np.float64) @ cell - pos[i]))


# --------------------------------------------------------------------------- LJ
def mix_lorentz_berthelot(eps_by_type, sigma_by_type):
    """Lorentz-Berthelot: sigma_ab = (sigma_a + sigma_b)/2, eps_ab = sqrt(eps_a eps_b)."""
    e = np.asarray(eps_by_type, dtype=np.float64).reshape(-1)
    s = np.asarray(sigma_by_type, dtype=np.float64).reshape(-1)
    return np.sqrt(np.outer(e, e)), 0.5 * (s[:, None] + s[None, :])


def lj_reference(positions, cell, pbc, numbers, epsilon, sigma, type_of, cutoff, shift,
                 return_scales=False):
    """Lennard-Jones energy, forces, virial and per-atom energies (float64).

    u(r) = 4 eps [(sigma/r)^12 - (sigma/r)^6] (- u(rc) if ``shift``) for r < rc, with eps and
    sigma taken from the (T, T) tables at (type_of[Z_i], type_of[Z_j]).

    Returns ``(energy, forces (n,3), virial (3,3), energies (n,))``; with
    ``return_scales=True`` additionally a dict of magnitudes for relative tolerances:
    ``energy`` = sum over pairs of |u|, ``forces`` = max over atoms of sum_j |f_ij|,
    ``virial`` = sum over pairs of |r||f|, ``energies`` (n,) = per-atom sum of |u|/2.
    """
    pos, cell_, pbc_ = _as_inputs(positions, cell, pbc)
    n = len(pos)
    eps_t = np.asarray(epsilon, dtype=np.float64)
    sig_t = np.asarray(sigma, dtype=np.float64)
    types = np.array([type_of[int(z)] for z in np.asarray(numbers).reshape(-1)], dtype=np.int64)
    i, j, _, rvec = pair_arrays(pos, cell_, pbc_, cutoff)
    r = np.linalg.norm(rvec, axis=1)
    eps = eps_t[types[i], types[j]]
    sig = sig_t[types[i], types[j]]
    sr6 = (sig / r) ** 6
    u = 4.0 * eps * (sr6 * sr6 - sr6)
    if shift:
        src6 = (sig / cutoff) ** 6
        u = u - 4.0 * eps * (src6 * src6 - src6)
    dudr = -24.0 * eps * (2.0 * sr6 * sr6 - sr6) / r
    # full list: every unordered pair appears twice -> factor 1/2 on pair sums
    energies = 0.5 * np.bincount(i, weights=u, minlength=n)
    energy = 0.5 * u.sum()
    # force on the centre i: -du/dx_i = u'(r) * rvec / r   (dr/dx_i = -rvec/r)
    fi = (dudr / r)[:, None] * rvec
    forces = np.zeros((n, 3))
    np.add.at(forces, i, fi)
    # virial = sum_unordered r_ij (x) f_j,  f_j = -u' rvec / r
    virial = -0.5 * np.einsum("e,ea,eb->ab", dudr / r, rvec, rvec)
    if not return_scales:
        return energy, forces, virial, energies
    fmag = np.abs(dudr)
    fs = np.bincount(i, weights=fmag, minlength=n)
    scales = {
        "energy": 0.5 * np.abs(u).sum(),
        "forces": float(fs.max()) if n else 0.0,
        "virial": 0.5 * float((fmag * r).sum()),
        "energies": 0.5 * np.bincount(i, weights=np.abs(u), minlength=n),
        "n_pairs": len(i) // 2,
    }
    return energy, forces, virial, energies, scales


def lj_pair_distances(positions, cell, pbc, cutoff):
    """All pair distances (ordered pairs) up to ``cutoff``; helper for margin checks."""
    _, _, _, rvec = pair_arrays(positions, cell, pbc, cutoff)
    return np.linalg.norm(rvec, axis=1)


# --------------------------------------------------------------------------- configs
def random_rotation(rng):
    q, rr = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(rr))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def random_cell(rng, lengths=(6.0, 10.0), max_tilt=1.0, rotate=False):
    """Triclinic cell: lower-triangular shear with tilts up to ``max_tilt`` (1 = 45 deg),
    optionally rigidly rotated (then it is a general, non-triangular matrix)."""
    L = rng.uniform(*lengths, size=3)
    t = rng.uniform(-max_tilt, max_tilt, size=3)
    cell = np.array([[L[0], 0.0, 0.0],
                     [t[0] * L[1], L[1], 0.0],
                     [t[1] * L[2], t[2] * L[2], L[2]]])
    if rotate:
        cell = cell @ random_rotation(rng).T
    return cell


def random_positions(rng, n, cell, pbc, frac_range_periodic=(0.0, 1.0),
                     frac_range_open=(-0.5, 1.5)):
    """Uniform fractional coordinates (periodic axes in ``frac_range_periodic``, non-periodic
    axes spread over ``frac_range_open``, i.e. beyond the cell) -> Cartesian."""
    pbc = np.asarray(pbc, dtype=bool)
    frac = np.empty((n, 3))
    for k in range(3):
        lo, hi = frac_range_periodic if pbc[k] else frac_range_open
        frac[:, k] = rng.uniform(lo, hi, size=n)
    return frac @ np.asarray(cell, dtype=np.float64)


def min_pair_distance(positions, cell, pbc, cutoff=20.0):
    """Smallest pair distance (including periodic self images), or inf."""
    d = lj_pair_distances(positions, cell, pbc, cutoff)
    return float(d.min()) if len(d) else np.inf


def insert_positions(rng, n, cell, pbc, dmin, frac_range_open=(-0.3, 1.3), max_tries=200000):
    """Random sequential insertion: ``n`` atoms with every pair distance (periodic images
    included) >= dmin[k_new, k_old] where dmin is a scalar or a callable(ia, ib) -> float.
    Returns Cartesian positions (float64)."""
    cell = np.asarray(cell, dtype=np.float64)
    pbc = np.asarray(pbc, dtype=bool)
    dfun = dmin if callable(dmin) else (lambda a, b: dmin)
    dmax = max(dfun(a, b) for a in range(n) for b in range(n)) if callable(dmin) else dmin
    pos = np.zeros((0, 3))
    tries = 0
    while len(pos) < n:
        tries += 1
        if tries > max_tries:
            raise RuntimeError("random insertion failed: box too crowded")
        cand = random_positions(rng, 1, cell, pbc, frac_range_open=frac_range_open)[0]
        trial = np.vstack([pos, cand])
        i, j, _, rvec = pair_arrays(trial, cell, pbc, dmax)
        new = len(trial) - 1
        m = i == new
        ok = True
        for jj, rv in zip(j[m], rvec[m]):
            if np.linalg.norm(rv) < dfun(new, int(jj)):
                ok = False
                break
        if ok:
            pos = trial
    return pos
