"""DistributedModel's ``direct_call`` (shardmd.domain.distributed_model): which models it is taken
for, and the engine's LJ called through it gives the op's bits on one rank (tests/mpi/shard_cases.py
compares them on 2-4 ranks)."""
from __future__ import annotations

import pytest
import torch

from shardmd.domain.api import DistributedModel
from shardmd.models.lj import LennardJones
from shardmd.models.lj_op import SPEC_LJ, LennardJonesOp


def _lj():
    return LennardJones({"Ar": 0.0104}, {"Ar": 3.40}, cutoff=8.5)


class _Forwarding:
    """A wrapper forwarding attributes to its model, with a compute of its own."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, k):
        return getattr(self.inner, k)

    def compute(self, *a, **k):
        return self.inner.compute(*a, **k)


def test_taken_only_for_the_models_own_attribute():
    assert DistributedModel(LennardJonesOp(_lj(), direct=True)).direct is not None
    assert DistributedModel(LennardJonesOp(_lj())).direct is None
    assert DistributedModel(LennardJonesOp(_lj(), direct=True), SPEC_LJ).direct is None   # a spec given: the op
    assert DistributedModel(_Forwarding(LennardJonesOp(_lj(), direct=True))).direct is None
    m = LennardJonesOp(_lj())
    m.direct = True   # a model's own flag of that name (ORB's direct forces) is not the hook
    assert DistributedModel(m).direct is None
    m.direct_call = object()
    with pytest.raises(TypeError, match="direct_call must offer compute"):
        DistributedModel(m)


@pytest.mark.parametrize("skip", [None, "forces_only", "virial_only"])
def test_engine_lj_direct_equals_the_op(tmp_path, skip):
    """One rank, an npt-free LJ run's state after 20 steps: the model call through direct_call and
    through the op give the same bits (NaN where the call skips a sum)."""
    from shardmd.engine.run.simulation import Simulation

    sim = Simulation.from_args(["model=lj", "system.repeat=[3,3,3]", "steps=20", "quiet=true", "threads=1",
                                "trajectory.every=0", "thermo.every=0", "checkpoint.every=0",
                                f"output={tmp_path / 'a.h5'}"])
    sim.run(20)
    d, dm = sim.domain, sim.dmodel
    assert dm.direct is not None
    outs = []
    for direct in (dm.direct, None):
        dm.direct = direct
        if skip:
            setattr(sim.model, skip, True)
        try:
            outs.append(dm.compute(d.ctx, d.padded_positions, d.padded_numbers, d.nl.current))
        finally:
            if skip:
                setattr(sim.model, skip, False)
    a, b = outs
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k].isnan(), b[k].isnan()), k
        keep = ~a[k].isnan()
        assert torch.equal(a[k][keep], b[k][keep]), k
    assert bool(a["forces"].abs().sum() > 0)
    assert bool(a["energy"].isnan()) == (skip is not None)   # the flags reached the call


def test_a_deep_copy_calls_its_own_model():
    """copy.deepcopy of the op model: the copy's direct_call serves the copy (its handle, its LJ)."""
    import copy

    m = LennardJonesOp(_lj(), direct=True)
    c = copy.deepcopy(m)
    assert c.direct_call.op is c and m.direct_call.op is m
