"""Gradients through global sums inside a model: a charge-equilibration model (the charges
depend on every point through a sum over the whole system; tests/qeq_model.py) on 1, 2, 3 and
4 domains against a brute-force single-process evaluation (plain torch, every pair over
explicit periodic images) and finite differences, over NVE steps with migrations; per-point
energies summing to the total; the collectives' backward against hand-derived gradients."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WorldTask

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "mpi"))

import qeq_model as Q  # noqa: E402

STEPS = 30
MODELS = ("qeq", "qeq_partial", "qeq_self")


def world_tasks(item):
    if item.originalname.startswith("test_k_domains_"):
        k = item.callspec.params["k"]
        return [WorldTask(k, f"global_sums{k}", "global_sums", ["{out}", str(STEPS)])]
    return []


@pytest.fixture(scope="module")
def one_domain():
    import global_sums

    from shardmd.domain.comm import Comm

    return {m: global_sums.run_md(Comm(), m, STEPS) for m in MODELS}


@pytest.fixture(scope="module")
def brute_frames(one_domain):
    """Brute-force outputs at the first and last checkpoint of the one-domain trajectory."""
    d = one_domain["qeq"]
    return {i: Q.brute_force(d["positions"][i], d["cell"], d["numbers"]) for i in (0, -1)}


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


# -- the references themselves ------------------------------------------------------------------
@pytest.fixture(scope="module")
def brute_force_fd():
    """Largest |finite difference - brute-force force| over a few coordinates (one process)."""
    a = Q.sample()
    bf = Q.brute_force(a.positions, a.cell.array, a.numbers)
    cell = torch.tensor(a.cell.array, dtype=torch.float64)
    z = torch.tensor(a.numbers)
    h, worst = 1e-4, 0.0
    for i, ax in ((3, 0), (100, 1), (250, 2)):
        e = []
        for s in (h, -h):
            x = torch.tensor(a.positions, dtype=torch.float64)
            x[i, ax] += s
            e.append(float(Q.brute_energy(x, cell, z)[0]))
        worst = max(worst, abs(-(e[0] - e[1]) / (2 * h) - bf["forces"][i, ax]))
    assert abs(bf["charges"].sum() - Q.TOTAL_CHARGE) < 1e-12 and abs(bf["energies"].sum() - bf["energy"]) < 1e-12
    return worst


def _one_domain_matches_brute_force(one_domain, brute_frames):
    for name in MODELS:
        d = one_domain[name]
        for i, bf in brute_frames.items():
            assert _rel(d["forces"][i], bf["forces"]) <= 1e-10, name
            assert _rel(d["energies"][i], bf["energies"]) <= 1e-10, name
            assert _rel(d["charges"][i], bf["charges"]) <= 1e-10, name
            assert abs(d["energy"][i] - bf["energy"]) <= 1e-10 * abs(bf["energy"]), name


def test_a_float32_system_sum_is_the_exact_sum_rounded_once():
    """100,000 float32 site energies of ~-3.5 eV: system_sum gives the exact sum (math.fsum in
    float64) rounded once to float32, where a float32 index_add drifts by eV (one rounding per
    term); its gradient stays ones in float32."""
    import math

    from shardmd.domain.runtime import system_sum

    g = torch.Generator().manual_seed(0)
    v = (-3.5 + 0.1 * torch.randn(100_000, generator=g, dtype=torch.float64)).float().requires_grad_(True)
    index = torch.zeros(100_000, dtype=torch.int64)
    exact = math.fsum(v.detach().double().tolist())
    out = system_sum(v, index)
    assert out.dtype == torch.float32 and out.shape == (1,)
    assert abs(float(out) - exact) <= float(torch.finfo(torch.float32).eps) * abs(exact)
    (grad,) = torch.autograd.grad(out.sum(), v)
    assert grad.dtype == torch.float32 and bool((grad == 1).all())
    two = system_sum(v.detach(), torch.arange(100_000) % 2, 2)   # two systems, each its own exact sum
    for k in range(2):
        ref = math.fsum(v.detach().double()[k::2].tolist())
        assert abs(float(two[k]) - ref) <= float(torch.finfo(torch.float32).eps) * abs(ref)


def test_seed_once_is_the_identity_outside_a_scope_and_on_one_rank():
    """(seed_once is what a model differentiating itself calls; docs/distributed.md)"""
    from shardmd.domain.api import seed_once
    from shardmd.domain.collectives import seed_once as seed_once_on
    from shardmd.domain.comm import Comm

    x = torch.ones(3, requires_grad=True)
    assert seed_once(x) is x and seed_once_on(Comm(), x) is x


# -- K domains --------------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_domains_md_with_migrations_match_one_domain_and_brute_force(k, mpi_world, one_domain, brute_frames):
    _one_domain_matches_brute_force(one_domain, brute_frames)
    out = mpi_world(k, f"global_sums{k}")
    for name in MODELS:
        d, ref = dict(np.load(out / f"{name}.npz")), one_domain[name]
        assert int(d["migrated"]) > 0 and int(d["rebuilds"]) >= 3 and np.prod(d["grid"]) == k, name
        assert np.abs(d["positions"] - ref["positions"]).max() < 1e-10, name
        assert _rel(d["forces"], ref["forces"]) <= 1e-10, name            # every checkpoint
        assert _rel(d["energy"], ref["energy"]) <= 1e-10, name            # every step
        assert _rel(d["charges"], ref["charges"]) <= 1e-10, name
        for i in (0, -1):   # fresh brute-force evaluations of the K-domain configurations
            bf = Q.brute_force(d["positions"][i], d["cell"], d["numbers"]) if i else brute_frames[0]
            assert _rel(d["forces"][i], bf["forces"]) <= 1e-10, name
            assert _rel(d["energies"][i], bf["energies"]) <= 1e-10, name
            assert abs(d["energy"][i] - bf["energy"]) <= 1e-10 * abs(bf["energy"]), name


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_domains_forces_are_finite_differences_of_the_k_domain_energy(k, mpi_world, brute_force_fd):
    assert brute_force_fd < 1e-6          # the brute-force reference is the energy's gradient
    out = mpi_world(k, f"global_sums{k}")
    for name in MODELS:
        d = dict(np.load(out / f"{name}.npz"))
        assert np.abs(d["fd"] - d["fd_forces"]).max() < 1e-6, name
        assert np.abs(d["fd_forces"]).max() > 1e-3, name    # the probes see real forces


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_domains_per_point_energies_sum_to_the_total(k, mpi_world):
    out = mpi_world(k, f"global_sums{k}")
    for name in MODELS:
        d = dict(np.load(out / f"{name}.npz"))
        total = d["energy"][::10]
        assert np.abs(d["energies"].sum(1) - total).max() <= 1e-12 * np.abs(total).max(), name
        assert np.abs(d["charges"].sum(1) - Q.TOTAL_CHARGE).max() < 1e-12, name


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_domains_all_reduce_backward_is_its_adjoint(k, mpi_world):
    checks = json.loads((mpi_world(k, f"global_sums{k}") / "collectives.json").read_text())
    assert checks["reused_global_value"] <= 1e-12 and checks["seed_once"] == 0.0
