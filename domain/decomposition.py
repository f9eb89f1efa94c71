"""Spatial decomposition of a (possibly triclinic) cell into a Px x Py x Pz grid of domains.

Domains are slabs in fractional coordinates: domain (i, j, k) owns the points with
``f_0 in [i/Px, (i+1)/Px)`` and so on.  Its thickness perpendicular to the faces is
``t_k = w_k / P_k`` with ``w_k = V / |a_i x a_j|`` (the cell's perpendicular width).

The grid is chosen to minimise the ghost (halo) volume each domain must import:
``prod_k (t_k + 2 g_k) - prod_k t_k`` with ``g_k`` the ghost width on axes that need ghosts
(split or periodic axes) and 0 on open, unsplit axes.  Ghosts come from the nearest
neighbour domains only (single hop), so every split axis needs ``t_k >= ghost width``; a
grid that cannot satisfy it is refused with the largest domain count that would work.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cell import perpendicular_widths
from .grid_shape import DecompositionError, all_grids, ghost_volume, grid_shape, max_domains_of


@dataclass(frozen=True)
class DomainGrid:
    """A Px x Py x Pz grid of domains; rank r has grid coordinates ``coords(r)`` (row-major)."""

    shape: tuple[int, int, int]

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    def coords(self, rank: int) -> tuple[int, int, int]:
        px, py, pz = self.shape
        return rank // (py * pz), (rank // pz) % py, rank % pz

    def rank_of(self, coords) -> int:
        px, py, pz = self.shape
        i, j, k = (int(c) % p for c, p in zip(coords, self.shape))
        return (i * py + j) * pz + k

    def bounds(self, rank: int) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """Fractional (lo, hi) corners of the domain of ``rank``."""
        c = self.coords(rank)
        lo = tuple(c[k] / self.shape[k] for k in range(3))
        hi = tuple((c[k] + 1) / self.shape[k] for k in range(3))
        return lo, hi

    def owner(self, frac: torch.Tensor) -> torch.Tensor:
        """(n,) int64 owning rank of points with fractional coordinates ``frac`` (n, 3).

        Coordinates are clamped to [0, 1) per axis first (points outside an open axis belong
        to the edge domains)."""
        shape = torch.tensor(self.shape, dtype=frac.dtype, device=frac.device)
        c = torch.floor(frac * shape).to(torch.int64)
        hi = torch.tensor(self.shape, device=frac.device) - 1
        c = torch.minimum(torch.clamp(c, min=0), hi)
        return (c[:, 0] * self.shape[1] + c[:, 1]) * self.shape[2] + c[:, 2]


def max_domains(cell: torch.Tensor, pbc, ghost_width: float, limit: int) -> int:
    """Largest domain count <= ``limit`` for which some grid has every split slab at least
    ``ghost_width`` thick."""
    return max_domains_of([float(w) for w in perpendicular_widths(cell)], ghost_width, limit)


def choose_grid(n_domains: int, cell: torch.Tensor, pbc, ghost_width: float,
                shape: tuple[int, int, int] | None = None) -> DomainGrid:
    """The grid of ``n_domains`` domains with the least ghost volume (or the given ``shape``):
    :func:`shardmd.domain.grid_shape.grid_shape` of the cell's perpendicular widths.

    cell: (3, 3) Å rows = lattice vectors; pbc: 3 bools; ghost_width: Å (cutoff + skin +
    migration margin)."""
    pbc = [bool(p) for p in (pbc.tolist() if torch.is_tensor(pbc) else pbc)]
    widths = [float(w) for w in perpendicular_widths(cell)]
    return DomainGrid(grid_shape(n_domains, widths, pbc, ghost_width, shape))


__all__ = ["DecompositionError", "DomainGrid", "all_grids", "choose_grid", "ghost_volume", "max_domains"]
