"""A domain's model call made in parts (``subdomains=N``, domain/subdomains.py), each part whole or
layer by layer (domain/layered_parts.py): the same energy, forces, virial and site energies as
the call in one piece (float64, a random mace-torch model), the same trajectory as the run in one
piece and as two MPI domains, and the refusals."""
from __future__ import annotations

import csv
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from ase.build import bulk
from conftest import cli_in_process, run_engine

SKIN = 1.0


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    from shardmd.models.mace_random import make_random_mace

    return make_random_mace(tmp_path_factory.mktemp("m") / "cu.model", r_max=3.0)


def crystal(n=5, rattle=0.1, seed=0):
    a = bulk("Cu", "fcc", a=3.59, cubic=True).repeat((n, n, n))
    a.positions += np.random.default_rng(seed).normal(0.0, rattle, a.positions.shape)
    return a


@pytest.mark.parametrize("by_layer", [False, True], ids=["whole", "by-layer"])
@pytest.mark.parametrize("count", [2, 4, 8])
def test_parts_give_the_one_piece_call(model_file, count, by_layer):
    from shardmd.domain.layered_parts import evaluate_by_layer
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.subdomains import build_part, evaluate_parts, owner_parts, part_grid
    from shardmd.models.mace import MaceModel

    m = MaceModel(model_file, dtype=torch.float64, trust_pickle=True)
    a = crystal()
    x, cell, z = torch.tensor(a.positions), torch.tensor(a.cell.array), torch.tensor(a.numbers)
    pbc = (True, True, True)
    nl = build_neighbor_list(x, cell, torch.tensor(pbc), m.cutoff + SKIN)
    ref = m.compute(x, cell, pbc, z, nl)
    walk = 1 if by_layer else m.layers   # by layer: one cutoff + skin of halo
    grid = part_grid(count, cell, pbc, walk * (m.cutoff + SKIN))
    owner = owner_parts(x, cell, pbc, grid)
    parts = [build_part(nl, torch.nonzero(owner == p).squeeze(1), walk, x.dtype) for p in range(count)]
    assert sorted(torch.cat([p.ids[: p.n_counted] for p in parts]).tolist()) == list(range(len(a)))
    assert all(p.ids.numel() > p.n_counted for p in parts)   # each part has a halo
    out = (evaluate_by_layer(m, parts, x, cell, z, m.layers) if by_layer
           else evaluate_parts(m, parts, x, cell, pbc, z))
    scale = float(ref["forces"].abs().max())
    assert float((out["forces"] - ref["forces"]).abs().max()) <= 1e-10 * scale
    assert abs(float(out["energy"] - ref["energy"])) <= 1e-10 * abs(float(ref["energy"]))
    assert float((out["virial"] - ref["virial"]).abs().max()) <= 1e-10 * float(ref["virial"].abs().max())
    assert float((out["energies"] - ref["energies"]).abs().max()) <= 1e-10 * float(ref["energies"].abs().max())


def test_by_layer_with_three_layers_two_heads_and_a_pair_term(tmp_path):
    """Layer by layer on a harder model than the shipped one: three interactions (two layers'
    outputs kept and their gradients carried), three species, the second of two heads (its own
    E0s, scale and shift), mace-torch's ZBL pair term; against the call in one piece (float64)."""
    from shardmd.domain.layered_parts import evaluate_by_layer
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.subdomains import build_part, owner_parts, part_grid
    from shardmd.models.mace import MaceModel
    from shardmd.models.mace_random import make_random_mace

    f = make_random_mace(tmp_path / "m.model", elements=(13, 28, 29), r_max=3.0, num_interactions=3,
                         heads=("pbe", "r2scan"), pair_repulsion=True, seed=3)
    m = MaceModel(f, dtype=torch.float64, trust_pickle=True, head="r2scan")
    assert m.layer_problem() is None and m.layers == 3
    a = crystal(n=4, rattle=0.15, seed=2)
    a.numbers = np.random.default_rng(4).choice([13, 28, 29], len(a))
    x, cell, z = torch.tensor(a.positions), torch.tensor(a.cell.array), torch.tensor(a.numbers)
    pbc = (True, True, True)
    nl = build_neighbor_list(x, cell, torch.tensor(pbc), m.cutoff + SKIN)
    ref = m.compute(x, cell, pbc, z, nl)
    grid = part_grid(4, cell, pbc, m.cutoff + SKIN)
    owner = owner_parts(x, cell, pbc, grid)
    parts = [build_part(nl, torch.nonzero(owner == p).squeeze(1), 1, x.dtype) for p in range(4)]
    out = evaluate_by_layer(m, parts, x, cell, z, m.layers)
    for key in ("energy", "forces", "virial", "energies"):
        assert float((out[key] - ref[key]).abs().max()) <= 1e-10 * float(ref[key].abs().max()), key


