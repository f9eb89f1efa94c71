"""AIMNet2 (aimnet 0.2.5, unmodified) through the spec, against aimnet's own calculator (its
neighbour lists, its Coulomb module, its autograd forces and stress on the whole system: an
independent, single-process reference): a random-weight model of AIMNet2's architecture written
by aimnet's own exporter (tests/aimnet2_cases.py), on a periodic water box; the CLI on 1, 2 and
4 domains (real MPI ranks) through 50 Langevin steps with migrations, and across a restart; the
refusals, one line each; and the one-line error without the package (runs where aimnet is
absent, e.g. the main environment).

Tolerances (float64): 1e-10 relative to the largest value for the network, the charge
equilibration and aimnet's closed-form DSF Coulomb (``LRCoulomb._coul_dsf_torch``); 1e-9 with
Ewald, where two Ewald sums (models/coulomb.py and nvalchemiops') agree to their accuracy
(1e-10 here); float32 against aimnet's unmodified calculator (its float32 positions, its
nvalchemiops DSF kernel) 1e-4 relative.  aimnet's ASE calculator is float32 only; the float64
reference casts it (models/aimnet2.py ``AIMNet2Model.ase_calculator``).
"""
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.io import write
from conftest import run_engine, run_in_process
from family_checks import assert_restart_bit_exact, save_hostile

from shardmd.engine.io.h5md_read import read_frames

TOL = 1e-10
#: the Coulomb cutoff of the multi-domain runs (Å): one AEV cutoff, so a 12.4 Å box splits in two
RC = 5.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The exported random AIMNet2 and the water boxes (made once); skips without aimnet."""
    pytest.importorskip("aimnet", reason="aimnet is not installed (pip install 'shardmd[aimnet2]')")
    from aimnet2_cases import make_model_file, water_box

    d = tmp_path_factory.mktemp("aimnet2")
    write(d / "water.extxyz", water_box(4, offset=1.5))
    return {"pt": make_model_file(d), "xyz": d / "water.extxyz", "dir": d}


def _evaluate(calc, atoms):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) of a fresh evaluation."""
    a = atoms.copy()
    a.calc = calc
    calc.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def _rel(got, want) -> tuple[float, float, float]:
    (e, f, w), (e0, f0, w0) = got, want
    return (abs(e - e0) / abs(e0), float(np.abs(f - f0).max() / np.abs(f0).max()),
            float(np.abs(w - w0).max() / np.abs(w0).max()))


def _ours(**kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model="aimnet2", **kw)


@pytest.mark.parametrize("coulomb, charge, tol", [("dsf", 0.0, TOL), ("dsf", 1.0, TOL), ("ewald", 0.0, 1e-9)])
def test_equals_aimnets_calculator(files, coulomb, charge, tol):
    """The engine on one domain (ShardMDCalculator) against aimnet's calculator on the same
    file, periodic, float64: energy, forces and stress; the charges sum to the total charge."""
    from aimnet2_cases import water_box

    a = water_box(3)
    ours = _ours(checkpoint=str(files["pt"]), coulomb=coulomb, coulomb_cutoff=8.0, charge=charge,
                 ewald_accuracy=1e-10)
    ref = ours.model.ase_calculator()
    rel = _rel(_evaluate(ours, a), _evaluate(ref, a))
    assert max(rel) <= tol, rel
    # aimnet's equilibration adds 1e-6 to the sum of the weights, so the charges miss Q by that share
    assert abs(ref.results["charges"].sum() - charge) < 1e-3


