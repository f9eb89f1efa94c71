"""Periodic-cell geometry: volumes, perpendicular widths, wrapping with image flags.

The cell is a (3, 3) tensor whose rows are the lattice vectors ``a_0, a_1, a_2`` (Å), as in
ASE.  Fractional coordinates ``f`` satisfy ``x = f @ cell``.
"""
from __future__ import annotations

import torch

from .grid_shape import perpendicular_widths_of


def volume(cell: torch.Tensor) -> torch.Tensor:
    """0-d tensor: cell volume |det(cell)| in Å^3."""
    return torch.det(cell).abs()


def perpendicular_widths(cell: torch.Tensor) -> torch.Tensor:
    """(3,) distance between the two faces spanned by the other two lattice vectors (Å).

    ``w_k = V / |a_i x a_j|``.  A slab of fractional thickness ``t`` along axis ``k`` is
    ``t * w_k`` thick.
    """
    if cell.device.type == "cpu":   # nine floats: Python's arithmetic, not ~10 torch calls (a small step's builds)
        try:
            return torch.tensor(perpendicular_widths_of(cell.detach().to(torch.float64).tolist()), dtype=torch.float64)
        except ZeroDivisionError:   # a flat cell: torch's 0 / 0 below gives its NaN
            pass
    c = cell.to(torch.float64)
    v = volume(c)
    cross = torch.stack([
        torch.linalg.cross(c[1], c[2]),
        torch.linalg.cross(c[2], c[0]),
        torch.linalg.cross(c[0], c[1]),
    ])
    return v / cross.norm(dim=1)


def to_fractional(positions: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """(n, 3) fractional coordinates of Cartesian ``positions`` (n, 3) Å."""
    return torch.linalg.solve(cell.T, positions.T).T


def wrap(positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, images: torch.Tensor):
    """Fold points into the cell on periodic axes and update their image flags.

    positions: (n, 3) Å; images: (n, 3) int32, so that ``positions + images @ cell`` (the
    unwrapped position) is unchanged by the fold.  Returns new (positions, images).
    """
    if positions.shape[0] == 0 or not bool(pbc.any()):
        return positions, images
    if (positions.device.type == "cpu" and positions.dtype in (torch.float32, torch.float64)
            and cell.dtype == positions.dtype and images.dtype == torch.int32):
        from .cell_kernels import fold  # Warp, loaded where first needed

        return fold(positions, cell.contiguous(), inverse_transpose(cell), tuple(bool(p) for p in pbc.tolist()), images)
    return wrap_torch(positions, cell, pbc, images)


def wrap_torch(positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, images: torch.Tensor):
    """:func:`wrap` in torch operations (any device; a GPU's path): the same folds as the CPU's
    kernel (domain/cell_kernels.py), the fractional coordinates from a linear solve."""
    f = to_fractional(positions, cell)
    shift = torch.floor(f) * pbc.to(f.dtype)
    new_pos = positions - shift @ cell
    # floating round-off can leave f == 1.0 after the fold; fold it once more
    f2 = to_fractional(new_pos, cell)
    extra = torch.floor(f2) * pbc.to(f.dtype)
    if bool(extra.any()):
        new_pos = new_pos - extra @ cell
        shift = shift + extra
    return new_pos, images + shift.to(images.dtype)


_inverse_kept: tuple | None = None


def inverse_transpose(cell: torch.Tensor) -> torch.Tensor:
    """(3, 3) ``(cell^T)^-1``, contiguous: fractional coordinates are ``f = hinv @ x``. Kept for
    the last cell tensor asked about (its identity and version counter): a neighbour build asks
    three times (the fold, the binning, the search's pruning) for the same cell."""
    global _inverse_kept
    kept = _inverse_kept
    if kept is None or kept[0] is not cell or kept[1] != cell._version:
        kept = _inverse_kept = (cell, cell._version, torch.linalg.inv(cell.T).contiguous())
    return kept[2]


def unwrap(positions: torch.Tensor, cell: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """(n, 3) unwrapped positions ``positions + images @ cell`` (Å)."""
    return positions + images.to(positions.dtype) @ cell


def regularise_open_axes(cell: torch.Tensor, pbc, positions: torch.Tensor, cutoff: float):
    """Replace a degenerate lattice vector on an open axis by one orthogonal to the others.

    Open axes only need a frame to bin in; a zero or parallel vector (common for molecules
    read from files) would make the cell singular.
    """
    if all(pbc):
        return cell
    vol = torch.det(cell).abs()
    if float(vol) > 1e-6 * float(cell.norm(dim=1).prod().clamp_min(1e-30)) and float(vol) > 0:
        return cell
    cell = cell.clone()
    extent = float((positions.max(0).values - positions.min(0).values).max()) + 2 * cutoff
    eye = torch.eye(3, dtype=cell.dtype, device=cell.device)
    for k in range(3):
        if not pbc[k] and float(cell[k].norm()) < 1e-9:
            cell[k] = eye[k] * extent
    if float(torch.det(cell).abs()) < 1e-9:
        raise ValueError("cell is singular: give three independent lattice vectors")
    return cell
