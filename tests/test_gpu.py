"""CUDA against CPU: neighbour lists, Lennard-Jones forces/energy/virial, an engine run.

Skipped (with the reason) where torch sees no CUDA device; on the device machine:
``pytest -q -m gpu tests/test_gpu.py``.  scripts/check_cuda_lj.py prints the same
comparisons with their figures.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on the device machine"),
]

TOL = 1e-10
EPS = {"Ar": 0.0103, "Kr": 0.014}
SIG = {"Ar": 3.405, "Kr": 3.65}
CUTOFF = 8.5


def _system(n_cells=11, two_species=True, seed=0, dtype=torch.float64):
    """~5k atoms on a perturbed fcc lattice in a sheared cell, a fifth of them moved by
    lattice vectors (unwrapped positions, many image shifts)."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    atoms = bulk("Ar", "fcc", a=5.72, cubic=True).repeat((n_cells,) * 3)
    frac = atoms.get_scaled_positions()
    L = atoms.cell.lengths()[0]
    cell = np.array([[L, 0.0, 0.0], [0.31 * L, 0.95 * L, 0.0], [-0.22 * L, 0.27 * L, 1.02 * L]])
    pos = frac @ cell + rng.normal(scale=0.15, size=frac.shape)
    moved = rng.random(len(pos)) < 0.2
    pos[moved] += rng.integers(-2, 3, size=(int(moved.sum()), 3)) @ cell
    numbers = rng.choice([18, 36], size=len(pos)) if two_species else np.full(len(pos), 18)
    return (torch.tensor(pos, dtype=dtype), torch.tensor(cell, dtype=dtype), torch.tensor([True] * 3),
            torch.tensor(numbers, dtype=torch.int64))


def _lj(two_species):
    from shardmd.models.lj import LennardJones

    if two_species:
        return LennardJones(epsilon=dict(EPS), sigma=dict(SIG), cutoff=CUTOFF)
    return LennardJones(epsilon={"Ar": EPS["Ar"]}, sigma={"Ar": SIG["Ar"]}, cutoff=CUTOFF)


def _cuda(*ts):
    return [t.cuda() for t in ts]


@pytest.mark.parametrize("n_ghost", [0, 500], ids=["all-query", "ghosts"])
@pytest.mark.parametrize("two_species", [True, False], ids=["ArKr", "Ar"])
def test_lj_cuda_matches_cpu(two_species, n_ghost):
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = _system(two_species=two_species)
    nq = len(pos) - n_ghost
    nl_c = build_neighbor_list(pos, cell, pbc, CUTOFF + 1.0, n_query=nq)
    gpos, gcell, gpbc, gz = _cuda(pos, cell, pbc, z)
    nl_g = build_neighbor_list(gpos, gcell, gpbc, CUTOFF + 1.0, n_query=nq)
    # the same edges in the same order: the order is set by ids and geometry, not the device
    assert torch.equal(nl_c.offsets, nl_g.offsets.cpu())
    assert torch.equal(nl_c.neighbors, nl_g.neighbors.cpu())
    assert torch.equal(nl_c.shifts, nl_g.shifts.cpu())
    assert int((nl_c.shifts != 0).any(1).sum()) > 1000

    lj = _lj(two_species)
    ref = lj.compute(pos, cell, pbc, z, nl_c)
    out = lj.compute(gpos, gcell, gpbc, gz, nl_g)
    out = {k: v.cpu() for k, v in out.items()}
    fmax = ref["forces"].abs().max()
    assert (out["forces"] - ref["forces"]).abs().max() <= TOL * fmax
    assert (out["energies"] - ref["energies"]).abs().max() <= TOL * ref["energies"].abs().max()
    assert (out["energy"] - ref["energy"]).abs() <= TOL * ref["energies"].abs().sum()
    assert (out["virial"] - ref["virial"]).abs().max() <= TOL * ref["virial"].abs().max()


def test_lj_cuda_is_deterministic():
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = _cuda(*_system())
    lj = _lj(True)
    runs = []
    for _ in range(2):
        nl = build_neighbor_list(pos, cell, pbc, CUTOFF + 1.0)
        runs.append((nl, lj.compute(pos, cell, pbc, z, nl)))
    (nl_a, a), (nl_b, b) = runs
    assert torch.equal(nl_a.neighbors, nl_b.neighbors) and torch.equal(nl_a.shifts, nl_b.shifts)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_lj_cuda_float32_close_to_float64():
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = _system(n_cells=8)
    lj = _lj(True)
    ref = lj.compute(pos, cell, pbc, z, build_neighbor_list(pos, cell, pbc, CUTOFF + 1.0))
    p32, c32 = pos.float().cuda(), cell.float().cuda()
    # float32 loses ~1e-7 of |x| ~ 100 Å in x_j - x_i: compare at 1e-4 of max|F|
    out = lj.compute(p32, c32, pbc.cuda(), z.cuda(), build_neighbor_list(p32, c32, pbc.cuda(), CUTOFF + 1.0))
    assert out["forces"].dtype == torch.float32
    assert (out["forces"].double().cpu() - ref["forces"]).abs().max() <= 1e-4 * ref["forces"].abs().max()


def test_engine_run_on_cuda(tmp_path):
    from shardmd.engine.config import compose_config
    from shardmd.engine.simulation import Simulation

    def run(device):
        cfg = compose_config(["model=lj", "system.repeat=[6,6,6]", "system.a=5.72", "steps=30", "dt=5.0",
                              "temperature=120.0", f"device={device}", "threads=1", "quiet=true",
                              "trajectory.every=0", "thermo.every=0", f"output={tmp_path}/{device}.h5"])
        sim = Simulation(cfg)
        obs = sim.run()
        return sim, obs

    sim_g, gpu = run("cuda")
    assert sim_g.state.positions.is_cuda and sim_g.state.forces.is_cuda
    _, cpu = run("cpu")
    n = 864
    assert abs(gpu["potential_energy"] - cpu["potential_energy"]) / n < 1e-8
    assert abs(gpu["total_energy"] - cpu["total_energy"]) / n < 1e-8
