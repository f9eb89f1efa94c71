"""Half neighbour lists with Newton's third law (``LennardJones(newton=True)``, the CPU default)
against the full list and the brute-force reference (tests/reference.py).

A half list keeps one edge per pair of query points and adds the force on j to j's row; edges
to ghost points (domain decomposition) are kept one-sided. Both ways to get one are checked: the
model filtering the engine's full list (models/lj.py ``half_list``) and the build making it
directly (``build_neighbor_list(half=True)``, packed words and arrays). Domains are emulated in
this process: each slab's owned atoms plus ghost images within the cutoff, a list with
``n_query = n_owned`` on the axes left periodic, as the engine builds it (engine/run/rank_domain.py),
so no MPI launch is needed; the engine's own N-domain runs are tests/test_decomposed*.py.
"""
from __future__ import annotations

import itertools
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import brute_force_pairs
from test_lj import CUTOFF, RTOL64, assert_close, make_config, make_lj, run_ref, to_t

from shardmd.domain.neighbors import build_neighbor_list

# (seed, n, pbc, lengths, tilt, rotate, two species): triclinic, mixed axes, open, a cell far
# smaller than the cutoff (a point's own images: the S > 0 rule), one species
CASES = {
    "periodic": (1, 24, (True, True, True), (9.5, 11.0), 0.7, True, True),
    "mixed": (2, 24, (True, False, True), (9.5, 11.0), 0.7, False, True),
    "open": (3, 24, (False, False, False), (9.5, 11.0), 0.7, False, True),
    "images": (4, 3, (True, True, True), (4.5, 5.5), 0.5, True, True),
    "one-species": (5, 24, (True, True, True), (9.5, 11.0), 0.3, False, False),
}


def _case(name):
    seed, n, pbc, lengths, tilt, rotate, two = CASES[name]
    pos, cell, pbc, numbers = make_config(seed, n=n, pbc=pbc, two_species=two, lengths=lengths, tilt=tilt,
                                          rotate=rotate)
    return pos, cell, pbc, numbers, two


def _np(out):
    return {k: out[k].detach().double().numpy() for k in ("energy", "forces", "virial", "energies")}


def _lists(p, c, b, radius, n_query=None):
    """The full list, and the four ways to a half list: the model filters the full list
    (packed / arrays), or the build makes it (packed / arrays)."""
    full = build_neighbor_list(p, c, b, radius, n_query=n_query)
    built = build_neighbor_list(p, c, b, radius, n_query=n_query, half=True)
    assert built.half and not full.half
    return full, {"filtered": full, "filtered-arrays": full.without_packed(), "built": built,
                  "built-arrays": built.without_packed()}


# the periodic case's brute-force reference takes ~20 s: the full suite's
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "periodic" else n for n in CASES])
def test_half_equals_full_and_reference(name):
    pos, cell, pbc, numbers, two = _case(name)
    ref, sc = run_ref(pos, cell, pbc, numbers)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    full_lj, half_lj = make_lj(two_species=two), make_lj(two_species=two)
    assert half_lj.newton   # the default on the CPU: the half list
    full_lj.newton = False
    for skin in (0.0, 1.0):
        full_nl, halves = _lists(p, c, b, CUTOFF + skin)
        full = _np(full_lj.compute(p, c, b, z, full_nl))
        assert_close(full, ref, sc, RTOL64)
        for kind, nl in halves.items():
            hl = half_lj.half_list(nl)
            assert hl.half and 2 * hl.n_edges == full_nl.n_edges, (kind, hl.n_edges, full_nl.n_edges)
            got = _np(half_lj.compute(p, c, b, z, nl))
            assert_close(got, full, sc, RTOL64)
            assert_close(got, ref, sc, RTOL64)
            assert abs(got["energies"].sum() - got["energy"]) <= RTOL64 * sc["energy"], kind


