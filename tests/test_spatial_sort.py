"""Spatial sort (neighbor.sort=spatial): the order against a float64 numpy binning, the
trajectory of a structure read in random order (unchanged by the sort), and a restart that
rebuilds the uninterrupted run's memory order."""
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.io import write

from shardmd.domain.neighbors import _bin_grid
from shardmd.domain.spatial_sort import spatial_order
from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation


def reference_bins(x: np.ndarray, cell: np.ndarray, pbc, nb) -> np.ndarray:
    """Linear bin of each point, float64 numpy: fractional coordinates, folded on periodic
    axes, floor(f * nb) clamped to the grid, index (b0 * nb1 + b1) * nb2 + b2."""
    f = np.linalg.solve(cell.T, x.T).T
    f = np.where(pbc, f - np.floor(f), f)
    b = np.clip(np.floor(f * np.asarray(nb)), 0, np.asarray(nb) - 1).astype(np.int64)
    return (b[:, 0] * nb[1] + b[:, 1]) * nb[2] + b[:, 2]


def assert_bin_then_id(x, cell, pbc, radius, ids):
    """Points x (memory order) are in ascending bin, and ascending id inside a bin."""
    nb, _ = _bin_grid(torch.as_tensor(cell), tuple(pbc), radius, len(x))
    b = reference_bins(np.asarray(x, dtype=np.float64), np.asarray(cell, dtype=np.float64), pbc, nb)
    ids = np.asarray(ids)
    assert np.all(np.diff(b) >= 0), "bins not ascending"
    same = np.diff(b) == 0
    assert np.all(np.diff(ids)[same] > 0), "ids not ascending inside a bin"
    assert len(np.unique(b)) > 10   # a real grid, not one bin


@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)])
def test_order_is_bin_then_id_and_independent_of_arrival(pbc):
    g = torch.Generator().manual_seed(3)
    cell = torch.tensor([[20.0, 0, 0], [3.0, 18.0, 0], [-2.0, 1.5, 16.0]], dtype=torch.float64)
    n = 3000
    x = (torch.rand(n, 3, generator=g, dtype=torch.float64) * 1.6 - 0.3) @ cell   # also outside the cell
    ids = torch.randperm(n, generator=g) * 3 + 5                                     # not 0..n-1
    order = spatial_order(x, cell, pbc, 4.0, ids=ids)
    assert torch.equal(torch.sort(order).values, torch.arange(n))                    # a permutation
    assert torch.equal(spatial_order(x, cell, pbc, 4.0, ids=ids, id_bound=3 * n + 5), order)  # one-key sort
    assert_bin_then_id(x[order].numpy(), cell.numpy(), pbc, 4.0, ids[order].numpy())
    # the same points arriving in another order end in the same order
    p = torch.randperm(n, generator=g)
    again = spatial_order(x[p], cell, pbc, 4.0, ids=ids[p])
    assert torch.equal(ids[p][again], ids[order])


