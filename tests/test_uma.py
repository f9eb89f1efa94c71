"""UMA (fairchem-core 2.24, unmodified) through the specs, against fairchem's own ASE calculator
(``FAIRChemCalculator`` on its ``MLIPPredictUnit``: its own graph, its autograd forces and
stress on the whole system, float64): a checkpoint of UMA's real architecture (eSCN-MD with a
mixture of linear experts, composition embedding, per-task heads; small, random weights,
written as fairchem writes inference checkpoints: tests/uma_cases.py) on every task; the CLI
on 1, 2 and 4 domains (real MPI ranks) through 50 hot Langevin steps with migrations, and
across a restart on two domains; the refusals, one line each.

Routes: with ``uma`` registered (models/registry.py and the entry point) the tests use
``model=uma``; until then the same factory through ``model=py:shardmd.models.uma:factory``.
"""
import importlib.util
import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.io import write
from conftest import run_engine, run_in_process
from family_checks import assert_install_line, assert_restart_bit_exact, save_hostile
from uma_cases import crystal, make_checkpoint

from shardmd.engine.io.h5md_read import read_frames
from shardmd.models.registry import registered_names

TOL = 1e-10
ROUTE = "uma" if "uma" in registered_names() else "py:shardmd.models.uma:factory"
HAVE_FAIRCHEM = importlib.util.find_spec("fairchem") is not None
#: every test but the one for an environment without it needs fairchem-core
needs_fairchem = pytest.mark.skipif(not HAVE_FAIRCHEM, reason="fairchem-core is not installed (pip install "
                                    "'shardmd[uma]' in its own environment: it needs e3nn >= 0.5 and torch 2.13)")


def _evaluate(calc, atoms, **info):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) of a fresh evaluation."""
    a = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=True)
    a.info.update(info)
    a.calc = calc
    calc.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def _assert_close(got, want, what=""):
    (e, f, w), (e0, f0, w0) = got, want
    assert abs(e - e0) <= TOL * abs(e0), (what, e, e0)
    assert np.abs(f - f0).max() <= TOL * np.abs(f0).max(), (what, np.abs(f - f0).max())
    assert np.abs(w - w0).max() <= TOL * np.abs(w0).max(), (what, np.abs(w - w0).max())


def _ours(**kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model=ROUTE, **kw)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The checkpoint and the test structure (made once)."""
    d = tmp_path_factory.mktemp("uma")
    write(d / "cuni.extxyz", crystal())
    return {"ckpt": make_checkpoint(d), "xyz": d / "cuni.extxyz", "dir": d}


@needs_fairchem
def test_checkpoint_equals_fairchem_calculator_on_every_task(files):
    """The engine on one domain (ShardMDCalculator) against FAIRChemCalculator on the same file:
    energy, forces and stress to 1e-10 relative, float64, for each task (each its own dataset
    embedding, expert mix and head); omol with a charge and a spin multiplicity."""
    from shardmd.models.uma import factory

    a = crystal(seed=5)
    for task, info in (("omat", {}), ("oc20", {}), ("omol", {"charge": 1, "spin": 2})):
        ours = _ours(checkpoint=str(files["ckpt"]), task=task)
        ref = factory(checkpoint=str(files["ckpt"]), task=task).ase_calculator()
        got = _evaluate(ours, a, **info)   # both read the charge and multiplicity from atoms.info
        _assert_close(got, _evaluate(ref, a, **info), task)
    e_omat = _evaluate(_ours(checkpoint=str(files["ckpt"]), task="omat"), a)[0]
    assert abs(e_omat - got[0]) > 1e-3   # the tasks differ: the comparison covers what selects them


