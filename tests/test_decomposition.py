"""Grid choice for spatial domains, checked against brute-force ghost counting."""
import itertools

import numpy as np
import pytest
import torch

from shardmd.domain.decomposition import DecompositionError, all_grids, choose_grid, max_domains


def _ghost_count(shape, frac, cell, pbc, g):
    """Mean number of ghost points per domain: points (with periodic images) inside the domain
    slab widened by g perpendicular to each face, minus the domain's own points."""
    cell = np.asarray(cell)
    vol = abs(np.linalg.det(cell))
    w = np.array([vol / np.linalg.norm(np.cross(cell[(k + 1) % 3], cell[(k + 2) % 3])) for k in range(3)])
    gf = g / w  # ghost width in fractional units per axis
    images = [(-1, 0, 1) if p else (0,) for p in pbc]
    total = 0
    for c in itertools.product(*(range(s) for s in shape)):
        lo = np.array(c) / shape
        hi = (np.array(c) + 1) / shape
        need = [(shape[k] > 1 or pbc[k]) for k in range(3)]
        lo_g = np.where(need, lo - gf, lo)
        hi_g = np.where(need, hi + gf, hi)
        for s in itertools.product(*images):
            f = frac + np.array(s)
            inside_g = np.all((f >= lo_g) & (f < hi_g), axis=1)
            own = np.all((f >= lo) & (f < hi), axis=1) if s == (0, 0, 0) else np.zeros(len(f), bool)
            total += int(inside_g.sum() - own.sum())
    return total / np.prod(shape)


CELLS = {
    "elongated": (np.diag([60.0, 30.0, 20.0]), (True, True, True)),
    "triclinic": (np.array([[40.0, 0, 0], [12.0, 35.0, 0], [5.0, 6.0, 30.0]]), (True, True, True)),
    "slab": (np.diag([50.0, 50.0, 25.0]), (True, True, False)),
}


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("n", [2, 3, 4, 6, 8, 12])
def test_chosen_grid_has_least_ghosts(name, n):
    cell, pbc = CELLS[name]
    g = 4.0
    frac = np.random.default_rng(0).random((6000, 3))
    grid = choose_grid(n, torch.tensor(cell), pbc, g)
    assert grid.size == n
    counts = {s: _ghost_count(s, frac, cell, pbc, g) for s in all_grids(n)
              if all(s[k] == 1 or (abs(np.linalg.det(cell)) / np.linalg.norm(
                  np.cross(cell[(k + 1) % 3], cell[(k + 2) % 3]))) / s[k] >= g for k in range(3))}
    best = min(counts.values())
    assert counts[grid.shape] <= best * 1.03 + 1, (grid.shape, counts)


def test_owner_and_coords_roundtrip():
    grid = choose_grid(12, torch.eye(3, dtype=torch.float64) * 40, (True,) * 3, 3.0)
    for r in range(12):
        assert grid.rank_of(grid.coords(r)) == r
        lo, hi = grid.bounds(r)
        centre = torch.tensor([[(a + b) / 2 for a, b in zip(lo, hi)]], dtype=torch.float64)
        assert int(grid.owner(centre)[0]) == r
    edge = torch.tensor([[1.0 - 1e-17, -0.2, 1.3]], dtype=torch.float64)  # clamped on each axis
    assert 0 <= int(grid.owner(edge)[0]) < 12


def test_thin_domains_are_refused_with_the_largest_usable_count():
    cell = torch.eye(3, dtype=torch.float64) * 20.0  # 20 Å cube, ghost width 6 Å: at most 3 per axis
    with pytest.raises(DecompositionError) as e:
        choose_grid(64, cell, (True,) * 3, 6.0)
    msg = str(e.value)
    assert "domains=27" in msg and "\n" not in msg
    assert max_domains(cell, (True,) * 3, 6.0, 64) == 27
    assert choose_grid(27, cell, (True,) * 3, 6.0).shape == (3, 3, 3)


def test_explicit_shape_is_checked():
    cell = torch.eye(3, dtype=torch.float64) * 30.0
    assert choose_grid(4, cell, (True,) * 3, 3.0, shape=(1, 4, 1)).shape == (1, 4, 1)
    with pytest.raises(DecompositionError):
        choose_grid(4, cell, (True,) * 3, 3.0, shape=(2, 3, 1))
