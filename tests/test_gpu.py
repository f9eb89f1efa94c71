"""CUDA: neighbour lists, Lennard-Jones forces/energy/virial and an engine run.

Skipped (with the reason) where torch sees no CUDA device; on the device machine:
``pytest -q -m gpu tests/test_gpu.py``.  The CUDA results are compared with the NumPy
references of tests/reference.py (always) and with Warp's CPU kernels (where Warp's CPU
compiler is available: a GPU machine may carry only warp's CUDA part).
scripts/check_cuda_lj.py prints the same comparisons with their figures.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import brute_force_pairs, lj_reference, mix_lorentz_berthelot, pair_distance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on the device machine"),
]

TOL = 1e-10
EPS = {"Ar": 0.0103, "Kr": 0.014}
SIG = {"Ar": 3.405, "Kr": 3.65}
CUTOFF = 8.5


def _cpu_kernels() -> bool:
    from shardmd.domain.warp_setup import init_warp

    return init_warp().is_cpu_available()


needs_cpu_kernels = pytest.mark.skipif(
    torch.cuda.is_available() and not _cpu_kernels(),
    reason="Warp's CPU compiler is not available here: CUDA is compared with the NumPy references only")


def _system(n_cells=11, two_species=True, seed=0, dtype=torch.float64):
    """4 n^3 atoms on a perturbed fcc lattice in a sheared cell, a fifth of them moved by
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


def _edges(nl):
    off = nl.offsets.cpu().numpy()
    centre = np.repeat(np.arange(len(off) - 1), np.diff(off))
    return {(int(a), int(b), tuple(int(x) for x in s))
            for a, b, s in zip(centre, nl.neighbors.cpu().numpy(), nl.shifts.cpu().numpy())}


# --------------------------------------------------------------- against the NumPy references
def test_cuda_list_matches_brute_force():
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, _ = _system(n_cells=5)
    nl = build_neighbor_list(*_cuda(pos, cell, pbc), CUTOFF + 1.0)
    got = _edges(nl)
    assert len(got) == nl.n_edges  # no duplicates
    ref = brute_force_pairs(pos.numpy(), cell.numpy(), [True] * 3, CUTOFF + 1.0)
    diff = got ^ ref
    assert all(abs(pair_distance(pos.numpy(), cell.numpy(), *e) - (CUTOFF + 1.0)) < 1e-9 for e in diff)
    assert sum(1 for e in got if any(e[2])) > 1000


@pytest.mark.parametrize("two_species", [True, False], ids=["ArKr", "Ar"])
def test_lj_cuda_matches_reference(two_species):
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = _system(n_cells=5, two_species=two_species)
    gpos, gcell, gpbc, gz = _cuda(pos, cell, pbc, z)
    out = _lj(two_species).compute(gpos, gcell, gpbc, gz, build_neighbor_list(gpos, gcell, gpbc, CUTOFF + 1.0))
    out = {k: v.cpu().numpy() for k, v in out.items()}
    names = ["Ar", "Kr"] if two_species else ["Ar"]
    eps, sig = mix_lorentz_berthelot([EPS[s] for s in names], [SIG[s] for s in names])
    type_of = {18: 0, 36: 1}
    e, f, w, ea = lj_reference(pos.numpy(), cell.numpy(), [True] * 3, z.numpy(), eps, sig, type_of, CUTOFF, True)
    assert np.abs(out["forces"] - f).max() <= TOL * np.abs(f).max()
    assert abs(out["energy"] - e) <= TOL * np.abs(ea).sum()
    assert np.abs(out["energies"] - ea).max() <= TOL * np.abs(ea).max()
    assert np.abs(out["virial"] - w).max() <= TOL * np.abs(w).max()


def test_lj_cuda_float32_close_to_reference():
    from shardmd.domain.neighbors import build_neighbor_list

    pos, cell, pbc, z = _system(n_cells=5)
    p32, c32, gpbc, gz = _cuda(pos.float(), cell.float(), pbc, z)
    out = _lj(True).compute(p32, c32, gpbc, gz, build_neighbor_list(p32, c32, gpbc, CUTOFF + 1.0))
    assert out["forces"].dtype == torch.float32
    eps, sig = mix_lorentz_berthelot([EPS["Ar"], EPS["Kr"]], [SIG["Ar"], SIG["Kr"]])
    _, f, _, _ = lj_reference(pos.float().double().numpy(), cell.float().double().numpy(), [True] * 3,
                              z.numpy(), eps, sig, {18: 0, 36: 1}, CUTOFF, True)
    # float32 loses ~1e-7 of |x| (up to ~100 Å here) in x_j - x_i
    assert np.abs(out["forces"].double().cpu().numpy() - f).max() <= 1e-4 * np.abs(f).max()


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


# --------------------------------------------------------------- against Warp's CPU kernels
@needs_cpu_kernels
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

    lj = _lj(two_species)
    ref = lj.compute(pos, cell, pbc, z, nl_c)
    out = {k: v.cpu() for k, v in lj.compute(gpos, gcell, gpbc, gz, nl_g).items()}
    assert (out["forces"] - ref["forces"]).abs().max() <= TOL * ref["forces"].abs().max()
    assert (out["energies"] - ref["energies"]).abs().max() <= TOL * ref["energies"].abs().max()
    assert (out["energy"] - ref["energy"]).abs() <= TOL * ref["energies"].abs().sum()
    assert (out["virial"] - ref["virial"]).abs().max() <= TOL * ref["virial"].abs().max()