@needs_fairchem
def test_edge_chunks_recomputed_equal_fairchem_calculator(files):
    """model.edge_chunk: the message passing in blocks of 97 edges whose activations are
    recomputed in the backward pass (fairchem's activation checkpointing, many blocks here)
    gives fairchem's calculator's energy, forces and stress to 1e-10, float64; a bad value is
    refused in one line."""
    from shardmd.models.uma import factory

    a = crystal(seed=7)
    ours = _ours(checkpoint=str(files["ckpt"]), task="omat", edge_chunk=97)
    chunked = factory(checkpoint=str(files["ckpt"]), task="omat", edge_chunk=97)
    sizes = [m.activation_checkpoint_chunk_size for m in chunked.hydra.modules()
             if hasattr(m, "activation_checkpoint_chunk_size")]
    assert sizes and set(sizes) == {97}
    ref = factory(checkpoint=str(files["ckpt"]), task="omat").ase_calculator()
    _assert_close(_evaluate(ours, a), _evaluate(ref, a), "edge_chunk=97")
    assert factory(checkpoint=str(files["ckpt"]), task="omat").edge_chunk is None   # auto on the CPU: none
    for bad in (-1, "big", 1.5, True):
        with pytest.raises(ValueError, match="model.edge_chunk=") as err:
            factory(checkpoint=str(files["ckpt"]), task="omat", edge_chunk=bad)
        assert "\n" not in str(err.value)


@needs_fairchem
def test_charge_and_spin_reach_the_experts(files):
    """omol: another charge or multiplicity gives another energy (fairchem's too, the same)."""
    from shardmd.models.uma import factory

    a = crystal(n=2, seed=3)
    ref = factory(checkpoint=str(files["ckpt"]), task="omol").ase_calculator()
    model = factory(checkpoint=str(files["ckpt"]), task="omol")
    assert model.model_config.system_inputs == ("charge", "spin")
    energies = [_evaluate(ref, a, charge=q, spin=s)[0] for q, s in ((0, 1), (1, 2), (-1, 2))]
    assert len({round(e, 8) for e in energies}) == 3


# -- N domains ---------------------------------------------------------------------------------------
CLI = ["run", f"model={ROUTE}", "model.task=omat", "precision=float64", "steps=50", "dt=2.0", "temperature=900",
       "integrator=langevin", "trajectory.every=50", "thermo.every=0", "checkpoint.every=0", "quiet=true", "threads=1",
       "neighbor.skin=0.4"]


@needs_fairchem
@pytest.mark.mpi
def test_cli_on_1_2_and_4_domains(files):
    """``python -m engine run model=uma model.checkpoint=... domains=N`` (N real ranks): 50
    Langevin steps at 900 K with migrations; the frames' energies and forces equal fairchem's
    calculator (1e-10) and the 2- and 4-domain trajectories equal one domain's (1e-10 Å)."""
    from shardmd.models.uma import factory

    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", f"system.file={files['xyz']}"]
    for k, grid in ((1, []), (2, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    log = (d / "d4.log").read_text()
    assert "grid 2x2x1" in log and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    ref = factory(checkpoint=str(files["ckpt"]), task="omat").ase_calculator()
    runs = {k: read_frames(d / f"d{k}.h5") for k in (1, 2, 4)}
    for k, frames in runs.items():
        assert [f.info["step"] for f in frames] == [0, 50]
        for f in frames:
            e, forces, _ = _evaluate(ref, f)
            assert abs(f.get_potential_energy() - e) <= TOL * abs(e), k
            assert np.abs(f.get_forces() - forces).max() <= TOL * np.abs(forces).max(), k
        assert np.abs(frames[-1].positions - runs[1][-1].positions).max() <= 1e-10, k
    moved = runs[1][-1].get_positions(wrap=False) - runs[1][0].get_positions(wrap=False)
    assert np.sqrt((moved ** 2).sum(1).mean()) > 0.05


@needs_fairchem
@pytest.mark.mpi
def test_restart_on_two_domains_is_bit_exact(files):
    """20 steps straight == 10 + restart + 10 (Langevin, 2 domains)."""
    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", f"system.file={files['xyz']}", "trajectory.every=5",
            "domains=2"]
    assert_restart_bit_exact(base, d)


# -- files, refusals ----------------------------------------------------------------------------------
def _edited(files, name, edit):
    """A copy of the checkpoint with ``edit(checkpoint)`` applied."""
    from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    with torch.serialization.safe_globals([MLIPInferenceCheckpoint]):
        cp = torch.load(files["ckpt"], map_location="cpu", weights_only=True)
    edit(cp)
    torch.save(cp, files["dir"] / name)
    return files["dir"] / name


@needs_fairchem
def test_file_refusals_are_one_line(files):
    """A hostile pickle (never unpickled), a bare state dict, a config naming other code, a
    direct-force model, weights that do not fit, a corrupt file, a missing file, an unknown task."""
    from shardmd.models.uma import factory

    d = files["dir"]
    marker = d / "MARKER"
    save_hostile(d / "evil.pt", marker)
    torch.save({"backbone.sphere_embedding.weight": torch.zeros(3)}, d / "bare.pt")
    (d / "junk.pt").write_bytes(b"not a checkpoint")
    cases = [
        (d / "evil.pt", ["not a plain UMA checkpoint", "posix.system", "trust_pickle=true"]),
        (d / "bare.pt", ["not a UMA inference checkpoint", "bare state dict"]),
        (_edited(files, "other.pt", lambda c: c.model_config.update(_target_="os.system")),
         ["not fairchem's HydraModel", "os.system"]),
        (_edited(files, "head.pt", lambda c: c.model_config["heads"]["energyandforcehead"].update(
            head_cls="builtins.eval")), ["builtins.eval", "trust_pickle"]),
        (_edited(files, "direct.pt", lambda c: c.model_config["backbone"].update(direct_forces=True)),
         ["direct-force model"]),
        (_edited(files, "weights.pt", lambda c: c.ema_state_dict.pop("module.backbone.sphere_embedding.weight")),
         ["weights do not fit", "missing: backbone.sphere_embedding.weight"]),
        (d / "junk.pt", ["not a loadable UMA checkpoint"]),
        (d / "nowhere.pt", ["no such file"]),
        ("uma-s-1p1", ["not in the Hugging Face cache", "nothing is downloaded"]),
    ]
    for path, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(path), task="omat")
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (str(path), msg)
    assert not marker.exists()
    for task, words in (("omx", ["model.task=omx", "its tasks: oc20, omat, omol"]), (None, ["needs model.task="])):
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(files["ckpt"]), task=task)
        assert "\n" not in str(exc.value) and all(w in str(exc.value) for w in words), str(exc.value)