@pytest.mark.parametrize("name", ["periodic", "images"])
def test_half_lists_hold_each_pair_once(name):
    """Every pair (i, j, S) of the brute-force set is in a half list exactly once, as (i, j, S)
    or as (j, i, -S)."""
    pos, cell, pbc, numbers, two = _case(name)
    pairs = brute_force_pairs(pos, cell, pbc, CUTOFF)
    p, c, b, _ = to_t(pos, cell, pbc, numbers, torch.float64)
    full_nl, halves = _lists(p, c, b, CUTOFF)
    lj = make_lj(two_species=two)
    for kind, nl in halves.items():
        hl = lj.half_list(nl)
        i = hl.centers().tolist()
        edges = list(zip(i, hl.neighbors.tolist(), map(tuple, hl.shifts.tolist())))
        assert len(set(edges)) == len(edges), kind
        unordered = {min((a, b_, s), (b_, a, tuple(-x for x in s))) for a, b_, s in edges}
        assert len(unordered) == len(edges), kind
        assert {min((a, b_, s), (b_, a, tuple(-x for x in s))) for a, b_, s in pairs} == unordered, kind


def _domain_points(pos, cell, owner_of, d, splits, width):
    """Owned atoms of domain ``d`` (indices), then ghosts: periodic images ``x + S @ cell`` (S along
    the split axes) of any atom within ``width`` Å (perpendicular) of the domain, owned zero images
    excluded. Returns (points (m, 3), atom index of each point, n_owned)."""
    inv = np.linalg.inv(cell)
    frac = pos @ inv
    perp = 1.0 / np.linalg.norm(inv, axis=0)   # perpendicular widths of the cell
    coords = np.unravel_index(d, splits)
    owned = np.nonzero(owner_of == d)[0]
    ghosts = []
    ranges = [range(-1, 2) if splits[k] > 1 else range(0, 1) for k in range(3)]
    for s in itertools.product(*ranges):
        f = frac + np.array(s)
        inside = np.ones(len(pos), bool)
        for k in range(3):
            if splits[k] > 1:
                lo, hi = coords[k] / splits[k], (coords[k] + 1) / splits[k]
                g = width / perp[k]
                inside &= (f[:, k] >= lo - g) & (f[:, k] < hi + g)
        idx = np.nonzero(inside)[0]
        if not any(s):
            idx = idx[owner_of[idx] != d]
        ghosts += [(a, np.asarray(s)) for a in idx]
    points = np.concatenate([pos[owned]] + [(pos[a] + s @ cell)[None] for a, s in ghosts])
    index = np.concatenate([owned, np.array([a for a, _ in ghosts], dtype=np.int64)])
    return points, index, len(owned)


@pytest.mark.parametrize("splits", [(2, 1, 1), (1, 3, 1), (2, 2, 1)], ids=lambda s: "x".join(map(str, s)))
def test_half_on_domains(splits):
    """Domains emulated in-process: owned rows of forces and per-atom energies, and the sums of
    energy and virial over domains, equal the full list's and the reference to 1e-12."""
    rng_seed = {(2, 1, 1): 11, (1, 3, 1): 12, (2, 2, 1): 13}[splits]
    pos, cell, pbc, numbers = make_config(rng_seed, n=120, pbc=(True, True, True), lengths=(26.0, 28.0),
                                          tilt=0.5)
    ref, sc = run_ref(pos, cell, pbc, numbers)
    frac = (pos @ np.linalg.inv(cell)) % 1.0
    coords = np.minimum((frac * np.array(splits)).astype(int), np.array(splits) - 1)
    owner_of = np.ravel_multi_index(coords.T, splits)
    local_pbc = tuple(bool(pbc[k]) and splits[k] == 1 for k in range(3))
    full_lj, half_lj = make_lj(), make_lj()
    full_lj.newton = False
    n_dom = int(np.prod(splits))
    for skin in (0.0, 0.8):
        sums = {kind: {"energy": 0.0, "virial": np.zeros((3, 3)), "forces": np.zeros((len(pos), 3)),
                       "energies": np.zeros(len(pos))} for kind in ("full", "filtered", "built")}
        for d in range(n_dom):
            pts, index, n_own = _domain_points(pos, cell, owner_of, d, splits, CUTOFF + skin)
            p, c, b, z = to_t(pts, cell, local_pbc, numbers[index], torch.float64)
            full_nl, halves = _lists(p, c, b, CUTOFF + skin, n_query=n_own)
            outs = {"full": _np(full_lj.compute(p, c, b, z, full_nl)),
                    "filtered": _np(half_lj.compute(p, c, b, z, halves["filtered"])),
                    "built": _np(half_lj.compute(p, c, b, z, halves["built"]))}
            for kind, out in outs.items():
                assert out["forces"].shape == (n_own, 3)
                s = sums[kind]
                s["energy"] += float(out["energy"])
                s["virial"] += out["virial"]
                s["forces"][index[:n_own]] = out["forces"]
                s["energies"][index[:n_own]] = out["energies"]
                assert_close(out, outs["full"], sc, RTOL64)   # this domain's partial sums too
        for s in sums.values():
            assert_close(s, ref, sc, RTOL64)