def test_a_part_walk_reaches_a_site_energys_whole_neighbourhood(model_file):
    """An independent count: the points a part's own point depends on are those within
    ``layers`` list edges; a part holding fewer (one walk step short) gives other forces."""
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.subdomains import build_part, evaluate_parts, owner_parts
    from shardmd.models.mace import MaceModel

    m = MaceModel(model_file, dtype=torch.float64, trust_pickle=True)
    a = crystal()
    x, cell, z = torch.tensor(a.positions), torch.tensor(a.cell.array), torch.tensor(a.numbers)
    pbc = (True, True, True)
    nl = build_neighbor_list(x, cell, torch.tensor(pbc), m.cutoff + SKIN)
    ref = m.compute(x, cell, pbc, z, nl)
    owner = owner_parts(x, cell, pbc, (2, 1, 1))
    short = [build_part(nl, torch.nonzero(owner == p).squeeze(1), m.layers - 1, x.dtype) for p in range(2)]
    out = evaluate_parts(m, short, x, cell, pbc, z)
    assert float((out["forces"] - ref["forces"]).abs().max()) > 1e-6


def final(path):
    with h5py.File(path) as f:
        return f["particles/all/position/value"][-1] + f["particles/all/image/value"][-1] @ \
            f["particles/all/box/edges/value"][-1]


def test_by_layer_on_an_open_and_a_slanted_cell(model_file):
    """Layer by layer where a part's images matter and where they do not: a triclinic periodic
    cell (parts cut along slanted faces, halo atoms at lattice images) and a cluster with no
    periodic axis; against the call in one piece (float64)."""
    from shardmd.domain.layered_parts import evaluate_by_layer
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.domain.subdomains import build_part, owner_parts, part_grid
    from shardmd.models.mace import MaceModel

    m = MaceModel(model_file, dtype=torch.float64, trust_pickle=True)
    a = crystal(n=4, rattle=0.1, seed=5)
    slanted = a.cell.array + np.array([[0.0, 0.0, 0.0], [1.7, 0.0, 0.0], [0.9, -1.1, 0.0]])
    a.set_cell(slanted, scale_atoms=True)
    cluster = crystal(n=3, rattle=0.1, seed=6)
    cluster.pbc = False
    for atoms, pbc in ((a, (True, True, True)), (cluster, (False, False, False))):
        x, cell, z = torch.tensor(atoms.positions), torch.tensor(atoms.cell.array), torch.tensor(atoms.numbers)
        nl = build_neighbor_list(x, cell, torch.tensor(pbc), m.cutoff + SKIN)
        ref = m.compute(x, cell, pbc, z, nl)
        grid = part_grid(4, cell, pbc, m.cutoff + SKIN)
        owner = owner_parts(x, cell, pbc, grid)
        parts = [p for p in (build_part(nl, torch.nonzero(owner == k).squeeze(1), 1, x.dtype) for k in range(4))
                 if p.n_counted]
        assert len(parts) > 1
        out = evaluate_by_layer(m, parts, x, cell, z, m.layers)
        for key in ("energy", "forces", "virial", "energies"):
            assert float((out[key] - ref[key]).abs().max()) <= 1e-10 * float(ref[key].abs().max()), (pbc, key)


