"""SevenNet (the sevenn package, unmodified) through the specs, against sevenn's own ASE
calculator (its matscipy neighbour list and its edge-gradient forces and stress on the whole
system: an independent, single-process reference): SevenNet-0 from sevenn's wheel through the
CLI on 1 and 4 domains; a model of SevenNet's architecture with random weights on 1, 2 and 4
domains before and after 50 hot MD steps with migrations, and across a restart; checkpoint
files and their refusals.  models/sevennet.py has no exchange code: the spec's PythonAdapter
and MethodAdapter make sevenn's message sum and energy sum visible to the handlers; the
control case runs the same model without them and must be wrong.

sevenn runs float32 only (its one-hot is ``.float()``, its calculator casts inputs to float32):
float32 runs are compared with the unmodified calculator at float32 tolerance, float64 runs
with the same calculator given float64 inputs and the model in float64 (the wrapper's
``ase_calculator``) at 1e-10 relative.
"""
import pickle
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.io import write
from conftest import mpiexec_cmd, run_engine
from family_checks import assert_restart_bit_exact, evaluate_in_parts, run_ends, save_hostile

pytest.importorskip("sevenn", reason="sevenn is not installed (pip install 'sevenn==0.13.0', in an environment "
                                     "without mace-torch: sevenn needs e3nn >= 0.5)")

from sevennet_cases import KWARGS, MODEL

from shardmd.engine.io.h5md_read import read_frames

HERE = Path(__file__).resolve().parent
ROUTE = "py:shardmd.models.sevennet:factory"
#: sevenn's float32 evaluation against ours (other summation orders): measured 2e-7 (energy),
#: 4e-6 (forces, virial, relative to their largest entry) on 108 Cu atoms with SevenNet-0
F32 = {"energy": 1e-6, "forces": 2e-5, "virial": 2e-5}
F64 = {"energy": 1e-10, "forces": 1e-10, "virial": 1e-10}


def _cuni(n=3, seed=1):
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((n, n, n))
    a.rattle(0.08, seed=seed)
    a.numbers[np.random.default_rng(0).random(len(a)) < 0.3] = 28
    return a


def _evaluate(calc, numbers, positions, cell):
    a = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    a.calc = calc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def _assert_close(got, want, tol, what=""):
    (e, f, w), (e0, f0, w0) = got, want
    assert abs(e - e0) <= tol["energy"] * abs(e0), (what, e, e0)
    assert np.abs(f - f0).max() <= tol["forces"] * np.abs(f0).max(), (what, np.abs(f - f0).max())
    assert np.abs(w - w0).max() <= tol["virial"] * np.abs(w0).max(), (what, np.abs(w - w0).max())


def _ours(**kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model=ROUTE, **kw)


_REFS: dict = {}


def _random_reference():
    """sevenn's calculator on the random model of tests/sevennet_cases.py (float64 inputs)."""
    if "random" not in _REFS:
        from shardmd.models.sevennet import factory

        _REFS["random"] = factory(**KWARGS).ase_calculator()
    return _REFS["random"]


def test_random_model_equals_sevenn_calculator():
    """The engine on one domain (ShardMDCalculator) against sevenn's calculator: float64 to
    1e-10, and float32 against the unmodified float32 calculator; per-atom energies too."""
    a = _cuni()
    ours = _ours(precision="float64", **KWARGS)
    got = _evaluate(ours, a.numbers, a.positions, a.cell.array)
    _assert_close(got, _evaluate(_random_reference(), a.numbers, a.positions, a.cell.array), F64, "float64")
    b = a.copy()
    b.calc = ours
    ref = _random_reference()
    ref.calculate(b, ["energy"])
    assert np.abs(b.get_potential_energies() - ref.results["energies"]).max() <= 1e-10 * abs(got[0]) / len(a)
    ours32 = _ours(precision="float32", **KWARGS)
    ref32 = ours32.model.ase_calculator()
    assert type(ref32).__name__ == "SevenNetCalculator" and next(ref32.model.parameters()).dtype == torch.float32
    _assert_close(_evaluate(ours32, a.numbers, a.positions, a.cell.array),
                  _evaluate(ref32, a.numbers, a.positions, a.cell.array), F32, "float32")


