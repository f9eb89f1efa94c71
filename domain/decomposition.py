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


class DecompositionError(ValueError):
    """The requested decomposition cannot be built (one-line message with the fix)."""


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


def _factorisations(n: int):
    for px in range(1, n + 1):
        if n % px:
            continue
        for py in range(1, n // px + 1):
            if (n // px) % py:
                continue
            yield px, py, n // (px * py)


def ghost_volume(shape, widths, pbc, ghost_width: float) -> float:
    """Ghost volume (Å^3, per domain, in the perpendicular-width approximation) of a grid."""
    t = [widths[k] / shape[k] for k in range(3)]
    g = [ghost_width if (shape[k] > 1 or pbc[k]) else 0.0 for k in range(3)]
    outer = 1.0
    inner = 1.0
    for k in range(3):
        outer *= t[k] + 2 * g[k]
        inner *= t[k]
    return outer - inner


def _feasible(shape, widths, ghost_width: float) -> bool:
    return all(shape[k] == 1 or widths[k] / shape[k] >= ghost_width for k in range(3))


def max_domains(cell: torch.Tensor, pbc, ghost_width: float, limit: int) -> int:
    """Largest domain count <= ``limit`` for which some grid has every split slab at least
    ``ghost_width`` thick."""
    widths = [float(w) for w in perpendicular_widths(cell)]
    for n in range(limit, 0, -1):
        if any(_feasible(s, widths, ghost_width) for s in _factorisations(n)):
            return n
    return 1


def choose_grid(n_domains: int, cell: torch.Tensor, pbc, ghost_width: float,
                shape: tuple[int, int, int] | None = None) -> DomainGrid:
    """The grid of ``n_domains`` domains with the least ghost volume (or the given ``shape``).

    cell: (3, 3) Å rows = lattice vectors; pbc: 3 bools; ghost_width: Å (cutoff + skin +
    migration margin).  Ties go to the grid splitting the widest axes most, then to the
    lexicographically largest shape, so every rank picks the same grid.
    """
    if n_domains < 1:
        raise DecompositionError(f"domains={n_domains}: give a whole number >= 1")
    pbc = [bool(p) for p in (pbc.tolist() if torch.is_tensor(pbc) else pbc)]
    widths = [float(w) for w in perpendicular_widths(cell)]
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3 or shape[0] * shape[1] * shape[2] != n_domains:
            raise DecompositionError(f"domain grid {list(shape)} does not have {n_domains} domains")
        candidates = [shape]
    else:
        candidates = list(_factorisations(n_domains))
    feasible = [s for s in candidates if _feasible(s, widths, ghost_width)]
    if not feasible:
        best = max_domains(cell, pbc, ghost_width, n_domains)
        thin = min(candidates, key=lambda s: -min(widths[k] / s[k] for k in range(3) if s[k] > 1))
        tmin = min(widths[k] / thin[k] for k in range(3) if thin[k] > 1)
        if shape is not None:
            raise DecompositionError(
                f"grid={list(shape)} makes domains {tmin:.2f} Å thin, less than the ghost width "
                f"{ghost_width:.2f} Å (cutoff + skin); use fewer domains along that axis or grid=null "
                f"(at most {best} domains fit this system)")
        raise DecompositionError(
            f"domains={n_domains}: domains would be {tmin:.2f} Å thin, less than the ghost width "
            f"{ghost_width:.2f} Å (cutoff + skin); use at most domains={best} for this system, or a larger system")

    def key(s):
        spread = tuple(sorted(((s[k], widths[k]) for k in range(3)), key=lambda p: -p[1]))
        return (round(ghost_volume(s, widths, pbc, ghost_width), 9), tuple(-p[0] for p in spread),
                tuple(-x for x in s))

    return DomainGrid(min(feasible, key=key))


def all_grids(n_domains: int):
    """Every (Px, Py, Pz) with Px * Py * Pz = n_domains (for tests and tools)."""
    return list(_factorisations(n_domains))


__all__ = ["DecompositionError", "DomainGrid", "all_grids", "choose_grid", "ghost_volume", "max_domains"]
