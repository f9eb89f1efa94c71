"""The metatomic family (models/metatomic.py): a metatomic model file -- metatrain's PET, its
real architecture with random weights, exported offline -- through our wrapper against
metatomic's own ASE calculator (its neighbour lists, its autograd forces and stress on the
whole periodic system: an independent, single-process reference), on 1, 2 and 4 real MPI
domains before and after 50 hot MD steps with migrations (the wide-halo route: each rank runs
the model on its owned atoms plus a halo of the model's receptive field); the same trajectory
on 1, 2 and 4 domains; restarts bit-exact; refusals in one line.  The control case sizes the
halo by the interaction range metatrain declares for PET (one cutoff short) and must be wrong.
"""
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metatomic.torch", reason="metatomic-torch is not installed: the metatomic family's tests need "
                                               "it (pip install 'metatomic-torch>=0.1.19' vesin)")
pytest.importorskip("metatrain", reason="metatrain is not installed: these tests build a PET with random weights "
                                        "with it (pip install metatrain)")

import torch
from ase import Atoms
from ase.build import bulk
from ase.io import write
from conftest import mpiexec_cmd, run_engine, run_in_process
from metatomic_cases import ROUTE, arguments, run_case
from metatomic_model import build_pet

from shardmd.engine.io.h5md import read_frames

HERE = Path(__file__).resolve().parent
_FILES: dict = {}


def _files(tmp_path_factory) -> Path:
    """The PET files (float64 and float32, Ni and Cu) and the structures, made once."""
    if "dir" not in _FILES:
        d = tmp_path_factory.mktemp("metatomic")
        build_pet(d / "pet.pt", seed=3)
        build_pet(d / "pet32.pt", seed=3, dtype=torch.float32)
        rng = np.random.default_rng(0)
        # cuni384: close-packed rows along x and y (the split axes), so that PET's last hop,
        # 3 x 2.55 Å along a row, reaches past the halo of metatrain's declared range (6 Å)
        for name, reps, ortho in (("cuni108", (3, 3, 3), False), ("cuni384", (8, 8, 3), True)):
            a = bulk("Cu", "fcc", a=3.61, cubic=not ortho, orthorhombic=ortho).repeat(reps)
            a.rattle(0.08, seed=1)
            a.numbers[rng.random(len(a)) < 0.3] = 28
            write(d / f"{name}.extxyz", a)
        tri = bulk("Ni", "fcc", a=3.52).repeat((4, 4, 4))   # the primitive fcc cell: triclinic
        tri.rattle(0.1, seed=2)
        tri.numbers[rng.random(len(tri)) < 0.5] = 29
        write(d / "tri64.extxyz", tri)
        _FILES["dir"] = d
    return _FILES["dir"]


def _ours(model_file, **kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model=ROUTE.split("=", 1)[1], checkpoint=str(model_file), trust_code=True, **kw)


_REF: dict = {}


def _reference(model_file):
    """metatomic's own ASE calculator on the file."""
    key = str(model_file)
    if key not in _REF:
        try:
            from metatomic_ase import MetatomicCalculator
        except ImportError:   # metatomic-torch before metatomic-ase was split out
            from metatomic.torch.ase_calculator import MetatomicCalculator
        _REF[key] = MetatomicCalculator(key, device="cpu")
    return _REF[key]


def _evaluate(calc, numbers, positions, cell):
    """energy (eV), forces (eV/Å), virial (-stress x volume, eV), per-atom energies (eV)."""
    a = Atoms(numbers=numbers, positions=positions, cell=cell, pbc=True)
    a.calc = calc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume(),
                a.get_potential_energies())


def _close(ours, ref, rtol=1e-10):
    """max |ours - ref| <= rtol max |ref| (the largest element's scale); the relative error."""
    ours, ref = np.asarray(ours, dtype=float), np.asarray(ref, dtype=float)
    err = float(np.abs(ours - ref).max()) / float(np.abs(ref).max())
    return err <= rtol, err


