"""Neighbour list (shardmd.domain.neighbors) against the brute-force reference.

The edge SETS {(i, j, S)} must be equal, without duplicates, for triclinic/rotated cells,
every combination of periodic and open axes, tiny cells (many images), unwrapped
positions, float32/float64 and empty/one-atom systems.  A pair whose float64 distance is
within a float tolerance of the cutoff may legitimately be on either side; such pairs are
tolerated in the symmetric difference (and nothing else is).
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import (
    brute_force_pairs,
    pair_distance,
    random_cell,
    random_positions,
)

from shardmd.domain.neighbors import build_neighbor_list

DTYPES = [torch.float64, torch.float32]


# --------------------------------------------------------------------------- helpers
def _edges(nl, n):
    """Check the CSR structure and return the list of (i, j, S) edges."""
    off, nb, sh = nl.offsets, nl.neighbors, nl.shifts
    assert off.dtype == torch.int32 and nb.dtype == torch.int32 and sh.dtype == torch.int32
    assert off.shape == (n + 1,)
    E = nb.shape[0]
    assert nb.shape == (E,) and sh.shape == (E, 3)
    off_np = off.cpu().numpy().astype(np.int64)
    assert off_np[0] == 0 and off_np[-1] == E
    assert np.all(np.diff(off_np) >= 0)
    nb_np = nb.cpu().numpy().astype(np.int64)
    sh_np = sh.cpu().numpy().astype(np.int64)
    if E:
        assert nb_np.min() >= 0 and nb_np.max() < n
    centre = np.repeat(np.arange(n), np.diff(off_np))
    ei = nl.edge_index()
    assert ei.dtype == torch.int64 and ei.shape == (2, E)
    ei_np = ei.cpu().numpy()
    np.testing.assert_array_equal(ei_np[0], centre)
    np.testing.assert_array_equal(ei_np[1], nb_np)
    return [(int(a), int(b), tuple(int(x) for x in s)) for a, b, s in zip(centre, nb_np, sh_np)]


def _tolerance(pos64, cell64, cutoff, dtype):
    """Distance tolerance at the cutoff for an implementation working in ``dtype``."""
    if dtype == torch.float64:
        return 1e-9 * cutoff
    # float32: r = x_j + S@cell - x_i carries ~ a few ulp of the largest operand
    scale = cutoff + 2.0 * (np.abs(pos64).max() if len(pos64) else 0.0) + 3.0 * np.abs(cell64).sum()
    return 1e-6 * scale


def check(positions, cell, pbc, cutoff, dtype=torch.float64, expect_edges=None):
    pos_t = torch.as_tensor(np.asarray(positions, dtype=np.float64).reshape(-1, 3), dtype=dtype)
    cell_t = torch.as_tensor(np.asarray(cell, dtype=np.float64), dtype=dtype)
    pbc_t = torch.as_tensor(np.asarray(pbc, dtype=bool))
    n = pos_t.shape[0]
    nl = build_neighbor_list(pos_t, cell_t, pbc_t, cutoff)
    # reference on exactly the values the implementation saw
    pos64 = pos_t.double().numpy()
    cell64 = cell_t.double().numpy()
    got_list = _edges(nl, n)
    got = set(got_list)
    assert len(got) == len(got_list), f"{len(got_list) - len(got)} duplicate edges"
    ref = brute_force_pairs(pos64, cell64, pbc, cutoff)
    tol = _tolerance(pos64, cell64, cutoff, dtype)
    # full list symmetry
    for (i, j, s) in got:
        assert (j, i, tuple(-x for x in s)) in got, f"missing reverse of {(i, j, s)}"
    # every returned edge is within the cutoff
    for (i, j, s) in got_list:
        d = pair_distance(pos64, cell64, i, j, s)
        assert d < cutoff + tol, f"edge {(i, j, s)} has distance {d} >= cutoff {cutoff}"
        assert i != j or any(s), "self pair with zero shift"
    missing = ref - got
    extra = got - ref
    bad_missing = [e for e in missing if abs(pair_distance(pos64, cell64, *e) - cutoff) > tol]
    bad_extra = [e for e in extra if abs(pair_distance(pos64, cell64, *e) - cutoff) > tol]
    assert not bad_missing and not bad_extra, (
        f"{len(bad_missing)} missing (e.g. {sorted(bad_missing)[:5]}), "
        f"{len(bad_extra)} extra (e.g. {sorted(bad_extra)[:5]}); ref has {len(ref)}, got {len(got)}"
    )
    if expect_edges is not None:
        assert len(got) == expect_edges
    return nl, ref


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(5))
def test_random_triclinic(seed, dtype):
    rng = np.random.default_rng(1000 + seed)
    cell = random_cell(rng, lengths=(6.0, 10.0), max_tilt=1.0, rotate=seed % 2 == 1)
    pos = random_positions(rng, 40, cell, [True] * 3)
    _, ref = check(pos, cell, [True] * 3, cutoff=4.5, dtype=dtype)
    assert len(ref) > 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pbc", list(itertools.product([False, True], repeat=3)),
                         ids=lambda p: "".join("T" if x else "F" for x in p))
def test_mixed_pbc(pbc, dtype):
    rng = np.random.default_rng(7 + 2 * sum(b << k for k, b in enumerate(pbc)))
    cell = random_cell(rng, lengths=(5.0, 9.0), max_tilt=0.8, rotate=False)
    # open axes: atoms spread to fractional [-0.5, 1.5), i.e. well outside the cell
    pos = random_positions(rng, 35, cell, pbc)
    _, ref = check(pos, cell, pbc, cutoff=4.0, dtype=dtype)
    assert len(ref) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_open_zero_cell(dtype):
    """Fully non-periodic system given ASE-style with an all-zero cell (a molecule)."""
    rng = np.random.default_rng(3)
    pos = rng.uniform(-6.0, 6.0, size=(30, 3))
    check(pos, np.zeros((3, 3)), [False] * 3, cutoff=4.0, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["cubic1", "triclinic1", "skewed1", "small3", "thinslab"])
def test_tiny_cells(case, dtype):
    rng = np.random.default_rng(11)
    pbc = [True, True, True]
    if case == "cubic1":  # one atom, edge 2.1 < cutoff 5 -> self images only
        cell, pos = np.eye(3) * 2.1, np.array([[0.3, 0.2, 0.1]])
    elif case == "triclinic1":
        cell = np.array([[2.5, 0.0, 0.0], [1.2, 2.3, 0.0], [-0.9, 1.1, 2.7]])
        pos = np.array([[0.1, -0.2, 0.3]])
    elif case == "skewed1":
        # long lattice vectors (~4 A) but a perpendicular width of only ~0.6 A along b
        cell = np.array([[4.0, 0.0, 0.0], [3.9, 0.6, 0.0], [0.5, 0.3, 3.0]])
        pos = np.array([[0.0, 0.0, 0.0]])
    elif case == "small3":
        cell = random_cell(rng, lengths=(2.0, 3.0), max_tilt=1.0, rotate=True)
        pos = random_positions(rng, 3, cell, pbc)
    else:  # thin slab: periodic in-plane with a 1.5 A cell, open along z
        pbc = [True, True, False]
        cell = np.array([[1.5, 0.0, 0.0], [0.7, 1.4, 0.0], [0.0, 0.0, 1.0]])
        pos = random_positions(rng, 4, cell, pbc, frac_range_open=(-3.0, 3.0))
    check(pos, cell, pbc, cutoff=5.0, dtype=dtype)


def test_one_atom_self_images_count():
    """Simple cubic, a = 2: images within 5 A are the lattice points 0 < |S| < 2.5."""
    S = np.array(list(itertools.product(range(-3, 4), repeat=3)))
    r = 2.0 * np.linalg.norm(S, axis=1)
    expected = int(((r > 0) & (r < 5.0)).sum())
    check(np.array([[0.5, 0.5, 0.5]]), np.eye(3) * 2.0, [True] * 3, 5.0, expect_edges=expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)])
def test_unwrapped_positions(pbc, dtype):
    rng = np.random.default_rng(21)
    cell = random_cell(rng, lengths=(5.0, 8.0), max_tilt=1.0, rotate=True)
    pos = random_positions(rng, 25, cell, pbc, frac_range_periodic=(-2.0, 3.0),
                           frac_range_open=(-1.0, 2.0))
    check(pos, cell, pbc, cutoff=4.0, dtype=dtype)


@pytest.mark.parametrize("pbc", [(True, True, True), (False, True, True)])
def test_points_hundreds_of_cells_away(pbc):
    """Points moved by up to 400 lattice vectors: bin images past the packed edge format's
    10-bit shifts, so the edges are written directly (domain/neighbors.py). The list must be
    the brute-force list of the points in the cell, each S changed by n_i - n_j."""
    rng = np.random.default_rng(8)
    cell = random_cell(rng, lengths=(5.0, 7.0), max_tilt=0.5)
    pos = random_positions(rng, 30, cell, pbc)
    _, ref = check(pos, cell, pbc, cutoff=4.0)
    moves = rng.integers(-400, 401, size=(30, 3)) * np.asarray(pbc, dtype=np.int64)
    assert np.abs(moves).max() > 256                       # past the packed range
    far = pos + moves @ cell
    nl = build_neighbor_list(torch.as_tensor(far), torch.as_tensor(cell), torch.tensor(pbc), 4.0)
    got = set(_edges(nl, 30))
    want = {(i, j, tuple(int(x) for x in np.asarray(s) + moves[i] - moves[j])) for i, j, s in ref}
    tol = _tolerance(far, cell, 4.0, torch.float64)
    for (i, j, s) in got ^ want:   # only pairs at the cutoff (round-off) may differ
        assert abs(pair_distance(far, cell, i, j, s) - 4.0) < tol, (i, j, s)
    assert len(got) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_unwrapped_matches_wrapped_distances(dtype):
    """Shifting one atom by a lattice vector changes S by the opposite amount only."""
    rng = np.random.default_rng(5)
    cell = random_cell(rng, lengths=(6.0, 8.0), max_tilt=0.5)
    pos = random_positions(rng, 12, cell, [True] * 3)
    _, ref = check(pos, cell, [True] * 3, 4.0, dtype)
    pos2 = pos.copy()
    pos2[0] += np.array([2, -1, 3]) @ cell
    _, ref2 = check(pos2, cell, [True] * 3, 4.0, dtype)
    assert len(ref) == len(ref2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty(dtype):
    nl = build_neighbor_list(torch.zeros((0, 3), dtype=dtype), torch.eye(3, dtype=dtype) * 5.0,
                             torch.tensor([True, True, True]), 3.0)
    assert _edges(nl, 0) == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pbc", [(True, True, True), (False, False, False)])
def test_single_atom_large_cell(pbc, dtype):
    check(np.array([[1.0, 2.0, 3.0]]), np.eye(3) * 10.0, pbc, 4.0, dtype, expect_edges=0)


def test_two_atoms_exact():
    """Hand-checked: two atoms 1.5 A apart in a 10 A cubic box, cutoff 2 -> exactly 2 edges."""
    nl, _ = check(np.array([[0.2, 0.0, 0.0], [9.7, 0.0, 0.0]]), np.eye(3) * 10.0, [True] * 3,
                  2.0, expect_edges=2)
    edges = set(_edges(nl, 2))
    assert edges == {(0, 1, (-1, 0, 0)), (1, 0, (1, 0, 0))}


# ------------------------------------------------------------- reference self-check
@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True), (False, False, False)])
def test_reference_matches_ase(pbc):
    """The brute-force reference itself agrees with ASE's neighbour list."""
    from ase import Atoms
    from ase.neighborlist import neighbor_list

    rng = np.random.default_rng(99)
    cell = random_cell(rng, lengths=(3.0, 7.0), max_tilt=1.0, rotate=True)
    pos = random_positions(rng, 20, cell, pbc)
    atoms = Atoms("Ar20", positions=pos, cell=cell, pbc=pbc)
    i, j, S = neighbor_list("ijS", atoms, 4.0)
    ase_set = {(int(a), int(b), tuple(int(x) for x in s)) for a, b, s in zip(i, j, S)}
    ref = brute_force_pairs(pos, cell, pbc, 4.0)
    diff = ase_set ^ ref
    assert all(abs(pair_distance(pos, cell, *e) - 4.0) < 1e-9 for e in diff)
    assert len(ref) > 0