@pytest.mark.parametrize("name", ["periodic", "images", "one-species"])
@pytest.mark.parametrize("built", [False, True], ids=["filtered", "built"])
def test_half_sums_do_not_follow_memory_order(name, built):
    """The same points in another memory order (ids travelling with them): every atom's force and
    energy, bit for bit. The kernel visits the points in the list's (bin, id) order and a pair
    belongs to the point visited first (models/lj_kernels.py), so each row, and the energy and
    virial totals, are summed in an order that depends on ids and positions only. Lists without
    that order (``order=None``) still give the right forces, to rounding."""
    pos, cell, pbc, numbers, two = _case(name)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    ids = torch.arange(len(p)) * 7 + 3
    lj = make_lj(two_species=two)
    rows = []
    for seed in (None, 1, 2):
        g = torch.Generator().manual_seed(seed or 0)
        perm = torch.arange(len(p)) if seed is None else torch.randperm(len(p), generator=g)
        nl = build_neighbor_list(p[perm], c, b, CUTOFF + 0.7, ids=ids[perm], half=built)
        out = lj.compute(p[perm], c, b, z[perm], nl)
        inv = torch.argsort(perm)
        rows.append((out["forces"][inv], out["energies"][inv], out["energy"], out["virial"]))
        no_order = lj.compute(p[perm], c, b, z[perm], nl.replace(order=None))
        assert torch.allclose(no_order["forces"][inv], rows[0][0], rtol=0, atol=1e-12)
    for got in rows[1:]:   # the totals too: summed in the kernel, in visit order
        assert all(torch.equal(a, b) for a, b in zip(got, rows[0]))


