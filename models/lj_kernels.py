"""Warp kernel of the Lennard-Jones pair potential on a full CSR neighbour list.

For each query atom i and each edge (i, j, S) with ``d = x[j] + S @ cell - x[i]`` and
``r = |d| < cutoff``, with ``g = fpr * d`` the force on j from i:

    U(r)   = c12 / r^12 - c6 / r^6 - u_shift          (eV; c12 = 4 eps sigma^12, c6 = 4 eps sigma^6)
    fpr    = (12 c12 / r^12 - 6 c6 / r^6) / r^2        (= -dU/dr / r)
    F_i   -= g                                          (eV/Å)
    E_i   += U / 2                                      (each pair is seen from both ends)
    W     += d (x) g / 2 summed over all edges          (virial = sum over pairs r_ij (x) f_ij, eV)

Because the list is full, each atom's sums need no atomics: results are deterministic on
CPU and GPU, and atom i sums its edges in the list's order.

The virial: when every point is a query point, (i, j, S) and (j, i, -S) are both in the
list, and sum over edges of d (x) g / 2 = sum_i x_i (x) F_i + sum over edges of
(S @ cell) (x) g / 2, whose last sum only runs over the ~10 % of edges that cross a periodic
boundary.  With ghost points (query points first, n_query < n_points) the reverse edges of
ghosts are missing and the per-edge sum is kept (``pair_virial``).

Choices, each measured (docs/benchmarks.md: "The force kernel (ns per edge of the full list)"
on the CPU, "LJ at 4 M atoms" on a GPU):

- the cutoff test is a select, not a branch: ~30 % of the edges of a list built with a skin
  lie beyond the cutoff in no predictable pattern, and a mispredicted branch costs more than
  the arithmetic it saves (beyond the cutoff 1/r^2 becomes 0, which zeroes U and g);
- the periodic shift is a branch: it is zero for ~90 % of the edges, in long runs;
- one species (the common case) reads its parameters once: no per-edge type and table
  loads; the virial identity above saves a 3x3 update per edge;
- U and fpr in factored form (fewer operations per edge);
- on a GPU, the list's packed edges (one int64 per edge, ``NeighborList.packed``) instead of
  the neighbour and shift arrays: each thread walks its own stretch of the list, so a warp's
  loads land in 32 places and their number sets the cost; one 8-byte load per edge instead
  of four 4-byte ones is a quarter of them.
These are compile-time variants of one kernel (``wp.static``), generic over float32/float64.
"""
from __future__ import annotations

from typing import Any

from shardmd.domain.api import ZERO_SHIFT, init_warp, packed_neighbor, packed_shift_code, shift_of_code

wp = init_warp()
# forward-only kernels: no adjoint code (halves compile time)
wp.set_module_options({"enable_backward": False})


@wp.func
def _lj_pair(r2: Any, p: Any, cutoff2: Any):
    """(U, fpr) of one edge with ``p = (c12, c6, u_shift)``; ``fpr = -dU/dr / r``, so the
    force on i is ``-fpr * d``.  Both are exactly 0 at and beyond the cutoff."""
    zero = cutoff2 - cutoff2
    inside = wp.where(r2 < cutoff2, type(zero)(1.0), zero)
    inv_r2 = inside / r2
    inv_r6 = inv_r2 * inv_r2 * inv_r2
    # U = (c12 / r^6 - c6) / r^6 - u_shift; fpr = (12 c12 / r^6 - 6 c6) / r^8 (fewest operations:
    # with one species 12 c12 and 6 c6 are loop invariants)
    u = (p[0] * inv_r6 - p[1]) * inv_r6 - inside * p[2]
    fpr = ((type(zero)(12.0) * p[0]) * inv_r6 - type(zero)(6.0) * p[1]) * (inv_r6 * inv_r2)
    return u, fpr


def _lj_kernel(one_species: bool, pair_virial: bool, packed_edges: bool):
    """The kernel, specialised at compile time (``wp.static``) for one species (parameters
    read once, no per-edge type lookups), for the way the virial is summed, and for the
    edges it reads (``packed`` or ``neighbors`` and ``shifts``; the others may be dummies)."""

    @wp.kernel(enable_backward=False, module="unique")
    def lj_full_list(
        x: wp.array(dtype=Any),
        cell: wp.array(dtype=Any),
        offsets: wp.array(dtype=wp.int32),
        neighbors: wp.array(dtype=wp.int32),
        shifts: wp.array(dtype=wp.vec3i),
        packed: wp.array(dtype=wp.int64),
        types: wp.array(dtype=wp.int32),
        table: wp.array(dtype=Any),
        n_types: int,
        cutoff2: Any,
        forces: wp.array(dtype=Any),
        energies: wp.array(dtype=Any),
        virials: wp.array(dtype=Any),
    ):
        """Atom i: ``table[t_i * n_types + t_j] = (c12, c6, u_shift)``."""
        i = wp.tid()
        h = cell[0]
        xi = x[i]
        zero = cutoff2 - cutoff2
        row = int(0)
        params = table[0]
        if wp.static(not one_species):
            row = types[i] * n_types
        f = type(xi)()
        e = zero
        w = type(h)()
        for p in range(offsets[i], offsets[i + 1]):
            j = int(0)
            s = wp.vec3i(0, 0, 0)
            shifted = bool(False)
            if wp.static(packed_edges):
                v = packed[p]
                j = packed_neighbor(v)
                k = packed_shift_code(v)
                shifted = k != ZERO_SHIFT
                if shifted:
                    s = shift_of_code(k)
            else:
                j = neighbors[p]
                s = shifts[p]
                shifted = (s[0] | s[1] | s[2]) != 0
            d = x[j] - xi
            image = type(xi)()
            if shifted:  # rare: S = 0 for ~90 % of the edges
                image = type(zero)(s[0]) * h[0] + type(zero)(s[1]) * h[1] + type(zero)(s[2]) * h[2]
                d += image
            if wp.static(not one_species):
                params = table[row + types[j]]
            u, fpr = _lj_pair(wp.dot(d, d), params, cutoff2)
            g = fpr * d  # force on j from i
            e += u
            f -= g
            if wp.static(pair_virial):
                w += wp.outer(d, g)
            elif shifted:
                w += wp.outer(image, g)
        half = type(zero)(0.5)
        forces[i] = f
        energies[i] = half * e
        if wp.static(pair_virial):
            virials[i] = half * w
        else:
            virials[i] = wp.outer(xi, f) + half * w

    for vec, mat, scalar in ((wp.vec3f, wp.mat33f, wp.float32), (wp.vec3d, wp.mat33d, wp.float64)):
        wp.overload(
            lj_full_list,
            [wp.array(dtype=vec), wp.array(dtype=mat), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
             wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int64), wp.array(dtype=wp.int32), wp.array(dtype=vec), int,
             scalar,
             wp.array(dtype=vec), wp.array(dtype=scalar), wp.array(dtype=mat)],
        )
    return lj_full_list


#: ``LJ_KERNELS[one_species, pair_virial, packed_edges]``
LJ_KERNELS = {(one, pair, packed): _lj_kernel(one, pair, packed)
              for one in (True, False) for pair in (True, False) for packed in (True, False)}
