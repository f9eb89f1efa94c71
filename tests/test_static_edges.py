"""Sync-free edge selection (models/edge_filter.py) and its overflow path through the engine's
deferred skin check. References: the exact selection by ``torch.nonzero`` (a host read per
step), and the engine with the per-step skin check, whose MACE path uses that exact selection."""
import numpy as np
import pytest
import torch

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation
from shardmd.models.edge_filter import RadiusFilter


class _List:  # stands for a neighbour list: the filter keys its capacity on the object
    pass


def test_static_selection_keeps_exactly_the_inner_edges():
    g = torch.Generator().manual_seed(0)
    lengths = 6.0 * torch.rand(5000, generator=g, dtype=torch.float64)
    exact = torch.nonzero(lengths < 5.0).squeeze(1)
    f = RadiusFilter(5.0, margin=0.02, slack=8)
    sel = f.select(lengths, _List(), static=True)
    assert sel.index.shape[0] == f.capacity > exact.shape[0]
    assert torch.equal(sel.index[sel.valid], exact)
    assert 0.9 < float(sel.fill) < 1.0
    m = sel.index.shape[0]
    v = torch.randn(m, 3, dtype=torch.float64, generator=g)
    i, j = torch.randint(0, 40, (m,), generator=g), torch.randint(0, 40, (m,), generator=g)
    pi, pj, padded = f.pad(i, j, v, sel, 40)
    assert torch.all(torch.linalg.vector_norm(padded[~sel.valid], dim=1) == 10.0)
    assert torch.equal(padded[sel.valid], v[sel.valid]) and torch.equal(pi[sel.valid], i[sel.valid])
    assert torch.equal(pi[~sel.valid], pj[~sel.valid])                 # padding: self-edges,
    assert pi[~sel.valid].unique().numel() == min(40, int((~sel.valid).sum()))  # spread over points


def test_static_selection_reports_overflow_and_grows_at_the_next_list():
    lengths = torch.linspace(0.0, 6.0, 1000, dtype=torch.float64)
    f = RadiusFilter(5.0, margin=0.0, slack=0)
    nl = _List()
    f.select(lengths, nl, static=True)
    grown = torch.linspace(0.0, 5.5, 1000, dtype=torch.float64)   # more edges inside, same list
    over = f.select(grown, nl, static=True)
    assert float(over.fill) > 1.0
    f.observe(over.fill)    # what the model does after each call (eager or replayed graph)
    sel = f.select(grown, _List(), static=True)                    # a new list: resized, margin up
    assert float(sel.fill) <= 1.0 and f.margin > 0.0
    assert torch.equal(sel.index[sel.valid], torch.nonzero(grown < 5.0).squeeze(1))


HOT_CU = ["model=mace", "precision=float64", "system.a=3.61", "system.repeat=[3,3,3]", "temperature=1500",
          "dt=2.0", "integrator=langevin", "seed=4", "neighbor.skin=0.8", "thermo.every=0",
          "trajectory.every=0", "checkpoint.every=0", "quiet=true", "overwrite=true", "steps=40"]


def _final(sim):
    sim.run()
    s = sim.state
    order = np.argsort(s.ids.numpy())
    return s.unwrapped_positions()[order].numpy(), s.velocities[order].numpy()


@pytest.mark.slow
def test_sync_free_mace_steps_match_the_exact_selection(tmp_path):
    ref = Simulation(compose_config([*HOT_CU, "neighbor.deferred=false", f"output={tmp_path}/r.h5"]))
    assert not ref.model.static_edges
    x_ref, v_ref = _final(ref)
    sim = Simulation(compose_config([*HOT_CU, "neighbor.deferred=true", f"output={tmp_path}/s.h5"]))
    assert sim.model.static_edges
    x, v = _final(sim)
    assert sim.deferred.reads < 40 and sim.model._filter.resizes == sim.nl.n_builds
    assert np.abs(x - x_ref).max() < 1e-9 and np.abs(v - v_ref).max() < 1e-9
    # an undersized capacity (one edge short at every new list until an overflow was seen):
    # the incomplete step-0 forces are detected, the run rolls back, rebuilds and recomputes
    bad = Simulation(compose_config([*HOT_CU, "neighbor.deferred=true", f"output={tmp_path}/b.h5"]))
    bad.model._filter.margin, bad.model._filter.slack = 0.0, -1
    xb, vb = _final(bad)
    assert bad.deferred.rollbacks >= 1 and bad.model._filter.margin > 0.0
    assert np.abs(xb - x_ref).max() < 1e-9 and np.abs(vb - v_ref).max() < 1e-9
    # the same with pipelined reads: the overflow arrives in a read settled a step later
    late = Simulation(compose_config([*HOT_CU, "neighbor.deferred=true", f"output={tmp_path}/p.h5"]))
    late.deferred.pipelined = True
    late.model._filter.margin, late.model._filter.slack = 0.0, -1
    xp, vp = _final(late)
    assert late.deferred.rollbacks >= 1 and late.deferred.posted >= 1 and late.model._filter.margin > 0.0
    assert np.abs(xp - x_ref).max() < 1e-9 and np.abs(vp - v_ref).max() < 1e-9


def test_mace_call_restores_the_torchscript_executor_setting():
    """MaceModel switches TorchScript to its simple executor for its own call only."""
    pytest.importorskip("mace")
    from ase.build import bulk

    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.models.mace import MaceModel

    model = MaceModel()
    a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))
    x = torch.tensor(a.positions, dtype=torch.float64)
    cell = torch.tensor(a.cell.array, dtype=torch.float64)
    nl = build_neighbor_list(x, cell, (True, True, True), model.cutoff)
    for setting in (True, False):
        before = torch._C._jit_set_profiling_executor(setting)
        try:
            out = model.compute(x, cell, (True, True, True), torch.tensor(a.numbers), nl)
            assert torch._C._jit_set_profiling_executor(setting) is setting
        finally:
            torch._C._jit_set_profiling_executor(before)
        assert torch.isfinite(out["forces"]).all()


@pytest.mark.gpu
def test_sync_free_mace_steps_on_cuda_match_the_exact_selection(tmp_path):
    cuda = [*HOT_CU, "device=cuda", "model.cueq=false"]

    def final(sim):
        sim.run()
        s = sim.state
        order = np.argsort(s.ids.cpu().numpy())
        return s.unwrapped_positions().cpu()[order].numpy(), s.velocities.cpu()[order].numpy()

    x_ref, v_ref = final(Simulation(compose_config([*cuda, "neighbor.deferred=false", f"output={tmp_path}/r.h5"])))
    sim = Simulation(compose_config([*cuda, f"output={tmp_path}/s.h5"]))    # auto: deferred on CUDA
    assert sim.model.static_edges
    x, v = final(sim)
    bad = Simulation(compose_config([*cuda, f"output={tmp_path}/b.h5"]))
    bad.model._filter.margin, bad.model._filter.slack = 0.0, -1
    xb, vb = final(bad)
    assert bad.deferred.rollbacks >= 1
    # CUDA's atomic scatter-adds sum in varying order: round-off grows a little over 40 hot steps
    for a, b in ((x, x_ref), (v, v_ref), (xb, x_ref), (vb, v_ref)):
        assert np.abs(a - b).max() < 1e-8
