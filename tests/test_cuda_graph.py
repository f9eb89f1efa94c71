"""CUDA graphs (domain/graphed_call.py) and the MACE call replayed as one between rebuilds.

References: the same function run eagerly, the engine with ``model.cuda_graph=false``, and
mace-torch's own calculator (float64, CPU) on the final configuration. Skipped (with the
reason) without CUDA; on the device machine: ``pytest -q -m gpu tests/test_cuda_graph.py``.
"""
import warnings

import numpy as np
import pytest
import torch

from shardmd.domain.api import GraphedCall
from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on the device machine"),
]


def _fn(x, w):
    y = torch.tanh(x @ w)
    return {"y": y, "s": y.sum()}


def test_graphed_call_replays_the_eager_result_and_follows_new_inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(16, 16, device="cuda", generator=g)
    call, owner = GraphedCall(), object()
    for k in range(4):   # eager, capture + replay, replay, replay
        x = torch.randn(64, 16, device="cuda", generator=g)
        out = call(_fn, owner, (64,), (x, w))
        ref = _fn(x, w)
        assert torch.allclose(out["y"], ref["y"], rtol=1e-6, atol=1e-6), k
    assert (call.eager, call.captures, call.replays) == (1, 1, 3)
    kept = out["y"].clone()
    call(_fn, owner, (64,), (torch.zeros(64, 16, device="cuda"), w))
    assert torch.equal(out["y"], kept)           # outputs are copies: a replay does not overwrite them
    call(_fn, object(), (64,), (x, w))           # a new owner: the graph is dropped, eager again
    assert call.eager == 2 and call.graph is None


def test_graphed_call_stays_eager_when_the_function_reads_back():
    def reads_back(x):
        return {"y": x * float(x.sum())}         # a device->host read: cannot be captured

    call, owner = GraphedCall(), object()
    x = torch.arange(4.0, device="cuda")
    for _ in range(3):
        assert torch.equal(call(reads_back, owner, (4,), (x,))["y"], x * 6.0)
    assert call.disabled and call.captures == 0 and call.eager == 3
    # the failed capture left nothing behind: work is back on the default stream, and a new
    # capture in this process succeeds (a torch.cuda.graph body that raised broke both)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    w = torch.eye(16, device="cuda")
    good, owner = GraphedCall(), object()
    for k in range(3):
        x = torch.full((8, 16), float(k), device="cuda")
        assert torch.allclose(good(_fn, owner, (8,), (x, w))["y"], torch.tanh(x)), k
    assert good.disabled is None and (good.captures, good.replays) == (1, 2)


def _run(tmp_path, name, graph):
    cfg = compose_config(["model=mace", "precision=float64", "device=cuda", "system.repeat=[4,4,4]",
                          "temperature=1200", "dt=2.0", "steps=60", "thermo.every=0", "trajectory.every=0",
                          "checkpoint.every=0", "quiet=true", "overwrite=true", f"model.cuda_graph={graph}",
                          f"output={tmp_path}/{name}.h5"])
    sim = Simulation(cfg)
    sim.run()
    full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
    return sim, full


def test_graphed_mace_run_matches_the_eager_run_and_mace_calculator(tmp_path):
    from ase import Atoms
    from mace.calculators import MACECalculator

    from shardmd.models.mace import DEFAULT_MODEL

    sim, full = _run(tmp_path, "graph", "true")
    g = sim.model._graphed
    assert g.disabled is None, g.disabled
    assert g.replays >= 30 and g.captures >= 1, (g.replays, g.captures, g.eager)
    assert sim.nl.n_builds >= 2                  # hot: the graph was re-captured for a new list
    eager, ref = _run(tmp_path, "eager", "false")
    assert eager.model._graphed.replays == 0
    # the same kernels in the same order: the trajectories agree to round-off
    assert np.abs(full["positions"] - ref["positions"]).max() < 1e-9
    # forces of the final configuration against mace-torch's own calculator (independent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(model_paths=str(DEFAULT_MODEL), device="cpu", default_dtype="float64")
    atoms = Atoms(numbers=full["numbers"], positions=full["positions"], cell=sim.state.cell.cpu().numpy(), pbc=True)
    atoms.calc = calc
    f_ref = atoms.get_forces()
    # cuEquivariance's kernels (when installed) contract in another order than e3nn: 1e-9 relative
    assert np.abs(full["forces"] - f_ref).max() <= 1e-9 * np.abs(f_ref).max()


@pytest.mark.parametrize("graph", ["true", "false"])
def test_compiled_mace_follows_the_eager_run_with_and_without_the_cuda_graph(tmp_path, monkeypatch, graph):
    """``model.compile=true`` on CUDA (cuEquivariance where installed), replayed as the graph of
    each list or called each step: the trajectory follows the eager, ungraphed run's through
    list rebuilds to round-off. (On torch 2.11 + CUDA, mace-torch's per-layer exchange, an
    autograd.Function that writes its output in place, gave wrong gradients once traced: 4e-3
    eV/Å on the second call; a call without ghost rows passes none: scripts/check_compiled_mace.py.)"""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = compose_config(["model=mace", "precision=float64", "device=cuda", "system.repeat=[4,4,4]",
                          "temperature=1200", "dt=2.0", "steps=60", "thermo.every=0", "trajectory.every=0",
                          "checkpoint.every=0", "quiet=true", "overwrite=true", "model.compile=true",
                          f"model.cuda_graph={graph}", f"output={tmp_path}/compiled.h5"])
    sim = Simulation(cfg)
    sim.run()
    g = sim.model._graphed
    assert sim.model.compiled and sim.nl.n_builds >= 2, sim.nl.n_builds
    if graph == "true":
        assert g.disabled is None and g.replays >= 30, (g.disabled, g.replays)
    else:
        assert sim.model.graph_max_points is None and g.replays == 0
    full = sim.domain.gather(sim.state, ("positions",))
    _, ref = _run(tmp_path, "eager", "false")
    assert np.abs(full["positions"] - ref["positions"]).max() < 1e-9
