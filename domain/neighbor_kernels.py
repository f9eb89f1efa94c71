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
# forward-only kernels: no adjoint code (halves compile time)
wp.set_module_options({"enable_backward": False})


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


@wp.func
def _fold(b: int, n: int):
    """Bin index ``b`` on a periodic axis of ``n`` bins folded into ``[0, n)``, and the
    number of periods folded (``b = folded + periods * n``).  Integer division is slow on
    CPUs and ``b`` is rarely more than one period out, so this steps."""
    s = int(0)
    while b < 0:
        b += n
        s -= 1
    while b >= n:
        b -= n
        s += 1
    return b, s


@wp.func
def _row_extent(c2: int, reach2: int, n2: int, periodic: int):
    """The d2 extent of every row of bins around bin coordinate ``c2``: all of it on a periodic
    axis, clipped to the grid on an open one."""
    lo2 = -reach2
    hi2 = reach2
    if periodic == 0:
        lo2 = wp.max(lo2, -c2)
        hi2 = wp.min(hi2, n2 - 1 - c2)
    return lo2, hi2


@wp.func
def _axis_bin(b: int, n: int, periodic: int):
    """Bin index ``b`` on an axis of ``n`` bins: (folded bin, periods folded, 1 if it is on the
    grid; an open axis's bins past the grid are skipped, 0)."""
    s = int(0)
    inside = int(1)
    if periodic != 0:
        b, s = _fold(b, n)
    elif b < 0 or b >= n:
        inside = 0
    return b, s, inside


@wp.func
def _gap(d: int, u: Any, width: Any):
    """Distance (Å, >= 0) from a point at fraction ``u`` of its bin's width along an axis to
    the bin ``d`` bins away: the slab between them (bins of perpendicular ``width``)."""
    g = type(u)(0.0)
    if d > 0:
        g = (type(u)(d) - u) * width
    elif d < 0:
        g = (u - type(u)(1 + d)) * width   # d = -1: u widths down to the bin below
    return wp.max(g, type(u)(0.0))


@wp.func
def _trim(lo: int, hi: int, u: Any, width: Any, rem: Any):
    """The bins [lo, hi] of a row cut to those whose gap along the row's axis, squared, is
    below ``rem`` (the gap grows away from the point's own bin, offset 0): :func:`_gap` solved
    for d, ``d < u + s`` above and ``d > u - 1 - s`` below, s = sqrt(rem) / width bins."""
    s = wp.sqrt(rem) / width
    first = wp.min(wp.max(lo, int(wp.floor(u - type(u)(1.0) - s)) + 1), 0)
    return first, wp.max(wp.min(hi, int(wp.ceil(u + s)) - 1), 0)


@wp.func
def _upper_image(s0: int, s1: int, s2: int):
    """True when the shift S is > 0 lexicographically (a half list then keeps i's own image)."""
    return s0 > 0 or (s0 == 0 and (s1 > 0 or (s1 == 0 and s2 > 0)))


@wp.func
def _part_range(bin_start: wp.array(dtype=wp.int32), at: int, n_bins: int, skip: int, upper: bool, slot: int):
    """Slots [first, last) of a run of ``n_bins`` bins whose first bin start is ``bin_start[at]``;
    ``skip`` (a half list's query points): only the slots after ``i``'s (from ``i``'s own when
    the run is an upper image)."""
    first = bin_start[at]
    last = bin_start[at + n_bins]
    if skip != 0:
        first = wp.min(wp.max(first, wp.where(upper, slot, slot + 1)), last)
    return first, last


#: a packed edge holds each shift component in [-PACK_LIMIT, PACK_LIMIT) (10 bits each) above
#: the neighbour index (31 bits); a zero shift packs to ``ZERO_SHIFT``
PACK_LIMIT = 512
ZERO_SHIFT = (512 << 20) | (512 << 10) | 512


@wp.func
def packed_neighbor(v: wp.int64):
    """The neighbour index of a packed edge."""
    return wp.int32(v & wp.int64(2147483647))


@wp.func
def packed_shift_code(v: wp.int64):
    """The shift of a packed edge, still packed (``ZERO_SHIFT`` when S = 0)."""
    return wp.int32(v >> wp.int64(31))


@wp.func
def shift_of_code(k: wp.int32):
    """The shift S (vec3i) of a packed shift code."""
    return wp.vec3i(((k >> 20) & 1023) - 512, ((k >> 10) & 1023) - 512, (k & 1023) - 512)


@wp.func
def _pack(j: int, s: wp.vec3i):
    k = ((s[0] + 512) << 20) | ((s[1] + 512) << 10) | (s[2] + 512)
    return (wp.int64(k) << wp.int64(31)) | wp.int64(j)


