"""Warp kernels of the cell-list neighbour search (one code path for CPU and CUDA).

Conventions shared by every kernel here:

- ``cell`` rows are the lattice vectors ``a_0, a_1, a_2`` (Å); ``hinv`` is the inverse of
  ``cell.T``, so fractional coordinates are ``f = hinv @ x``;
- a point's *bin image* ``img`` is ``floor(f)`` on periodic axes (0 elsewhere) and its
  wrapped position is ``xw = x - img @ cell``;
- bins are a ``nb_0 x nb_1 x nb_2`` grid over fractional space, linear index
  ``(c0 * nb_1 + c1) * nb_2 + c2``; on non-periodic axes bin indices are clamped to the grid
  (clamping only brings points closer in bin space, so no pair is missed);
- an edge ``(i, j, S)`` means ``r_ij = x[j] + S @ cell - x[i]`` with the caller's
  (unwrapped) positions.

The kernels are generic over float32/float64 (``typing.Any`` arguments, overloaded below).
Every query atom scans the same bins in the same order and every bin lists its points
sorted by id, so the edge order of an atom never depends on memory order or thread timing.
"""
from __future__ import annotations

from typing import Any

from .warp_setup import init_warp

wp = init_warp()


@wp.func
def _frac(x: Any, hinv: Any):
    return hinv * x


@wp.kernel
def bin_points(
    x: wp.array(dtype=Any),
    hinv: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    pbc: wp.vec3i,
    nb: wp.vec3i,
    xw: wp.array(dtype=Any),
    img: wp.array(dtype=wp.vec3i),
    bin_of: wp.array(dtype=wp.int32),
):
    """Bin every point: wrapped position, bin image and linear bin index."""
    i = wp.tid()
    f = _frac(x[i], hinv[0])
    h = cell[0]
    c = wp.vec3i(0, 0, 0)
    s = wp.vec3i(0, 0, 0)
    for k in range(3):
        fk = f[k]
        if pbc[k] != 0:
            fl = wp.floor(fk)
            s[k] = int(fl)
            fk = fk - fl
        ck = int(wp.floor(fk * type(fk)(nb[k])))
        ck = wp.clamp(ck, 0, nb[k] - 1)
        c[k] = ck
    shift = type(f)(type(f[0])(s[0]), type(f[0])(s[1]), type(f[0])(s[2]))
    # xw = x - s @ cell  (row vector times matrix whose rows are lattice vectors)
    xw[i] = x[i] - (shift[0] * h[0] + shift[1] * h[1] + shift[2] * h[2])
    img[i] = s
    bin_of[i] = (c[0] * nb[1] + c[1]) * nb[2] + c[2]


@wp.func
def _bin_coords(b: int, nb: wp.vec3i):
    c2 = b % nb[2]
    r = b / nb[2]
    c1 = r % nb[1]
    c0 = r / nb[1]
    return wp.vec3i(c0, c1, c2)


@wp.kernel
def scan_neighbors(
    xw: wp.array(dtype=Any),
    img: wp.array(dtype=wp.vec3i),
    bin_of: wp.array(dtype=wp.int32),
    order: wp.array(dtype=wp.int32),
    bin_start: wp.array(dtype=wp.int32),
    cell: wp.array(dtype=Any),
    pbc: wp.vec3i,
    nb: wp.vec3i,
    reach: wp.vec3i,
    cutoff2: Any,
    write: int,
    offsets: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    neighbors: wp.array(dtype=wp.int32),
    shifts: wp.array(dtype=wp.vec3i),
):
    """Count (``write == 0``) or write (``write == 1``) the neighbours of query point ``i``."""
    i = wp.tid()
    h = cell[0]
    xi = xw[i]
    ci = _bin_coords(bin_of[i], nb)
    n_found = int(0)
    base = int(0)
    if write != 0:
        base = offsets[i]
    for d0 in range(-reach[0], reach[0] + 1):
        b0 = ci[0] + d0
        s0 = int(0)
        if pbc[0] != 0:
            s0 = int(wp.floor(float(b0) / float(nb[0])))
            b0 = b0 - s0 * nb[0]
        elif b0 < 0 or b0 >= nb[0]:
            continue
        for d1 in range(-reach[1], reach[1] + 1):
            b1 = ci[1] + d1
            s1 = int(0)
            if pbc[1] != 0:
                s1 = int(wp.floor(float(b1) / float(nb[1])))
                b1 = b1 - s1 * nb[1]
            elif b1 < 0 or b1 >= nb[1]:
                continue
            for d2 in range(-reach[2], reach[2] + 1):
                b2 = ci[2] + d2
                s2 = int(0)
                if pbc[2] != 0:
                    s2 = int(wp.floor(float(b2) / float(nb[2])))
                    b2 = b2 - s2 * nb[2]
                elif b2 < 0 or b2 >= nb[2]:
                    continue
                b = (b0 * nb[1] + b1) * nb[2] + b2
                zero = type(xi[0])(0.0)
                sv = type(xi)(type(zero)(s0), type(zero)(s1), type(zero)(s2))
                offset = sv[0] * h[0] + sv[1] * h[1] + sv[2] * h[2]
                for p in range(bin_start[b], bin_start[b + 1]):
                    j = order[p]
                    if j == i and s0 == 0 and s1 == 0 and s2 == 0:
                        continue
                    dx = xw[j] + offset - xi
                    if wp.dot(dx, dx) < cutoff2:
                        if write != 0:
                            neighbors[base + n_found] = j
                            shifts[base + n_found] = wp.vec3i(s0, s1, s2) - img[j] + img[i]
                        n_found += 1
    if write == 0:
        counts[i] = n_found


for _vec, _mat, _s in (
    (wp.vec3f, wp.mat33f, wp.float32),
    (wp.vec3d, wp.mat33d, wp.float64),
):
    wp.overload(
        bin_points,
        [wp.array(dtype=_vec), wp.array(dtype=_mat), wp.array(dtype=_mat), wp.vec3i, wp.vec3i,
         wp.array(dtype=_vec), wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int32)],
    )
    wp.overload(
        scan_neighbors,
        [wp.array(dtype=_vec), wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.int32), wp.array(dtype=wp.int32), wp.array(dtype=_mat), wp.vec3i,
         wp.vec3i, wp.vec3i, _s, int, wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i)],
    )