def test_sevennet0_equals_sevenn_calculator():
    """SevenNet-0 from sevenn's wheel: our float32 run against SevenNetCalculator('7net-0')
    (sevenn loads the file itself); our float64 run against the float64 reference (1e-10)."""
    from sevenn.calculator import SevenNetCalculator

    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)
    a.rattle(0.05, seed=3)
    args = (a.numbers, a.positions, a.cell.array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sevenn_own = SevenNetCalculator("7net-0", device="cpu")
    ours32 = _ours(precision="float32", checkpoint="7net-0")
    assert ours32.model.cutoff == 5.0 and len(ours32.model.atomic_numbers) == 89
    _assert_close(_evaluate(ours32, *args), _evaluate(sevenn_own, *args), F32, "float32")
    ours64 = _ours(checkpoint="7net-0")
    got = _evaluate(ours64, *args)
    _assert_close(got, _evaluate(ours64.model.ase_calculator(), *args), F64, "float64")
    _assert_close(got, _evaluate(sevenn_own, *args), F32, "float64 vs sevenn's float32")


# -- N domains ------------------------------------------------------------------------------------
_RUNS: dict = {}


def _inputs(tmp_path_factory) -> Path:
    if "inputs" not in _RUNS:
        d = tmp_path_factory.mktemp("sevennet")
        write(d / "cuni.extxyz", _cuni())
        _RUNS["inputs"] = d
    return _RUNS["inputs"]


def _cases(k, tmp_path_factory) -> Path:
    """tests/sevennet_cases.py on k ranks (one launch per k): 1 domain, 2 (with the control
    case) or 4 (grid 2x2x1); its output folder."""
    if k not in _RUNS:
        src = _inputs(tmp_path_factory) / "cuni.extxyz"
        out = tmp_path_factory.mktemp(f"sevennet{k}")
        cases = {1: [str(src)], 2: [str(src), f"{src}::plain"], 4: [f"{src}:2x2x1"]}[k]
        script = [str(HERE / "sevennet_cases.py"), str(out), *cases]
        cmd = [sys.executable, *script] if k == 1 else mpiexec_cmd(k, script)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        _RUNS[k] = out
    return _RUNS[k]


def _result(k, tmp_path_factory, name="cuni"):
    return dict(np.load(_cases(k, tmp_path_factory) / f"{name}.npz"))


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_random_model_on_k_domains(k, tmp_path_factory):
    """Energy, forces and virial at steps 0 and 50 against sevenn's calculator (1e-10), and
    the 50-step hot trajectory (migrations between domains) equal to one domain's (1e-10 Å)."""
    res = _result(k, tmp_path_factory, "cuni" if k == 2 else "cuni_2x2x1")
    one = _result(1, tmp_path_factory)
    assert np.prod(res["grid"]) == k and int(res["migrated"]) > 0
    for tag in "01":
        want = _evaluate(_random_reference(), res["numbers"], res["pos" + tag], res["cell"])
        _assert_close((float(res["e" + tag]), res["f" + tag], res["w" + tag]), want, F64, f"step {tag}")
    assert np.abs(res["pos1"] - one["pos1"]).max() <= 1e-10
    assert np.abs(res["f1"] - one["f1"]).max() <= 1e-10 * np.abs(one["f1"]).max()
    d = res["pos1"] - res["pos0"]
    d -= np.round(d @ np.linalg.inv(res["cell"])) @ res["cell"]
    assert np.sqrt((d ** 2).sum(1).mean()) > 0.05   # the 50 hot steps moved the atoms
    if k == 2:   # control: without the spec's adapters the ghosts' features are never refreshed
        plain = _result(2, tmp_path_factory, "cuni_plain")
        _, f, _ = _evaluate(_random_reference(), plain["numbers"], plain["pos0"], plain["cell"])
        assert np.abs(plain["f0"] - f).max() > 1e-3 * np.abs(f).max()


CLI = ["run", "model=sevennet", "model.name=7net-0", "system.file=cu.extxyz", "steps=4", "dt=2.0",
       "temperature=600", "trajectory.every=2", "trajectory.fields=[position,image,velocity,force]",
       "thermo.every=2", "neighbor.skin=0.3", "threads=1", "quiet=true", "checkpoint.every=0"]


@pytest.mark.mpi
@pytest.mark.slow
def test_sevennet0_cli_on_1_and_4_domains(tmp_path):
    """``python -m engine run model=sevennet model.name=7net-0`` on a rattled Cu crystal, 1 and 4
    domains: forces at every frame equal sevenn's calculator (float64: 1e-10; sevenn's own
    float32 run: its tolerance) and the two runs equal each other."""
    from sevenn.calculator import SevenNetCalculator

    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)   # 108 atoms, 10.8 Å: 2x2x1 domains of 5.4 Å
    cu.rattle(0.05, seed=5)
    write(tmp_path / "cu.extxyz", cu)
    for extra in (["output=d1.h5"], ["domains=4", "output=d4.h5"]):
        r = run_engine([*CLI, *extra], cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    assert "grid 2x2x1" in (tmp_path / "d4.log").read_text() or "domains 4" in (tmp_path / "d4.log").read_text()
    a, b = read_frames(tmp_path / "d1.h5"), read_frames(tmp_path / "d4.h5")
    assert [f.info["step"] for f in a] == [f.info["step"] for f in b] == [0, 2, 4]
    ref64 = _ours(checkpoint="7net-0").model.ase_calculator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sevenn_own = SevenNetCalculator("7net-0", device="cpu")
    for fa, fb in zip(a, b):
        assert np.abs(fa.positions - fb.positions).max() <= 1e-10
        e64, f64, _ = _evaluate(ref64, fa.numbers, fa.positions, fa.cell.array)
        e32, f32, _ = _evaluate(sevenn_own, fa.numbers, fa.positions, fa.cell.array)
        for frame in (fa, fb):   # the frames' own energy and forces (the run's outputs)
            e, f = frame.get_potential_energy(), frame.get_forces()
            assert abs(e - e64) <= 1e-10 * abs(e64) and np.abs(f - f64).max() <= 1e-10 * np.abs(f64).max()
            assert abs(e - e32) <= F32["energy"] * abs(e32)
            assert np.abs(f - f32).max() <= F32["forces"] * np.abs(f32).max()
    assert np.abs(a[-1].positions - a[0].positions).max() > 1e-3


@pytest.mark.mpi
@pytest.mark.slow
def test_restart_on_two_domains_is_bit_exact(tmp_path):
    """20 steps straight == 10 + restart + 10 (langevin, 2 domains, the random model)."""
    base = ["run", *MODEL, f"system.file={_write(tmp_path)}", "dt=2.0", "temperature=900", "integrator=langevin",
            "trajectory.every=5", "thermo.every=0", "quiet=true", "checkpoint.every=0", "threads=1",
            "neighbor.skin=0.4", "domains=2"]
    assert_restart_bit_exact(base, tmp_path)


def _write(d: Path) -> Path:
    write(d / "cuni.extxyz", _cuni())
    return d / "cuni.extxyz"


# -- checkpoints, refusals ------------------------------------------------------------------------
def _save_checkpoint(model, path: Path, **config):
    """A checkpoint in sevenn's format (its trainer's keys) of a model built by the wrapper."""
    torch.save({"config": {**model.config, **config}, "model_state_dict": model.graph_model.float().state_dict(),
                "epoch": 1, "time": "now", "hash": "0"}, path)


def test_checkpoint_file_and_identity(tmp_path):
    """model.checkpoint=FILE (sevenn's format): the same model as the one saved (float64,
    bitwise), sevenn's own calculator reads the file and agrees (float32), and another file
    is another model for a restart."""
    from sevenn.calculator import SevenNetCalculator

    from shardmd.engine.io.checkpoint import model_identity_of
    from shardmd.models.registry import model_origin
    from shardmd.models.sevennet import factory

    _save_checkpoint(factory(**KWARGS), tmp_path / "cp.pth")
    a = _cuni(2, seed=4)
    args = (a.numbers, a.positions, a.cell.array)
    loaded = _ours(checkpoint=str(tmp_path / "cp.pth"))
    e1 = _evaluate(loaded, *args)
    e0 = _evaluate(_ours(**KWARGS), *args)
    assert e1[0] == e0[0] and np.array_equal(e1[1], e0[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = SevenNetCalculator(str(tmp_path / "cp.pth"), device="cpu")
    _assert_close(e1, _evaluate(own, *args), F32, "sevenn reads our file")
    other = factory(**{**KWARGS, "seed": 8})
    assert abs(_evaluate(other.ase_calculator(), *args)[0] - e0[0]) > 1e-6
    cfg = {"name": ROUTE, "checkpoint": str(tmp_path / "cp.pth")}
    before = model_identity_of(model_origin(cfg))
    _save_checkpoint(other, tmp_path / "cp.pth")
    assert model_identity_of(model_origin(cfg)) != before


def _foreign_module(monkeypatch, module: str, cls: str):
    """A class that pickles as ``module.cls`` (e.g. mace-torch's model class, not installed here)."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    klass = type(cls, (torch.nn.Module,), {"__module__": module})
    setattr(sys.modules[module], cls, klass)
    return klass


def test_checkpoint_refusals_are_one_line(tmp_path, monkeypatch):
    """Files of other families, a newer sevenn's file, a bare state dict, weights that do not fit
    the config, a hostile pickle
    (never unpickled: its payload does not run), a missing file, an unknown name, a bad dtype."""
    from shardmd.models.sevennet import factory, random_config

    marker = tmp_path / "MARKER"
    save_hostile(tmp_path / "evil.pth", marker)
    torch.save(_foreign_module(monkeypatch, "mace.modules.models", "ScaleShiftMACE")(), tmp_path / "mace.model")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    torch.save({"model.func.weight": torch.zeros(3)}, tmp_path / "best_model.pth")
    cfg = random_config()
    torch.save({"config": {**cfg, "version": "99.1.0"}, "model_state_dict": {}}, tmp_path / "newer.pth")
    torch.save({"config": {**cfg, "_model_type": "other"}, "model_state_dict": {}}, tmp_path / "other.pth")
    torch.save({"config": cfg, "model_state_dict": {"x": torch.zeros(1)}}, tmp_path / "misfit.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    cases = [("evil.pth", ["posix.system", "trust_pickle"]),
             ("mace.model", ["not a SevenNet checkpoint", "mace.modules.models.ScaleShiftMACE", "model=mace"]),
             ("module.pt", ["not a SevenNet checkpoint", "torch.nn.modules.linear.Linear"]),
             ("best_model.pth", ["not a SevenNet checkpoint", "bare state dict"]),
             ("newer.pth", ["sevenn 99.1.0", "newer than the installed", "pip install 'sevenn>=99.1.0'"]),
             ("other.pth", ["type 'other'", "E3_equivariant_model"]),
             ("misfit.pth", ["sevenn cannot build a model from it", "RuntimeError"]),
             ("junk.pth", ["not a loadable SevenNet checkpoint"]),
             ("nowhere.pth", ["no such file", "7net-0"]),
             ("7net-omat", ["not a SevenNet model shipped with sevenn", "download"]),
             ("7net-mf-0", ["multi-fidelity", "single-fidelity"])]
    for name, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(tmp_path / name) if name.endswith(("pth", "pt", "model")) else name)
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (name, msg)
    assert not marker.exists()
    with pytest.raises(ValueError, match="model.dtype='half': give float32 or float64"):
        factory(dtype="half")


def test_engine_refusals_are_one_line(tmp_path):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.run.simulation import Simulation

    for args, words in ((["model.random=true", "model.species=[Cu]"], ["does not know Ni", "it knows Cu"]),
                        (["model.nope=3"], ["no parameter nope", "checkpoint"]),
                        (["model.checkpoint=/nowhere/cp.pth"], ["no such file", "sevenn checkpoint"])):
        with pytest.raises(UserError) as exc:
            Simulation(compose_config([f"model={ROUTE}", "system.element=Ni", "system.lattice=fcc", "system.a=3.52",
                                       "system.repeat=[3,3,3]", *args, "steps=1", "quiet=true",
                                       f"output={tmp_path / 'r.h5'}"])).run()
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


def test_without_sevenn_the_error_is_one_line_with_the_install_command(tmp_path):
    """sevenn hidden from the interpreter: the module imports (sevenn only when chosen), the
    engine refuses the model in one line giving the install command (exit status 2)."""
    code = ("import sys; sys.modules['sevenn'] = None; import shardmd.models.sevennet; "
            "from shardmd.engine.cli.main import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "run", "model=sevennet", "system.element=Cu",
                        "system.lattice=fcc", "system.a=3.61", "system.repeat=[2,2,2]", "steps=1",
                        "output=r.h5"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if "sevenn" in ln]
    assert len(lines) == 1 and "pip install 'sevenn==0.13.0'" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_spec_saves_and_loads(tmp_path):
    """SPEC_SEVENNET is a plain, saveable spec (its adapters name importable replacements)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.registry import build_model
    from shardmd.models.sevennet import SPEC_SEVENNET

    SPEC_SEVENNET.save(tmp_path / "sevennet_spec.json")
    back = MLIPSpec.load(tmp_path / "sevennet_spec.json")
    assert back == SPEC_SEVENNET
    helpers = back.distribution.third_party_helpers
    assert [type(h).__name__ for h in helpers] == ["PythonAdapter", "MethodAdapter"]
    assert [h.replacement for h in helpers] == ["shardmd.models.sevennet:message_gather",
                                                "shardmd.models.sevennet:atom_reduce"]
    model = build_model({"name": ROUTE, **KWARGS, "spec": str(tmp_path / "sevennet_spec.json")})
    assert model.distribution_spec == SPEC_SEVENNET


def test_hostile_pickle_is_unpickled_only_with_trust_pickle(tmp_path):
    """The same hostile file runs its payload only when the user opts in (and is then still no
    SevenNet checkpoint)."""
    from shardmd.models.sevennet import factory

    marker = tmp_path / "MARKER"
    save_hostile(tmp_path / "evil.pth", marker)
    with pytest.raises(ValueError):
        factory(checkpoint=str(tmp_path / "evil.pth"))
    assert not marker.exists()
    with pytest.raises(ValueError, match="not a SevenNet checkpoint"):
        factory(checkpoint=str(tmp_path / "evil.pth"), trust_pickle=True)
    assert marker.exists()


def test_shipped_checkpoints_load_through_the_safe_path():
    """Every checkpoint sevenn ships loads through the safe path (weights_only=True)."""
    import sevenn._const as C

    from shardmd.models.sevennet import load_checkpoint_dict

    for attr in ("SEVENNET_0_11Jul2024", "SEVENNET_0_22May2024", "SEVENNET_l3i5"):
        cp = load_checkpoint_dict(Path(getattr(C, attr)), attr)
        assert "model_state_dict" in cp and cp["config"]["cutoff"] > 0
    with pytest.raises(pickle.UnpicklingError):   # what the safe path guards against: a plain weights-only load
        torch.load(C.SEVENNET_0_11Jul2024, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("count, by_layer", [(2, False), (4, False), (2, True), (8, True)])
def test_parts_give_sevenns_own_call(count, by_layer):
    """The call made in parts (``subdomains=N``, domain/subdomains.py: each part an open cluster
    reaching layers x (cutoff + skin), forces and virial by autograd through the part; or layer by
    layer, domain/layered_parts.py, one cutoff + skin of halo) against sevenn's own calculator on
    the whole periodic cell: float64, a random SevenNet (two layers; three by layer, so that a
    gradient is carried through a kept layer) on rattled CuNi, to 1e-10; the site energies of the
    parts' own atoms add up to the energy."""
    from shardmd.models.sevennet import factory

    m = factory(**{**KWARGS, "num_layers": 3 if by_layer else 2}, precision=torch.float64)
    assert m.layers == (3 if by_layer else 2) and m.counts_rows and m.layer_problem() is None
    a = _cuni(n=7)
    out = evaluate_in_parts(m, a, count, by_layer=by_layer)
    e0, f0, w0 = _evaluate(m.ase_calculator(), a.numbers, a.positions, a.cell.array)
    _assert_close((float(out["energy"]), out["forces"].numpy(), out["virial"].numpy()), (e0, f0, w0), F64, "parts")
    assert abs(float(out["energies"].sum()) - e0) <= 1e-10 * abs(e0)


def test_sevennet_0_by_layer_in_eight_parts_gives_sevenns_own_call():
    """SevenNet-0 (its shipped weights, five layers: whole parts would need 5 x (5 + 0.5) Å of
    halo, more than this cell holds) layer by layer in eight parts of one cutoff + skin of halo,
    against sevenn's own calculator on the periodic cell (float64, 1e-10)."""
    from shardmd.models.sevennet import factory

    m = factory(checkpoint="7net-0", precision=torch.float64)
    assert m.layers == 5 and m.layer_problem() is None
    a = _cuni(n=5)
    out = evaluate_in_parts(m, a, 8, by_layer=True)
    e0, f0, w0 = _evaluate(m.ase_calculator(), a.numbers, a.positions, a.cell.array)
    _assert_close((float(out["energy"]), out["forces"].numpy(), out["virial"].numpy()), (e0, f0, w0), F64, "7net-0")


def test_a_run_in_parts_follows_the_run_in_one_piece(tmp_path):
    """``subdomains=2`` with a random two-layer SevenNet, layer by layer (the default) and each
    part whole: 30 hot steps (list rebuilds) in parts end where the run in one piece ends
    (float64, 1e-10 Å)."""
    _cuni(n=7).write(tmp_path / "cuni.extxyz")
    model = [m if not m.startswith("model.num_layers") else "model.num_layers=2" for m in MODEL]
    common = ["run", *model, "system.file=cuni.extxyz", "precision=float64", "steps=30", "temperature=900", "dt=2",
              "trajectory.every=30", "quiet=true", "threads=1", "neighbor.skin=0.5"]
    ends = run_ends(common, {"one": [], "parts": ["subdomains=2"],
                             "whole": ["subdomains=2", "parts_by_layer=false"]}, tmp_path)
    assert np.abs(ends["parts"] - ends["one"]).max() <= 1e-10
    assert np.abs(ends["whole"] - ends["one"]).max() <= 1e-10
    assert np.abs(ends["one"] - _cuni(n=7).positions).max() > 0.01   # it moved


def test_a_run_too_large_for_the_memory_is_refused_before_it_starts(tmp_path):
    """SevenNet-0 needs ~60 kB per list edge (~4.5 MB an atom, measured on a GPU): 32,000 atoms
    in 8 GiB are refused in one line before the first step, naming the need and the fixes."""
    r = run_engine(["run", "model=sevennet", "model.name=7net-0", "system.element=Cu", "system.lattice=fcc",
                    "system.a=3.61", "system.repeat=[20,20,20]", "precision=float32", "steps=1",
                    "limits.memory_gb=8", "quiet=true"], tmp_path, timeout=600)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert "GiB" in lines[0] and "domains" in lines[0], lines[0]
    assert not (tmp_path / "run.h5").exists()
