"""The second MLIP family through the specs: NequIP (the nequip package,
unmodified, random weights) on 1, 2 and 4 domains against nequip's own ASE calculator (its
neighbour list, its ForceOutput/StressOutput on the whole system: an independent,
single-process reference) and against the same model as one process (ShardMDCalculator on
one domain), before and after 50 hot MD steps with migrations.  models/nequip.py has no
exchange code: the spec's JitAdapters make nequip's TorchScript scatter visible to the
handlers; the control case runs the same model without them and must be wrong."""
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.io import write
from conftest import WorldTask, cli_in_process
from family_checks import evaluate_in_parts, last_unwrapped

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation

HERE = Path(__file__).resolve().parent
#: the model of tests/mpi/nequip_cases.py (its MODEL)
KWARGS = {"species": ["Cu", "Ni"], "r_max": 4.0, "seed": 7}
#: k -> cases of tests/mpi/nequip_cases.py (file[:grid][:plain]); 2 in the fast tier
# one axis split (k=2) and two (k=4); three axes are LJ's, NPT's and the message-passing examples'
# (an 8-rank NequIP world cost ~55 s of CPU on two cores for 108 atoms)
CASES = {2: ["cuni.extxyz", "cuni.extxyz::plain"], 4: ["cuni.extxyz:2x2x1"]}

_INPUTS: dict = {}


def _inputs(tmp_path_factory) -> Path:
    """108 atoms of fcc Cu with 30% Ni, rattled (10.8 Å box)."""
    if "dir" not in _INPUTS:
        d = tmp_path_factory.mktemp("nequip")
        a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3))
        a.rattle(0.08, seed=1)
        a.numbers[np.random.default_rng(0).random(len(a)) < 0.3] = 28
        write(d / "cuni.extxyz", a)
        _INPUTS["dir"] = d
    return _INPUTS["dir"]


def world_tasks(item):
    """The k-domain NequIP runs join the shared k-rank world (conftest.MPIWorlds)."""
    if item.originalname == "test_nequip_on_k_domains_equals_nequip_calculator":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"nequip_cases{k}", "nequip_cases",
                          ["{out}", *(lambda f, c=c: str(_inputs(f) / c.split(":")[0]) + c[len("cuni.extxyz"):]
                                      for c in CASES[k])], timeout=900)]
    return []


