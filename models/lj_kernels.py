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
def _packed_edge(packed: wp.array(dtype=wp.int64), p: int):
    """(j, S, S != 0) of edge ``p`` of a packed list; S is decoded only when not zero (rare)."""
    v = packed[p]
    k = packed_shift_code(v)
    s = wp.vec3i(0, 0, 0)
    shifted = k != ZERO_SHIFT
    if shifted:
        s = shift_of_code(k)
    return packed_neighbor(v), s, shifted


@wp.func
def _array_edge(neighbors: wp.array(dtype=wp.int32), shifts: wp.array(dtype=wp.vec3i), p: int):
    """(j, S, S != 0) of edge ``p`` of a list kept as neighbour and shift arrays."""
    s = shifts[p]
    return neighbors[p], s, (s[0] | s[1] | s[2]) != 0


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
            if wp.static(packed_edges):
                j, s, shifted = _packed_edge(packed, p)
            else:
                j, s, shifted = _array_edge(neighbors, shifts, p)
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


class _Variants(dict):
    """``{(one_species, pair_virial, packed_edges): kernel}``, each made on first use: defining
    a Warp kernel parses and transforms its source (~15-30 ms of CPU each), and a run uses one
    or two of the eight variants, so making all at import cost every process ~0.3 s."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        key = tuple(bool(k) for k in key)
        if key not in self:
            self[key] = self._make(*key)
        return dict.__getitem__(self, key)


#: ``LJ_KERNELS[one_species, pair_virial, packed_edges]``
LJ_KERNELS = _Variants(_lj_kernel)


# -- half list (Newton's third law, CPU) --------------------------------------------------------
#
# A half list keeps one edge of each pair of query points: (i, j, S) with rank[j] > rank[i], or
# j == i (a point's own periodic image) with S > 0 lexicographically; the kernel adds -g to i and
# +g to j. ``rank`` is a point's place in the list's canonical order (``NeighborList.order``:
# the build's (bin, id) order, a function of positions and ids only), and the kernel visits the
# points in that order (``visit = order``), so a pair always belongs to the point visited first.
#
# Determinism (the engine's promise: memory order never changes a trajectory). Row a of the
# result is ((0 + g_1) + g_2 + ... + g_k) + f_a: the g are the pairs of a that other points own,
# added when their owners are visited (owners in canonical order, each owner's edges in its list
# order), and f_a, added last, is the sum of a's own edges in its list order. Every part of
# that order is canonical (the list's edge order is by ids and geometry: domain/neighbors.py),
# and a pair's force does not depend on which end owns it: fl(x_j - x_i) = -fl(x_i - x_j) and the
# image term negates exactly, so d, r^2 and fpr are the same bits from either end. Without a
# canonical order (a list built elsewhere) ``rank`` and ``visit`` are the identity: correct
# forces, summed in an order that follows memory order.
# Edges to points beyond the query points (ghosts: ``j >= n_newton``) are kept from the owned
# side only and counted one-sided (force on i, half the pair's energy and virial), LAMMPS's
# `newton off` for pairs that cross a domain face: the ghost's owner computes the same pair for
# its own atom, so no force has to travel back (no reverse exchange per step).
#
# The scatter to j is a read-modify-write of another atom's row, which is only deterministic when
# one thread runs the atoms in order: Warp's CPU launches are serial loops, so on the CPU the
# result is the same bits every run; on a GPU it would need atomics (order-dependent rounding),
# so CUDA keeps the full list (models/lj.py).


@wp.func
def _keep_half(i: int, j: int, rank_i: int, rank_j: int, code: wp.int32, n_newton: int):
    """True for the one kept edge of each pair (see above); ``code`` is the packed shift code,
    whose order is the lexicographic order of S (ZERO_SHIFT for S = 0)."""
    return j >= n_newton or rank_j > rank_i or (j == i and code > ZERO_SHIFT)


@wp.func
def _lex_positive(s: wp.vec3i):
    return s[0] > 0 or (s[0] == 0 and (s[1] > 0 or (s[1] == 0 and s[2] > 0)))


def _half_filter(packed_edges: bool, write: bool):
    """Count (``write`` False) or copy (True) the kept edges of a full list, per query point."""

    @wp.kernel(enable_backward=False, module="unique")
    def half_filter(offsets: wp.array(dtype=wp.int32), neighbors: wp.array(dtype=wp.int32),
                    shifts: wp.array(dtype=wp.vec3i), packed: wp.array(dtype=wp.int64), n_newton: int,
                    rank: wp.array(dtype=wp.int32), counts: wp.array(dtype=wp.int32),
                    out_offsets: wp.array(dtype=wp.int32),
                    out_neighbors: wp.array(dtype=wp.int32), out_shifts: wp.array(dtype=wp.vec3i),
                    out_packed: wp.array(dtype=wp.int64)):
        i = wp.tid()
        ri = rank[i]
        n = int(0)
        if wp.static(write):
            n = out_offsets[i]
        for p in range(offsets[i], offsets[i + 1]):
            keep = bool(False)
            if wp.static(packed_edges):
                v = packed[p]
                j = packed_neighbor(v)
                rj = ri
                if j < n_newton:
                    rj = rank[j]
                keep = _keep_half(i, j, ri, rj, packed_shift_code(v), n_newton)
                if wp.static(write):
                    if keep:
                        out_packed[n] = v
            else:
                j = neighbors[p]
                s = shifts[p]
                keep = j >= n_newton
                if not keep:
                    keep = rank[j] > ri or (j == i and _lex_positive(s))
                if wp.static(write):
                    if keep:
                        out_neighbors[n] = j
                        out_shifts[n] = s
            if keep:
                n += 1
        if wp.static(not write):
            counts[i] = n

    return half_filter


#: ``HALF_FILTER[packed_edges, write]``
HALF_FILTER = {(pk, w): _half_filter(pk, w) for pk in (True, False) for w in (True, False)}


def _lj_half_kernel(one_species: bool, pair_virial: bool, packed_edges: bool, energy: bool = True,
                    virial: bool | None = None):
    """The Lennard-Jones kernel on a half list (see above), specialised as :func:`_lj_kernel`,
    and for the sums: ``energy`` False leaves the energy and per-atom energies unsummed (zeros
    in ``acc``'s fourth column and ``tot_e``), ``virial`` False (default: as ``energy``) the
    virial (zeros in ``tot_w``); the forces are the same bits in every variant, and so is the
    virial with or without the energy (the same additions in the same order). Forces alone
    serve a step without output; the virial alone serves npt's steps without output (its
    pressure needs the virial every step, nobody reads the energy).

    ``acc`` (n_query, 4) is zero on entry and collects (force, per-atom energy) of each query
    point: its own edges' sums and what the edges of other points scatter into it.

    ``final != 0`` (the list's ownership follows the visit order, see above): when point i's
    visit ends its row is complete (every pair it does not own belongs to a point visited
    before it), so the kernel writes ``forces[i]``, ``energies[i]`` and adds i's energy and
    virial (``d (x) g`` of its edges with ``pair_virial``, else ``x_i (x) F_i`` plus its edges'
    image part ``(S @ cell) (x) g``) to the totals ``tot_e[0]``, ``tot_w[0]``: one serial sum
    in visit order, so the totals do not follow memory order either, and no per-atom virial
    array is written and summed again (``virials[0]``: the current row's image sum, scratch).
    ``final == 0``: ``acc`` keeps the rows and ``virials[i]``
    gets i's part of the virial (the image part only without ``pair_virial``: the caller adds
    ``sum_a x_a (x) F_a``); one-sided edges to ghosts count half the pair."""

    with_virial = energy if virial is None else bool(virial)

    @wp.kernel(enable_backward=False, module="unique")
    def lj_half_list(
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
        n_newton: int,
        visit: wp.array(dtype=wp.int32),
        acc: wp.array(dtype=Any),
        virials: wp.array(dtype=Any),
        final: int,
        forces: wp.array(dtype=Any),
        energies: wp.array(dtype=Any),
        tot_e: wp.array(dtype=Any),
        tot_w: wp.array(dtype=Any),
    ):
        i = visit[wp.tid()]
        h = cell[0]
        xi = x[i]
        zero = cutoff2 - cutoff2
        half = type(zero)(0.5)
        row = int(0)
        params = table[0]
        if wp.static(not one_species):
            row = types[i] * n_types
        f = type(xi)()
        e = zero
        w = type(h)()
        # Without pair_virial the row's image virial is summed in memory (virials[wrow]), not in
        # nine registers: with them live across the loop, next to f, e, x_i and the cell, the
        # loop spilled, and the rare shifted edges' outer product cost every edge ~15 % of the
        # call. Same additions in the same order: the same bits. The cell is read where used.
        wrow = int(0)
        if final == 0:
            wrow = i
        if wp.static(not pair_virial):
            virials[wrow] = w
        for p in range(offsets[i], offsets[i + 1]):
            if wp.static(packed_edges):
                j, s, shifted = _packed_edge(packed, p)
            else:
                j, s, shifted = _array_edge(neighbors, shifts, p)
            d = x[j] - xi
            image = type(xi)()
            if shifted:
                hh = cell[0]
                image = type(zero)(s[0]) * hh[0] + type(zero)(s[1]) * hh[1] + type(zero)(s[2]) * hh[2]
                d += image
            if wp.static(not one_species):
                params = table[row + types[j]]
            # no branch on the cutoff: beyond it u and g are zeros (the select in _lj_pair) and
            # j's update adds them, which changes no bit (x + 0 == x; the rows start at +0). In a
            # liquid ~30 % of a skin list's edges lie beyond the cutoff in no pattern, and the
            # mispredicted branch cost more than the update it skipped; on a perfect lattice it
            # is predictable, which is why calls on the start lattice did not show it
            # (docs/benchmarks.md: "the in-loop gap")
            u, fpr = _lj_pair(wp.dot(d, d), params, cutoff2)
            g = fpr * d  # force on j from i
            hu = zero
            if wp.static(energy):
                hu = half * u
                e += hu
            f -= g
            if j < n_newton:   # Newton's third law: j's share now
                aj = acc[j]
                acc[j] = type(aj)(aj[0] + g[0], aj[1] + g[1], aj[2] + g[2], aj[3] + hu)
                if wp.static(with_virial):
                    if wp.static(pair_virial):
                        w += wp.outer(d, g)
                    elif shifted:
                        virials[wrow] = virials[wrow] + wp.outer(image, g)
            else:              # one-sided edge to a ghost: half the pair is this rank's
                if wp.static(pair_virial and with_virial):
                    w += half * wp.outer(d, g)
        if wp.static(not pair_virial):
            w = virials[wrow]
        ai = acc[i]
        fi = type(xi)(ai[0] + f[0], ai[1] + f[1], ai[2] + f[2])
        ei = ai[3] + e
        if final != 0:
            forces[i] = fi
            energies[i] = ei
            if wp.static(with_virial):
                if wp.static(not pair_virial):
                    w += wp.outer(xi, fi)
                tot_w[0] = tot_w[0] + w
            if wp.static(energy):
                tot_e[0] = tot_e[0] + ei
        else:
            acc[i] = type(ai)(fi[0], fi[1], fi[2], ei)
            virials[i] = w

    for vec, vec4, mat, scalar in ((wp.vec3f, wp.vec4f, wp.mat33f, wp.float32),
                                   (wp.vec3d, wp.vec4d, wp.mat33d, wp.float64)):
        wp.overload(
            lj_half_list,
            [wp.array(dtype=vec), wp.array(dtype=mat), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
             wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int64), wp.array(dtype=wp.int32), wp.array(dtype=vec), int,
             scalar, int, wp.array(dtype=wp.int32), wp.array(dtype=vec4), wp.array(dtype=mat), int,
             wp.array(dtype=vec), wp.array(dtype=scalar), wp.array(dtype=scalar), wp.array(dtype=mat)],
        )
    return lj_half_list


#: ``LJ_HALF_KERNELS[one_species, pair_virial, packed_edges, energy, virial]``
LJ_HALF_KERNELS = _Variants(_lj_half_kernel)
