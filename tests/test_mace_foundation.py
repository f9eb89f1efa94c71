"""MACE foundation models by name: ``model.checkpoint=<name>`` goes through
mace-torch's own resolver (``mace.calculators.foundations_models``) to the file in its cache,
loaded by our safe loader; ``model.head=`` picks a head of a multi-head model.  No network
here: a random 3-species MACE is saved under the file name mace-torch caches each model as,
in a temporary ``XDG_CACHE_HOME``; the reference is mace-torch's MACECalculator on that file
with the same ``head=`` (float64, 1e-10 relative), on 1 domain and on 4 (the shared 4-rank world)."""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk
from ase.io import write
from conftest import WorldTask, run_in_process

from shardmd.models.mace_random import make_random_mace

#: mace-torch 0.3's cache names (written out here, not derived by our code: an independent check)
MH1 = "macemh1model"                                     # mh-1: .../mace_mh_1/mace-mh-1.model
SMALL = "20231210mace128L0_energy_epoch249model"         # small: .../2023-12-10-mace-128-L0_energy_epoch-249.model
OFF_SMALL = "MACE-OFF23_small.model"                     # mace_off small: the URL's base name


_CACHE: dict = {}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return _cache_root(tmp_path_factory)


def _cache_root(tmp_path_factory) -> Path:
    """XDG_CACHE_HOME with mh-1 (heads pbe, r2scan; Al, Ni, Cu), small and off-small (one head),
    made once per process (the module's tests and the 4-rank world's task)."""
    if "root" in _CACHE:
        return _CACHE["root"]
    root = tmp_path_factory.mktemp("xdg")
    d = root / "mace"
    d.mkdir()
    make_random_mace(d / MH1, elements=(13, 28, 29), heads=("pbe", "r2scan"), seed=4)
    make_random_mace(d / SMALL, elements=(13, 28, 29), seed=5)
    (d / OFF_SMALL).write_bytes((d / SMALL).read_bytes())
    atoms = bulk("Cu", "fcc", a=3.62, cubic=True).repeat((4, 4, 4))
    atoms.rattle(0.08, seed=3)
    rng = np.random.default_rng(7)
    atoms.numbers[rng.random(len(atoms)) < 0.3] = 28
    atoms.numbers[rng.random(len(atoms)) < 0.2] = 13
    write(root / "alnicu.extxyz", atoms)
    _CACHE["root"] = root
    return root