def _shuffled_file(tmp_path, seed=4):
    """fcc Ar (4x4x4 cells, 256 atoms) written in random order, with thermal velocities."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((4, 4, 4))
    rng = np.random.default_rng(seed)
    atoms = atoms[rng.permutation(len(atoms))]
    atoms.positions += rng.normal(0, 0.05, atoms.positions.shape)
    atoms.set_velocities(rng.normal(0, 0.005, atoms.positions.shape))
    path = tmp_path / "shuffled.extxyz"
    write(path, atoms)
    return path


def _sim(tmp_path, sort, steps, out="run.h5", extra=()):
    cfg = compose_config(["model=lj", f"system.file={_shuffled_file(tmp_path)}", "quiet=true", "threads=1", "dt=4.0",
                          "neighbor.skin=0.3", "integrator=langevin", "temperature=120", "seed=2",
                          "trajectory.every=0", "thermo.every=0", f"steps={steps}", f"neighbor.sort={sort}",
                          f"output={tmp_path / out}", *extra])
    return Simulation(cfg)


def test_sort_leaves_trajectories_unchanged_and_keeps_space_order(tmp_path):
    """A structure read in random order: spatial sort and no sort give bit-identical atom
    trajectories (LJ forces do not depend on memory order), and after the run the atoms are
    in (bin, id) order of their positions at the last rebuild."""
    runs = {}
    for sort in ("none", "spatial"):
        sim = _sim(tmp_path, sort, 60, out=f"{sort}.h5")
        sim.run()
        runs[sort] = sim
    s0, s1 = runs["none"].state, runs["spatial"].state
    i0, i1 = torch.argsort(s0.ids), torch.argsort(s1.ids)
    assert runs["spatial"].nl.n_builds > 2
    for name in ("positions", "velocities", "images", "forces"):
        assert torch.equal(getattr(s0, name)[i0], getattr(s1, name)[i1]), name
    assert not torch.equal(s0.ids, s1.ids)        # the memory orders did differ
    d = runs["spatial"].domain
    assert_bin_then_id(d.reference_positions().numpy(), s1.cell.numpy(), (True,) * 3, d.nl.radius, s1.ids.numpy())


def test_restart_rebuilds_the_memory_order(tmp_path):
    """A restart between rebuilds puts the atoms in the uninterrupted run's memory order (the
    order of the last rebuild's positions), and recomputes the same forces to the bit."""
    a = _sim(tmp_path, "spatial", 45, out="a.h5", extra=["checkpoint.every=45"])
    a.run()
    assert a.nl.n_builds > 1
    ids, forces = a.state.ids.clone(), a.state.forces.clone()
    ckpt = tmp_path / "a.ckpt" / "step-000000000045.h5"
    b = _sim(tmp_path, "spatial", 90, out="b.h5", extra=[f"restart.file={ckpt}"])
    assert not torch.equal(b.state.ids, ids)     # the checkpoint holds the atoms in id order
    b.setup()
    assert torch.equal(b.state.ids, ids)
    assert torch.equal(b.state.forces, forces)


@pytest.mark.parametrize("pbc", [(True, True, True), (True, False, True)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_binning_handed_to_the_build_gives_its_own_list(pbc, dtype):
    """spatial_sort's binning, handed to the build of the sorted points, gives the list the
    build makes binning and sorting them itself, bit for bit; and the engine's one-domain
    rebuild (which hands it on) keeps the list equal to a fresh build of its atoms."""
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.spatial_sort import spatial_sort

    g = torch.Generator().manual_seed(8)
    cell = torch.tensor([[20.0, 0, 0], [3.0, 18.0, 0], [-2.0, 1.5, 16.0]], dtype=torch.float64).to(dtype)
    n = 2000
    x = ((torch.rand(n, 3, generator=g, dtype=torch.float64) * 1.4 - 0.2) @ cell.double()).to(dtype)
    ids = torch.randperm(n, generator=g) * 2 + 1
    order, binning = spatial_sort(x, cell, pbc, 4.0, ids=ids, id_bound=2 * n + 1)
    xs, ids_s = x[order], ids[order]
    for half in (False, True):
        ref = build_neighbor_list(xs, cell, pbc, 4.0, ids=ids_s, half=half)
        got = build_neighbor_list(xs, cell, pbc, 4.0, ids=ids_s, half=half, binning=binning)
        assert ref.n_edges > 10 * n
        for name in ("offsets", "packed", "order"):
            assert torch.equal(getattr(got, name), getattr(ref, name)), (half, name)


def test_one_domain_rebuild_list_equals_a_fresh_build(tmp_path):
    """The engine's rebuild (sort handing its binning on) against a build from scratch of the
    same atoms after 40 steps of a random-order structure."""
    from shardmd.domain.neighbors import build_neighbor_list

    sim = _sim(tmp_path, "spatial", 40)
    sim.run()
    d, s = sim.domain, sim.state
    d.rebuild(s)
    fresh = build_neighbor_list(s.positions, s.cell, s.pbc, d.nl.radius, ids=s.ids, half=d.nl.half)
    for name in ("offsets", "order"):
        assert torch.equal(getattr(d.nl.current, name), getattr(fresh, name)), name
    assert torch.equal(d.nl.current.neighbors, fresh.neighbors) and torch.equal(d.nl.current.shifts, fresh.shifts)
