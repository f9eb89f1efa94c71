"""Emit-pass variants of scan_neighbors (experiment): what do its stores cost?
variant 0: neighbors + vec3i shifts (as now); 1: neighbors only; 2: one int64 per edge
(neighbour | packed shift); 3: neighbors + one int32 packed shift."""
from typing import Any
from shardmd.domain.warp_setup import init_warp
from shardmd.domain.neighbor_kernels import _bin_coords, _fold, _lowest_bit
wp = init_warp()
wp.set_module_options({"enable_backward": False})

@wp.kernel
def emit_v(xs: wp.array(dtype=Any), order: wp.array(dtype=wp.int32), rank: wp.array(dtype=wp.int32),
           bin_start: wp.array(dtype=wp.int32), bin_of: wp.array(dtype=wp.int32), img: wp.array(dtype=wp.vec3i),
           pbc: wp.vec3i, nb: wp.vec3i, reach: wp.vec3i, word_start: wp.array(dtype=wp.int32),
           mask: wp.array(dtype=wp.uint32), offsets: wp.array(dtype=wp.int32), variant: int,
           neighbors: wp.array(dtype=wp.int32), shifts: wp.array(dtype=wp.vec3i),
           packed: wp.array(dtype=wp.int64), code: wp.array(dtype=wp.int32)):
    i = wp.tid()
    ci = _bin_coords(bin_of[i], nb)
    first_word = word_start[i]
    c = int(0)
    n_found = offsets[i]
    lo2 = -reach[2]
    hi2 = reach[2]
    imi = img[i]
    for d0 in range(-reach[0], reach[0] + 1):
        b0, s0 = _fold(ci[0] + d0, nb[0])
        for d1 in range(-reach[1], reach[1] + 1):
            b1, s1 = _fold(ci[1] + d1, nb[1])
            row = (b0 * nb[1] + b1) * nb[2]
            d2 = lo2
            while d2 <= hi2:
                b2, s2 = _fold(ci[2] + d2, nb[2])
                n_bins = wp.min(hi2 - d2 + 1, nb[2] - b2)
                d2 += n_bins
                first = bin_start[row + b2]
                last = bin_start[row + b2 + n_bins]
                shift = wp.vec3i(s0, s1, s2) + imi
                c_first = c
                end = c + last - first
                while c < end:
                    n_bits = wp.min(32 - (c & 31), end - c)
                    w = mask[first_word + (c >> 5)] >> wp.uint32(c & 31)
                    if n_bits < 32:
                        w = w & ((wp.uint32(1) << wp.uint32(n_bits)) - wp.uint32(1))
                    while w != wp.uint32(0):
                        j = order[first + c - c_first + _lowest_bit(w)]
                        sj = shift - img[j]
                        if variant == 0:
                            neighbors[n_found] = j
                            shifts[n_found] = sj
                        elif variant == 1:
                            neighbors[n_found] = j
                        elif variant == 2:
                            k = (sj[0] + 512) * 1048576 + (sj[1] + 512) * 1024 + (sj[2] + 512)
                            packed[n_found] = wp.int64(k) * wp.int64(2147483648) + wp.int64(j)
                        else:
                            neighbors[n_found] = j
                            code[n_found] = (sj[0] + 512) * 1048576 + (sj[1] + 512) * 1024 + (sj[2] + 512)
                        n_found += 1
                        w = w & (w - wp.uint32(1))
                    c += n_bits

for _vec in (wp.vec3f, wp.vec3d):
    wp.overload(emit_v, [wp.array(dtype=_vec), wp.array(dtype=wp.int32), wp.array(dtype=wp.int32),
                         wp.array(dtype=wp.int32), wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i),
                         wp.vec3i, wp.vec3i, wp.vec3i, wp.array(dtype=wp.int32), wp.array(dtype=wp.uint32),
                         wp.array(dtype=wp.int32), int, wp.array(dtype=wp.int32), wp.array(dtype=wp.vec3i),
                         wp.array(dtype=wp.int64), wp.array(dtype=wp.int32)])
