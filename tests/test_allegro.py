"""Allegro (nequip-allegro 0.8.3 on nequip >= 0.18, unmodified) through the specs, against nequip's
own ASE calculator (its neighbour list, its autograd forces and stress on the whole system: an
independent, single-process reference): a model of Allegro's architecture with random weights;
a checkpoint written by ``nequip-train`` itself (tests/allegro_cases.py) loaded as data, equal to
nequip's own loader and to its package (``nequip-package``, loaded with ``trust_code``); the CLI
on 1, 2 and 4 domains (real MPI ranks) through 50 hot Langevin steps with migrations, and across
a restart; the refusals, one line each.  models/allegro.py has no exchange code: Allegro is
strictly local, the wrapper sums the per-atom energies per system.

nequip's data is float64 under its global state; its calculator builds it with the process
default dtype, so the references here evaluate with float64 as the default (``_evaluate``).
"""
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.io import write
from conftest import run_engine
from family_checks import assert_install_line, assert_restart_bit_exact, evaluate_in_parts, run_ends, save_hostile

pytest.importorskip("allegro", reason="nequip-allegro is not installed (pip install 'shardmd[allegro]' in its own "
                                      "environment: nequip >= 0.18 needs e3nn >= 0.5, which mace-torch excludes)")

from allegro_cases import KWARGS, cuag, make_checkpoint, make_package

from shardmd.engine.io.h5md_read import read_frames

TOL = 1e-10


def _evaluate(calc, numbers, positions, cell):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) of a fresh evaluation, float64 data."""
    from nequip.utils import torch_default_dtype

    a = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    a.calc = calc
    calc.reset()
    with warnings.catch_warnings(), torch_default_dtype(torch.float64):
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
        return ShardMDCalculator(model="allegro", **kw)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The nequip-train checkpoint, its package and the test structure (made once)."""
    d = tmp_path_factory.mktemp("allegro")
    ckpt = make_checkpoint(d / "train")
    write(d / "cuag.extxyz", cuag())
    return {"ckpt": ckpt, "package": make_package(ckpt, d / "allegro.nequip.zip"), "xyz": d / "cuag.extxyz",
            "dir": d}


def test_random_model_equals_nequip_calculator():
    """The engine on one domain (ShardMDCalculator) against nequip's calculator on the same
    random-weight model: energy, forces, stress and per-atom energies to 1e-10 relative."""
    a = cuag()
    ours = _ours(**KWARGS)
    ref = ours.model.ase_calculator()
    args = (a.numbers, a.positions, a.cell.array)
    got = _evaluate(ours, *args)
    _assert_close(got, _evaluate(ref, *args), "random")
    b = a.copy()
    b.calc = ours
    ref.calculate(b, ["energy"])
    assert np.abs(b.get_potential_energies() - ref.results["energies"]).max() <= TOL * abs(got[0]) / len(a)
    assert torch.get_default_dtype() == torch.float32   # nequip's global state did not leak into the process


def test_checkpoint_equals_nequips_own_loader_and_package(files):
    """model.checkpoint=FILE.ckpt, read as data, is nequip's own model (the weights nequip's
    loader gives, EMA included: the same numbers bit for bit); its package (trust_code) too."""
    from nequip.integrations.ase import NequIPCalculator

    from shardmd.models.allegro import factory, nequip_state

    a = cuag(seed=5)
    args = (a.numbers, a.positions, a.cell.array)
    with nequip_state(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = NequIPCalculator._from_saved_model(str(files["ckpt"]), chemical_species_to_atom_type_map=True)
    want = _evaluate(own, *args)
    ours = _ours(checkpoint=str(files["ckpt"]))
    _assert_close(_evaluate(ours, *args), want, "checkpoint")
    mine = factory(checkpoint=str(files["ckpt"])).graph_model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in own.model.state_dict().items())
    _assert_close(_evaluate(_ours(checkpoint=str(files["package"]), trust_code=True), *args), want, "package")


# -- N domains ---------------------------------------------------------------------------------------
CLI = ["run", "model=allegro", "precision=float64", "steps=50", "dt=2.0", "temperature=900", "integrator=langevin",
       "trajectory.every=50", "thermo.every=0", "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4"]


