"""model=d3 (models/d3.py) against dftd3, the Python API of simple-DFT-D3 (the Fortran reference
implementation, an independent code): D3(BJ) and D3(0) with PBE parameters, with and without
the ATM three-body term, for a periodic molecular crystal (triclinic) and a Cu(111) slab; the
model's default cutoffs against dftd3's defaults without the engine; 4 domains (real MPI ranks)
against one domain and dftd3; bad keys on the command line as one-line errors."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from ase.units import Bohr, Hartree
from conftest import WorldTask, run_in_process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from d3_systems import CUTOFFS, MPI_CASES, structure  # noqa: E402
from faultkit import one_line  # noqa: E402

from shardmd.engine.ase_calculator import ShardMDCalculator  # noqa: E402

dftd3 = pytest.importorskip("dftd3.interface")
VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


#: the 4-rank cases of the fast tier; the rest (the 192-atom slab with ATM) are slow
FAST_MPI = ("crystal_bj", "crystal_bj_atm", "crystal_bj_atm_local")
SLOW_MPI = tuple(c for c in MPI_CASES if c not in FAST_MPI)


def world_tasks(item):
    if item.originalname.startswith("test_four_domains"):
        case = item.callspec.params["case"]
        key, cases = ("d3_4", FAST_MPI) if case in FAST_MPI else ("d3_4_slow", SLOW_MPI)
        return [WorldTask(4, key, "d3_cases", ["{out}", *cases])]
    return []


def reference(atoms, damping="bj", atm=False, cutoffs=CUTOFFS, functional="pbe", width2=0.0) -> dict:
    """dftd3's energy (eV), forces (eV/Å), ASE stress (Voigt, eV/Å^3) and atom-resolved energies (eV);
    ``cutoffs`` (Å) as model.cutoff / cn_cutoff / three_body_cutoff, None: dftd3's defaults."""
    model = dftd3.DispersionModel(atoms.numbers, atoms.positions / Bohr, atoms.cell[:] / Bohr,
                                  np.array(atoms.pbc))
    if cutoffs is not None:
        model.set_realspace_cutoff(cutoffs["cutoff"] / Bohr, cutoffs["three_body_cutoff"] / Bohr,
                                   cutoffs["cn_cutoff"] / Bohr, width2 / Bohr, 0.0)
    cls = dftd3.RationalDampingParam if damping == "bj" else dftd3.ZeroDampingParam
    param = cls(method=functional, atm=atm)
    res = model.get_dispersion(param, grad=True)
    sigma = res["virial"] * Hartree / atoms.get_volume()   # dE/d(strain) / V: ASE's stress
    pair = model.get_pairwise_dispersion(param)
    per_atom = (pair["additive pairwise energy"] + pair["non-additive pairwise energy"]).sum(1) * Hartree
    return {"energy": float(res["energy"]) * Hartree, "forces": -res["gradient"] * Hartree / Bohr,
            "stress": np.array([sigma[a, b] for a, b in VOIGT]), "energies": per_atom}


def ours(atoms, **keys) -> dict:
    atoms = atoms.copy()
    atoms.calc = ShardMDCalculator(model="d3", **keys)
    return {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(), "stress": atoms.get_stress(),
            "energies": atoms.get_potential_energies()}


def assert_matches(got, ref, n, tol_e=1e-8):
    """Energy to tol_e eV/atom, forces to tol_e eV/Å, stress to 1e-9 eV/Å^3, per-atom energies to tol_e."""
    assert abs(got["energy"] - ref["energy"]) / n <= tol_e, (got["energy"], ref["energy"])
    assert np.abs(got["forces"] - ref["forces"]).max() <= tol_e
    assert np.abs(got["stress"] - ref["stress"]).max() <= 1e-9
    assert np.abs(got["energies"] - ref["energies"]).max() <= tol_e
    assert np.abs(ref["forces"]).max() > 1e-3 and np.abs(ref["stress"]).max() > 1e-5   # real forces, real stress