@pytest.mark.slow
def test_an_npt_run_by_layer_follows_the_run_in_one_piece(model_file, tmp_path):
    """integrator=npt (couple tri) on a slanted cell: the virial of the parts drives the cell, so
    30 steps in four parts by layer end where the run in one piece ends (positions and cell)."""
    a = crystal(n=5, rattle=0.05, seed=7)
    a.set_cell(a.cell.array + np.array([[0.0, 0.0, 0.0], [0.8, 0.0, 0.0], [0.4, 0.3, 0.0]]), scale_atoms=True)
    a.write(tmp_path / "cu.extxyz")
    common = ["run", "model=mace", f"model.checkpoint={model_file}", "model.trust_pickle=true",
              "system.file=cu.extxyz", "steps=30", "temperature=600", "dt=2", "trajectory.every=30", "quiet=true",
              "threads=1", "integrator=npt", "integrator.couple=tri", "integrator.pressure=20000",
              "integrator.pdamp=100"]
    for name, extra in {"one": [], "parts": ["subdomains=4"]}.items():
        r = run_engine([*common, *extra, f"output={name}.h5"], tmp_path, timeout=900)
        assert r.returncode == 0, (name, r.stderr[-2000:])
    with h5py.File(tmp_path / "one.h5") as f, h5py.File(tmp_path / "parts.h5") as g:
        box_one, box_parts = f["particles/all/box/edges/value"][-1], g["particles/all/box/edges/value"][-1]
    assert np.abs(box_parts - box_one).max() <= 1e-10
    assert np.abs(box_one - a.cell.array).max() > 1e-4   # the cell moved
    assert np.abs(final(tmp_path / "parts.h5") - final(tmp_path / "one.h5")).max() <= 1e-10


@pytest.mark.slow
@pytest.mark.mpi
def test_a_run_in_parts_follows_the_run_in_one_piece_and_on_two_domains(model_file, tmp_path):
    crystal(rattle=0.05).write(tmp_path / "cu.extxyz")
    common = ["run", "model=mace", f"model.checkpoint={model_file}", "model.trust_pickle=true",
              "system.file=cu.extxyz", "steps=50", "temperature=900", "dt=2", "trajectory.every=50",
              "quiet=true", "threads=1", "neighbor.skin=1.0"]
    runs = {"one": ["output=one.h5"], "parts": ["subdomains=4", "output=parts.h5"],
            "whole": ["subdomains=4", "parts_by_layer=false", "output=whole.h5"],
            "domains": ["domains=2", "output=two.h5"]}
    for name, extra in runs.items():
        r = run_engine([*common, *extra], tmp_path, timeout=900)
        assert r.returncode == 0, (name, r.stderr[-2000:])
    one = final(tmp_path / "one.h5")
    assert np.abs(final(tmp_path / "parts.h5") - one).max() <= 1e-10
    assert np.abs(final(tmp_path / "whole.h5") - one).max() <= 1e-10
    assert np.abs(final(tmp_path / "two.h5") - one).max() <= 1e-10
    assert np.abs(final(tmp_path / "parts.h5") - crystal(rattle=0.05).positions).max() > 0.01   # it moved


@pytest.mark.parametrize("args, needle", [
    (["subdomains=64", "parts_by_layer=false"], "use at most subdomains=8 for this system"),
    (["subdomains=125"], "use at most subdomains=64 for this system"),   # by layer: 4 Å of reach
    (["subdomains=2", "parts_by_layer=maybe"], "parts_by_layer"),
    (["subdomains=2", "domains=2"], "parts run on one domain per process"),
])
def test_parts_refused_up_front(model_file, args, needle, tmp_path, capfd, monkeypatch):
    crystal().write(tmp_path / "cu.extxyz")
    r = cli_in_process(["run", "model=mace", f"model.checkpoint={model_file}", "model.trust_pickle=true",
                        "system.file=cu.extxyz", "steps=2", "quiet=true", *args], tmp_path, capfd, monkeypatch)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not (tmp_path / "run.h5").exists()   # refused before any file


def test_by_layer_asked_of_a_model_that_cannot_is_refused(tmp_path, capfd, monkeypatch):
    crystal().write(tmp_path / "cu.extxyz")
    r = cli_in_process(["run", "model=nequip", "model.species=[Cu]", "model.r_max=3.0", "system.file=cu.extxyz",
                        "steps=2", "quiet=true", "subdomains=2", "parts_by_layer=true"], tmp_path, capfd, monkeypatch)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "parts_by_layer=true" in lines[0] and "use parts_by_layer=auto or false" in lines[0]
    assert not (tmp_path / "run.h5").exists()