def _check(res, tag, model_file, rtol=1e-10):
    """Energy, forces, virial, per-atom energies of one snapshot against metatomic's calculator."""
    e, f, w, ea = _evaluate(_reference(model_file), res["numbers"], res["pos" + tag], res["cell"])
    for name, ours, ref in (("energy", res["e" + tag], e), ("forces", res["f" + tag], f),
                            ("virial", res["w" + tag], w), ("energies", res["ea" + tag], ea)):
        ok, err = _close(ours, ref, rtol)
        assert ok, (name, tag, err)
    return e


@pytest.mark.parametrize("structure", ["cuni108", "tri64"])
def test_energy_forces_stress_equal_metatomic_calculator(structure, tmp_path_factory):
    """One process: our wrapper (ShardMDCalculator, one domain) vs metatomic's calculator on the
    same file, float64: measured ~1e-16 relative (energy, forces, stress, per-atom energies)."""
    from ase.io import read

    d = _files(tmp_path_factory)
    a = read(d / f"{structure}.extxyz")
    ours = _evaluate(_ours(d / "pet.pt"), a.numbers, a.positions, a.cell.array)
    ref = _evaluate(_reference(d / "pet.pt"), a.numbers, a.positions, a.cell.array)
    for name, x, y in zip(("energy", "forces", "virial", "energies"), ours, ref):
        ok, err = _close(x, y)
        assert ok, (name, err)
    assert np.abs(ref[1]).max() > 0.1 and abs(ref[0]) > 1.0   # a real, non-trivial model


def test_float32_model_within_float32_tolerance(tmp_path_factory):
    """A PET exported in float32 runs in float32 (inputs converted, outputs back in the
    engine's float64): metatomic's calculator's numbers to float32's tolerance."""
    from ase.io import read

    d = _files(tmp_path_factory)
    a = read(d / "cuni108.extxyz")
    ours = _evaluate(_ours(d / "pet32.pt"), a.numbers, a.positions, a.cell.array)
    ref = _evaluate(_reference(d / "pet32.pt"), a.numbers, a.positions, a.cell.array)
    for name, x, y, tol in zip(("energy", "forces", "virial", "energies"), ours, ref, (1e-6, 1e-4, 1e-4, 1e-5)):
        ok, err = _close(x, y, tol)
        assert ok, (name, err)


_ONE: dict = {}


def _one_domain(d, tmp_path_factory) -> dict:
    """The engine on one domain (this process): cuni384 at step 0 and after 50 steps."""
    if "res" not in _ONE:
        out = tmp_path_factory.mktemp("one") / "one.h5"
        _ONE["res"] = run_case(None, d / "pet.pt", d / "cuni384.extxyz", out)
    return _ONE["res"]


def test_one_domain_md_equals_metatomic_calculator(tmp_path_factory):
    d = _files(tmp_path_factory)
    res = _one_domain(d, tmp_path_factory)
    e0 = _check(res, "0", d / "pet.pt")
    e1 = _check(res, "1", d / "pet.pt")
    assert abs(e1 - e0) > 1.0   # the 50 hot steps moved the atoms


_WORLDS: dict = {}