@pytest.mark.parametrize("system", ["crystal", "slab"])
@pytest.mark.parametrize("damping", ["bj", "zero"])
def test_two_body_matches_dftd3(system, damping):
    atoms = structure(system)
    got = ours(atoms, functional="pbe", damping=damping, **CUTOFFS)
    assert_matches(got, reference(atoms, damping), len(atoms))


@pytest.mark.parametrize("system,damping", [("crystal", "bj"), ("slab", "bj"), ("slab", "zero")])
def test_three_body_on_and_off_match_dftd3(system, damping):
    atoms = structure(system)
    on = ours(atoms, functional="pbe", damping=damping, three_body=True, **CUTOFFS)
    ref_on, ref_off = reference(atoms, damping, atm=True), reference(atoms, damping, atm=False)
    assert_matches(on, ref_on, len(atoms))
    # the term is there to see: ATM moves the energy by far more than the tolerance
    assert abs(ref_on["energy"] - ref_off["energy"]) / len(atoms) > 1e-5


def test_switched_two_body_cutoff_matches_dftd3_width2():
    """model.cutoff_width is s-dftd3's width2: the pair energy switched off over the last 3 Å."""
    atoms = structure("crystal")
    got = ours(atoms, functional="pbe", damping="bj", cutoff_width=3.0, **CUTOFFS)
    ref = reference(atoms, "bj", width2=3.0)
    assert_matches(got, ref, len(atoms))
    assert abs(ref["energy"] - reference(atoms, "bj")["energy"]) > 1e-3   # the switch changes the energy


def test_default_cutoffs_match_dftd3_defaults_without_the_engine():
    """The model's defaults are s-dftd3's (60, 40, 40 Bohr); D3Dispersion.calculate runs without
    the engine (its own list over the periodic images)."""
    from shardmd.models.d3 import D3Dispersion

    atoms = structure("slab")
    res = D3Dispersion().calculate(atoms.positions, atoms.cell[:], atoms.pbc, atoms.numbers)
    ref = reference(atoms, "bj", cutoffs=None)
    got = dict(res, stress=np.array([res["stress"][a, b] for a, b in VOIGT]))
    assert_matches(got, ref, len(atoms))


def test_other_functional_parameters_are_used():
    """b3lyp's D3(BJ) parameters, not pbe's: dftd3 with method=b3lyp."""
    atoms = structure("slab")
    got = ours(atoms, functional="b3lyp", damping="bj", **CUTOFFS)
    assert_matches(got, reference(atoms, "bj", functional="b3lyp"), len(atoms))
    assert abs(got["energy"] - reference(atoms, "bj")["energy"]) > 1e-3


# -- 4 domains --------------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("case", [*FAST_MPI, *(pytest.param(c, marks=pytest.mark.slow) for c in SLOW_MPI)])
def test_four_domains_equal_one_domain_and_dftd3(case, mpi_world):
    system, keys = MPI_CASES[case]
    d = dict(np.load(mpi_world(4, "d3_4" if case in FAST_MPI else "d3_4_slow") / f"d3_{case}.npz"))
    assert len(d["owned"]) == 4 and (d["owned"] > 0).all()        # really split over 4 ranks
    atoms = structure(system)
    one = ours(atoms, **keys)
    assert d["owned"].sum() == len(atoms)
    scale = np.abs(one["forces"]).max()
    assert abs(d["energy"] - one["energy"]) <= 1e-10 * abs(one["energy"])
    assert np.abs(d["forces"] - one["forces"]).max() <= 1e-10 * scale
    assert np.abs(d["energies"] - one["energies"]).max() <= 1e-10 * np.abs(one["energies"]).max()
    assert np.abs(d["stress"] - one["stress"]).max() <= 1e-10 * np.abs(one["stress"]).max()
    cut = {k: keys[k] for k in ("cutoff", "cn_cutoff", "three_body_cutoff")}
    ref = reference(atoms, keys["damping"], atm=keys.get("three_body", False), cutoffs=cut)
    assert_matches({k: d[k] for k in ("energy", "forces", "stress", "energies")}, ref, len(atoms))