def test_a_model_that_cannot_count_its_rows_is_refused(tmp_path, capfd, monkeypatch):
    r = cli_in_process(["run", "model=lj", "system.repeat=[6,6,6]", "steps=2", "quiet=true", "subdomains=2"],
                       tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and "cannot be evaluated in parts" in r.stderr and "use subdomains=1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big")
    crystal(n=10, rattle=0.05).write(d / "cu.extxyz")
    return d / "cu.extxyz"


def engine_run(model_file, big, args, tmp_path, capfd, monkeypatch):
    return cli_in_process(["run", "model=mace", f"model.checkpoint={model_file}", "model.trust_pickle=true",
                           f"system.file={big}", "steps=1", "quiet=false", "thermo.every=1", *args],
                          tmp_path, capfd, monkeypatch)


def test_a_memory_budget_chooses_the_parts(model_file, big, tmp_path, capfd, monkeypatch):
    """4,000 atoms: one piece is estimated over 0.13 GiB (refused, naming subdomains=0); with
    subdomains=0 the run chooses parts that fit and says so in its header; with room, one piece."""
    r = engine_run(model_file, big, ["limits.memory_gb=0.13"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and "or subdomains=0" in r.stderr, r.stderr
    r = engine_run(model_file, big, ["limits.memory_gb=0.13", "subdomains=0", "output=a.h5"], tmp_path, capfd,
                   monkeypatch)
    assert r.returncode == 0, r.stderr
    # by layer (the default for mace): one layer's activations alive and 4 Å of halo: 2 parts fit
    assert "subdomains 2 (grid 2x1x1, layer by layer, reach 4 Å)" in r.stdout + r.stderr
    r = engine_run(model_file, big, ["limits.memory_gb=0.13", "subdomains=0", "parts_by_layer=false", "output=w.h5"],
                   tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert "subdomains 12 (grid 3x2x2, reach 8 Å)" in r.stdout + r.stderr
    r = engine_run(model_file, big, ["limits.memory_gb=50", "subdomains=0", "output=b.h5"], tmp_path, capfd,
                   monkeypatch)
    assert r.returncode == 0 and "subdomains" not in r.stdout + r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["limits.memory_gb=0.01", "subdomains=0"], "give limits.memory_gb >= 0.0128"),   # by layer
    (["limits.memory_gb=0.01", "subdomains=0", "parts_by_layer=false"], "give limits.memory_gb >= 0.05"),
    (["limits.memory_gb=0.01", "subdomains=2"], "no count fits"),
])
def test_a_budget_too_small_for_one_part_is_refused(model_file, big, args, needle, tmp_path, capfd, monkeypatch):
    r = engine_run(model_file, big, args, tmp_path, capfd, monkeypatch)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "run.h5").exists()


@pytest.mark.slow
def test_a_system_too_large_for_the_budget_runs_in_parts_among_many(model_file, tmp_path, capfd, monkeypatch):
    """system.frames: three 32-atom crystals and one of 4,000 atoms whose one-piece estimate is over
    limits.memory_gb: the large one runs alone in parts (the others as usual), and its trajectory
    is the one it has in one piece."""
    from ase.io import write

    small = [crystal(n=2, seed=s) for s in range(3)]
    write(tmp_path / "mixed.extxyz", [small[0], crystal(n=10, rattle=0.05), small[1], small[2]])
    common = ["run", "model=mace", f"model.checkpoint={model_file}", "model.trust_pickle=true", "steps=3",
              "quiet=true", "trajectory.every=3", "system.file=mixed.extxyz"]
    r = cli_in_process([*common, "system.frames=all", "limits.memory_gb=0.13", "output=m.h5"], tmp_path, capfd,
                       monkeypatch)
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "m.log").read_text()
    assert "system 1: ~0.142 GiB in one piece" in log and "its model call in parts (subdomains=0)" in log
    assert "subdomains" not in log.split("system 1:")[0]   # only that one
    rows = list(csv.DictReader(open(tmp_path / "m.summary.csv")))
    assert [x["status"] for x in rows] == ["ok"] * 4 and int(rows[1]["atoms"]) == 4000
    r = cli_in_process([*common, "system.index=1", "output=one.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert np.abs(final(tmp_path / "m.1.h5") - final(tmp_path / "one.h5")).max() <= 1e-10
