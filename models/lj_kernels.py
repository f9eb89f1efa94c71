"""Warp kernel of the Lennard-Jones pair potential on a full CSR neighbour list.

For each query atom i and each edge (i, j, S) with ``d = x[j] + S @ cell - x[i]`` and
``r = |d| < cutoff``:

    U(r)      = c12 / r^12 - c6 / r^6 - u_shift          (eV; c12 = 4 eps sigma^12, c6 = 4 eps sigma^6)
    F_i      += -(12 c12 / r^12 - 6 c6 / r^6) / r^2 * d  (eV/Å)
    E_i      += U / 2                                     (each pair is seen from both ends)
    W_i      += (12 c12 / r^12 - 6 c6 / r^6) / r^2 * d (x) d / 2   (virial, eV)

Because the list is full, each atom's sums need no atomics: results are deterministic on
CPU and GPU, and atom i's force uses its neighbours in the list's (id-sorted) order.

What makes it fast (docs/benchmarks.md has the numbers):

- the virial is symmetric: 6 running sums (two vec3: diagonal, off-diagonal) instead of a
  mat33 outer product per edge; the halves of E and W are applied once per atom;
- the cutoff test is a select, not a branch: about 30 % of the edges of a list built with a
  skin lie beyond the cutoff, in no predictable pattern, and a mispredicted branch costs more
  than the arithmetic it skips (1/r^2 is replaced by 0 there, which zeroes U and F);
- the periodic shift is a branch: it is zero for ~90 % of the edges, in long runs.
"""
from __future__ import annotations

from typing import Any

from shardmd.domain.warp_setup import init_warp

wp = init_warp()
# forward-only kernels: no adjoint code (halves compile time)
wp.set_module_options({"enable_backward": False})


@wp.kernel
def lj_full_list(
    x: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    types: wp.array(dtype=wp.int32),
    offsets: wp.array(dtype=wp.int32),
    neighbors: wp.array(dtype=wp.int32),
    shifts: wp.array(dtype=wp.vec3i),
    c12: wp.array(dtype=Any),
    c6: wp.array(dtype=Any),
    u_shift: wp.array(dtype=Any),
    n_types: int,
    cutoff2: Any,
    forces: wp.array(dtype=Any),
    energies: wp.array(dtype=Any),
    virials: wp.array(dtype=Any),
):
    i = wp.tid()
    h = cell[0]
    xi = x[i]
    ti = types[i] * n_types
    zero = cutoff2 - cutoff2
    one = type(zero)(1.0)
    f = type(xi)()
    e = zero
    w_diag = type(xi)()  # sum of fpr * (dx dx, dy dy, dz dz)
    w_off = type(xi)()   # sum of fpr * (dy dz, dx dz, dx dy)
    for p in range(offsets[i], offsets[i + 1]):
        j = neighbors[p]
        s = shifts[p]
        d = x[j] - xi
        if s[0] != 0 or s[1] != 0 or s[2] != 0:
            d += type(zero)(s[0]) * h[0] + type(zero)(s[1]) * h[1] + type(zero)(s[2]) * h[2]
        r2 = wp.dot(d, d)
        k = ti + types[j]
        inside = r2 < cutoff2
        inv_r2 = wp.where(inside, one / r2, zero)
        inv_r6 = inv_r2 * inv_r2 * inv_r2
        a = c12[k] * inv_r6 * inv_r6
        b = c6[k] * inv_r6
        e += wp.where(inside, a - b - u_shift[k], zero)
        fpr = (type(zero)(12.0) * a - type(zero)(6.0) * b) * inv_r2
        fd = fpr * d
        f -= fd
        w_diag += wp.cw_mul(fd, d)
        w_off += type(xi)(fd[1] * d[2], fd[0] * d[2], fd[0] * d[1])
    half = type(zero)(0.5)
    forces[i] = f
    energies[i] = half * e
    w_diag = half * w_diag
    w_off = half * w_off
    virials[i] = type(h)(w_diag[0], w_off[2], w_off[1],
                         w_off[2], w_diag[1], w_off[0],
                         w_off[1], w_off[0], w_diag[2])


for _vec, _mat, _s in ((wp.vec3f, wp.mat33f, wp.float32), (wp.vec3d, wp.mat33d, wp.float64)):
    wp.overload(
        lj_full_list,
        [wp.array(dtype=_vec), wp.array(dtype=_mat), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.int32), wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i),
         wp.array(dtype=_s), wp.array(dtype=_s), wp.array(dtype=_s), int, _s,
         wp.array(dtype=_vec), wp.array(dtype=_s), wp.array(dtype=_mat)],
    )
