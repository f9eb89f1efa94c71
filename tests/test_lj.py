"""Lennard-Jones model (shardmd.models.lj) against the NumPy reference, ASE and finite
differences.

Tolerances against the reference are relative to the natural magnitude of each sum
(sum of |pair energies|, max over atoms of sum of |pair forces|, sum of |r||f|), because
round-off is bounded by those and not by the (possibly cancelling) totals.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import (
    insert_positions,
    lj_pair_distances,
    lj_reference,
    mix_lorentz_berthelot,
    pair_arrays,
    random_cell,
)

from shardmd.domain.neighbors import build_neighbor_list
from shardmd.models.lj import LennardJones

EPS = {18: 0.0104, 36: 0.014}
SIG = {18: 3.40, 36: 3.65}
CUTOFF = 8.5
RTOL64 = 1e-12


# --------------------------------------------------------------------------- helpers
def tables(species):
    """(eps (T,T), sigma (T,T), type_of) for the given atomic numbers, LB mixed."""
    zs = sorted(species)
    type_of = {z: k for k, z in enumerate(zs)}
    eps, sig = mix_lorentz_berthelot([EPS[z] for z in zs], [SIG[z] for z in zs])
    return eps, sig, type_of


_CONFIGS: dict = {}


def make_config(seed, n=16, pbc=(True, True, True), two_species=True, lengths=(9.5, 11.0),
                tilt=0.7, rotate=False, fd_margin=0.0):
    """Random sequential insertion with every pair distance >= 0.85 sigma_ij.

    With ``fd_margin`` > 0 the seed is advanced until no pair distance lies within
    ``fd_margin`` of the cutoff (so finite differences never cross it). Made once per process
    and argument set (the brute-force insertion of a tilted, rotated cell took ~16 s of CPU, and
    test_lj_half asks for the same configuration in four tests); callers get copies."""
    key = (seed, n, tuple(bool(b) for b in pbc), two_species, tuple(lengths), tilt, rotate, fd_margin)
    if key not in _CONFIGS:
        _CONFIGS[key] = _make_config(seed, n, pbc, two_species, lengths, tilt, rotate, fd_margin)
    return tuple(np.copy(a) for a in _CONFIGS[key])


def _make_config(seed, n, pbc, two_species, lengths, tilt, rotate, fd_margin):
    while True:
        rng = np.random.default_rng(seed)
        cell = random_cell(rng, lengths=lengths, max_tilt=tilt, rotate=rotate)
        numbers = rng.choice([18, 36], size=n) if two_species else np.full(n, 18)

        def dmin(a, b, numbers=numbers):
            return 0.85 * 0.5 * (SIG[int(numbers[a])] + SIG[int(numbers[b])])

        pos = insert_positions(rng, n, cell, pbc, dmin)
        if fd_margin > 0:
            d = lj_pair_distances(pos, cell, pbc, CUTOFF + 2 * fd_margin)
            if len(d) and np.abs(d - CUTOFF).min() <= fd_margin:
                seed += 10007
                continue
        return pos, cell, np.asarray(pbc, dtype=bool), numbers


def make_lj(shift=True, two_species=True):
    if two_species:
        return LennardJones(epsilon=dict(EPS), sigma=dict(SIG), cutoff=CUTOFF, shift=shift,
                            mixing="lorentz-berthelot")
    return LennardJones(epsilon=EPS[18], sigma=SIG[18], cutoff=CUTOFF, shift=shift)


def to_t(pos, cell, pbc, numbers, dtype):
    return (torch.tensor(pos, dtype=dtype), torch.tensor(cell, dtype=dtype),
            torch.tensor(pbc, dtype=torch.bool), torch.tensor(numbers, dtype=torch.int64))


def run_impl(lj, pos, cell, pbc, numbers, dtype=torch.float64, skin=0.0, nl=None):
    p, c, b, z = to_t(pos, cell, pbc, numbers, dtype)
    if nl is None:
        nl = build_neighbor_list(p, c, b, lj.cutoff + skin)
    out = lj.compute(p, c, b, z, nl)
    n = len(pos)
    assert out["energy"].shape == ()
    assert out["forces"].shape == (n, 3)
    assert out["virial"].shape == (3, 3)
    assert out["energies"].shape == (n,)
    return {k: out[k].detach().double().cpu().numpy() for k in ("energy", "forces", "virial", "energies")}


def run_ref(pos, cell, pbc, numbers, shift=True):
    eps, sig, type_of = tables(set(int(z) for z in numbers) | {18})
    e, f, w, ea, sc = lj_reference(pos, cell, pbc, numbers, eps, sig, type_of, CUTOFF, shift,
                                   return_scales=True)
    return {"energy": e, "forces": f, "virial": w, "energies": ea}, sc


def assert_close(got, ref, sc, rtol):
    dE = abs(float(got["energy"]) - ref["energy"])
    assert dE <= rtol * sc["energy"], \
        f"energy {got['energy']} vs {ref['energy']} (|dE|={dE:.3e}, scale {sc['energy']:.3e})"
    dF = np.abs(got["forces"] - ref["forces"]).max(initial=0.0)
    assert dF <= rtol * sc["forces"], f"max|dF|={dF:.3e}, scale {sc['forces']:.3e}"
    dW = np.abs(got["virial"] - ref["virial"]).max()
    assert dW <= rtol * sc["virial"], f"max|dW|={dW:.3e}, scale {sc['virial']:.3e}\n{got['virial']}\n{ref['virial']}"
    dEa = np.abs(got["energies"] - ref["energies"]).max(initial=0.0)
    assert dEa <= rtol * max(sc["energies"].max(initial=0.0), 1e-300), f"max|dE_i|={dEa:.3e}"


# --------------------------------------------------------------------------- tests
PBCS = [(True, True, True), (True, False, True), (False, True, False), (False, False, False)]


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("pbc", PBCS, ids=lambda p: "".join("T" if x else "F" for x in p))
@pytest.mark.parametrize("seed", [1, 2])
def test_vs_reference_two_species(seed, pbc, shift):
    pos, cell, pbc, numbers = make_config(seed, pbc=pbc, rotate=seed == 2)
    ref, sc = run_ref(pos, cell, pbc, numbers, shift)
    assert sc["n_pairs"] > 20
    got = run_impl(make_lj(shift), pos, cell, pbc, numbers)
    assert_close(got, ref, sc, RTOL64)
    assert abs(got["energies"].sum() - got["energy"]) <= RTOL64 * sc["energy"]
    np.testing.assert_allclose(got["virial"], got["virial"].T, rtol=0, atol=RTOL64 * sc["virial"])


@pytest.mark.parametrize("shift", [True, False])
def test_vs_reference_single_species_float_params(shift):
    pos, cell, pbc, numbers = make_config(3, two_species=False)
    ref, sc = run_ref(pos, cell, pbc, numbers, shift)
    got = run_impl(make_lj(shift, two_species=False), pos, cell, pbc, numbers)
    assert_close(got, ref, sc, RTOL64)


@pytest.mark.parametrize("two_species", [True, False])
@pytest.mark.parametrize("n_query", [None, 12])
def test_packed_and_plain_edges_vs_reference(two_species, n_query):
    """The kernel reads the list's packed edges when it has them (domain/neighbors.py) and the
    neighbour and shift arrays otherwise: both against the float64 reference, in a sheared
    cell (edges with image shifts), with every point a query point and with 12 of 20."""
    pos, cell, pbc, numbers = make_config(7, n=20, rotate=True, two_species=two_species)
    ref, sc = run_ref(pos, cell, pbc, numbers)
    lj = make_lj(two_species=two_species)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    nl = build_neighbor_list(p, c, b, lj.cutoff, n_query=n_query)
    assert nl.packed is not None and not nl.has_arrays    # the build keeps the packed words alone
    plain = build_neighbor_list(p, c, b, lj.cutoff, n_query=n_query).without_packed()
    assert plain.packed is None and bool((plain.shifts != 0).any())
    for edges in (nl, plain):
        got = {k: v.numpy() for k, v in lj.compute(p, c, b, z, edges).items()}
        if n_query is None:
            assert_close(got, ref, sc, RTOL64)
        else:   # the query points' own rows are complete; energy and virial are partial sums
            dF = np.abs(got["forces"] - ref["forces"][:n_query]).max()
            assert dF <= RTOL64 * sc["forces"], (edges.packed is None, dF)
            dEa = np.abs(got["energies"] - ref["energies"][:n_query]).max()
            assert dEa <= RTOL64 * sc["energies"].max(), (edges.packed is None, dEa)
    assert not nl.has_arrays    # the kernel read the packed words only: nothing was unpacked


def test_small_cell_many_images():
    """Cell (~5 A) much smaller than the cutoff: interactions with many images."""
    pos, cell, pbc, numbers = make_config(4, n=3, lengths=(4.5, 5.5), tilt=0.5, rotate=True)
    ref, sc = run_ref(pos, cell, pbc, numbers)
    got = run_impl(make_lj(), pos, cell, pbc, numbers)
    assert_close(got, ref, sc, RTOL64)


def test_unwrapped_positions():
    pos, cell, pbc, numbers = make_config(5)
    rng = np.random.default_rng(0)
    pos_u = pos + rng.integers(-2, 3, size=(len(pos), 3)) @ cell
    ref, sc = run_ref(pos, cell, pbc, numbers)
    got = run_impl(make_lj(), pos_u, cell, pbc, numbers)
    assert_close(got, ref, sc, 1e-11)  # positions lose a few ulp when shifted by 2 cells


@pytest.mark.parametrize("pbc", [(True, True, True), (False, True, True)])
def test_skin_does_not_change_result(pbc):
    pos, cell, pbc, numbers = make_config(6, pbc=pbc)
    ref, sc = run_ref(pos, cell, pbc, numbers)
    lj = make_lj()
    bare = run_impl(lj, pos, cell, pbc, numbers, skin=0.0)
    skin = run_impl(lj, pos, cell, pbc, numbers, skin=1.0)
    assert_close(bare, ref, sc, RTOL64)
    assert_close(skin, ref, sc, RTOL64)
    assert_close(skin, bare, sc, RTOL64)


def test_dimer_minimum():
    """Hand check: a dimer at r = 2^(1/6) sigma has zero force and energy -eps (+shift)."""
    r = 2 ** (1 / 6) * SIG[18]
    pos = np.array([[1.0, 1.0, 1.0], [1.0 + r, 1.0, 1.0]])
    cell, pbc, numbers = np.eye(3) * 30.0, np.array([False] * 3), np.array([18, 18])
    for shift in (False, True):
        got = run_impl(make_lj(shift), pos, cell, pbc, numbers)
        sr = SIG[18] / CUTOFF
        e = -EPS[18] - (4 * EPS[18] * (sr**12 - sr**6) if shift else 0.0)
        assert abs(got["energy"] - e) < 1e-15
        np.testing.assert_allclose(got["energies"], [e / 2, e / 2], rtol=0, atol=1e-15)
        assert np.abs(got["forces"]).max() < 1e-15
        assert np.abs(got["virial"]).max() < 1e-14


def test_dimer_beyond_cutoff_is_zero():
    pos = np.array([[0.0, 0.0, 0.0], [CUTOFF + 0.01, 0.0, 0.0]])
    got = run_impl(make_lj(), pos, np.eye(3) * 30.0, np.array([False] * 3), np.array([18, 36]),
                   skin=1.0)
    assert got["energy"] == 0.0 and np.all(got["forces"] == 0.0) and np.all(got["virial"] == 0.0)


# --------------------------------------------------------------------------- ASE
@pytest.mark.parametrize("pbc", [(True, True, True), (True, True, False)])
def test_vs_ase(pbc):
    """ASE's calculator (ase 3.29, smooth=False) always subtracts u(rc) from every pair with
    r <= rc, i.e. it is our shift=True; its stress is (1/V) * sum_pairs f_on_i (x) r_ij,
    i.e. stress = -virial / V, in Voigt order xx yy zz yz xz xy."""
    from ase import Atoms
    from ase.calculators.lj import LennardJones as AseLJ

    pos, cell, pbc, numbers = make_config(7, two_species=False, pbc=pbc, rotate=True)
    atoms = Atoms(numbers=numbers, positions=pos, cell=cell, pbc=pbc)
    atoms.calc = AseLJ(sigma=SIG[18], epsilon=EPS[18], rc=CUTOFF, smooth=False)
    e_ase = atoms.get_potential_energy()
    f_ase = atoms.get_forces()
    s_ase = atoms.get_stress(voigt=True)
    ea_ase = atoms.get_potential_energies()

    ref, sc = run_ref(pos, cell, pbc, numbers, shift=True)
    got = run_impl(make_lj(True, two_species=False), pos, cell, pbc, numbers)
    vol = abs(np.linalg.det(cell))
    W = got["virial"]
    s_got = -np.array([W[0, 0], W[1, 1], W[2, 2], W[1, 2], W[0, 2], W[0, 1]]) / vol
    rt = 1e-11  # ASE sums in a different order; its own round-off is the limit here
    assert abs(got["energy"] - e_ase) <= rt * sc["energy"]
    assert np.abs(got["forces"] - f_ase).max() <= rt * sc["forces"]
    assert np.abs(got["energies"] - ea_ase).max() <= rt * sc["energy"]
    assert np.abs(s_got - s_ase).max() <= rt * sc["virial"] / vol
    # the reference agrees with ASE too
    assert abs(ref["energy"] - e_ase) <= rt * sc["energy"]
    assert np.abs(ref["forces"] - f_ase).max() <= rt * sc["forces"]


# --------------------------------------------------------------------------- finite differences
H = 1e-5


def _third_derivative_bound(pos, cell, pbc, numbers, shift):
    """Per ordered pair a bound on |d^3 u(|r + t e|)/dt^3| for a unit vector e:
    with rho = |r + t e|: rho' = c (|c| <= 1), |rho''| <= 1/rho, |rho'''| <= 3/rho^2, so
    |u'''rho'^3 + 3u''rho'rho'' + u'rho'''| <= |u'''| + 3|u''|/r + 3|u'|/r^2."""
    eps_t, sig_t, type_of = tables({18, 36})
    t = np.array([type_of[int(z)] for z in numbers])
    i, j, _, rvec = pair_arrays(pos, cell, pbc, CUTOFF)
    r = np.linalg.norm(rvec, axis=1)
    e, s = eps_t[t[i], t[j]], sig_t[t[i], t[j]]
    a, b = 4 * e * s**12, 4 * e * s**6  # u = a r^-12 - b r^-6
    u1 = -12 * a * r**-13 + 6 * b * r**-7
    u2 = 156 * a * r**-14 - 42 * b * r**-8
    u3 = -2184 * a * r**-15 + 336 * b * r**-9
    return i, j, r, np.abs(u3) + 3 * np.abs(u2) / r + 3 * np.abs(u1) / r**2


@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, False)])
def test_forces_are_minus_gradient(pbc):
    pos, cell, pbc, numbers = make_config(8, n=12, pbc=pbc, fd_margin=10 * H)
    lj = make_lj(shift=False)  # the shift is a constant; no pair crosses the cutoff anyway
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    nl = build_neighbor_list(p, c, b, CUTOFF + 1.0)  # displacements of 1e-5 A stay valid
    f = run_impl(lj, pos, cell, pbc, numbers, nl=nl)["forces"]
    _, sc = run_ref(pos, cell, pbc, numbers)
    i, j, _, B = _third_derivative_bound(pos, cell, pbc, numbers, False)
    # Error of the central difference (E(x+h) - E(x-h)) / 2h:
    #  truncation  h^2/6 * |d^3E/dx^3|, and d^3E/dx_a^3 for atom k is a sum over the pairs
    #    containing k (each unordered pair once; a self-image pair does not depend on x_k)
    #    of the bound above -> h^2/6 * sum_j B_kj   (~1e-9 eV/A here);
    #  round-off   ~ (ulp of the energy sum) / h: E is a sum of ~1e3 terms whose magnitudes
    #    add up to sum|u|, error <= ~1e3 * 1.1e-16 * sum|u| in the worst case, divided by h.
    # A factor 2 of safety on top.
    trunc = H**2 / 6 * np.bincount(i, weights=B * (i != j), minlength=len(pos))
    roundoff = 1e3 * 1.1e-16 * sc["energy"] / H
    tol = 2 * (trunc + roundoff)
    fd = np.zeros_like(pos)
    for k in range(len(pos)):
        for a in range(3):
            ep, em = pos.copy(), pos.copy()
            ep[k, a] += H
            em[k, a] -= H
            Ep = run_impl(lj, ep, cell, pbc, numbers, nl=nl)["energy"]
            Em = run_impl(lj, em, cell, pbc, numbers, nl=nl)["energy"]
            fd[k, a] = -(Ep - Em) / (2 * H)
    err = np.abs(fd - f)
    assert np.all(err <= tol[:, None]), f"max err {err.max():.3e}, tol {tol.min():.3e}..{tol.max():.3e}"


@pytest.mark.parametrize("pbc", [(True, True, True), (False, True, True)])
def test_virial_is_minus_strain_derivative(pbc):
    # a strain of 1e-5 moves a pair at the cutoff by 1e-5 * 8.5 A: keep 10x that margin
    pos, cell, pbc, numbers = make_config(9, n=12, pbc=pbc, rotate=True, fd_margin=10 * H * CUTOFF)
    lj = make_lj(shift=True)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float64)
    nl = build_neighbor_list(p, c, b, CUTOFF + 1.0)  # shifts stay valid under a tiny strain
    W = run_impl(lj, pos, cell, pbc, numbers, nl=nl)["virial"]
    _, sc = run_ref(pos, cell, pbc, numbers)
    i, j, r, B = _third_derivative_bound(pos, cell, pbc, numbers, True)
    # r' = (I + h E_ab) r changes along e_a at rate r_b <= r, so d^3 u/dh^3 <= B r^3; summed
    # over unordered pairs (1/2 of the ordered sum).  Same round-off estimate as for forces.
    trunc = H**2 / 6 * 0.5 * (B * r**3).sum()
    tol = 2 * (trunc + 1e3 * 1.1e-16 * sc["energy"] / H)
    fd = np.zeros((3, 3))
    for a in range(3):
        for bb in range(3):
            E = np.zeros((3, 3))
            E[a, bb] = H
            vals = []
            for sgn in (1, -1):
                F = np.eye(3) + sgn * E  # x' = F x  (row vectors: x @ F.T)
                vals.append(run_impl(lj, pos @ F.T, cell @ F.T, pbc, numbers, nl=nl)["energy"])
            fd[a, bb] = -(vals[0] - vals[1]) / (2 * H)
    err = np.abs(fd - W).max()
    assert err <= tol, f"max err {err:.3e} > tol {tol:.3e}\nfd={fd}\nW={W}"


def test_reference_forces_and_virial_finite_difference():
    """The reference's own forces/virial are consistent with its energy (cheap spot check)."""
    pos, cell, pbc, numbers = make_config(10, n=8, fd_margin=10 * H * CUTOFF)
    eps, sig, type_of = tables({18, 36})

    def energy(p, c):
        return lj_reference(p, c, pbc, numbers, eps, sig, type_of, CUTOFF, True)[0]

    _, f, W, _ = lj_reference(pos, cell, pbc, numbers, eps, sig, type_of, CUTOFF, True)
    for k, a in [(0, 0), (3, 1), (7, 2)]:
        ep, em = pos.copy(), pos.copy()
        ep[k, a] += H
        em[k, a] -= H
        assert abs(-(energy(ep, cell) - energy(em, cell)) / (2 * H) - f[k, a]) < 1e-7
    for a, b in [(0, 0), (0, 1), (2, 1)]:
        E = np.zeros((3, 3))
        E[a, b] = H
        Fp, Fm = np.eye(3) + E, np.eye(3) - E
        d = -(energy(pos @ Fp.T, cell @ Fp.T) - energy(pos @ Fm.T, cell @ Fm.T)) / (2 * H)
        assert abs(d - W[a, b]) < 1e-6


# --------------------------------------------------------------------------- float32
@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)])
def test_float32_matches_float64(pbc):
    pos, cell, pbc, numbers = make_config(11, pbc=pbc, fd_margin=1e-3)
    lj = make_lj()
    ref, sc = run_ref(pos, cell, pbc, numbers)
    p, c, b, z = to_t(pos, cell, pbc, numbers, torch.float32)
    out = lj.compute(p, c, b, z, build_neighbor_list(p, c, b, CUTOFF))
    assert out["forces"].dtype == torch.float32
    got = {k: out[k].double().numpy() for k in ("energy", "forces", "virial", "energies")}
    assert_close(got, ref, sc, 1e-5)
