"""The choice of a decomposition's grid shape, in plain Python (no torch): a launcher checks a
domain count against the system before it starts ranks, without importing torch for it.
:mod:`shardmd.domain.decomposition` builds its :class:`DomainGrid` from the same choice.

widths: the cell's perpendicular widths w_k = V / |a_i x a_j| (Å); ghost_width: Å (cutoff +
skin + migration margin); pbc: 3 bools.
"""
from __future__ import annotations


class DecompositionError(ValueError):
    """The requested decomposition cannot be built (one-line message with the fix)."""


def perpendicular_widths_of(rows) -> list[float]:
    """(3,) perpendicular widths (Å) of a cell given as three lattice vectors (rows, Å)."""
    a, b, c = ([float(x) for x in r] for r in rows)

    def cross(u, v):
        return (u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0])

    crosses = (cross(b, c), cross(c, a), cross(a, b))
    volume = abs(sum(x * y for x, y in zip(a, crosses[0])))
    return [volume / sum(x * x for x in w) ** 0.5 for w in crosses]


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


def max_domains_of(widths, ghost_width: float, limit: int) -> int:
    """Largest domain count <= ``limit`` for which some grid has every split slab at least
    ``ghost_width`` thick."""
    for n in range(limit, 0, -1):
        if any(_feasible(s, widths, ghost_width) for s in _factorisations(n)):
            return n
    return 1


def grid_shape(n_domains: int, widths, pbc, ghost_width: float,
               shape: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """The (Px, Py, Pz) of ``n_domains`` domains with the least ghost volume (or the given
    ``shape``, checked).  Ties go to the grid splitting the widest axes most, then to the
    lexicographically largest shape, so every rank picks the same grid."""
    if n_domains < 1:
        raise DecompositionError(f"domains={n_domains}: give a whole number >= 1")
    pbc = [bool(p) for p in pbc]
    widths = [float(w) for w in widths]
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3 or shape[0] * shape[1] * shape[2] != n_domains:
            raise DecompositionError(f"domain grid {list(shape)} does not have {n_domains} domains")
        candidates = [shape]
    else:
        candidates = list(_factorisations(n_domains))
    feasible = [s for s in candidates if _feasible(s, widths, ghost_width)]
    if not feasible:
        best = max_domains_of(widths, ghost_width, n_domains)
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

    return min(feasible, key=key)


def all_grids(n_domains: int):
    """Every (Px, Py, Pz) with Px * Py * Pz = n_domains (for tests and tools)."""
    return list(_factorisations(n_domains))
