"""The per-step list check and health measure in one CPU pass (integrators/fused.py
``check_measure``, engine/run/rank_domain.py ``_fused_check``) against the torch path they replace."""
from __future__ import annotations

import math

import pytest
import torch


def test_fused_check_measure_matches_torch():
    """fused.check_measure (the per-step list check and health measure in one pass) against torch:
    max |x - x0 T|^2 and max |v|^2 over several chunks to 1e-14 relative, for T = I (a fixed cell)
    and a tilted T; a NaN position or velocity gives NaN in its own column only."""
    from shardmd.integrators import fused

    if not fused.usable(torch.zeros(1, 3, dtype=torch.float64)):
        pytest.skip("Warp is not available: the torch code runs")
    g = torch.Generator().manual_seed(11)
    n = 2 * fused.CHUNK + 7
    x0 = torch.rand(n, 3, dtype=torch.float64, generator=g) * 60.0
    work = torch.empty(n, 3, dtype=torch.float64)
    for t in ([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
              [[1.01, 0.0, 0.0], [0.02, 0.99, 0.0], [-0.01, 0.03, 1.0]]):
        tt = torch.tensor(t, dtype=torch.float64)
        x = x0 @ tt + torch.randn(n, 3, dtype=torch.float64, generator=g) * 0.1
        v = torch.randn(n, 3, dtype=torch.float64, generator=g) * 0.01
        d2, v2 = fused.check_measure(x, x0, t, v, work)
        ref_d2 = float(((x0 @ tt - x) ** 2).sum(1).amax())
        ref_v2 = float((v ** 2).sum(1).amax())
        assert abs(d2 - ref_d2) <= 1e-14 * ref_d2 and abs(v2 - ref_v2) <= 1e-14 * ref_v2, (d2, ref_d2, v2, ref_v2)
        v[n - 2, 1] = float("nan")
        d2, v2 = fused.check_measure(x, x0, t, v, work)
        assert math.isnan(v2) and abs(d2 - ref_d2) <= 1e-14 * ref_d2
        x[3, 0] = float("nan")
        assert math.isnan(fused.check_measure(x, x0, t, v, work)[0])


@pytest.mark.parametrize("case", ["verlet", "npt"])
def test_fused_check_agrees_with_the_torch_check(case, tmp_path):
    """RankDomain's one-pass check (``_fused_check``) gives the decision and measure of the torch
    path (displacement + health.step_measure) on the states of a real run, fixed cell and npt
    (a changing cell): the same rebuild decision every step over 60 steps with rebuilds, the
    measure to 1e-14; a NaN velocity makes the measure +inf, as the torch path does."""
    from shardmd.engine.run.health import step_measure
    from shardmd.engine.run.simulation import Simulation

    args = ["model=lj", "system.repeat=[4,4,4]", "dt=5.0", "temperature=600", "steps=60", "neighbor.skin=0.4",
            "quiet=true", "threads=1",
            "trajectory.every=0", "thermo.every=0", "checkpoint.every=0", f"output={tmp_path / 'run.h5'}"]
    if case == "npt":
        args += ["integrator=npt", "integrator.pressure=5000", "integrator.pdamp=200", "integrator.tdamp=50"]
    sim = Simulation.from_args(args)
    sim.setup()
    sim.started = True
    dom, dt = sim.domain, sim.integrator.dt
    fast, seen = dom._fused_check, []

    def both(s, dt):   # the engine's own check of each step, beside the torch path's parts
        got = fast(s, dt)
        d, trigger = dom.displacement(s)
        seen.append((got, (bool(d > trigger), float(step_measure(s.velocities, dt, d)))))
        return got

    dom._fused_check = both
    for _ in range(60):
        sim.step()
    dom._fused_check = fast
    assert len(seen) == 60 and all(g is not None for g, _ in seen)
    for got, ref in seen:
        assert got[0] == ref[0] and abs(got[1] - ref[1]) <= 1e-14 * ref[1], (got, ref)
    assert {g[0] for g, _ in seen} == {True, False}   # both decisions were met
    sim.state.velocities[5, 0] = float("nan")
    assert fast(sim.state, dt)[1] == math.inf


def test_retarget_points_a_recorded_launch_at_new_tensors():
    """domain's ``retarget`` (and integrators' copy of it): a recorded Warp launch re-pointed at new
    tensors reads and writes those (an output is the new tensor itself, also a strided one, which
    takes the wrapping path), as a launch recorded for them would."""
    import warp as wp

    from shardmd.domain.api import init_warp, retarget
    from shardmd.integrators.fused_common import retarget as retarget_integrators

    init_warp()

    @wp.kernel
    def axpy(x: wp.array2d(dtype=wp.float64), y: wp.array2d(dtype=wp.float64), out: wp.array2d(dtype=wp.float64)):
        i, j = wp.tid()
        out[i, j] = wp.float64(2.0) * x[i, j] + y[i, j]

    def retarget_by_layout(cmd, i, t, like):   # the integrators' copy is told whether the layout is the old one
        same = t.shape == like.shape and t.stride() == like.stride() and t.dtype == like.dtype
        retarget_integrators(cmd, i, t, same_layout=same)

    g = torch.Generator().manual_seed(3)
    for fn in (retarget, retarget_by_layout):
        x, y, out = (torch.rand(5, 3, dtype=torch.float64, generator=g) for _ in range(3))
        cmd = wp.launch(axpy, dim=(5, 3), device="cpu", record_cmd=True,
                        inputs=[wp.from_torch(x), wp.from_torch(y), wp.from_torch(out)])
        cmd.launch()
        assert torch.equal(out, 2.0 * x + y)
        x2, out2 = torch.rand(5, 3, dtype=torch.float64, generator=g), torch.zeros(5, 3, dtype=torch.float64)
        fn(cmd, 0, x2, x)
        fn(cmd, 2, out2, out)
        cmd.launch()
        assert torch.equal(out2, 2.0 * x2 + y)
        strided = torch.zeros(3, 5, dtype=torch.float64).T   # (5, 3), strides (1, 5)
        fn(cmd, 2, strided, out2)
        cmd.launch()
        assert torch.equal(strided, 2.0 * x2 + y)


@pytest.mark.parametrize("name", ["verlet", "nose-hoover"])
def test_fused_nve_and_nvt_steps_give_the_torch_bits(name, monkeypatch):
    """Velocity Verlet's and the Nosé-Hoover chain's half steps through the one-pass kernels
    (integrators/fused.py: scaling, kick and drift; kick and m v^2's words) against their torch
    expressions, bit for bit over three steps: velocities over four decades, several chunks and a
    partial one, forces that change between the halves."""
    from shardmd.integrators import fused
    from shardmd.integrators.nose_hoover import NoseHoover
    from shardmd.integrators.velocity_verlet import VelocityVerlet

    if not fused.usable(torch.zeros(1, 3, dtype=torch.float64)):
        pytest.skip("Warp is not available: the torch code runs")
    g = torch.Generator().manual_seed(11)
    n = 2 * fused.CHUNK + 29
    v = torch.randn(n, 3, dtype=torch.float64, generator=g) * 10.0 ** torch.empty(n, 1).uniform_(-4, 0, generator=g)
    masses = torch.rand(n, dtype=torch.float64, generator=g) * 100.0 + 1.0
    x = torch.rand(n, 3, dtype=torch.float64, generator=g) * 40.0 - 5.0
    f = torch.randn(n, 3, dtype=torch.float64, generator=g)

    def steps(enabled: bool):
        monkeypatch.setattr(fused, "ENABLED", enabled)
        it = VelocityVerlet(2.0) if name == "verlet" else NoseHoover(2.0, 100.0, 100.0)
        vv, xx = v.clone(), x.clone()
        for step in range(3):
            it.first_half(xx, vv, f * (step + 1), masses, torch.arange(n), step)
            it.second_half(vv, f.roll(step + 1, 0), masses)
        chain = [] if name == "verlet" else [it.t_current, *it.eta, *it.eta_dot, *it.eta_dotdot]
        return vv, xx, torch.tensor(chain, dtype=torch.float64)

    for a, b in zip(steps(True), steps(False)):
        assert torch.equal(a, b), name


def test_the_recorded_passes_keep_no_tensor_alive():
    """fused.py's recorded launches remember addresses and layouts, not tensors: a run's arrays
    are freed with their owner (the launches live as long as the process)."""
    import gc
    import weakref

    from shardmd.integrators import fused

    if not fused.usable(torch.zeros(1, 3, dtype=torch.float64)):
        pytest.skip("Warp is not available: the torch code runs")
    g = torch.Generator().manual_seed(3)
    for n in (1000, 5000):   # a second size: the arrays wrapped again, not re-pointed
        x, v, f = (torch.randn(n, 3, generator=g, dtype=torch.float64) for _ in range(3))
        m = torch.rand(n, generator=g, dtype=torch.float64) + 1.0
        fused.scale_kick_drift(x, v, f, m, 1.0, 0.01, 0.5)
        refs = [weakref.ref(t) for t in (x, v, f, m)]
        del x, v, f, m
        gc.collect()
        assert all(r() is None for r in refs)
