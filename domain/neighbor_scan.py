"""The CPU's one-pass search and the candidate counts of the cell-list search
(domain/neighbors.py builds the bins and the list; the kernels are domain/neighbor_kernels.py).

Every function here takes the binned points (``neighbors._Bins``: ``nb``, ``reach``,
``per_bin``, ``bin_of``, ``img``, ``order``, ``xs``, ``dtype``) and returns plain tensors.
"""
from __future__ import annotations

import math

import torch

from . import neighbor_kernels as nk
from .cell import inverse_transpose
from .grid_shape import perpendicular_widths_of
from .warp_setup import KeptLaunch, init_warp, scalar_type, vec3_type

wp = init_warp()
_SCAN_SERIAL = KeptLaunch(nk.scan_serial)   # its launch, replayed (the arrays re-pointed at each build's)


def _candidates(b, pbc, nq: int) -> torch.Tensor:
    """(nq,) the candidates the scan tests for each query point: the points in the ``(2 reach +
    1)^3`` bins around its own (periodic axes wrap, possibly more than once in small cells; open
    axes stop at the grid)."""
    nb, reach = b.nb, b.reach
    c = b.per_bin.view(nb[0], nb[1], nb[2])
    for axis in range(3):
        total = torch.zeros_like(c)
        for d in range(-reach[axis], reach[axis] + 1):
            if pbc[axis]:
                total += torch.roll(c, shifts=-d, dims=axis)  # total[b] += c[(b + d) mod nb]
            elif d >= 0:
                total.narrow(axis, 0, nb[axis] - d).add_(c.narrow(axis, d, nb[axis] - d))
            else:
                total.narrow(axis, -d, nb[axis] + d).add_(c.narrow(axis, 0, nb[axis] + d))
        c = total
    return c.reshape(-1)[b.bin_of[:nq].long()]


def _refuse_too_many(candidates: int) -> None:
    """One line for a search whose candidate pairs the int32 indices cannot count."""
    if candidates >= 2**36:
        raise ValueError(f"neighbour search: {candidates} candidate pairs exceed the int32 index range; "
                         "the cutoff is far too large for this system")


def candidate_words(b, pbc_t, nq: int) -> tuple[torch.Tensor, int, int]:
    """(word_start (nq + 1,) int64, mask words in all, the largest bin image): one mask bit per
    candidate; point i owns ceil(candidates / 32) words from word_start[i]."""
    candidates = _candidates(b, pbc_t, nq)
    word_start = torch.zeros(nq + 1, dtype=torch.int64, device=candidates.device)
    word_start[1:] = torch.cumsum((candidates + 31) // 32, 0)
    # one read-back for two sizes: the mask words, and the largest bin image (packed edges)
    n_words, max_img = torch.stack([word_start[-1], b.img.abs().max().to(torch.int64)]).tolist()
    _refuse_too_many(32 * n_words)   # the mask's words are indexed in int32
    return word_start, n_words, max_img


def prune_args(cell: torch.Tensor, b, cutoff: float, max_img: int) -> list:
    """``scan_serial``'s pruning arguments: hinv, the bins' perpendicular widths (Å), the
    radius no bin beyond which is visited (the cutoff and a margin of the positions' rounding:
    points up to ``max_img`` cells out) and whether the cell's axes are orthogonal."""
    rows = cell.detach().to(torch.float64).cpu().tolist()
    widths = perpendicular_widths_of(rows)
    norms = [math.sqrt(sum(c * c for c in r)) for r in rows]
    eps = torch.finfo(b.dtype).eps
    margin = 64 * eps * ((max_img + 2) * sum(norms) + cutoff)
    dots = [abs(sum(rows[i][k] * rows[j][k] for k in range(3))) for i, j in ((0, 1), (0, 2), (1, 2))]
    orthogonal = all(d <= 1e-12 * norms[i] * norms[j] for d, (i, j) in zip(dots, ((0, 1), (0, 2), (1, 2))))
    vec, scalar = vec3_type(b.dtype), scalar_type(b.dtype)
    return [inverse_transpose(cell)[None], vec(*[widths[k] / b.nb[k] for k in range(3)]), scalar(cutoff + margin),
            int(orthogonal)]


def scan_serial(b, inputs: list, prune: list, pbc_t, nq: int, capacity) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets (nq + 1,), packed edges (E,)) from ``scan_serial``: one pass, or two when the
    edges outnumber the reserve (the second with exactly their count). ``inputs`` and ``prune``:
    the kernel's arguments, arrays as torch tensors."""
    device = b.xs.device
    # candidates: counted when no reserve is given, or when a cheap bound (the fullest bin's
    # points in every bin scanned) does not rule out more than the int32 counts hold
    bound = nq * int(b.per_bin.max()) * math.prod(2 * r + 1 for r in b.reach)
    if capacity is None or bound >= 2**36:
        candidates = int(_candidates(b, pbc_t, nq).sum())
        _refuse_too_many(candidates)
        capacity = candidates // 3 if capacity is None else capacity   # a sphere fills ~27 % of the cube
    # each sorted slot's packed word with the run's shift zero (nk._pack(j, -img_j))
    ims = 512 - (b.img if b.identity else b.img[b.order.long()]).to(torch.int64)
    words = (((((ims[:, 0] << 10) | ims[:, 1]) << 10 | ims[:, 2]) << 31) | b.order.long()).contiguous()
    offsets = torch.empty(nq + 1, dtype=torch.int32, device=device)
    cap = max(int(capacity), 1)
    for _ in range(2):
        packed = torch.empty(cap, dtype=torch.int64, device=device)
        _SCAN_SERIAL(b.dtype, 1, "cpu", inputs + [offsets, packed, words] + prune)
        n_edges = int(offsets[-1])
        if n_edges <= cap:
            break
        cap = n_edges
    return offsets, packed[:n_edges]