@pytest.mark.parametrize("name", ["periodic", "images", "mixed"])
@pytest.mark.parametrize("ghosts", [False, True], ids=["all-query", "ghosts"])
def test_forces_only_same_forces_nan_sums(name, ghosts):
    """``forces_only`` (a step whose energy nobody reads): the forces bit for bit as the full
    call's, for every way to a half list (filtered, built, packed or arrays, and a list without
    a canonical order: the kernel's non-final path), with and without ghost points; energy,
    virial and per-atom energies NaN; ``virial_only`` (npt's steps without output): the forces
    and the virial bit for bit, energies NaN; the next full call unchanged."""
    pos, cell, pbc, numbers, two = _case(name)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    nq = len(pos) - max(1, len(pos) // 5) if ghosts else None
    lj = make_lj(two_species=two)
    _, halves = _lists(p, c, b, CUTOFF + 0.7, n_query=nq)
    halves["no-order"] = halves["built"].replace(order=None)
    for kind, nl in halves.items():
        ref = lj.compute(p, c, b, z, nl)
        lj.forces_only = True
        got = lj.compute(p, c, b, z, nl)
        lj.forces_only = False
        assert torch.equal(got["forces"], ref["forces"]), kind
        assert torch.isnan(got["energy"]) and torch.isnan(got["virial"]).all(), kind
        assert torch.isnan(got["energies"]).all() and got["energies"].shape == ref["energies"].shape, kind
        lj.virial_only = True   # npt's steps without output: the virial too, the same bits
        vir = lj.compute(p, c, b, z, nl)
        lj.virial_only = False
        assert torch.equal(vir["forces"], ref["forces"]) and torch.equal(vir["virial"], ref["virial"]), kind
        assert torch.isnan(vir["energy"]) and torch.isnan(vir["energies"]).all(), kind
        again = lj.compute(p, c, b, z, nl)
        for k in ref:
            assert torch.equal(again[k], ref[k]), (kind, k)


def _lj_sim(tmp_path, tag, steps=24, extra=()):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    return Simulation(compose_config([
        "model=lj", "system.repeat=[3,3,3]", f"steps={steps}", "thermo.every=8", "trajectory.every=0",
        "checkpoint.every=0", "quiet=true", "threads=1", "temperature=200", "dt=5", "neighbor.skin=0.6",
        f"output={tmp_path / (tag + '.h5')}", *extra]))


def test_engine_npt_virial_only_steps_change_no_bit(tmp_path, monkeypatch):
    """Under npt (tri: every virial component drives the cell) the loop asks LJ for forces and
    virial without the energy on steps with no output due: positions, velocities, cell and the
    thermo at output steps bit for bit as a run that sums everything at every step."""
    from shardmd.engine.run.simulation import Simulation

    npt = ("integrator=npt", "integrator.couple=tri", "integrator.pressure=5000", "integrator.pdamp=500",
           "integrator.tdamp=100")
    calls = []
    lazy = _lj_sim(tmp_path, "lazy", extra=npt)
    cell0 = lazy.state.cell.clone()
    compute = lazy.model.lj.compute

    def spy(*a, **kw):
        calls.append((lazy.model.lj.forces_only, lazy.model.lj.virial_only))
        return compute(*a, **kw)

    monkeypatch.setattr(lazy.model.lj, "compute", spy)
    obs_lazy = lazy.run()
    assert calls.count((False, True)) >= 18 and calls.count((False, False)) >= 3, calls
    full = _lj_sim(tmp_path, "full", extra=npt)
    monkeypatch.setattr(Simulation, "_output_due", lambda self, step: True)
    obs_full = full.run()
    assert not torch.equal(full.state.cell, cell0)   # the barostat moved the cell
    for key in ("positions", "velocities", "forces", "cell"):
        assert torch.equal(getattr(lazy.state, key), getattr(full.state, key)), key
    for key in ("potential_energy", "kinetic_energy", "pressure", "volume"):
        assert obs_lazy[key] == obs_full[key], key


def test_engine_forces_only_steps_change_no_bit(tmp_path, monkeypatch):
    """The run loop asks LJ for the forces alone on steps with no output due: positions and
    velocities after 24 steps, and the thermo energies at the output steps, bit for bit as a run
    that computes everything at every step; a forces-only step's observables, read after all
    (as a stop does), are completed, equal to the full step's."""
    from shardmd.engine.run.simulation import Simulation

    calls = []
    lazy = _lj_sim(tmp_path, "lazy")
    compute = lazy.model.lj.compute

    def spy(*a, **kw):
        calls.append(lazy.model.lj.forces_only)
        return compute(*a, **kw)

    monkeypatch.setattr(lazy.model.lj, "compute", spy)
    obs_lazy = lazy.run()
    assert calls.count(True) >= 18 and calls.count(False) >= 3, calls   # 21 of 24 steps skip the sums
    full = _lj_sim(tmp_path, "full")
    monkeypatch.setattr(Simulation, "_output_due", lambda self, step: True)
    obs_full = full.run()
    for key in ("positions", "velocities", "forces"):
        assert torch.equal(getattr(lazy.state, key), getattr(full.state, key)), key
    for key in ("potential_energy", "kinetic_energy", "pressure"):
        assert obs_lazy[key] == obs_full[key], key
    monkeypatch.undo()
    # a forces-only step read after all: observables() completes it
    a, b = _lj_sim(tmp_path, "a", steps=5), _lj_sim(tmp_path, "b", steps=5)
    for sim in (a, b):
        sim.setup()
    a._lazy_energy = True
    a.step()
    b.step()
    assert a._energy_missing and torch.isnan(a.results["energy"])
    oa, ob = a.observables(), b.observables()
    assert not a._energy_missing and torch.equal(a.state.forces, b.state.forces)
    assert oa["potential_energy"] == ob["potential_energy"] and oa["pressure"] == ob["pressure"]