@pytest.fixture
def xdg(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _calculator(path, numbers, positions, cell, head):
    from ase import Atoms
    from mace.calculators import MACECalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(model_paths=str(path), device="cpu", default_dtype="float64", head=head)
    a = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    a.calc = calc
    return a.get_potential_energy(), a.get_forces()


def test_names_resolve_where_mace_torch_caches_them(xdg):
    from mace.calculators.foundations_models import download_mace_mp_checkpoint

    from shardmd.models.mace import resolve_checkpoint

    d = xdg / "mace"
    assert resolve_checkpoint("mh-1") == d / MH1
    assert resolve_checkpoint("small") == d / SMALL
    assert resolve_checkpoint("off-small") == d / OFF_SMALL
    # the same file mace-torch's own resolver gives (cached: no download attempted)
    assert Path(download_mace_mp_checkpoint("small")) == d / SMALL
    # a path still wins over a name
    assert resolve_checkpoint(str(d / SMALL)) == d / SMALL


def test_foundation_file_loads_through_the_safe_loader(xdg):
    from shardmd.models.mace import MaceModel

    m = MaceModel("mh-1", head="r2scan")
    assert m.path == xdg / "mace" / MH1 and m.heads == ["pbe", "r2scan"] and m.head == "r2scan"
    assert m.atomic_numbers == [13, 28, 29]


def test_unknown_names_heads_and_failed_downloads_are_one_line(xdg, tmp_path, capfd, monkeypatch):
    cases = [(["model.checkpoint=not-a-model"], ["no such file", "not a foundation model name", "medium-mpa-0",
                                                 "off-medium", "mh-1"]),
             (["model.checkpoint=mh-1", "model.head=omol"], ["model.head='omol'", "pbe, r2scan"]),
             (["model.checkpoint=mh-1"], ["2 heads (pbe, r2scan)", "model.head=NAME"]),
             (["model.checkpoint=small", "model.head=pbe"], ["model.head='pbe'", "Default"])]
    for extra, needles in cases:
        code, lines = run_in_process(["run", "model=mace", "steps=0", "quiet=true", *extra], tmp_path, capfd,
                                     monkeypatch)
        assert code == 2 and len(lines) == 1, lines
        assert all(n in lines[0] for n in needles), lines[0]
    # not cached and no network: say where the file must go
    import mace.calculators.foundations_models as fm

    from shardmd.models.mace import resolve_checkpoint

    def offline(url, filename, timeout=0):
        raise OSError("network unreachable")

    monkeypatch.setattr(fm, "_urlretrieve_with_timeout", offline)
    for name, cached in (("medium-omat-0", "maceomat0mediummodel"), ("off-large", "MACE-OFF23_large.model")):
        with pytest.raises(ValueError) as e:
            resolve_checkpoint(name)
        msg = str(e.value)
        assert "\n" not in msg and str(xdg / "mace" / cached) in msg and "network unreachable" in msg, msg


@pytest.mark.slow
def test_named_multihead_model_on_one_domain_equals_mace_calculator(xdg, tmp_path):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    energies = {}
    for head in ("pbe", "r2scan"):
        sim = Simulation(compose_config(["model=mace", "model.checkpoint=mh-1", f"model.head={head}",
                                         f"system.file={xdg / 'alnicu.extxyz'}", "steps=0", "quiet=true",
                                         "trajectory.every=0", f"output={tmp_path / head}.h5"]))
        sim.run(0)
        full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
        assert len(set(full["numbers"].tolist())) == 3
        e, f = _calculator(xdg / "mace" / MH1, full["numbers"], full["positions"], sim.state.cell.numpy(), head)
        assert np.abs(full["forces"] - f).max() <= 1e-10 * np.abs(f).max(), head
        assert abs(float(sim.results["energy"]) - e) <= 1e-10 * abs(e), head
        energies[head] = e
    assert abs(energies["pbe"] - energies["r2scan"]) > 1.0        # the head is really used


@pytest.mark.slow
def test_head_is_part_of_the_model_identity(tmp_path, monkeypatch):
    """model.head is in the model's identity: the head a multi-head model resolved to (given, or
    its default) is in the log header and the checkpoint, and a restart with another head is
    refused in one line unless restart.allow_changes=true."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.io.checkpoint import model_identity_of, newest_valid
    from shardmd.engine.run.simulation import Simulation

    path = make_random_mace(tmp_path / "heads.model", elements=(29,), heads=("Default", "pbe"), seed=6)
    monkeypatch.chdir(tmp_path)
    common = ["model=mace", f"model.checkpoint={path}", "system.repeat=[3,3,3]", "quiet=true", "threads=1",
              "trajectory.every=2", "checkpoint.every=2", "output=h.h5"]
    sim = Simulation(compose_config([*common, "steps=2"]))
    sim.run()
    assert sim.model_origin["head"] == "Default" and "head Default" in (tmp_path / "h.log").read_text()
    _, ck = newest_valid(tmp_path / "h.ckpt")
    assert ck["model_identity"] == model_identity_of(sim.model_origin)
    assert ck["model_identity"] != model_identity_of({**sim.model_origin, "head": "pbe"})
    with pytest.raises(UserError) as exc:
        Simulation(compose_config([*common, "model.head=pbe", "steps=4", "restart=auto"]))
    msg = str(exc.value)
    assert "\n" not in msg and "restart.allow_changes=true" in msg, msg
    sim = Simulation(compose_config([*common, "model.head=pbe", "steps=4", "restart=auto",
                                     "restart.allow_changes=true"]))
    sim.run()
    assert sim.model_origin["head"] == "pbe" and newest_valid(tmp_path / "h.ckpt")[1]["step"] == 4
    # the ASE calculator records the head it uses, and its record makes the same calculator
    from shardmd.engine.ase_calculator import ShardMDCalculator

    calc = ShardMDCalculator(model="mace", checkpoint=str(path), head="pbe")
    assert calc.todict()["head"] == "pbe" and ShardMDCalculator(**calc.todict()).model.head == "pbe"
    assert ShardMDCalculator(model="mace", checkpoint=str(path)).todict()["head"] == "Default"


def world_tasks(item):
    """The 4-domain run joins the shared 4-rank world (which has imported MACE already)."""
    if item.originalname != "test_named_multihead_model_on_four_domains_equals_mace_calculator":
        return []
    return [WorldTask(4, "foundation4", "mace_foundation_cases",
                      ["{out}/four.npz", lambda f: str(_cache_root(f)), "mh-1", "r2scan", "10"])]


@pytest.mark.mpi
@pytest.mark.slow
def test_named_multihead_model_on_four_domains_equals_mace_calculator(xdg, mpi_world):
    res = np.load(mpi_world(4, "foundation4") / "four.npz")
    assert np.prod(res["grid"]) == 4
    for tag in ("0", "1"):
        e, f = _calculator(xdg / "mace" / MH1, res["numbers"], res["pos" + tag], res["cell"], "r2scan")
        assert np.abs(res["f" + tag] - f).max() <= 1e-10 * np.abs(f).max(), tag
        assert abs(float(res["e" + tag]) - e) <= 1e-10 * abs(e), tag


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
