"""MatterSim (mattersim 1.2.3 on Python 3.11, 1.2.5 on 3.12; unmodified: its M3GNet) through the
specs: a model of MatterSim's architecture with random weights against MatterSim's own
``MatterSimCalculator`` (float32, the only precision MatterSim runs) and against MatterSim's own
``M3Gnet.forward`` on its own graph in float64
(tests/mattersim_cases.py ``reference64``); a checkpoint written by MatterSim's ``Potential.save``
loaded as data; the CLI on 1, 2 and 4 domains (real MPI ranks) through 50 hot Langevin steps with
migrations, and across a restart; the refusals, one line each.  models/mattersim.py swaps only
MatterSim's per-atom scatter for one the halo handler sees (the per-layer exchange).
"""
import os
import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.io import write
from conftest import run_engine
from family_checks import assert_install_line, assert_restart_bit_exact, evaluate_in_parts, save_hostile

pytest.importorskip("mattersim", reason="mattersim is not installed (pip install 'shardmd[mattersim]' in its own "
                                        "environment: mattersim needs e3nn >= 0.5, which mace-torch excludes)")

from mattersim_cases import KWARGS, cuag, make_checkpoint, reference64

from shardmd.engine.io.h5md_read import read_frames

TOL = 1e-10
TOL32 = 2e-5   # float32 against float32: MatterSim's own graph and sum order differ from ours


def _ours(**kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model="mattersim", **kw)


def _evaluate(calc, atoms):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) of a fresh evaluation."""
    a = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=True)
    a.calc = calc
    calc.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def _close(got, want, tol, what=""):
    for k, (x, y) in enumerate(zip(got, want)):
        x, y = np.asarray(x, float), np.asarray(y, float)
        assert np.abs(x - y).max() <= tol * np.abs(y).max(), (what, k, np.abs(x - y).max(), np.abs(y).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A checkpoint of the random model written by MatterSim's Potential.save, and the structure."""
    from shardmd.models.mattersim import factory

    d = tmp_path_factory.mktemp("mattersim")
    ckpt = make_checkpoint(factory(**KWARGS, dtype="float32"), d / "m3gnet.pth")
    write(d / "cuag.extxyz", cuag())
    return {"ckpt": ckpt, "xyz": d / "cuag.extxyz", "dir": d}


def test_random_model_equals_mattersim_calculator_float32():
    """The engine on one domain in float32 against MatterSimCalculator on the same weights:
    energy, forces and stress to MatterSim's float32 tolerance."""
    a = cuag()
    ours = _ours(precision="float32", **KWARGS)
    _close(_evaluate(ours, a), _evaluate(ours.model.ase_calculator(), a), TOL32, "float32")


def test_random_model_float64_equals_mattersims_own_forward():
    """float64: energy and forces equal MatterSim's own M3Gnet.forward on its own graph (1e-10
    relative); the stress equals MatterSim's calculator to its float32 tolerance; per-atom
    energies sum to the energy."""
    a = cuag(seed=4)
    ours = _ours(precision="float64", **KWARGS)
    e, f, w = _evaluate(ours, a)
    e0, f0 = reference64(ours.model, a)
    _close((e, f), (e0, f0), TOL, "float64")
    _close((w,), _evaluate(ours.model.ase_calculator(), a)[2:], TOL32, "stress")
    b = a.copy()
    b.calc = ours
    assert abs(b.get_potential_energies().sum() - e) <= TOL * abs(e)


def test_three_body_indices_are_mattersims():
    """Our three-body pairs are the set MatterSim's compute_threebody builds from the same edges."""
    try:
        from mattersim.datasets.utils.converter import compute_threebody_indices
    except ImportError:   # mattersim 1.2.3's spelling of the module (1.2.4 renamed it)
        from mattersim.datasets.utils.convertor import compute_threebody_indices

    from shardmd.models.mattersim import three_body_indices

    rng = np.random.default_rng(0)
    centres = np.sort(rng.integers(0, 7, 60))
    lengths = rng.uniform(1.0, 5.0, 60)
    ours = three_body_indices(torch.as_tensor(centres), torch.as_tensor(lengths), 3.0).numpy()
    theirs, *_ = compute_threebody_indices(np.stack([centres, centres]).T.astype(np.int32), lengths, 7,
                                           np.ones(7, int), threebody_cutoff=3.0)
    assert sorted(map(tuple, ours)) == sorted(map(tuple, np.asarray(theirs)))


def test_checkpoint_is_loaded_as_data(files):
    """model.checkpoint=FILE (Potential.save's dict, weights_only) is the same model."""
    a = cuag(seed=5)
    want = _evaluate(_ours(precision="float32", **KWARGS), a)
    _close(_evaluate(_ours(precision="float32", checkpoint=str(files["ckpt"])), a), want, 1e-6, "checkpoint")


# -- N domains ---------------------------------------------------------------------------------------
CLI = ["run", "model=mattersim", "precision=float64", "steps=50", "dt=2.0", "temperature=900", "integrator=langevin",
       "trajectory.every=50", "thermo.every=0", "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4"]