def _k_domains(k: int, d, tmp_path_factory) -> Path:
    """tests/metatomic_cases.py on k real MPI ranks (one launch per k): cuni384 and, for k = 2,
    the control with the halo of metatrain's declared interaction range (6 Å)."""
    if k not in _WORLDS:
        out = tmp_path_factory.mktemp(f"metatomic{k}")
        grid = {2: "", 4: ":2x2x1"}[k]
        cases = [f"{d / 'cuni384.extxyz'}{grid}"] + ([f"{d / 'cuni384.extxyz'}:range=6.0"] if k == 2 else [])
        r = subprocess.run(mpiexec_cmd(k, [str(HERE / "metatomic_cases.py"), str(out), str(d / "pet.pt"), *cases]),
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        _WORLDS[k] = out
    return _WORLDS[k]


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_k_domains_equal_metatomic_calculator_and_one_domain(k, tmp_path_factory):
    """k domains: energies, forces, virial and per-atom energies at steps 0 and 50 equal
    metatomic's calculator (1e-10 relative), the trajectory equals one domain's (1e-10 Å after
    50 steps with migrations; measured ~1e-14 Å)."""
    d = _files(tmp_path_factory)
    out = _k_domains(k, d, tmp_path_factory)
    res = dict(np.load(out / ("cuni384.npz" if k == 2 else "cuni384_2x2x1.npz")))
    assert np.prod(res["grid"]) == k and int(res["migrated"]) > 0
    _check(res, "0", d / "pet.pt")
    _check(res, "1", d / "pet.pt")
    one = _one_domain(d, tmp_path_factory)
    assert np.array_equal(one["numbers"], res["numbers"])
    assert np.abs(res["pos1"] - one["pos1"]).max() <= 1e-10
    assert np.abs(res["pos1"] - res["pos0"]).max() > 0.1
    if k == 2:   # control: a halo of metatrain's declared range (layers x cutoff) misses PET's last hop
        ctl = dict(np.load(out / "cuni384_range.npz"))
        _, f, _, _ = _evaluate(_reference(d / "pet.pt"), ctl["numbers"], ctl["pos0"], ctl["cell"])
        assert not _close(ctl["f0"], f, 1e-8)[0]


def _frames(path):
    return {f.info["step"]: f for f in read_frames(path)}


@pytest.mark.parametrize("domains", [1, pytest.param(2, marks=[pytest.mark.slow, pytest.mark.mpi])])
def test_restart_is_bit_exact(domains, tmp_path, tmp_path_factory):
    """``python -m engine run`` with the model file: 20 steps straight == 10 + restart + 10."""
    d = _files(tmp_path_factory)
    base = [a for a in arguments(d / "pet.pt", d / "cuni384.extxyz", "x.h5", domains)
            if not a.startswith(("steps=", "output=", "trajectory.every=", "checkpoint.every="))]
    base += ["trajectory.every=5", "checkpoint.every=0"]
    for steps, output in ((20, "straight.h5"), (10, "split.h5"), (20, "split.h5")):
        extra = ["restart=auto"] if output == "split.h5" and steps == 20 else []
        r = run_engine(["run", *base, f"steps={steps}", f"output={output}", *extra], cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = _frames(tmp_path / "straight.h5"), _frames(tmp_path / "split.h5")
    assert sorted(a) == sorted(b) == [0, 5, 10, 15, 20]
    for s in sorted(a):
        assert np.array_equal(a[s].positions, b[s].positions), s
        assert np.array_equal(a[s].get_velocities(), b[s].get_velocities()), s
    assert np.abs(a[20].positions - a[0].positions).max() > 0.01


def _rewrite(src: Path, dst: Path, changes: dict) -> Path:
    """A copy of the zip ``src`` with the entries ending in the keys of ``changes`` replaced."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            for suffix, new in changes.items():
                if item.filename.endswith(suffix):
                    data = new.encode()
            zout.writestr(item, data)
    return dst


def _nequip_like(path: Path) -> Path:
    """A TorchScript file with a NequIP deployed model's metadata (nequip's ``nequip_version``)."""
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    torch.jit.save(scripted, str(path), _extra_files={"nequip_version": "0.6.2", "r_max": "4.0"})
    return path


def _plain_script(path: Path) -> Path:
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(path))
    return path


def test_refusals_are_one_line(tmp_path, tmp_path_factory, capfd, monkeypatch):
    """Through ``python -m engine run`` (in this process): each refusal is one line naming the
    problem and the fix, exit 2, and no file is loaded as code without model.trust_code=true."""
    d = _files(tmp_path_factory)
    pet = d / "pet.pt"
    (tmp_path / "notes.pt").write_text("not a model\n")
    newer = _rewrite(pet, tmp_path / "newer.pt", {"/extra/metatomic-version": "9.1.0"})
    ext = _rewrite(pet, tmp_path / "ext.pt", {"/extra/extensions": json.dumps(
        [{"name": "evil_torch", "path": "/tmp/libevil_torch.so"}])})
    (tmp_path / "exts").mkdir()
    mace_file = HERE.parent / "models" / "data" / "cu_mace_small.model"
    system = [f"system.file={d / 'cuni108.extxyz'}", "steps=1", "quiet=true", "output=r.h5"]
    cases = [
        ([f"model.checkpoint={pet}"], ["model.trust_code=true", "TorchScript program"]),
        ([], ["needs model.checkpoint"]),
        (["model.checkpoint=/nowhere/pet.pt", "model.trust_code=true"], ["no such file"]),
        ([f"model.checkpoint={tmp_path / 'notes.pt'}", "model.trust_code=true"], ["not a TorchScript archive"]),
        ([f"model.checkpoint={mace_file}", "model.trust_code=true"], ["mace-torch model", "model=mace"]),
        ([f"model.checkpoint={_nequip_like(tmp_path / 'deployed.pth')}", "model.trust_code=true"],
         ["NequIP deployed model", "model=nequip"]),
        ([f"model.checkpoint={_plain_script(tmp_path / 'plain.pt')}", "model.trust_code=true"],
         ["without metatomic's metadata"]),
        ([f"model.checkpoint={newer}", "model.trust_code=true"], ["metatomic-torch 9.1.0", "newer than the installed",
                                                                   "pip install -U"]),
        ([f"model.checkpoint={ext}", "model.trust_code=true"], ["evil_torch", "model.extensions_directory"]),
        ([f"model.checkpoint={ext}", "model.trust_code=true", f"model.extensions_directory={tmp_path / 'exts'}"],
         ["outside model.extensions_directory"]),
    ]
    loads = []
    real_load = torch.jit.load
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))

    def refused(args, words, system=system):
        code, lines = run_in_process(["run", ROUTE, *args, *system], tmp_path, capfd, monkeypatch)
        msg = " ".join(lines)
        assert code == 2 and len(lines) == 1 and all(w in msg for w in words), (args, lines)

    for args, words in cases:
        refused(args, words)
    assert loads == [], loads   # every refusal came before the file was loaded as TorchScript
    trusted = [f"model.checkpoint={pet}", "model.trust_code=true"]
    for args, words in ((["model.dtype=float32"], ["exported in float64"]),
                        (["model.interaction_range=1.0"], ["model.interaction_range=1.0", "neighbour-list cutoff 3"]),
                        (["model.variant=pbe"], ["no output 'energy/pbe'"])):
        refused(trusted + args, words)
    al = tmp_path / "al.extxyz"
    write(al, bulk("Al", "fcc", a=4.05, cubic=True).repeat((3, 3, 3)))
    refused(trusted, ["does not know Al", "knows Ni, Cu"],
            [f"system.file={al}", "steps=1", "quiet=true", "output=a.h5"])


def test_without_the_package_one_line_with_the_install_command(tmp_path, tmp_path_factory, capfd, monkeypatch):
    d = _files(tmp_path_factory)
    monkeypatch.setitem(sys.modules, "metatomic.torch", None)   # as if metatomic-torch were not installed
    code, lines = run_in_process(["run", ROUTE, f"model.checkpoint={d / 'pet.pt'}", "model.trust_code=true",
                                  f"system.file={d / 'cuni108.extxyz'}", "steps=1", "quiet=true", "output=r.h5"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "pip install 'metatomic-torch" in lines[0], lines


def test_model_identity_and_spec(tmp_path, tmp_path_factory):
    """The file is the model's identity (a restart with other weights is another model); the
    spec is the wide-halo preset and saves as data (it names no module)."""
    from shardmd.domain.api import PRESETS, MLIPSpec
    from shardmd.models.metatomic import SPEC_METATOMIC, factory

    d = _files(tmp_path_factory)
    model = factory(checkpoint=str(d / "pet.pt"), trust_code=True)
    assert model.cutoff == pytest.approx(9.0) and model.declared_range == pytest.approx(6.0)
    shutil.copy(d / "pet.pt", tmp_path / "a.pt")
    build_pet(tmp_path / "b.pt", seed=4)
    ids = {factory(checkpoint=str(tmp_path / n), trust_code=True).identity() for n in ("a.pt", "b.pt")}
    assert len(ids) == 2 and model.identity() in ids
    back = MLIPSpec.load(SPEC_METATOMIC.save(tmp_path / "spec.json"))
    assert back == SPEC_METATOMIC and back.distribution == PRESETS["wide-halo"].distribution
    assert back.all_reduce_outputs == {"energy"} and back.distribution.storage.mode == "local"