def test_command_line_run_matches_dftd3(tmp_path, capfd, monkeypatch):
    """model=d3 on the command line (the entry point, the schema's keys): the trajectory's frames
    (108 fcc Cu atoms, at the start and after 2 steps at 600 K) against dftd3."""
    from shardmd.engine.io.h5md import read_frames

    keys = {"cutoff": 9.0, "cn_cutoff": 7.0, "three_body_cutoff": 5.0}
    code, lines = run_in_process(["run", "model=d3", "model.damping=zero", "model.three_body=true",
                                  *(f"model.{k}={v}" for k, v in keys.items()), "system.repeat=[3,3,3]",
                                  "temperature=600", "steps=2", "trajectory.every=2", "quiet=true"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    for frame in read_frames(tmp_path / "run.h5"):
        ref = reference(frame, "zero", atm=True, cutoffs=keys)
        assert abs(frame.get_potential_energy() - ref["energy"]) / len(frame) <= 1e-8
        assert np.abs(frame.get_forces() - ref["forces"]).max() <= 1e-8


# -- bad input ------------------------------------------------------------------------------------
def test_unknown_functional_is_one_line_naming_the_key_and_the_list(tmp_path, capfd, monkeypatch):
    code, lines = run_in_process(["run", "model=d3", "model.functional=pbx", "steps=1"], tmp_path, capfd,
                                 monkeypatch)
    line = one_line(lines, "model.functional='pbx'")
    assert code == 2 and "closest: pbe" in line and "functionals()" in line


def test_unknown_damping_is_one_line_naming_the_key(tmp_path, capfd, monkeypatch):
    code, lines = run_in_process(["run", "model=d3", "model.damping=bjm", "steps=1"], tmp_path, capfd, monkeypatch)
    line = one_line(lines, "model.damping")
    assert code == 2 and "bj" in line and "zero" in line


def test_bad_cutoff_and_unknown_element_are_one_line_errors():
    from shardmd.models.d3 import D3Dispersion

    with pytest.raises(ValueError, match=r"model\.cn_cutoff=-1\.0 is invalid"):
        D3Dispersion(cn_cutoff=-1.0)
    with pytest.raises(ValueError, match=r"model\.cutoff_width=13\.0 is invalid.*less than model\.cutoff=12"):
        D3Dispersion(cutoff=12.0, cutoff_width=13.0)
    with pytest.raises(ValueError, match="no D3 reference data for atomic numbers \\[110\\]"):
        D3Dispersion().check_species(np.array([29, 110]))


def test_functional_names_resolve_aliases():
    from shardmd.models.d3 import functional_parameters, functionals

    names = functionals()
    assert "pbe" in names and "b3lyp" in names and len(names) > 100
    assert functional_parameters("PBE", "bj") == functional_parameters("pbe", "bj")   # as s-dftd3 normalises
    with pytest.raises(ValueError, match="no D3 parameters for model.damping=zero; use model.damping=bj"):
        functional_parameters("b3lyp_631gd", "zero")   # a functional with BJ parameters only


def test_explicit_parameters_replace_the_functionals():
    """``D3Dispersion(params=...)`` (another code's D3, e.g. an AIMNet2 file's d3_params): b3lyp's
    own parameters given explicitly reproduce functional=b3lyp (against dftd3); missing ones are a
    one-line error."""
    from shardmd.models.d3 import D3Dispersion, functional_parameters

    atoms = structure("slab")
    p = functional_parameters("b3lyp", "bj")
    d3 = D3Dispersion(functional="mine", params={k: p[k] for k in ("s6", "s8", "a1", "a2")}, **CUTOFFS)
    res = d3.calculate(atoms.positions, atoms.cell[:], atoms.pbc, atoms.numbers)
    got = dict(res, stress=np.array([res["stress"][a, b] for a, b in VOIGT]))
    assert_matches(got, reference(atoms, "bj", functional="b3lyp"), len(atoms))
    with pytest.raises(ValueError, match="a1 is None, not a finite number .bj damping needs s6, s8, a1, a2"):
        D3Dispersion(params={"s6": 1.0, "s8": 0.4, "a2": 3.0})
