"""AIMNet2 (aimnet 0.2.5, unmodified) through the spec, against aimnet's own calculator (its
neighbour lists, its Coulomb module, its autograd forces and stress on the whole system: an
independent, single-process reference): a random-weight model of AIMNet2's architecture written
by aimnet's own exporter (tests/aimnet2_cases.py), on a periodic water box; the CLI on 1, 2 and
4 domains (real MPI ranks) through 50 Langevin steps with migrations, and across a restart; the
refusals, one line each; and the one-line error without the package (runs where aimnet is
absent, e.g. the main environment).  A variant of the file with the released models' DFTD3 output
(wB97M's D3(BJ) parameters, stripped by the exporter to ``needs_dispersion`` and ``d3_params``):
our D3 (models/d3.py) added inside the wrapper, against aimnet's calculator with its D3 attached,
on 1 and 2 domains, and without it (``model.dispersion=false``).

Tolerances (float64): 1e-10 relative to the largest value for the network, the charge
equilibration and aimnet's closed-form DSF Coulomb (``LRCoulomb._coul_dsf_torch``); 1e-9 with
Ewald, where two Ewald sums (models/coulomb.py and nvalchemiops') agree to their accuracy
(1e-10 here); float32 against aimnet's unmodified calculator (its float32 positions, its
nvalchemiops DSF kernel) 1e-4 relative.  aimnet's ASE calculator is float32 only; the float64
reference casts it (models/aimnet2.py ``AIMNet2Model.ase_calculator``).  With DFT-D3 the reference's
dispersion is nvalchemiops' kernel (float32 tables and arithmetic, reference pairs below e^-12
of the largest Gaussian weight dropped), ours tad-dftd3's float64 tables without that cut: 1e-6
of the D3 energy, 1e-4 of the largest D3 force and virial component (measured 1.7e-7 and 3e-5).
"""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.io import write
from conftest import run_engine, run_in_process
from family_checks import assert_install_line, assert_restart_bit_exact, save_hostile

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
    write(d / "water5.extxyz", water_box(5, offset=1.5))
    return {"pt": make_model_file(d), "d3": make_model_file(d, name="aimnet2_d3.pt", dispersion=True),
            "xyz": d / "water.extxyz", "xyz5": d / "water5.extxyz", "dir": d}


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


@pytest.mark.parametrize("key", ["pt", "d3"], ids=["plain", "d3"])
def test_float32_equals_aimnets_own_calculator(files, key):
    """float32 against aimnet's calculator as it ships (float32 positions, its DSF kernel, and
    its D3 kernel for the file that carries D3), 1e-4 relative to the largest value."""
    from aimnet.calculators import AIMNet2Calculator
    from aimnet.calculators.aimnet2ase import AIMNet2ASE
    from aimnet2_cases import water_box

    a = water_box(3)
    ours = _ours(checkpoint=str(files[key]), coulomb_cutoff=8.0, dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = AIMNet2Calculator(str(files[key]), device="cpu")
    base.set_lrcoulomb_method("dsf", cutoff=8.0, dsf_alpha=0.2)
    rel = _rel(_evaluate(ours, a), _evaluate(AIMNet2ASE(base), a))
    assert max(rel) <= 1e-4, rel


# -- DFT-D3 (the released models' dispersion) --------------------------------------------------------
#: ours against aimnet's D3 kernel, shares of the D3 term's own energy and largest force/virial component
D3_TOL = {"energy": 1e-6, "forces": 1e-4, "virial": 1e-4}


@pytest.mark.parametrize("coulomb_cutoff", [8.0, 17.0])
def test_d3_equals_aimnets_calculator_with_its_d3(files, coulomb_cutoff):
    """A file that needs DFT-D3 (default model.dispersion=true) against aimnet's calculator with
    its DFTD3 attached, float64, periodic: energy, forces, virial.  8 Å: aimnet gives D3 its own
    15 Å list; 17 Å: it shares the DSF list (within 20 %), so its CNs reach 17 Å, as ours then."""
    from aimnet2_cases import water_box

    a = water_box(3)
    ours = _ours(checkpoint=str(files["d3"]), coulomb_cutoff=coulomb_cutoff)
    ref = ours.model.ase_calculator()
    assert ref.base_calc.external_dftd3 is not None and ours.model.d3 is not None
    got, want = _evaluate(ours, a), _evaluate(ref, a)
    bare = _evaluate(_ours(checkpoint=str(files["d3"]), coulomb_cutoff=coulomb_cutoff, dispersion=False), a)
    d3 = [g - b for g, b in zip(got, bare)]   # our D3 term alone
    assert -4.0 < d3[0] < -3.0   # 81 waters' D3(BJ), wB97M parameters: ~ -3.56 eV
    for name, g, w, t in zip(("energy", "forces", "virial"), got, want, d3):
        err, scale = float(np.abs(g - w).max()), float(np.abs(t).max())
        assert err <= D3_TOL[name] * scale, (name, err, scale)


def test_dispersion_false_is_the_network_alone(files):
    """model.dispersion=false on the D3 file: the D3-free model (the same weights' file without
    DFTD3, bit for bit) and aimnet's calculator with needs_dispersion=False (1e-10)."""
    from aimnet2_cases import water_box

    a = water_box(3)
    ours = _ours(checkpoint=str(files["d3"]), coulomb_cutoff=8.0, dispersion=False)
    assert ours.model.d3 is None and ours.model.cutoff == 8.0
    got = _evaluate(ours, a)
    plain = _evaluate(_ours(checkpoint=str(files["pt"]), coulomb_cutoff=8.0), a)
    assert all(np.array_equal(g, p) for g, p in zip(got, plain))
    ref = ours.model.ase_calculator()
    assert ref.base_calc.external_dftd3 is None
    assert max(_rel(got, _evaluate(ref, a))) <= TOL


@pytest.mark.mpi
def test_d3_cli_on_1_and_2_domains(files):
    """``python -m engine run model=aimnet2 ... domains=N`` with the D3 file (a 7 Å D3 cutoff, so
    that 2 domains fit the 15.5 Å box): 30 Langevin steps, the 2-domain trajectory equals one
    domain's (1e-10 Å); the first frame's energy and forces are the one-process model's (1e-10), D3
    included."""
    d = files["dir"]
    keys = ["model.coulomb_cutoff=5.0", "model.dispersion_cutoff=7.0"]
    base = [*CLI, *keys, "steps=30", "trajectory.every=30", f"model.checkpoint={files['d3']}",
            f"system.file={files['xyz5']}"]
    for k in (1, 2):
        r = run_engine([*base, f"domains={k}", f"output=d3_{k}.h5"], cwd=d, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    runs = {k: read_frames(d / f"d3_{k}.h5") for k in (1, 2)}
    assert [f.info["step"] for f in runs[2]] == [0, 30]
    assert np.abs(runs[2][-1].positions - runs[1][-1].positions).max() <= 1e-10
    e1, e2 = runs[1][-1].get_potential_energy(), runs[2][-1].get_potential_energy()
    assert abs(e1 - e2) <= TOL * abs(e1)
    first, kw = runs[2][0], {"checkpoint": str(files["d3"]), "coulomb_cutoff": 5.0, "dispersion_cutoff": 7.0}
    e, forces, _ = _evaluate(_ours(**kw), first)
    assert abs(first.get_potential_energy() - e) <= TOL * abs(e)
    assert np.abs(first.get_forces() - forces).max() <= TOL * np.abs(forces).max()
    assert _evaluate(_ours(**kw, dispersion=False), first)[0] - e > 1.0   # the D3 term is in


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
    not fit, a file needing DFT-D3 without its parameters, a junk file, a missing file, a
    registry name not in aimnet's cache; DFT-D3 without tad-dftd3."""
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
            "s8": 0.3908, "a2": 3.128, "s6": 1.0})), ["needs DFT-D3", "lack s8, a1 or a2", "model.dispersion=false"]),
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
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "tad_dftd3", None)
        with pytest.raises(ValueError, match=r"DFT-D3\(BJ\).*pip install 'shardmd\[d3\]'.*dispersion=false"):
            factory(checkpoint=str(files["d3"]))
        assert factory(checkpoint=str(files["d3"]), dispersion=False).d3 is None