@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)], ids=["TTT", "TFT"])
def test_cpu_one_pass_equals_two_passes(pbc, half, monkeypatch):
    """The CPU's one-pass search (edges written at a running cursor while the candidates are
    tested) gives the two-pass list bit for bit (offsets, packed edges, order), for every
    reserve: ample, exact, one short and none (the emit pass takes over: counted past the end,
    nothing written there). With ghosts (n_query < n) and ids out of memory order."""
    import shardmd.domain.neighbors as nbm

    rng = np.random.default_rng(5 + half)
    cell = random_cell(rng, lengths=(9.0, 12.0), max_tilt=0.5, rotate=False)
    pos = torch.tensor(random_positions(rng, 300, cell, list(pbc)))
    ids = torch.randperm(300, generator=torch.Generator().manual_seed(3))
    kw = dict(ids=ids, n_query=250, half=half)
    cell_t = torch.tensor(cell)
    monkeypatch.setattr(nbm, "ONE_PASS_ON_CPU", False)
    ref = build_neighbor_list(pos, cell_t, pbc, 4.0, **kw)
    assert ref.packed is not None and ref.n_edges > 1000
    monkeypatch.setattr(nbm, "ONE_PASS_ON_CPU", True)
    for cap in (None, 2 * ref.n_edges, ref.n_edges, ref.n_edges - 1, 1):
        got = build_neighbor_list(pos, cell_t, pbc, 4.0, capacity=cap, **kw)
        assert torch.equal(got.offsets, ref.offsets), cap
        assert torch.equal(got.packed, ref.packed), cap
        assert torch.equal(got.order, ref.order), cap


def test_cutoff_far_beyond_the_cell_is_refused_in_one_line():
    """A cutoff of 10 km in a 10 Å cell (a unit slip: m for Å) asks for ~1e13 candidate pairs:
    refused before any memory is reserved for them, naming the cause."""
    pos = torch.rand(10, 3, dtype=torch.float64) * 10.0
    cell = torch.eye(3, dtype=torch.float64) * 10.0
    with pytest.raises(ValueError, match="cutoff is far too large"):
        build_neighbor_list(pos, cell, (True, True, True), 1e4)