@pytest.mark.mpi
def test_cli_on_1_2_and_4_domains(files):
    """``python -m engine run model=mattersim model.checkpoint=... domains=N`` (N real ranks): 50
    Langevin steps at 900 K with migrations; the frames' energies and forces equal MatterSim's own
    float64 forward (1e-10) and the 2- and 4-domain trajectories equal one domain's (1e-10 Å)."""
    from shardmd.models.mattersim import factory

    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", f"system.file={files['xyz']}"]
    for k, grid in ((1, []), (2, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    log = (d / "d4.log").read_text()
    assert "grid 2x2x1" in log and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    model = factory(checkpoint=str(files["ckpt"]))
    runs = {k: read_frames(d / f"d{k}.h5") for k in (1, 2, 4)}
    for k, frames in runs.items():
        assert [f.info["step"] for f in frames] == [0, 50]
        for f in frames:
            e, forces = reference64(model, f)
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
    cp = torch.load(files["ckpt"], map_location="cpu", weights_only=True)
    edit(cp)
    torch.save(cp, files["dir"] / name)
    return files["dir"] / name


def test_file_refusals_are_one_line(files):
    """A hostile pickle (never unpickled), another family, a bare state dict, another MatterSim
    model, a newer format (arguments or weights this MatterSim lacks), a TorchScript archive, a
    junk file, a missing file, a pretrained name not downloaded."""
    from shardmd.models.mattersim import factory

    d = files["dir"]
    marker = d / "MARKER"
    save_hostile(d / "evil.pth", marker)
    torch.save({"config": {"version": "0.13.0"}, "model_state_dict": {}}, d / "sevenn.pth")
    torch.save({"w": torch.zeros(3)}, d / "bare.pth")
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(d / "scripted.pt"))
    (d / "junk.pth").write_bytes(b"not a checkpoint")
    cases = [
        (d / "evil.pth", ["posix.system", "trust_pickle=true"]),
        (d / "sevenn.pth", ["not a MatterSim checkpoint", "model=sevennet"]),
        (d / "bare.pth", ["not a MatterSim checkpoint", "bare state dict"]),
        (_edited(files, "graphormer.pth", lambda c: c.update(model_name="graphormer")), ["'graphormer'", "m3gnet"]),
        (_edited(files, "newer.pth", lambda c: c["model_args"].update(num_heads=4)),
         ["num_heads", "newer mattersim", "pip install -U mattersim"]),
        (_edited(files, "weights.pth", lambda c: c["model"].update({"extra.weight": torch.zeros(2)})),
         ["do not fit", "extra.weight"]),
        (d / "scripted.pt", ["TorchScript"]),
        (d / "junk.pth", ["not a loadable MatterSim checkpoint"]),
        (d / "nowhere.pth", ["no such file"]),
    ]
    for path, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(path))
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (path.name, msg)
    assert not marker.exists()
    if not os.path.exists(os.path.expanduser("~/.local/mattersim/pretrained_models/mattersim-v1.0.0-5M.pth")):
        with pytest.raises(ValueError, match="not downloaded yet"):
            factory(checkpoint="mattersim-v1.0.0-5M")


def test_engine_refusals_are_one_line(files, tmp_path):
    """Through the engine: an unknown key, no checkpoint."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.run.simulation import Simulation

    ck = f"model.checkpoint={files['ckpt']}"
    for args, words in (([ck, "model.nope=3"], ["no parameter nope", "checkpoint"]),
                        ([], ["needs model.checkpoint=FILE.pth", "model.random=true"])):
        with pytest.raises(UserError) as exc:
            Simulation(compose_config(["model=mattersim", "system.element=Cu", "system.lattice=fcc",
                                       "system.a=3.625", "system.repeat=[3,3,3]", *args, "steps=1", "quiet=true",
                                       f"output={tmp_path / 'r.h5'}"])).run()
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """mattersim hidden from the interpreter: the engine refuses model=mattersim in one line giving
    the install command (exit status 2)."""
    assert_install_line(tmp_path, "mattersim", ["model=mattersim", "model.random=true"], "mattersim", "mattersim")


def test_spec_saves_and_loads(tmp_path):
    """SPEC_MATTERSIM saves and loads with its one adapter (MatterSim's per-atom scatter)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.mattersim import SPEC_MATTERSIM

    SPEC_MATTERSIM.save(tmp_path / "mattersim_spec.json")
    back = MLIPSpec.load(tmp_path / "mattersim_spec.json")
    assert back == SPEC_MATTERSIM and len(back.distribution.third_party_helpers) == 1


@pytest.mark.parametrize("count", [2, 4])
def test_parts_give_mattersims_own_forward(count):
    """The call made in parts (``subdomains=N``, domain/subdomains.py: each part its own atoms plus
    a walk of num_blocks list edges, forces by autograd through the part) against MatterSim's own
    M3Gnet.forward on the whole periodic cell (float64, 1e-10); per-atom energies add up."""
    m = _ours(precision="float64", **KWARGS).model
    assert m.layers == KWARGS["num_blocks"] and m.counts_rows
    a = cuag(n=6, seed=4)
    out = evaluate_in_parts(m, a, count)
    e0, f0 = reference64(m, a)
    _close((float(out["energy"]), out["forces"].numpy()), (e0, f0), TOL, "parts")
    assert abs(float(out["energies"].sum()) - e0) <= TOL * abs(e0)
