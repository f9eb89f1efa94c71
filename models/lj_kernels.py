"""Warp kernels of the Lennard-Jones pair potential on a full CSR neighbour list.

For each query atom i and each edge (i, j, S) with ``d = x[j] + S @ cell - x[i]`` and
``r = |d| < cutoff``:

    U(r)      = c12 / r^12 - c6 / r^6 - u_shift          (eV; c12 = 4 eps sigma^12, c6 = 4 eps sigma^6)
    F_i      += -(12 c12 / r^12 - 6 c6 / r^6) / r^2 * d  (eV/Å)
    E_i      += U / 2                                     (each pair is seen from both ends)
    W_i      += (12 c12 / r^12 - 6 c6 / r^6) / r^2 * d (x) d / 2   (virial, eV)

Because the list is full, each atom's sums need no atomics: results are deterministic on
CPU and GPU, and atom i's force sums its edges in the list's order.

Two kernels share the per-edge functions: ``lj_one_species`` takes the pair parameters as
one vec3 (c12, c6, u_shift), ``lj_species`` looks them up per edge in a (type_i, type_j)
table.  Choices, measured in docs/benchmarks.md (CPU, float64, ns per edge):

- the virial is symmetric: 6 running sums (two vec3s: diagonal, off-diagonal) instead of a
  mat33 outer product per edge; the halves of E and W are applied once per atom;
- the cutoff test is a select, not a branch: ~30 % of the edges of a list built with a skin
  lie beyond the cutoff in no predictable pattern, and a mispredicted branch costs more than
  the arithmetic it saves (beyond the cutoff 1/r^2 is replaced by 0, which zeroes U and F);
- the periodic shift is a branch: it is zero for ~90 % of the edges, in long runs;
- one species (the common case) needs no per-edge type and table loads (-15 %).
"""
from __future__ import annotations

from typing import Any

from shardmd.domain.warp_setup import init_warp

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
    a = p[0] * inv_r6 * inv_r6
    b = p[1] * inv_r6
    return a - b - inside * p[2], (type(zero)(12.0) * a - type(zero)(6.0) * b) * inv_r2


def _lj_kernel(one_species: bool, pair_virial: bool):
    """The kernel, specialised at compile time (``wp.static``) for one species (parameters
    read once, no per-edge type lookups) and for the way the virial is summed."""

    @wp.kernel(enable_backward=False, module="unique")
    def lj_full_list(
        x: wp.array(dtype=Any),
        cell: wp.array(dtype=Any),
        offsets: wp.array(dtype=wp.int32),
        neighbors: wp.array(dtype=wp.int32),
        shifts: wp.array(dtype=wp.vec3i),
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
            j = neighbors[p]
            s = shifts[p]
            d = x[j] - xi
            shifted = (s[0] | s[1] | s[2]) != 0
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
             wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int32), wp.array(dtype=vec), int, scalar,
             wp.array(dtype=vec), wp.array(dtype=scalar), wp.array(dtype=mat)],
        )
    return lj_full_list


#: ``LJ_KERNELS[one_species, pair_virial]``
LJ_KERNELS = {(one, pair): _lj_kernel(one, pair) for one in (True, False) for pair in (True, False)}