def test_engine_refusals_are_one_line_with_status_2(files, tmp_path, capfd, monkeypatch):
    """Through the CLI: an element the model lacks, an unknown key, a hostile file, no
    checkpoint, a bad Coulomb method, a bad dispersion switch or smoothing: exit status 2, one
    line, no traceback."""
    d = files["dir"]
    save_hostile(d / "evil2.pt", d / "MARKER2")
    ck = f"model.checkpoint={files['pt']}"
    cu = ["system.element=Cu", "system.lattice=fcc", "system.a=3.61", "system.repeat=[3,3,3]"]
    water = [f"system.file={files['xyz']}"]
    for args, words in (([ck, *cu], ["does not know Cu", "it knows H, C, N, O"]),
                        ([ck, *water, "model.nope=3"], ["no parameter nope", "checkpoint"]),
                        ([f"model.checkpoint={d / 'evil2.pt'}", *water], ["posix.system"]),
                        ([*water], ["needs model.checkpoint=FILE.pt"]),
                        ([ck, *water, "model.coulomb=wolf"], ["model.coulomb='wolf'", "dsf, ewald, pme, none"]),
                        ([ck, *water, "model.dispersion=maybe"], ["model.dispersion='maybe'", "true", "false"]),
                        ([ck, *water, "model.dispersion_smoothing=1.5"], ["model.dispersion_smoothing in [0, 1)"])):
        code, lines = run_in_process(["run", "model=aimnet2", *args, "steps=1", "quiet=true", "output=r.h5"],
                                     tmp_path, capfd, monkeypatch)
        lines = [ln for ln in lines if not ln.startswith(("Warp", "   ", "Module ", "UserWarning"))]
        assert code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not (d / "MARKER2").exists()


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """aimnet hidden from the interpreter (or absent: the main environment): the engine refuses
    model=aimnet2 in one line giving the install command (exit status 2)."""
    (tmp_path / "m.pt").write_bytes(b"x")
    assert_install_line(tmp_path, "aimnet", ["model=aimnet2", "model.checkpoint=m.pt"], "aimnet", "aimnet2")


def test_spec_saves_and_loads(tmp_path):
    """SPEC_AIMNET2 is a plain, saveable spec (no adapters: nothing of aimnet's is swapped)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.aimnet2 import SPEC_AIMNET2

    SPEC_AIMNET2.save(tmp_path / "aimnet2_spec.json")
    back = MLIPSpec.load(tmp_path / "aimnet2_spec.json")
    assert back == SPEC_AIMNET2 and back.distribution.third_party_helpers == ()
    assert Path(tmp_path / "aimnet2_spec.json").is_file()