def test_float32_equals_aimnets_own_calculator(files):
    """float32 against aimnet's calculator as it ships (float32 positions, its DSF kernel)."""
    from aimnet.calculators import AIMNet2Calculator
    from aimnet.calculators.aimnet2ase import AIMNet2ASE
    from aimnet2_cases import water_box

    a = water_box(3)
    ours = _ours(checkpoint=str(files["pt"]), coulomb_cutoff=8.0, dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = AIMNet2Calculator(str(files["pt"]), device="cpu")
    base.set_lrcoulomb_method("dsf", cutoff=8.0, dsf_alpha=0.2)
    rel = _rel(_evaluate(ours, a), _evaluate(AIMNet2ASE(base), a))
    assert max(rel) <= 1e-4, rel


# -- N domains ---------------------------------------------------------------------------------------
CLI = ["run", "model=aimnet2", f"model.coulomb_cutoff={RC}", "precision=float64", "steps=50", "dt=0.5",
       "temperature=300", "integrator=langevin", "trajectory.every=50", "thermo.every=0", "checkpoint.every=0",
       "quiet=true", "threads=1", "neighbor.skin=0.4"]


@pytest.mark.mpi
def test_cli_on_1_2_and_4_domains(files):
    """``python -m engine run model=aimnet2 model.checkpoint=... domains=N`` (N real ranks): 50
    Langevin steps with migrations; the frames' energies and forces equal aimnet's calculator
    (1e-10) and the 2- and 4-domain trajectories equal one domain's (1e-10 Å)."""
    from shardmd.models.aimnet2 import factory

    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['pt']}", f"system.file={files['xyz']}"]
    for k, grid in ((1, []), (2, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    log = (d / "d4.log").read_text()
    assert "grid 2x2x1" in log and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    ref = factory(checkpoint=str(files["pt"]), coulomb_cutoff=RC).ase_calculator()
    runs = {k: read_frames(d / f"d{k}.h5") for k in (1, 2, 4)}
    for k, frames in runs.items():
        assert [f.info["step"] for f in frames] == [0, 50]
        for f in frames:
            e, forces, _ = _evaluate(ref, f)
            assert abs(f.get_potential_energy() - e) <= TOL * abs(e), k
            assert np.abs(f.get_forces() - forces).max() <= TOL * np.abs(forces).max(), k
        assert np.abs(frames[-1].positions - runs[1][-1].positions).max() <= 1e-10, k
    moved = runs[1][-1].get_positions(wrap=False) - runs[1][0].get_positions(wrap=False)
    assert np.sqrt((moved ** 2).sum(1).mean()) > 0.02


@pytest.mark.mpi
def test_restart_on_two_domains_is_bit_exact(files):
    """20 steps straight == 10 + restart + 10 (Langevin, 2 domains)."""
    base = [*CLI, f"model.checkpoint={files['pt']}", f"system.file={files['xyz']}", "trajectory.every=5",
            "domains=2"]
    assert_restart_bit_exact(base, files["dir"])


# -- files, refusals ----------------------------------------------------------------------------------
def _edited(files, name, edit):
    """A copy of the v2 file with ``edit(dict)`` applied."""
    data = torch.load(files["pt"], map_location="cpu", weights_only=True)
    edit(data)
    torch.save(data, files["dir"] / name)
    return files["dir"] / name


def test_file_refusals_are_one_line(files):
    """A hostile pickle (never unpickled), TorchScript without trust_code, a bare state dict,
    another family's checkpoint, a YAML naming code outside aimnet's allow-list, weights that do
    not fit, a file needing DFT-D3 (without model.dispersion=false), a junk file, a missing file,
    a registry name not in aimnet's cache."""
    from shardmd.models.aimnet2 import factory

    d = files["dir"]
    marker = d / "MARKER"
    save_hostile(d / "evil.pt", marker)
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(d / "legacy.jpt"))
    torch.save({"afv.weight": torch.zeros(3)}, d / "bare.pt")
    torch.save({"config": {}, "model_state_dict": {}}, d / "sevennet.pth")
    (d / "junk.pt").write_bytes(b"not a model")
    cases = [
        (d / "evil.pt", ["not an AIMNet2 model file", "posix.system"]),
        (d / "legacy.jpt", ["TorchScript", "model.trust_code=true"]),
        (d / "bare.pt", ["not an AIMNet2 model file", "bare state dict"]),
        (d / "sevennet.pth", ["SevenNet checkpoint"]),
        (_edited(files, "code.pt", lambda c: c.update(model_yaml=c["model_yaml"].replace(
            "aimnet.models.AIMNet2", "os.system", 1))), ["not a valid AIMNet2 v2 file", "os.system"]),
        (_edited(files, "weights.pt", lambda c: c["state_dict"].pop("afv.weight")),
         ["aimnet cannot build the model", "afv.weight"]),
        (_edited(files, "d3.pt", lambda c: c.update(needs_dispersion=True, d3_params={
            "s8": 0.3908, "a1": 0.566, "a2": 3.128, "s6": 1.0})), ["DFT-D3(BJ)", "model.dispersion=false"]),
        (d / "junk.pt", ["not an AIMNet2 model file"]),
        (d / "nowhere.pt", ["no such file"]),
    ]
    for path, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(path))
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (path.name, msg)
    assert not marker.exists()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIMNET_CACHE_DIR", str(d / "empty-cache"))
        with pytest.raises(ValueError, match="nothing is downloaded here.*aimnet download") as exc:
            factory(checkpoint="aimnet2")
        assert "\n" not in str(exc.value)