# --------------------------------------------------------------- the engine
def _run(tmp_path, device, steps):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    cfg = compose_config(["model=lj", "system.repeat=[6,6,6]", "system.a=5.72", f"steps={steps}", "dt=5.0",
                          "temperature=120.0", f"device={device}", "threads=1", "quiet=true",
                          "trajectory.every=0", "thermo.every=0", f"output={tmp_path}/{device}{steps}.h5"])
    sim = Simulation(cfg)
    return sim, sim.run()


def test_engine_run_on_cuda(tmp_path):
    _, start = _run(tmp_path, "cuda", 0)
    sim, end = _run(tmp_path, "cuda", 40)
    assert sim.state.positions.is_cuda and sim.state.forces.is_cuda
    assert sim.nl.n_builds >= 1
    n = sim.state.n_atoms
    # NVE: the total energy is conserved to well below the thermal energy (~0.015 eV/atom)
    assert abs(end["total_energy"] - start["total_energy"]) / n < 2e-4
    assert end["potential_energy"] != start["potential_energy"]


@needs_cpu_kernels
def test_engine_cuda_matches_cpu(tmp_path):
    _, gpu = _run(tmp_path, "cuda", 30)
    sim, cpu = _run(tmp_path, "cpu", 30)
    n = sim.state.n_atoms
    assert abs(gpu["potential_energy"] - cpu["potential_energy"]) / n < 1e-8
    assert abs(gpu["total_energy"] - cpu["total_energy"]) / n < 1e-8


def test_states_built_from_atoms_run_on_cuda_alone_and_many(tmp_path, capfd, monkeypatch):
    """A State built from ase.Atoms holds CPU tensors; it runs where device= says, through the
    API and as each system of a many-system run (system.frames: every frame's state is built
    from its Atoms). steps=0: each energy equals the float64 NumPy reference of its frame."""
    import csv

    from ase.build import bulk
    from ase.io import write
    from conftest import cli_in_process

    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    rng = np.random.default_rng(3)
    frames = []
    for k in range(3):
        a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2 + k))
        a.positions += rng.normal(0.0, 0.05, a.positions.shape)
        frames.append(a)
    eps, sig = mix_lorentz_berthelot([EPS["Ar"]], [SIG["Ar"]])
    ref = [lj_reference(a.positions, a.cell.array, [True] * 3, a.numbers, eps, sig, {18: 0}, CUTOFF, True)[0]
           for a in frames]
    keys = [f"model.epsilon={{Ar:{EPS['Ar']}}}", f"model.sigma={{Ar:{SIG['Ar']}}}", f"model.cutoff={CUTOFF}",
            "model.shift=true", "device=cuda", "steps=0", "quiet=true", "threads=1"]
    cfg = compose_config(["model=lj", *keys, f"output={tmp_path}/api.h5"])
    sim = Simulation(cfg, state=State.from_atoms(frames[0]))
    out = sim.run()
    assert sim.state.positions.is_cuda and sim.state.velocities.is_cuda
    assert abs(out["potential_energy"] - ref[0]) <= 1e-9 * abs(ref[0])
    write(tmp_path / "many.extxyz", frames)
    r = cli_in_process(["run", "model=lj", *keys, f"system.file={tmp_path}/many.extxyz", "system.frames=all",
                        f"output={tmp_path}/m.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "m.summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(row["energy_eV"]) for row in rows] == pytest.approx(ref, rel=1e-9)


def test_systems_joined_on_cuda_replay_one_graph_and_equal_each_alone(tmp_path, capfd, monkeypatch):
    """Three Cu/Ag systems joined on CUDA (engine/batch/joined.py): sync-free edge selection and
    the joined call replayed as a CUDA graph; float64, each system equals its run alone (GPU sums
    in another order: 1e-8 Å after 100 steps at 900 K with rebuilds)."""
    from conftest import cli_in_process
    from test_batch import final
    from test_batch_joined import _frames, write_cuag

    from shardmd.models.mace import MaceModel

    write_cuag(tmp_path, _frames(sheared=False))
    models = []
    init = MaceModel.__init__
    monkeypatch.setattr(MaceModel, "__init__", lambda self, *a, **k: models.append(self) or init(self, *a, **k))
    common = ["run", "model=mace", "model.checkpoint=cuag.model", "device=cuda", "quiet=true",
              "system.file=cuag.extxyz", "steps=100", "trajectory.every=50", "temperature=900", "neighbor.skin=0.3"]
    r = cli_in_process([*common, "system.frames=all", "batch.size=3", "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    graphed = models[-1]._graphed_joined
    assert graphed.captures >= 1 and graphed.replays > 50, (graphed.captures, graphed.replays, graphed.disabled)
    for k in range(3):
        r = cli_in_process([*common, f"system.index={k}", f"output=a{k}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, r.stderr
        assert np.abs(final(tmp_path / f"b.{k}.h5") - final(tmp_path / f"a{k}.h5")).max() <= 1e-8