@wp.kernel
def unpack_edges(packed: wp.array(dtype=wp.int64), neighbors: wp.array(dtype=wp.int32),
                 shifts: wp.array(dtype=wp.vec3i)):
    """Edge ``p`` of a packed list into ``neighbors[p]`` and ``shifts[p]`` (coalesced)."""
    p = wp.tid()
    v = packed[p]
    neighbors[p] = packed_neighbor(v)
    shifts[p] = shift_of_code(packed_shift_code(v))


@wp.func
def _lowest_bit(bits: wp.uint32):
    """Index of the lowest set bit of a non-zero word."""
    return wp.bit_count((bits & (wp.uint32(0) - bits)) - wp.uint32(1))


@wp.kernel
def scan_neighbors(
    xs: wp.array(dtype=Any),
    order: wp.array(dtype=wp.int32),
    rank: wp.array(dtype=wp.int32),
    bin_start: wp.array(dtype=wp.int32),
    bin_of: wp.array(dtype=wp.int32),
    img: wp.array(dtype=wp.vec3i),
    cell: wp.array(dtype=Any),
    pbc: wp.vec3i,
    nb: wp.vec3i,
    reach: wp.vec3i,
    cutoff2: Any,
    word_start: wp.array(dtype=wp.int32),
    half: int,
    write: int,
    mask: wp.array(dtype=wp.uint32),
    offsets: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    neighbors: wp.array(dtype=wp.int32),
    shifts: wp.array(dtype=wp.vec3i),
    packed: wp.array(dtype=wp.int64),
):
    """Neighbours of query point ``i`` in two passes over the same candidates.

    The candidates are the points of the ``(2 reach + 1)^3`` bins around ``i``'s bin, in a
    fixed order: bin offsets lexicographically, then each bin's points in (bin, id) order.
    ``xs`` holds the wrapped positions in that sorted order, so the bins ``d2 = -reach ..
    reach`` of a row are one contiguous *run* of ``xs`` (split in two where the row wraps
    around a periodic boundary).  Candidate number ``c`` owns bit ``c`` of ``i``'s mask
    words, which start at ``word_start[i]``.

    ``write == 0`` (mark): distance test of every candidate (branch-free), set the bit of
    each hit; ``counts[i]`` = number of hits.
    ``write == 1`` (emit): visit only the set bits, in candidate order, and write those
    neighbours from ``offsets[i]`` on.
    ``write == 2`` (emit packed): the same edges, each as one int64 (:func:`_pack`), for
    :func:`unpack_edges`. Each thread writes its own stretch of the list, so a warp's stores
    land in 32 places and their number, not their bytes, sets the cost: one 8-byte store per
    edge instead of four 4-byte ones (the neighbour and the three shift components) is a
    quarter of the scattered stores (docs/benchmarks.md, "LJ at 4 M atoms"); the unpacking
    then writes coalesced.

    ``half != 0`` keeps one edge per pair of query points (Newton's third law, for a pair model
    that adds the force on j to j's row): the candidate whose sorted slot follows ``i``'s, and a
    point's own periodic image for S > 0 lexicographically, by skipping the slots before
    ``i``'s in each run (half the candidates, never tested).  ``half == 2``: every point is a
    query point.  ``half == 1``: the query points and the others (ghosts: points past the query ones)
    are sorted apart (``bin_start`` holds both parts' bin starts: :class:`_Bins` ``split``),
    so a row of bins is two runs: the query points' with the skip, then the ghosts', all kept
    (one-sided).
    """
    i = wp.tid()
    h = cell[0]
    n_cells = nb[0] * nb[1] * nb[2]
    parts = bin_start.shape[0] // (n_cells + 1)   # 2: query points and ghosts sorted apart (_Bins)
    slot = rank[i]
    xi = xs[slot]
    ci = _bin_coords(bin_of[i], nb)
    zero = type(xi[0])(0.0)
    first_word = word_start[i]
    bits = wp.uint32(0)
    c = int(0)
    n_found = int(0)
    if write == 1 or write == 2:
        n_found = offsets[i]
    lo2, hi2 = _row_extent(ci[2], reach[2], nb[2], pbc[2])
    for d0 in range(-reach[0], reach[0] + 1):
        b0, s0, in0 = _axis_bin(ci[0] + d0, nb[0], pbc[0])
        if in0 == 0:
            continue
        for d1 in range(-reach[1], reach[1] + 1):
            b1, s1, in1 = _axis_bin(ci[1] + d1, nb[1], pbc[1])
            if in1 == 0:
                continue
            row = (b0 * nb[1] + b1) * nb[2]
            d2 = lo2
            while d2 <= hi2:
                # one run: bins b2 .. b2 + n_bins - 1 of this row, all with image s2
                b2, s2, in2 = _axis_bin(ci[2] + d2, nb[2], pbc[2])
                n_bins = wp.min(hi2 - d2 + 1, nb[2] - b2)
                d2 += n_bins
                s_pos = _upper_image(s0, s1, s2)
                for part in range(parts):
                    # part 0: the query points (all points unless split); part 1: the others
                    skip = wp.where(half == 2 or (half == 1 and part == 0), 1, 0)
                    first, last = _part_range(bin_start, part * (n_cells + 1) + row + b2, n_bins, skip, s_pos, slot)
                    if write == 0:
                        offset = type(zero)(s0) * h[0] + type(zero)(s1) * h[1] + type(zero)(s2) * h[2] - xi
                        # i itself is no neighbour of its own zero image
                        own = -1
                        if s0 == 0 and s1 == 0 and s2 == 0:
                            own = slot
                        for p in range(first, last):
                            dx = xs[p] + offset
                            hit = wp.where(wp.dot(dx, dx) < cutoff2, wp.where(p != own, 1, 0), 0)
                            bits = bits | (wp.uint32(hit) << wp.uint32(c & 31))
                            c += 1
                            if (c & 31) == 0:
                                mask[first_word + (c >> 5) - 1] = bits
                                n_found += wp.bit_count(bits)
                                bits = wp.uint32(0)
                    else:
                        shift = wp.vec3i(s0, s1, s2) + img[i]
                        c_first = c  # candidate number of xs[first]
                        end = c + last - first
                        while c < end:
                            # the bits of this run held by word c >> 5
                            n_bits = wp.min(32 - (c & 31), end - c)
                            w = mask[first_word + (c >> 5)] >> wp.uint32(c & 31)
                            if n_bits < 32:
                                w = w & ((wp.uint32(1) << wp.uint32(n_bits)) - wp.uint32(1))
                            while w != wp.uint32(0):
                                j = order[first + c - c_first + _lowest_bit(w)]
                                if write == 1:
                                    neighbors[n_found] = j
                                    shifts[n_found] = shift - img[j]
                                else:
                                    packed[n_found] = _pack(j, shift - img[j])
                                n_found += 1
                                w = w & (w - wp.uint32(1))
                            c += n_bits
    if write == 0:
        if (c & 31) != 0:
            mask[first_word + (c >> 5)] = bits
            n_found += wp.bit_count(bits)
        counts[i] = n_found