@pytest.mark.mpi
def test_cli_on_1_2_and_4_domains(files):
    """``python -m engine run model=allegro model.checkpoint=... domains=N`` (N real ranks): 50
    Langevin steps at 900 K with migrations; the frames' energies and forces equal nequip's
    calculator (1e-10) and the 2- and 4-domain trajectories equal one domain's (1e-10 Å)."""
    from shardmd.models.allegro import factory

    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", f"system.file={files['xyz']}"]
    for k, grid in ((1, []), (2, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    log = (d / "d4.log").read_text()
    assert "grid 2x2x1" in log and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    ref = factory(checkpoint=str(files["ckpt"])).ase_calculator()
    runs = {k: read_frames(d / f"d{k}.h5") for k in (1, 2, 4)}
    for k, frames in runs.items():
        assert [f.info["step"] for f in frames] == [0, 50]
        for f in frames:
            e, forces, _ = _evaluate(ref, f.numbers, f.positions, f.cell.array)
            assert abs(f.get_potential_energy() - e) <= TOL * abs(e), k
            assert np.abs(f.get_forces() - forces).max() <= TOL * np.abs(forces).max(), k
        assert np.abs(frames[-1].positions - runs[1][-1].positions).max() <= 1e-10, k
    moved = runs[1][-1].get_positions(wrap=False) - runs[1][0].get_positions(wrap=False)
    assert np.sqrt((moved ** 2).sum(1).mean()) > 0.05


@pytest.mark.mpi
def test_restart_on_two_domains_is_bit_exact(files):
    """20 steps straight == 10 + restart + 10 (Langevin, 2 domains, the checkpoint's model)."""
    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", f"system.file={files['xyz']}", "trajectory.every=5",
            "domains=2"]
    assert_restart_bit_exact(base, d)


# -- files, refusals ----------------------------------------------------------------------------------
def _edited(files, name, edit):
    """A copy of the checkpoint with ``edit(checkpoint dict)`` applied."""
    cp = torch.load(files["ckpt"], map_location="cpu", weights_only=True)
    edit(cp)
    torch.save(cp, files["dir"] / name)
    return files["dir"] / name


def test_file_refusals_are_one_line(files):
    """Another family, a newer nequip, a part outside the allow-list, another training module,
    a hostile pickle (never unpickled), a bare state dict, a compiled model, a package without
    trust_code, a junk file, a missing file."""
    from shardmd.models.allegro import factory

    d = files["dir"]
    marker = d / "MARKER"
    save_hostile(d / "evil.ckpt", marker)
    torch.save({"model.func.weight": torch.zeros(3)}, d / "bare.ckpt")
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(d / "deployed.nequip.pth"))
    (d / "junk.ckpt").write_bytes(b"not a checkpoint")
    hp = "hyper_parameters"
    cases = [
        (_edited(files, "nequip.ckpt", lambda c: c[hp]["model"].update(_target_="nequip.model.NequIPGNNModel")),
         ["is not an Allegro model", "a NequIP model"]),
        (_edited(files, "newer.ckpt", lambda c: c[hp]["info_dict"]["versions"].update(nequip="99.0")),
         ["nequip 99.0", "newer than the installed", "pip install 'nequip>=99.0'"]),
        (_edited(files, "part.ckpt", lambda c: c[hp]["model"]["pair_potential"].update(_target_="os.system")),
         ["model.pair_potential._target_=os.system", "trust_code=true"]),
        (_edited(files, "sf.ckpt", lambda c: c[hp]["info_dict"]["training_module"].update(
            _target_="nequip.train.ScheduleFreeLightningModule")), ["ScheduleFreeLightningModule", "trust_code"]),
        (d / "evil.ckpt", ["not a nequip-train checkpoint", "posix.system", "trust_code"]),
        (d / "bare.ckpt", ["not a nequip-train checkpoint", "bare state dict"]),
        (d / "deployed.nequip.pth", ["compiled model", "torchscript", ".ckpt or .nequip.zip"]),
        (files["package"], ["nequip package holds pickled code", "model.trust_code=true"]),
        (d / "junk.ckpt", ["not a nequip model file"]),
        (d / "nowhere.ckpt", ["no such file"]),
    ]
    for path, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(path))
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (path.name, msg)
    assert not marker.exists()
    with pytest.raises(ValueError, match="trained with nequip.train.ScheduleFreeLightningModule"):
        factory(checkpoint=str(d / "sf.ckpt"))