@contextmanager
def _float64_default():
    """nequip's calculator builds its inputs in torch's default dtype (float32 unless set)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


_REFS: dict = {}


def _references():
    """(nequip's own ASE calculator, ShardMDCalculator on one domain) for the model of KWARGS."""
    if not _REFS:
        from shardmd.engine.ase_calculator import ShardMDCalculator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _REFS["one"] = ShardMDCalculator(model="nequip", **KWARGS)
            # nequip's calculator on the same nequip GraphModel object (one model build fewer)
            _REFS["nequip"] = _REFS["one"].model.ase_calculator()
    return _REFS["nequip"], _REFS["one"]


def _evaluate(calc, numbers, positions, cell):
    a = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    a.calc = calc
    with _float64_default():
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def _check(res, tag):
    """Energy, forces and virial of one snapshot against both references (1e-10 relative)."""
    ref, one = _references()
    args = (res["numbers"], res["pos" + tag], res["cell"])
    for name, calc in (("nequip calculator", ref), ("one domain", one)):
        e, f, w = _evaluate(calc, *args)
        assert np.abs(res["f" + tag] - f).max() <= 1e-10 * np.abs(f).max(), (name, tag)
        assert abs(float(res["e" + tag]) - e) <= 1e-10 * abs(e), (name, tag)
        if "w" + tag in res:
            assert np.abs(res["w" + tag] - w).max() <= 1e-10 * np.abs(w).max(), (name, tag)


def test_nequip_comes_through_the_entry_point_group():
    from importlib.metadata import entry_points

    from shardmd.models.registry import registered

    eps = {ep.name: ep.value for ep in entry_points(group="shardmd.models")}
    assert eps["nequip"] == "shardmd.models.registry:nequip"
    model = registered()["nequip"].load()(**KWARGS)
    assert type(model).__name__ == "NequipModel" and model.cutoff == 4.0 and sorted(model.symbols) == ["Cu", "Ni"]


def test_nequip_one_domain_equals_nequip_calculator(tmp_path_factory, tmp_path):
    """model=nequip on one domain (the engine, in this process), steps 0 and 50."""
    d = _inputs(tmp_path_factory)
    sim = Simulation(compose_config(["model=nequip", "model.species=[Cu,Ni]", "model.r_max=4.0", "model.seed=7",
                                     f"system.file={d / 'cuni.extxyz'}", "steps=50", "dt=2.0", "temperature=900",
                                     "integrator=langevin", "trajectory.every=0", "thermo.every=0",
                                     "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4",
                                     f"output={tmp_path / 'one.h5'}"]))
    res = {"cell": sim.state.cell.double().numpy()}
    for tag, steps in (("0", 0), ("1", 50)):
        sim.run(steps)
        full = sim.domain.gather(sim.state, ("positions", "forces", "numbers"))
        res.update({"numbers": full["numbers"], "pos" + tag: full["positions"], "f" + tag: full["forces"],
                    "e" + tag: float(sim.results["energy"]), "w" + tag: sim.results["virial"].double().numpy()})
    ref, _ = _references()
    e, f, w = _evaluate(ref, res["numbers"], res["pos1"], res["cell"])
    assert np.abs(res["f1"] - f).max() <= 1e-10 * np.abs(f).max()
    assert abs(res["e1"] - e) <= 1e-10 * abs(e) and np.abs(res["w1"] - w).max() <= 1e-10 * np.abs(w).max()
    e0, _, _ = _evaluate(ref, res["numbers"], res["pos0"], res["cell"])
    assert abs(res["e0"] - e0) <= 1e-10 * abs(e0) and abs(e - e0) > 1.0   # the 50 hot steps moved the atoms


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_nequip_on_k_domains_equals_nequip_calculator(k, tmp_path_factory, mpi_world):
    out = mpi_world(k, f"nequip_cases{k}")
    res = dict(np.load(out / "cuni.npz" if k == 2 else out / f"cuni_{CASES[k][0].split(':')[1]}.npz"))
    assert np.prod(res["grid"]) == k
    _check(res, "0")
    _check(res, "1")
    assert int(res["migrated"]) > 0   # 50 hot steps moved atoms between domains
    if k == 2:   # control: without the spec's JitAdapters the ghosts' features are never refreshed
        plain = dict(np.load(out / "cuni_plain.npz"))
        ref, _ = _references()
        _, f, _ = _evaluate(ref, plain["numbers"], plain["pos0"], plain["cell"])
        assert np.abs(plain["f0"] - f).max() > 1e-3 * np.abs(f).max()


def test_nequip_refusals_are_one_line(tmp_path):
    from shardmd.engine.errors import UserError

    for args, words in ((["model.species=[Cu]"], ["does not know Ni", "it knows Cu"]),
                        (["model.nope=3"], ["no parameter nope", "species"]),
                        (["model.config=/nowhere/nequip.yaml"], ["no such file", "YAML"])):
        with pytest.raises(UserError) as exc:
            Simulation(compose_config(["model=nequip", "system.element=Ni", "system.lattice=fcc", "system.a=3.52",
                                       "system.repeat=[3,3,3]", *args, "steps=1", "quiet=true",
                                       f"output={tmp_path / 'r.h5'}"])).run()
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


def test_nequip_config_and_weights_files(tmp_path):
    """model.config (nequip's YAML) with model.weights (its saved state dict): the saved model's
    numbers, not the config seed's random ones; both files are part of the model's identity."""
    import yaml

    from shardmd.engine.io.checkpoint import model_identity_of
    from shardmd.models.nequip import NequipModel, random_config
    from shardmd.models.registry import model_origin, nequip

    trained = nequip(**KWARGS)
    torch.save(trained.graph_model.state_dict(), tmp_path / "best_model.pth")
    (tmp_path / "nequip.yaml").write_text(yaml.safe_dump({**random_config(("Cu", "Ni"), 4.0), "seed": 99}))
    cfg = {"name": "nequip", "config": str(tmp_path / "nequip.yaml"), "weights": str(tmp_path / "best_model.pth")}
    loaded = nequip(config=cfg["config"], weights=cfg["weights"])
    fresh = NequipModel(cfg["config"])   # the config's own seed: other weights
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    a.rattle(0.05, seed=2)
    a.numbers[::3] = 28
    e = [_evaluate(m.ase_calculator(), a.numbers, a.positions, a.cell.array)[0] for m in (trained, loaded, fresh)]
    assert e[1] == e[0] and abs(e[2] - e[0]) > 1e-6
    before = model_identity_of(model_origin(cfg))
    torch.save({k: v + 1e-3 for k, v in trained.graph_model.state_dict().items()}, tmp_path / "best_model.pth")
    assert model_identity_of(model_origin(cfg)) != before   # other weights: another model for a restart


def test_nequip_spec_saves_and_loads(tmp_path):
    """SPEC_NEQUIP is a plain, saveable spec (its JitAdapters name an importable replacement):
    the JSON round trip gives the same spec, and model.spec=FILE gives a nequip model that spec."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.nequip import SPEC_NEQUIP
    from shardmd.models.registry import build_model

    SPEC_NEQUIP.save(tmp_path / "nequip_spec.json")
    back = MLIPSpec.load(tmp_path / "nequip_spec.json")
    assert back == SPEC_NEQUIP
    helpers = back.distribution.third_party_helpers
    assert [h.target for h in helpers] == ["nequip.nn._interaction_block:scatter", "nequip.nn._atomwise:scatter"]
    assert all(h.replacement == "shardmd.models.nequip:scatter" and h.factory for h in helpers)
    model = build_model({"name": "nequip", **KWARGS, "spec": str(tmp_path / "nequip_spec.json")})
    assert model.distribution_spec == SPEC_NEQUIP


@pytest.mark.parametrize("count", [2, 8])
def test_nequip_parts_give_nequips_own_call(count):
    """The call made in parts (``subdomains=N``, domain/subdomains.py: each part its own atoms plus
    a walk of num_layers list edges, forces and virial by autograd through the part) against
    nequip's own calculator on the whole periodic cell (float64, 1e-10)."""
    ref, one = _references()
    m = one.model
    assert m.counts_rows and m.layers >= 1
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((7, 7, 7))
    a.rattle(0.08, seed=2)
    a.numbers[np.random.default_rng(1).random(len(a)) < 0.3] = 28
    out = evaluate_in_parts(m, a, count)
    e, f, w = _evaluate(ref, a.numbers, a.positions, a.cell.array)
    assert abs(float(out["energy"]) - e) <= 1e-10 * abs(e)
    assert np.abs(out["forces"].numpy() - f).max() <= 1e-10 * np.abs(f).max()
    assert np.abs(out["virial"].numpy() - w).max() <= 1e-10 * np.abs(w).max()
    assert abs(float(out["energies"].sum()) - e) <= 1e-10 * abs(e)


def test_nequip_run_in_parts_follows_the_run_in_one_piece(tmp_path, capfd, monkeypatch):
    """``subdomains=2``: 20 hot steps in two parts end where the run in one piece ends (float64,
    1e-10 Å), through the engine's whole path (the model chosen by name, parts by the key)."""
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((5, 5, 5))
    a.rattle(0.08, seed=3)
    a.numbers[np.random.default_rng(2).random(len(a)) < 0.3] = 28
    write(tmp_path / "cuni.extxyz", a)
    common = ["run", "model=nequip", "model.species=[Cu,Ni]", "model.r_max=4.0", "model.seed=7",
              "system.file=cuni.extxyz", "precision=float64", "steps=20", "temperature=900", "dt=2",
              "trajectory.every=20", "quiet=true", "threads=1", "neighbor.skin=0.5"]
    ends = {}
    for name, extra in {"one": [], "parts": ["subdomains=2"]}.items():
        r = cli_in_process([*common, *extra, f"output={name}.h5"], tmp_path, capfd, monkeypatch)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        ends[name] = last_unwrapped(tmp_path / f"{name}.h5")
    assert np.abs(ends["parts"] - ends["one"]).max() <= 1e-10
    assert np.abs(ends["one"] - a.positions).max() > 0.01   # it moved