@wp.kernel
def scan_serial(
    xs: wp.array(dtype=Any),
    rank: wp.array(dtype=wp.int32),
    bin_start: wp.array(dtype=wp.int32),
    bin_of: wp.array(dtype=wp.int32),
    img: wp.array(dtype=wp.vec3i),
    cell: wp.array(dtype=Any),
    pbc: wp.vec3i,
    nb: wp.vec3i,
    reach: wp.vec3i,
    cutoff2: Any,
    half: int,
    offsets: wp.array(dtype=wp.int32),
    packed: wp.array(dtype=wp.int64),
    slot_words: wp.array(dtype=wp.int64),
    hinv: wp.array(dtype=Any),
    bin_width: Any,
    reach_r: Any,
    orthogonal: int,
):
    """The CPU's search: one thread (``dim=1``) visits the query points in index order and
    writes each hit at a running cursor, so one pass over the candidates gives the list
    :func:`scan_neighbors` makes in two (the same candidates, order and edges; no mask).

    ``offsets`` (n_query + 1,): each row's start, and the edge count in the last entry, also
    past ``packed``'s length (nothing is written there: the caller reserves that many and
    runs it again). ``slot_words[p]``: ``_pack(order[p], -img[order[p]])``; the pack is linear
    in the shift's fields, so a candidate's word is that plus the run's shift, one sequential
    load. The candidate loop tests branch-free and stores every candidate, a hit moving the
    cursor (a branch on the hit, mispredicted, cost as much as the test).

    Bins no point of which can be within ``reach_r`` (Å: the cutoff and a rounding margin) of
    point i are not visited (:func:`_gap`; ``bin_width``: the bins' perpendicular widths, Å;
    ``orthogonal``: the gaps of the three axes add in quadrature, else only the largest
    counts): about a third of the cube of bins, none of which holds a hit, so the list is
    the same. A half list of the query points alone (``half == 2``) also skips the rows of
    bins whose linear index is below i's bin: their slots are all below i's."""
    h = cell[0]
    r2 = reach_r * reach_r
    n_cells = nb[0] * nb[1] * nb[2]
    parts = bin_start.shape[0] // (n_cells + 1)
    n_q = offsets.shape[0] - 1
    capacity = packed.shape[0]
    n_out = int(0)
    for i in range(n_q):
        offsets[i] = n_out
        slot = rank[i]
        xi = xs[slot]
        ci = _bin_coords(bin_of[i], nb)
        shift_i = img[i]
        lo2, hi2 = _row_extent(ci[2], reach[2], nb[2], pbc[2])
        fi = _frac(xi, hinv[0])
        u = type(xi)(fi[0] * type(xi[0])(nb[0]) - type(xi[0])(ci[0]), fi[1] * type(xi[0])(nb[1]) - type(xi[0])(ci[1]),
                     fi[2] * type(xi[0])(nb[2]) - type(xi[0])(ci[2]))
        for d0 in range(-reach[0], reach[0] + 1):
            b0, s0, in0 = _axis_bin(ci[0] + d0, nb[0], pbc[0])
            g0 = _gap(d0, u[0], bin_width[0])
            # a half list of the query points alone keeps no slot below i's: a row of bins all
            # below i's bin holds none it keeps
            if in0 == 0 or g0 * g0 >= r2 or (half == 2 and b0 < ci[0]):
                continue
            for d1 in range(-reach[1], reach[1] + 1):
                b1, s1, in1 = _axis_bin(ci[1] + d1, nb[1], pbc[1])
                g1 = _gap(d1, u[1], bin_width[1])
                base = wp.where(orthogonal != 0, g0 * g0 + g1 * g1, wp.max(g0 * g0, g1 * g1))
                if in1 == 0 or base >= r2 or (half == 2 and b0 == ci[0] and b1 < ci[1]):
                    continue
                rem = wp.where(orthogonal != 0, r2 - base, r2)   # what the axis-2 gap may still take
                first2, last2 = _trim(lo2, hi2, u[2], bin_width[2], rem)
                row = (b0 * nb[1] + b1) * nb[2]
                d2 = first2
                while d2 <= last2:
                    b2, s2, in2 = _axis_bin(ci[2] + d2, nb[2], pbc[2])
                    n_bins = wp.min(last2 - d2 + 1, nb[2] - b2)
                    d2 += n_bins
                    s_pos = _upper_image(s0, s1, s2)
                    shift = wp.vec3i(s0, s1, s2) + shift_i
                    run_word = ((wp.int64(shift[0]) * wp.int64(1024) + wp.int64(shift[1])) * wp.int64(1024)
                                + wp.int64(shift[2])) * wp.int64(2147483648)
                    offset = type(xi[0])(s0) * h[0] + type(xi[0])(s1) * h[1] + type(xi[0])(s2) * h[2] - xi
                    own = -1   # i is no neighbour of its own zero image
                    if s0 == 0 and s1 == 0 and s2 == 0:
                        own = slot
                    for part in range(parts):
                        skip = wp.where(half == 2 or (half == 1 and part == 0), 1, 0)
                        first, last = _part_range(bin_start, part * (n_cells + 1) + row + b2, n_bins, skip, s_pos,
                                                  slot)
                        if (half != 0 or own < first or own >= last) and n_out + last - first <= capacity:
                            # the common case: nothing to exclude (a half list skips i's slot), room
                            for p in range(first, last):
                                dx = xs[p] + offset
                                packed[n_out] = slot_words[p] + run_word
                                n_out += wp.where(wp.dot(dx, dx) < cutoff2, 1, 0)
                        else:
                            for p in range(first, last):
                                dx = xs[p] + offset
                                hit = wp.where(wp.dot(dx, dx) < cutoff2, wp.where(p != own, 1, 0), 0)
                                if n_out < capacity:
                                    packed[n_out] = slot_words[p] + run_word
                                n_out += hit
    offsets[n_q] = n_out


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
        scan_serial,
        [wp.array(dtype=_vec), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.vec3i), wp.array(dtype=_mat), wp.vec3i, wp.vec3i, wp.vec3i, _s, int,
         wp.array(dtype=wp.int32), wp.array(dtype=wp.int64), wp.array(dtype=wp.int64),
         wp.array(dtype=_mat), _vec, _s, int],
    )
    wp.overload(
        scan_neighbors,
        [wp.array(dtype=_vec), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.int32), wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i),
         wp.array(dtype=_mat), wp.vec3i, wp.vec3i, wp.vec3i, _s, wp.array(dtype=wp.int32), int, int,
         wp.array(dtype=wp.uint32), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
         wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i), wp.array(dtype=wp.int64)],
    )
