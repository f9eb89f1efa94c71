"""The CPU search skips bins out of reach of a point (``scan_serial``'s pruning): the list it
gives must be the unpruned search's, bit for bit (offsets, packed edges, order).

The unpruned reference is the two-pass search every other device runs (``ONE_PASS_ON_CPU``
off), which visits the whole cube of bins. The geometries are the ones where a wrong bound
would show: orthogonal cells (the gaps of the axes add in quadrature), rotated and sheared
ones (only the largest gap counts), lattices whose points sit exactly on bin faces and whose
shell distances equal the cutoff, float32, points many cells away (the rounding margin grows
with them), open axes, and a cell smaller than the cutoff (bins of many images).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import random_cell, random_positions, random_rotation

import shardmd.domain.neighbors as nbm
from shardmd.domain.neighbors import build_neighbor_list


def _lattice(a: float, reps: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Simple cubic points of spacing ``a`` Å, ``reps`` along each axis, and their cubic cell."""
    g = torch.arange(reps, dtype=torch.float64) * a
    pos = torch.cartesian_prod(g, g, g)
    return pos.to(dtype), (torch.eye(3, dtype=torch.float64) * a * reps).to(dtype)


def _geometry(name: str, dtype):
    rng = np.random.default_rng(11)
    pbc = (True, True, True)
    if name == "orthogonal":
        cell = np.diag(rng.uniform(10.0, 14.0, size=3))
        pos = random_positions(rng, 400, cell, pbc)
    elif name == "rotated":   # orthogonal axes, not along x, y, z
        cell = np.diag(rng.uniform(10.0, 14.0, size=3)) @ random_rotation(rng).T
        pos = random_positions(rng, 400, cell, pbc)
    elif name == "sheared":
        cell = random_cell(rng, lengths=(10.0, 14.0), max_tilt=0.6, rotate=True)
        pos = random_positions(rng, 400, cell, pbc)
    elif name == "open axis":
        pbc = (True, False, True)
        cell = np.diag(rng.uniform(10.0, 14.0, size=3))
        pos = random_positions(rng, 400, cell, pbc)
    elif name == "far away":   # unwrapped points hundreds of cells out
        cell = np.diag(rng.uniform(10.0, 14.0, size=3))
        pos = random_positions(rng, 400, cell, pbc) + rng.integers(-300, 300, size=(400, 3)) @ cell
    elif name == "small cell":   # a cell smaller than the cutoff: many images of each point
        cell = np.diag([2.5, 3.0, 2.2])
        pos = random_positions(rng, 6, cell, pbc)
    else:
        raise AssertionError(name)
    return torch.tensor(pos, dtype=dtype), torch.tensor(cell, dtype=dtype), pbc


def _both(pos, cell, pbc, cutoff, monkeypatch, **kw):
    monkeypatch.setattr(nbm, "ONE_PASS_ON_CPU", False)
    ref = build_neighbor_list(pos, cell, pbc, cutoff, **kw)
    monkeypatch.setattr(nbm, "ONE_PASS_ON_CPU", True)
    return ref, build_neighbor_list(pos, cell, pbc, cutoff, **kw)


def _same(ref, got):
    assert torch.equal(got.offsets, ref.offsets)
    assert got.n_edges == ref.n_edges
    assert torch.equal(got.neighbors, ref.neighbors) and torch.equal(got.shifts, ref.shifts)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
@pytest.mark.parametrize("name", ["orthogonal", "rotated", "sheared", "open axis", "far away", "small cell"])
def test_pruned_search_gives_the_unpruned_list(name, half, dtype, monkeypatch):
    pos, cell, pbc = _geometry(name, dtype)
    ref, got = _both(pos, cell, pbc, 4.0, monkeypatch, half=half)
    assert ref.n_edges > 100
    _same(ref, got)


@pytest.mark.parametrize("above", [False, True], ids=["at", "above"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("per_bin", [1, 2])
def test_lattice_on_bin_corners_with_the_cutoff_at_a_shell(per_bin, dtype, above, monkeypatch):
    """Points on bin corners and pairs exactly at the cutoff, or a hair inside it ("above": the
    cutoff a few ulps past the shell). A 6-bin cell of edge 6 w and a cutoff of sqrt(3) w make
    bins exactly w wide (the search's own choice), so the pair across a body diagonal of a bin
    sits in a bin whose gap equals its distance: the pruning's margin must keep that bin (a
    bound of the bare cutoff loses those pairs, and this test fails)."""
    w = 1.7
    pos, cell = _lattice(w / per_bin, 6 * per_bin, dtype)
    cutoff = 3 ** 0.5 * w * (1 + (0.0 if not above else 1e-6 if dtype == torch.float32 else 1e-12))
    assert nbm._bin_grid(cell.double(), (True,) * 3, cutoff, pos.shape[0])[0] == [6, 6, 6]
    ref, got = _both(pos, cell, (True, True, True), cutoff, monkeypatch, half=True)
    assert ref.n_edges > 0
    _same(ref, got)