@needs_fairchem
def test_engine_refusals_are_one_line(files, tmp_path, capfd, monkeypatch):
    """Through the CLI: a hostile file, an unknown element, a wrong task, a missing file: exit 2,
    one line, no traceback, no output file. (In this process, conftest.run_in_process: each fresh
    interpreter would spend ~18 s of CPU importing fairchem before refusing.)"""
    marker = tmp_path / "MARKER"
    save_hostile(tmp_path / "evil.pt", marker)
    write(tmp_path / "fm.extxyz", Atoms("Fm2", positions=[[0, 0, 0], [1.6, 1.6, 1.6]], cell=[6, 6, 6], pbc=True))
    ck = f"model.checkpoint={files['ckpt']}"
    for args, words in (([f"model.checkpoint={tmp_path / 'evil.pt'}", "model.task=omat"], ["posix.system"]),
                        ([ck, "model.task=omat", f"system.file={tmp_path / 'fm.extxyz'}"], ["does not know Fm"]),
                        ([ck, "model.task=omx"], ["model.task=omx", "oc20, omat, omol"]),
                        ([f"model.checkpoint={tmp_path / 'none.pt'}"], ["no such file"])):
        system = [] if any(a.startswith("system.file") for a in args) else [f"system.file={files['xyz']}"]
        code, lines = run_in_process(["run", f"model={ROUTE}", *args, *system, "steps=1", "output=r.h5"], tmp_path,
                                     capfd, monkeypatch)
        assert code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), lines
        assert not any("Traceback" in ln for ln in lines) and not (tmp_path / "r.h5").exists()
    assert not marker.exists()


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """fairchem hidden from the interpreter: the engine refuses the model in one line giving the
    install command (exit status 2).  (In an environment without fairchem, e.g. the project's
    own .venv, the same holds without hiding it.)"""
    assert_install_line(tmp_path, "fairchem" if HAVE_FAIRCHEM else None, [f"model={ROUTE}", "model.checkpoint=uma.pt"],
                        "fairchem", "uma")


def test_spec_saves_and_loads(tmp_path):
    """SPEC_UMA is a plain, saveable spec (no adapters: nothing of fairchem's is swapped)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.uma import SPEC_UMA

    SPEC_UMA.save(tmp_path / "uma_spec.json")
    back = MLIPSpec.load(tmp_path / "uma_spec.json")
    assert back == SPEC_UMA and back.distribution.third_party_helpers == ()
