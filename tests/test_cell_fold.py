"""The CPU's fold of points into the cell (domain/cell_kernels.py, one Warp pass) against torch's
(two linear solves, ``cell.wrap_torch``) and against what a fold must keep: the unwrapped
position, fractional coordinates in [0, 1) on periodic axes, no fold along an open axis."""
import math

import pytest
import torch

from shardmd.domain.cell import inverse_transpose, wrap, wrap_torch

CELLS = {
    "cubic": [[7.5, 0.0, 0.0], [0.0, 7.5, 0.0], [0.0, 0.0, 7.5]],
    "orthorhombic": [[5.0, 0.0, 0.0], [0.0, 9.25, 0.0], [0.0, 0.0, 6.125]],
    "triclinic": [[6.0, 0.0, 0.0], [2.1, 5.7, 0.0], [-1.3, 1.9, 6.4]],
}


def _points(cell: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    f = torch.rand(n, 3, generator=g, dtype=torch.float64) * 7.0 - 3.0   # up to three cells out each way
    return f @ cell


def _fractional(x: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve(cell.double().T, x.double().T).T


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_fold_keeps_the_unwrapped_position_and_lands_in_the_cell(name, pbc, dtype):
    cell = torch.tensor(CELLS[name], dtype=dtype)
    x = _points(cell.double(), 3000, 7).to(dtype)
    images = torch.randint(-5, 5, (3000, 3), dtype=torch.int32)
    pbc_t = torch.tensor(pbc)
    xw, im = wrap(x, cell, pbc_t, images)
    assert xw.dtype == dtype and im.dtype == torch.int32 and xw.shape == x.shape
    unwrapped_before = x.double() + images.double() @ cell.double()
    unwrapped_after = xw.double() + im.double() @ cell.double()
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    assert torch.allclose(unwrapped_after, unwrapped_before, rtol=0, atol=tol * 40)
    f = _fractional(xw, cell)
    eps = 1e-12 if dtype == torch.float64 else 1e-6
    for k in range(3):
        if pbc[k]:
            assert float(f[:, k].min()) >= -eps and float(f[:, k].max()) < 1.0 + eps
        else:   # no fold along an open axis: its image flag and fractional coordinate stay
            assert torch.equal(im[:, k], images[:, k])
            assert torch.allclose(f[:, k], _fractional(x, cell)[:, k], rtol=0, atol=tol * 40)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_fold_agrees_with_torch_away_from_the_faces(name):
    """The two differ only in how f is computed (a multiply by the inverse against a solve), so
    in the last bit of f: the images agree for every point not within ~1e-12 of a face, and the
    folded positions are the same bits where the cell is orthogonal."""
    cell = torch.tensor(CELLS[name], dtype=torch.float64)
    x = _points(cell, 5000, 11)
    images = torch.zeros(5000, 3, dtype=torch.int32)
    pbc = torch.tensor([True, True, True])
    xw, im = wrap(x, cell, pbc, images)
    xt, it = wrap_torch(x, cell, pbc, images)
    f = _fractional(x, cell)
    frac = f - torch.floor(f)
    clear = ((frac > 1e-9) & (frac < 1 - 1e-9)).all(dim=1)
    assert int(clear.sum()) > 4900
    assert torch.equal(im[clear], it[clear])
    if name != "triclinic":
        assert torch.equal(xw[clear], xt[clear])
    else:
        assert float((xw[clear] - xt[clear]).abs().max()) < 1e-13


def test_points_on_the_faces_fold_into_the_cell():
    """Points at f = 0 and f = 1 exactly, one ulp either side, and -1e-17: each lands in [0, 1)
    by the kernel's own measure (its binning then gives a zero image), with the unwrapped
    position kept exactly (orthogonal cell: the folds subtract whole cell lengths)."""
    L = 7.3
    cell = torch.eye(3, dtype=torch.float64) * L
    vals = [0.0, L, math.nextafter(L, 0.0), math.nextafter(L, 2 * L), -1e-17, -0.0, -L, 2 * L,
            math.nextafter(0.0, -1.0), 3.0]
    x = torch.tensor([[a, b, c] for a in vals for b in vals[:3] for c in vals[-3:]], dtype=torch.float64)
    images = torch.zeros(x.shape[0], 3, dtype=torch.int32)
    xw, im = wrap(x, cell, torch.tensor([True] * 3), images)
    f = xw @ inverse_transpose(cell).T   # the kernel's own measure: hinv x
    assert bool((f >= 0).all()) and bool((f < 1).all())
    assert torch.equal(xw + im.double() * L, x) or float((xw + im.double() * L - x).abs().max()) <= 2 * L * 2**-52


def test_the_kept_launch_follows_new_arrays_sizes_and_axes():
    """The fold's recorded launch is replayed with other tensors, another point count and
    other periodic axes in turn: every call answers for its own inputs (torch's fold)."""
    cell = torch.tensor(CELLS["triclinic"], dtype=torch.float64)
    cases = [(_points(cell, n, seed), torch.tensor(pbc)) for n, seed, pbc in
             ((500, 1, (True, True, True)), (1200, 2, (True, False, True)), (500, 3, (False, True, True)),
              (1, 4, (True, True, True)))]
    for _ in range(2):
        for x, pbc in cases:
            images = torch.zeros(x.shape[0], 3, dtype=torch.int32)
            xw, im = wrap(x, cell, pbc, images)
            xt, it = wrap_torch(x, cell, pbc, images)
            assert torch.equal(im, it)
            assert float((xw - xt).abs().max()) < 1e-12


def test_the_kept_launch_keeps_no_tensor_alive():
    """The recorded launch remembers addresses and layouts, not tensors: the points of the last
    call are freed with their owner (a module-level launch holding a build's arrays would keep
    them, an edge list among them, after the simulation is gone)."""
    import gc
    import weakref

    cell = torch.tensor(CELLS["orthorhombic"], dtype=torch.float64)
    x = _points(cell, 2000, 5)
    images = torch.zeros(2000, 3, dtype=torch.int32)
    xw, im = wrap(x, cell, torch.tensor([True] * 3), images)
    refs = [weakref.ref(t) for t in (x, images, xw, im)]
    del x, images, xw, im
    gc.collect()
    assert all(r() is None for r in refs)


def test_points_flung_beyond_the_int32_range_fold_back_and_nan_stays_nan():
    """A blowing-up run flings atoms ~1e14 cells away: they are folded back near the cell, as
    torch's fold does (they then overlap and the run's non-finite check stops it), never left
    where the int32 cell count saturates; a NaN position stays NaN, never a finite number."""
    L = 7.3
    cell = torch.eye(3, dtype=torch.float64) * L
    x = torch.tensor([[1e15, 2.0, 3.0], [-3e14, 1.0, 1.0], [float("nan"), 1.0, 1.0], [2.0, 2.0, 2.0]],
                     dtype=torch.float64)
    xw, _ = wrap(x, cell, torch.tensor([True] * 3), torch.zeros(4, 3, dtype=torch.int32))
    assert float(xw[:2].abs().max()) < 2 * L and torch.equal(xw[3], x[3])
    assert bool(torch.isnan(xw[2, 0]))
