"""Deferred skin check (engine/run/skin_check.py): the skin criterion read back only at scheduled
steps must give the trajectory of a per-step check. The reference is the per-step check
(itself tested against brute-force pair searches in test_dynamics.py); the deferred runs must
read back far less often, and a window that missed a rebuild must be rolled back and replayed."""
import numpy as np
import pytest

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.skin_check import DeferredSkinCheck

# a hot Ar gas: ~1 rebuild every few steps, so windows cross skin/2 often
HOT = ["model=lj", "system.element=Ar", "system.lattice=fcc", "system.a=5.8", "system.repeat=[4,4,4]",
       "temperature=900", "dt=4.0", "neighbor.skin=0.6", "thermo.every=0", "trajectory.every=0",
       "checkpoint.every=0", "quiet=true", "overwrite=true", "model.cutoff=7.0", "threads=1"]


def _run(tmp_path, name, extra, steps=200, planner=None, pipelined=False):
    sim = Simulation(compose_config([*HOT, *extra, f"steps={steps}", f"output={tmp_path}/{name}.h5"]))
    if planner is not None:
        sim.deferred = planner
    if pipelined:
        sim.deferred.pipelined = True
    obs = sim.run()
    s = sim.state
    order = np.argsort(s.ids.numpy())
    return {"x": s.unwrapped_positions()[order].numpy(), "v": s.velocities[order].numpy(), "obs": obs,
            "builds": sim.nl.n_builds, "chk": sim.deferred}


class _Overconfident(DeferredSkinCheck):
    """Plans as if atoms never moved: every window overshoots skin/2, forcing rollbacks."""

    def plan(self, step, last, lead=1):
        return last > self.half_skin

    def schedule(self, step, current):
        self.next_check = step + self.max_every


class _NoLookahead(DeferredSkinCheck):
    """Reads every step and never rebuilds ahead: a posted step over skin/2 is found only when
    its read settles, after its forces were computed with the old list."""

    def plan(self, step, last, lead=1):
        self.next_check = step + 1
        return last > self.half_skin

    def schedule(self, step, current):
        self.next_check = step + 1


@pytest.mark.parametrize("integrator,pipelined", [("verlet", True), ("langevin", True), ("langevin", False)])
def test_deferred_check_gives_the_per_step_trajectory(tmp_path, integrator, pipelined):
    extra = [f"integrator={integrator}", "seed=5"]
    ref = _run(tmp_path, "ref", [*extra, "neighbor.deferred=false"])
    assert ref["chk"] is None and ref["builds"] > 20  # the check really fires often
    dfr = _run(tmp_path, "dfr", [*extra, "neighbor.deferred=true", "neighbor.deferred_max=20",
                                 f"neighbor.pipelined={str(pipelined).lower()}"])
    chk = dfr["chk"]
    # far fewer host read-backs than steps; rebuilds may come a step early, never late
    assert chk.reads < 0.7 * 200, chk.reads
    # pipelined: the scheduled reads that led to no rebuild did not wait (posted, settled a step later)
    assert (chk.posted >= 20) if pipelined else (chk.posted == 0), chk.posted
    # identical physics; rebuilds at other steps wrap positions at other times: round-off only
    assert np.abs(dfr["x"] - ref["x"]).max() < 1e-9
    assert np.abs(dfr["v"] - ref["v"]).max() < 1e-9
    assert dfr["obs"]["total_energy"] == pytest.approx(ref["obs"]["total_energy"], rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("pipelined", [False, True])
def test_missed_rebuild_is_rolled_back_and_replayed(tmp_path, pipelined):
    extra = ["integrator=langevin", "seed=9"]
    ref = _run(tmp_path, "ref", [*extra, "neighbor.deferred=false"], steps=120)
    bad = _Overconfident(half_skin=0.3, max_every=15, pipelined=pipelined)
    out = _run(tmp_path, "bad", [*extra, "neighbor.deferred=true"], steps=120, planner=bad)
    assert bad.rollbacks >= 3  # the overconfident schedule overshoots again and again
    assert (bad.posted >= 3) == pipelined, bad.posted   # pipelined: the rollbacks come from settled reads
    assert np.abs(out["x"] - ref["x"]).max() < 1e-9
    assert np.abs(out["v"] - ref["v"]).max() < 1e-9


def test_posted_step_over_the_skin_is_redone_with_a_new_list(tmp_path):
    extra = ["integrator=langevin", "seed=9"]
    ref = _run(tmp_path, "ref", [*extra, "neighbor.deferred=false"], steps=120)
    late = _NoLookahead(half_skin=0.3, max_every=15, pipelined=True)
    out = _run(tmp_path, "late", [*extra, "neighbor.deferred=true"], steps=120, planner=late)
    assert late.late_rebuilds >= 3 and late.posted > 60, (late.late_rebuilds, late.posted)
    assert np.abs(out["x"] - ref["x"]).max() < 1e-9
    assert np.abs(out["v"] - ref["v"]).max() < 1e-9


def test_deferred_keys_are_validated(tmp_path):
    from shardmd.engine.errors import UserError

    for bad in ("neighbor.deferred=sometimes", "neighbor.deferred_max=0"):
        with pytest.raises((UserError, ValueError), match=bad.split("=")[0]):
            Simulation(compose_config([*HOT, bad, f"output={tmp_path}/x.h5"]))


@pytest.mark.gpu
def test_deferred_is_the_cuda_default_and_matches_the_per_step_check(tmp_path):
    extra = ["integrator=langevin", "seed=3", "device=cuda"]
    ref = _run_cuda(tmp_path, "ref", [*extra, "neighbor.deferred=false"])
    dfr = _run_cuda(tmp_path, "dfr", extra)  # auto: on for CUDA
    assert dfr["chk"] is not None and dfr["chk"].reads < 0.7 * 200
    assert np.abs(dfr["x"] - ref["x"]).max() < 1e-9
    assert np.abs(dfr["v"] - ref["v"]).max() < 1e-9


@pytest.mark.gpu
def test_pipelined_reads_on_cuda_match_the_per_step_check(tmp_path):
    """The CUDA path of posted reads: pinned copy + event, settled a step later."""
    extra = ["integrator=langevin", "seed=3", "device=cuda"]
    ref = _run_cuda(tmp_path, "ref", [*extra, "neighbor.deferred=false"])
    chk = DeferredSkinCheck(half_skin=0.3, max_every=20, pipelined=True)
    dfr = _run_cuda(tmp_path, "dfr", extra, planner=chk)
    assert chk.posted >= 20 and chk.reads < 0.7 * 200, (chk.posted, chk.reads)
    assert np.abs(dfr["x"] - ref["x"]).max() < 1e-9
    assert np.abs(dfr["v"] - ref["v"]).max() < 1e-9


def _run_cuda(tmp_path, name, extra, planner=None):
    sim = Simulation(compose_config([*HOT, *extra, "steps=200", f"output={tmp_path}/{name}.h5"]))
    if planner is not None:
        sim.deferred = planner
    sim.run()
    s = sim.state
    order = np.argsort(s.ids.cpu().numpy())
    return {"x": s.unwrapped_positions().cpu()[order].numpy(), "v": s.velocities.cpu()[order].numpy(),
            "chk": sim.deferred}