def test_engine_refusals_are_one_line_with_status_2(files, tmp_path, capfd, monkeypatch):
    """Through the CLI: an element the model lacks, an unknown key, a hostile file, no
    checkpoint, a bad Coulomb method: exit status 2, one line, no traceback."""
    d = files["dir"]
    save_hostile(d / "evil2.pt", d / "MARKER2")
    ck = f"model.checkpoint={files['pt']}"
    cu = ["system.element=Cu", "system.lattice=fcc", "system.a=3.61", "system.repeat=[3,3,3]"]
    water = [f"system.file={files['xyz']}"]
    for args, words in (([ck, *cu], ["does not know Cu", "it knows H, C, N, O"]),
                        ([ck, *water, "model.nope=3"], ["no parameter nope", "checkpoint"]),
                        ([f"model.checkpoint={d / 'evil2.pt'}", *water], ["posix.system"]),
                        ([*water], ["needs model.checkpoint=FILE.pt"]),
                        ([ck, *water, "model.coulomb=wolf"], ["model.coulomb='wolf'", "dsf, ewald, pme, none"])):
        code, lines = run_in_process(["run", "model=aimnet2", *args, "steps=1", "quiet=true", "output=r.h5"],
                                     tmp_path, capfd, monkeypatch)
        lines = [ln for ln in lines if not ln.startswith(("Warp", "   ", "Module ", "UserWarning"))]
        assert code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not (d / "MARKER2").exists()


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """aimnet hidden from the interpreter (or absent: the main environment): the engine refuses
    model=aimnet2 in one line giving the install command (exit status 2)."""
    code = ("import sys; sys.modules['aimnet'] = None; "
            "from shardmd.engine.cli.main import main; sys.exit(main(sys.argv[1:]))")
    (tmp_path / "m.pt").write_bytes(b"x")
    r = subprocess.run([sys.executable, "-c", code, "run", "model=aimnet2", "model.checkpoint=m.pt",
                        "system.element=Cu", "system.lattice=fcc", "system.a=3.61", "system.repeat=[2,2,2]", "steps=1",
                        "output=r.h5"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if "aimnet" in ln]
    assert len(lines) == 1 and "pip install 'shardmd[aimnet2]'" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_spec_saves_and_loads(tmp_path):
    """SPEC_AIMNET2 is a plain, saveable spec (no adapters: nothing of aimnet's is swapped)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.aimnet2 import SPEC_AIMNET2

    SPEC_AIMNET2.save(tmp_path / "aimnet2_spec.json")
    back = MLIPSpec.load(tmp_path / "aimnet2_spec.json")
    assert back == SPEC_AIMNET2 and back.distribution.third_party_helpers == ()
    assert Path(tmp_path / "aimnet2_spec.json").is_file()
