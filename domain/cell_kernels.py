"""The CPU's fold of points into the cell (:func:`domain.cell.wrap`): one Warp pass over the
rows, where torch takes two linear solves and a dozen whole-array operations (~0.4 ms at
4,000 points, once per neighbour build: a small system builds every few steps).

The fold is the neighbour binning's own (domain/neighbor_kernels.py ``bin_points``):
fractional coordinates ``f = hinv x`` with ``hinv = (cell^T)^-1``, ``s = floor(f)`` on periodic
axes, ``x - (s_0 a_0 + s_1 a_1 + s_2 a_2)``, so a folded point bins with a zero image. A point
that round-off leaves at ``f == 1.0`` after the fold is folded once more.
"""
from __future__ import annotations

from typing import Any

import torch

from .warp_setup import KeptLaunch, init_warp

wp = init_warp()
wp.set_module_options({"enable_backward": False})


@wp.kernel
def fold_points(
    x: wp.array(dtype=Any),
    hinv: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    pbc: wp.vec3i,
    images: wp.array(dtype=wp.vec3i),
    xw: wp.array(dtype=Any),
    images_out: wp.array(dtype=wp.vec3i),
):
    """Point i folded into the cell (``xw``) and its image flags moved by the cells it crossed."""
    i = wp.tid()
    h = cell[0]
    y = x[i]
    s = wp.vec3i(0, 0, 0)
    for _ in range(2):   # the second fold: round-off can leave a folded point at f == 1.0
        f = hinv[0] * y
        e = type(f)()
        for k in range(3):
            if pbc[k] != 0:
                e[k] = wp.floor(f[k])
        # the cells crossed as floats: a point flung beyond the int32 range (a run blowing up) is
        # folded back as torch's fold does (then overlaps, and the run's non-finite check stops it)
        # instead of keeping the saturated integer's nonsense; NaN stays NaN
        zero = type(f[0])(0.0)
        if e[0] != zero or e[1] != zero or e[2] != zero:   # (NaN != 0: folded, stays NaN)
            y = y - (e[0] * h[0] + e[1] * h[1] + e[2] * h[2])
            s = s + wp.vec3i(int(e[0]), int(e[1]), int(e[2]))
    xw[i] = y
    images_out[i] = images[i] + s


for _vec, _mat in ((wp.vec3f, wp.mat33f), (wp.vec3d, wp.mat33d)):
    wp.overload(fold_points, [wp.array(dtype=_vec), wp.array(dtype=_mat), wp.array(dtype=_mat), wp.vec3i,
                              wp.array(dtype=wp.vec3i), wp.array(dtype=_vec), wp.array(dtype=wp.vec3i)])

_fold = KeptLaunch(fold_points)


def fold(positions: torch.Tensor, cell: torch.Tensor, hinv: torch.Tensor, pbc: tuple[bool, bool, bool],
         images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(folded positions (n, 3) Å, image flags (n, 3) int32): positions (n, 3) float32/float64
    on the CPU, cell (3, 3) of their dtype, hinv its ``(cell^T)^-1``, images (n, 3) int32."""
    xw = torch.empty_like(positions)
    out = torch.empty_like(images)
    _fold(positions.dtype, int(positions.shape[0]), "cpu",
          [positions, hinv[None], cell[None], wp.vec3i(*[int(p) for p in pbc]), images, xw, out])
    return xw, out
