"""Systems stepped as one array set (engine/batch/joined.py, integrators/batched.py): the batched
integrators give each system's atoms the bits of its own integrator; a batch of mixed sizes,
species and cells, with rebuilds inside the set, equals each system run alone (float64, 200
steps, 1e-10 Å), with one joined model call per step and no Python per system on a quiet step."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.io import write
from conftest import cli_in_process
from test_batch import final, summary

from shardmd.integrators import batched
from shardmd.integrators.langevin import Langevin
from shardmd.integrators.velocity_verlet import VelocityVerlet


def _systems(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    out = []
    for n in (5, 9, 2):
        out.append({"x": torch.randn(n, 3, generator=g, dtype=dtype),
                    "v": 0.01 * torch.randn(n, 3, generator=g, dtype=dtype),
                    "f": torch.randn(n, 3, generator=g, dtype=dtype),
                    "m": (1.0 + 100 * torch.rand(n, generator=g)).to(dtype), "ids": torch.randperm(n, generator=g)})
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_langevin_gives_each_system_its_own_bits(dtype):
    systems, seeds, steps, temps = _systems(dtype), [7, 2**40 + 5, 0], [0, 13, 2**33 + 1], [300.0, 50.0, 1000.0]
    alone = []
    for s, seed, step, t in zip(systems, seeds, steps, temps):
        x, v, f = s["x"].clone(), s["v"].clone(), s["f"].clone()
        lg = Langevin(dt=2.0, temperature=t, friction=0.01, seed=seed)
        lg.first_half(x, v, f, s["m"], s["ids"], step)
        alone.append((x, v, float(lg.local_change)))
    cat = lambda key: torch.cat([s[key] for s in systems])  # noqa: E731
    x, v, f, m, ids = cat("x"), cat("v"), cat("f"), cat("m"), cat("ids")
    sizes = [len(s["ids"]) for s in systems]
    system = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    consts = [batched.langevin_constants(2.0, t, 0.01, s["m"], dtype) for s, t in zip(systems, temps)]
    c1 = torch.cat([torch.full((n, 1), c, dtype=dtype) for n, (c, _) in zip(sizes, consts)])
    scale = torch.cat([sc for _, sc in consts])
    change = batched.langevin_first(x, v, f, m, ids, 2.0, c1, scale, torch.tensor(seeds)[system],
                                    torch.tensor(steps)[system], system, 3)
    for k, (xa, va, dk) in enumerate(alone):
        sl = system == k
        assert torch.equal(x[sl], xa) and torch.equal(v[sl], va)
        assert float(change[k]) == pytest.approx(dk, rel=1e-12, abs=1e-15)


def test_batched_verlet_gives_each_system_its_own_bits():
    systems = _systems()
    vv = VelocityVerlet(dt=1.5)
    x, v, f, m = (torch.cat([s[k] for s in systems]) for k in ("x", "v", "f", "m"))
    batched.verlet_first(x, v, f, m, 1.5)
    batched.half_kick(v, f, m, 1.5)
    start = 0
    for s in systems:
        xa, va = s["x"].clone(), s["v"].clone()
        vv.first_half(xa, va, s["f"], s["m"], s["ids"], 0)
        vv.second_half(va, s["f"], s["m"])
        n = len(s["ids"])
        assert torch.equal(x[start:start + n], xa) and torch.equal(v[start:start + n], va)
        start += n


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_nose_hoover_passes_give_each_system_its_own_bits(dtype):
    """Three systems, three chains (other temperatures, damping and lengths): the batched kinetic
    sums and scalings give each the bits (velocities, chain state) of its own NoseHoover, over a
    first half (with its set-up) and a second half."""
    from shardmd.integrators.nose_hoover import NoseHoover

    systems = _systems(dtype)
    make = lambda: [NoseHoover(dt=2.0, temperature=t, tdamp=d, chain=c)  # noqa: E731
                    for t, d, c in ((300.0, 100.0, 3), (50.0, 20.0, 1), (1000.0, 500.0, 5))]
    alone = []
    for s, nh in zip(systems, make()):
        x, v = s["x"].clone(), s["v"].clone()
        nh.first_half(x, v, s["f"], s["m"], s["ids"], 0)
        nh.second_half(v, 0.5 * s["f"], s["m"])
        alone.append((x, v, nh.state_dict()))
    cat = lambda key: torch.cat([s[key] for s in systems])  # noqa: E731
    x, v, f, m = cat("x"), cat("v"), cat("f"), cat("m")
    sizes = [len(s["ids"]) for s in systems]
    system = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    chains = make()
    for mv2_n, nh in zip(batched.mv2_per_system(v, m, system, 3, True), chains):
        nh.measured(*mv2_n)
        nh.set_up()
    batched.scale_per_system(v, [nh.nhc_factor() for nh in chains], system)
    batched.verlet_first(x, v, f, m, 2.0)
    batched.half_kick(v, 0.5 * f, m, 2.0)
    for mv2_n, nh in zip(batched.mv2_per_system(v, m, system, 3, True), chains):
        nh.measured(*mv2_n)
    batched.scale_per_system(v, [nh.nhc_factor() for nh in chains], system)
    for k, (xa, va, state) in enumerate(alone):
        sl = system == k
        assert torch.equal(x[sl], xa) and torch.equal(v[sl], va)
        assert chains[k].state_dict() == state


def test_batched_csvr_scaling_gives_each_system_its_own_bits():
    """CSVR's rescale per system (other temperatures, tau, seeds and steps) from the batched
    kinetic sums: the velocities' bits and each thermostat's energy change."""
    from shardmd.integrators.csvr import CSVR

    systems = _systems()
    make = lambda: [CSVR(dt=2.0, temperature=t, tau=u, seed=s)  # noqa: E731
                    for t, u, s in ((300.0, 100.0, 1), (50.0, 0.0, 2**40), (1000.0, 10.0, 9))]
    steps = [0, 7, 2**33]
    alone = []
    for s, th, step in zip(systems, make(), steps):
        v = s["v"].clone()
        th.rescale(v, s["m"], step)
        alone.append((v, th.energy_change))
    v, m = torch.cat([s["v"] for s in systems]), torch.cat([s["m"] for s in systems])
    system = torch.repeat_interleave(torch.arange(3), torch.tensor([len(s["ids"]) for s in systems]))
    ths = make()
    sums = batched.mv2_per_system(v, m, system, 3, True)
    batched.scale_per_system(v, [th.factor(mv2, n, step) for th, (mv2, n), step in zip(ths, sums, steps)], system)
    for k, (va, change) in enumerate(alone):
        assert torch.equal(v[system == k], va) and ths[k].energy_change == change


def _frames(sheared: bool = True):
    """Cu/Ag cells of 32 and 48 atoms, rattled; the third sheared unless ``sheared`` is False."""
    rng = np.random.default_rng(5)
    out = []
    for k in range(3):
        a = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 2, 2 + k % 2))
        a.positions += rng.normal(0.0, 0.05, a.positions.shape)
        a.numbers[k::3] = 47
        if k == 2 and sheared:
            a.cell[0, 1] = 0.3
        out.append(a)
    return out


def write_cuag(d, frames=None) -> None:
    """A random float64 Cu/Ag MACE model (``cuag.model``) and ``frames`` (default :func:`_frames`)
    as ``cuag.extxyz`` in ``d``."""
    from shardmd.models.mace_random import make_random_mace

    make_random_mace(d / "cuag.model", elements=(29, 47), r_max=4.0)
    write(d / "cuag.extxyz", _frames() if frames is None else frames)


@pytest.mark.slow
@pytest.mark.parametrize("integrator", ["verlet", "langevin", "nose-hoover", "csvr", "langevin fix.ids=[0,5,6,31]",
                                        "nose-hoover fix.ids=[1,2,3]"])
def test_a_joined_batch_with_rebuilds_equals_each_system_alone(integrator, tmp_path, capfd, monkeypatch):
    from shardmd.engine.batch import joined
    from shardmd.models.mace import MaceModel
    write_cuag(tmp_path)
    seen = {"calls": 0, "rebuilt": 0}
    call, rebuilt = MaceModel.compute_joined, joined.Joined.rebuilt
    monkeypatch.setattr(MaceModel, "compute_joined",
                        lambda self, g, x, **kw: seen.__setitem__("calls", seen["calls"] + 1) or call(self, g, x, **kw))
    monkeypatch.setattr(joined.Joined, "rebuilt",
                        lambda self, j: seen.__setitem__("rebuilt", seen["rebuilt"] + 1) or rebuilt(self, j))
    common = ["run", "model=mace", "model.checkpoint=cuag.model", "quiet=true", "system.file=cuag.extxyz",
              "steps=200", "trajectory.every=50", "temperature=900", *f"integrator={integrator}".split(),
              "neighbor.skin=0.3"]
    r = cli_in_process([*common, "system.frames=all", "batch.size=3", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert seen["calls"] == 200 and seen["rebuilt"] > 3   # every step one joined call, lists rebuilt inside the set
    for k in range(3):
        r = cli_in_process([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
        for field in ("position", "velocity"):
            assert np.abs(final(tmp_path / f"b.{k}.h5", field) - final(tmp_path / f"a{k}.h5", field)).max() <= 1e-10
    rows = summary(tmp_path / "b.summary.csv")
    assert [int(x["atoms"]) for x in rows] == [32, 48, 32] and all(int(x["steps"]) == 200 for x in rows)


@pytest.mark.slow
def test_sync_free_selection_and_its_overflow_equal_each_system_alone(tmp_path, capfd, monkeypatch):
    """The CUDA route's edge selection (fixed rows, padding edges, no host read) run on the CPU,
    its room cut to nothing so that it overflows: each overflowing step is redone exactly and the
    room grows; every system still equals its run alone."""
    from shardmd.engine.batch import joined
    from shardmd.models.mace import MaceModel
    write_cuag(tmp_path)
    monkeypatch.setattr(joined.Joined, "sync_free", True)
    monkeypatch.setattr(joined, "MARGIN", 1.0)
    monkeypatch.setattr(joined, "SLACK", -20)   # the first room 20 edges short
    fills = []
    call = MaceModel.compute_joined

    def seen(self, g, x, **kw):
        out = call(self, g, x, **kw)
        if "capacity_fill" in out:
            fills.append(float(out["capacity_fill"]))
        return out

    monkeypatch.setattr(MaceModel, "compute_joined", seen)
    common = ["run", "model=mace", "model.checkpoint=cuag.model", "quiet=true", "system.file=cuag.extxyz",
              "steps=60", "trajectory.every=30", "temperature=900", "integrator=langevin", "neighbor.skin=0.3"]
    r = cli_in_process([*common, "system.frames=all", "batch.size=3", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert len(fills) >= 50 and max(fills) > 1 and min(fills) < 1   # overflowed, redone, then fitted
    for k in range(3):
        r = cli_in_process([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
        assert np.abs(final(tmp_path / f"b.{k}.h5") - final(tmp_path / f"a{k}.h5")).max() <= 1e-10


@pytest.mark.slow
def test_a_system_failing_in_the_set_makes_room_for_the_next(tmp_path, capfd, monkeypatch):
    """batch.size=2 over three frames, the first blowing up at its first step: it leaves the set
    mid-step, the second goes on, the third joins in its place; both equal their runs alone."""
    frames = _frames()
    frames[0].set_velocities(np.full((len(frames[0]), 3), 20.0))   # ~2 Å/fs: past health.max_step at once
    write_cuag(tmp_path, frames)
    common = ["run", "model=mace", "model.checkpoint=cuag.model", "quiet=true", "system.file=cuag.extxyz",
              "steps=30", "trajectory.every=10", "integrator=langevin"]
    r = cli_in_process([*common, "system.frames=all", "batch.size=2", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 3, r.stderr
    rows = summary(tmp_path / "b.summary.csv")
    assert [x["status"] for x in rows] == ["failed", "ok", "ok"] and "exit status 3" in rows[0]["note"]
    for k in (1, 2):
        r = cli_in_process([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
        assert np.abs(final(tmp_path / f"b.{k}.h5") - final(tmp_path / f"a{k}.h5")).max() <= 1e-10


@pytest.mark.slow
def test_systems_at_different_steps_in_one_set(tmp_path, capfd, monkeypatch):
    """Two systems continued from step 20 and a new one from step 0 step as one set: the first
    two leave at 40 bit-identical to an uninterrupted run, the third goes on alone to its end."""
    write_cuag(tmp_path)
    common = ["run", "model=mace", "model.checkpoint=cuag.model", "quiet=true", "system.file=cuag.extxyz",
              "trajectory.every=10", "checkpoint.every=10", "integrator=langevin", "batch.size=3"]
    for args in (["system.frames=0:2", "steps=20", "output=p.h5"],
                 ["system.frames=all", "steps=40", "output=p.h5", "restart=auto"],
                 ["system.frames=all", "steps=40", "output=u.h5"]):
        r = cli_in_process([*common, *args], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
    for k in range(3):
        got, ref = final(tmp_path / f"p.{k}.h5"), final(tmp_path / f"u.{k}.h5")
        assert (np.array_equal(got, ref) if k < 2 else np.abs(got - ref).max() <= 1e-10), k
    assert [int(x["steps"]) for x in summary(tmp_path / "p.summary.csv")] == [40, 40, 40]