def test_engine_refusals_are_one_line(files, tmp_path):
    """Through the engine: an element the model lacks, an unknown key, no checkpoint."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.run.simulation import Simulation

    ck = f"model.checkpoint={files['ckpt']}"
    for args, words in (([ck], ["does not know Ni", "it knows Cu, Ag"]),
                        ([ck, "model.nope=3"], ["no parameter nope", "checkpoint"]),
                        ([], ["needs model.checkpoint=FILE", "model.random=true"])):
        with pytest.raises(UserError) as exc:
            Simulation(compose_config(["model=allegro", "system.element=Ni", "system.lattice=fcc", "system.a=3.52",
                                       "system.repeat=[3,3,3]", *args, "steps=1", "quiet=true",
                                       f"output={tmp_path / 'r.h5'}"])).run()
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


def test_trust_code_from_a_config_file_is_refused(files, tmp_path):
    """``model.trust_code: true`` in a config file is an opt-in from a file: refused in one line
    naming it (a config file cannot give an open choice's keys; engine/config/guard.py names it
    if one could); on the command line it is the user's own."""
    (tmp_path / "job.yaml").write_text("defaults:\n  - shardmd\n  - override model: custom\n  - _self_\n"
                                       "model:\n  name: allegro\n  trust_code: true\n")
    r = run_engine(["run", "config=job.yaml", f"model.checkpoint={files['package']}", f"system.file={files['xyz']}",
                    "steps=1", "output=r.h5"], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "model.trust_code" in lines[0], r.stderr[-2000:]
    assert not (tmp_path / "r.h5").exists()


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """nequip-allegro hidden from the interpreter: the engine refuses model=allegro in one line
    giving the install command (exit status 2)."""
    assert_install_line(tmp_path, "allegro", ["model=allegro", "model.random=true"], "allegro", "allegro")


def test_spec_saves_and_loads(tmp_path):
    """SPEC_ALLEGRO is a plain, saveable spec (no adapters: nothing of nequip's is swapped)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.allegro import SPEC_ALLEGRO

    SPEC_ALLEGRO.save(tmp_path / "allegro_spec.json")
    back = MLIPSpec.load(tmp_path / "allegro_spec.json")
    assert back == SPEC_ALLEGRO and back.distribution.third_party_helpers == ()
    assert Path(tmp_path / "allegro_spec.json").is_file()


@pytest.mark.parametrize("count", [2, 8])
def test_parts_give_nequips_own_call(count):
    """The call made in parts (``subdomains=N``, domain/subdomains.py): Allegro is strictly local,
    so each part is its own atoms plus one cutoff + skin of halo; forces and virial by autograd
    through the part. Against nequip's calculator on the whole periodic cell, to 1e-10."""
    m = _ours(**KWARGS).model
    assert m.layers == 1 and m.counts_rows
    a = cuag(n=5)
    out = evaluate_in_parts(m, a, count)
    _assert_close((float(out["energy"]), out["forces"].numpy(), out["virial"].numpy()),
                  _evaluate(m.ase_calculator(), a.numbers, a.positions, a.cell.array), "parts")


def test_a_run_in_parts_follows_the_run_in_one_piece(tmp_path):
    """``subdomains=8``: 30 hot steps (list rebuilds) in parts end where the run in one piece ends
    (float64, 1e-10 Å)."""
    write(tmp_path / "cuag.extxyz", cuag(n=5))
    model = ["model.random=true", "model.species=[Cu,Ag]", "model.r_max=4.0", "model.num_layers=2", "model.l_max=1",
             "model.num_scalar_features=16", "model.num_tensor_features=4", "model.seed=7"]
    common = ["run", "model=allegro", *model, "system.file=cuag.extxyz", "precision=float64", "steps=30",
              "temperature=900", "dt=2", "trajectory.every=30", "quiet=true", "threads=1", "neighbor.skin=0.5"]
    ends = run_ends(common, {"one": [], "parts": ["subdomains=8"]}, tmp_path)
    assert np.abs(ends["parts"] - ends["one"]).max() <= 1e-10
    assert np.abs(ends["one"] - cuag(n=5).positions).max() > 0.01   # it moved
