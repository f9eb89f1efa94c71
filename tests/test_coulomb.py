"""model=coulomb (models/coulomb.py, Ewald and PME) against independent references: the NaCl
Madelung constant, a numpy float64 Ewald sum with its own splitting and analytic forces
(tests/coulomb_systems.py), finite differences of that sum under strain, the neutralising
background of a charged cell; on one domain and on four real MPI ranks; bad input through the CLI."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WorldTask, run_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))

import coulomb_systems as S

from shardmd.engine.ase_calculator import ShardMDCalculator

CHARGES = {"Na": 1.0, "Cl": -1.0}
METHODS = ("ewald", "pme")
SMALL = (3, 3, 3)   # 216 ions, 16.9 Å: one domain


def world_tasks(item):
    if item.originalname.startswith("test_four_domains"):
        return [WorldTask(4, "coulomb4", "coulomb_cases", ["{out}"])]
    return []


def _calc(method, **kw):
    return ShardMDCalculator(model="coulomb", charges=CHARGES, cutoff=S.CUTOFF, method=method, **kw)


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def references():
    """The numpy Ewald sum's (energy, forces) of the small rattled and charged crystals."""
    out = {}
    for make in (S.rattled, S.charged):
        atoms = make(SMALL)
        out[make.__name__] = (atoms, *S.reference_ewald(atoms.positions, atoms.cell[:], S.charges_of(atoms)))
    return out


# -- one domain ---------------------------------------------------------------------------------
def test_charges_of_the_structure_replace_the_element_table(references):
    """An ``initial_charges`` array (the structure file's, here the Atoms object's) is the model's
    per-atom input and wins over ``model.charges``: a rattled crystal with charges of its own
    (per atom, not per element) against the numpy Ewald sum of those charges."""
    atoms = S.rattled(SMALL)
    q = S.charges_of(atoms) * (1.0 + 0.25 * np.cos(np.arange(len(atoms))))
    q -= q.mean()                                     # neutral: no background term in the reference
    atoms.set_initial_charges(q)
    e_ref, f_ref = S.reference_ewald(atoms.positions, atoms.cell[:], q)
    atoms.calc = _calc("ewald")
    assert abs(atoms.get_potential_energy() - e_ref) <= 1e-6 * abs(e_ref)
    assert _rel(atoms.get_forces(), f_ref) <= 1e-5
    e_table = references["rattled"][1]
    assert abs(e_ref - e_table) > 1e-2 * abs(e_table)   # the two charge sets differ in the energy


@pytest.mark.parametrize("method", METHODS)
def test_madelung_energy_of_rock_salt(method):
    atoms = S.nacl(SMALL)
    atoms.calc = _calc(method)
    want = S.madelung_energy(len(atoms))
    assert abs(atoms.get_potential_energy() - want) <= 1e-6 * abs(want)
    per_ion = atoms.get_potential_energies()
    assert np.abs(per_ion - want / len(atoms)).max() <= 1e-6 * abs(want / len(atoms))   # every ion alike
    assert np.abs(atoms.get_forces()).max() <= 1e-4    # a perfect crystal: no force (PME's mesh: ~2e-5)


@pytest.mark.parametrize("method", METHODS)
def test_rattled_crystal_against_an_independent_ewald_sum(method, references):
    atoms, e_ref, f_ref = references["rattled"]
    atoms = atoms.copy()
    atoms.calc = _calc(method)
    assert abs(atoms.get_potential_energy() - e_ref) <= 1e-6 * abs(e_ref)
    assert _rel(atoms.get_forces(), f_ref) <= 1e-5
    assert abs(atoms.get_potential_energies().sum() - e_ref) <= 1e-6 * abs(e_ref)


@pytest.mark.parametrize("method", METHODS)
def test_stress_is_the_strain_derivative_of_the_energy(method, references):
    """Central differences of the reference energy under strain: stress = (1/V) dE/d(eps)."""
    atoms, _, _ = references["rattled"]
    atoms = atoms.copy()
    atoms.calc = _calc(method)
    stress = atoms.get_stress(voigt=False)
    pos, cell, q, h = atoms.positions, atoms.cell[:], S.charges_of(atoms), 1e-5
    for a, b in ((0, 0), (1, 2), (2, 1)):
        e = []
        for sign in (1, -1):
            eps = np.eye(3)
            eps[a, b] += sign * h
            e.append(S.reference_ewald(pos @ eps, cell @ eps, q)[0])
        fd = (e[0] - e[1]) / (2 * h) / atoms.get_volume()
        assert abs(fd - 0.5 * (stress[a, b] + stress[b, a])) <= 1e-5 * np.abs(stress).max(), (a, b)


@pytest.mark.parametrize("method", METHODS)
def test_net_charged_cell_includes_the_neutralising_background(method, references):
    atoms, e_ref, f_ref = references["charged"]
    atoms = atoms.copy()
    atoms.calc = _calc(method)
    q = S.charges_of(atoms)
    assert q.sum() == pytest.approx(1.0)
    # the reference is the same with another splitting only because the background is in it
    alpha = S.reference_ewald.__defaults__[0]
    e_other = S.reference_ewald(atoms.positions, atoms.cell[:], q, alpha=0.45)[0]
    assert abs(e_other - e_ref) <= 1e-10 * abs(e_ref)
    background = -S.K * math.pi / (2 * atoms.get_volume()) * (1 / alpha ** 2 - 1 / 0.45 ** 2)
    assert abs(background) > 10 * 1e-6 * abs(e_ref)   # without it the two splittings would differ by this much
    assert abs(atoms.get_potential_energy() - e_ref) <= 1e-6 * abs(e_ref)
    assert _rel(atoms.get_forces(), f_ref) <= 1e-5


def test_net_charge_is_said_once_in_the_log(tmp_path):
    from ase.io import write

    write(tmp_path / "charged.extxyz", S.charged(SMALL))
    r = run_engine(["run", "model=coulomb", "model.cutoff=8", "system.file=charged.extxyz", "steps=2",
                    "thermo.every=1", "trajectory.every=0", "checkpoint.every=0", "threads=1", "quiet=true"],
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in (tmp_path / "run.log").read_text().splitlines() if "neutralising background" in x]
    assert len(lines) == 1 and "net charge of +1 e" in lines[0], lines
    # the value in the line: -pi Q^2 / (2 V alpha^2) with alpha = sqrt(-ln 1e-6) / 8 Å
    alpha = math.sqrt(-math.log(1e-6)) / 8.0
    want = -S.K * math.pi / (2 * S.charged(SMALL).get_volume() * alpha ** 2)
    assert float(lines[0].rsplit("=", 1)[1].split()[0]) == pytest.approx(want, rel=1e-5)


def test_neutral_cell_has_no_background_line(tmp_path):
    from ase.io import write

    write(tmp_path / "nacl.extxyz", S.nacl(SMALL))
    r = run_engine(["run", "model=coulomb", "model.cutoff=8", "system.file=nacl.extxyz", "steps=0",
                    "trajectory.every=0", "checkpoint.every=0", "threads=1", "quiet=true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "neutralising background" not in (tmp_path / "run.log").read_text()


def test_plain_single_process_use_and_per_atom_charges():
    """The model without the engine: a neighbour list of one's own, forces by autograd; a
    per-atom ``charges`` tensor replaces the element table (doubled charges: 4x the energy)."""
    from shardmd.models.coulomb import Coulomb

    atoms = S.rattled((2, 2, 2))
    model = Coulomb(CHARGES, cutoff=5.0, method="ewald")
    x = torch.tensor(atoms.positions, requires_grad=True)
    cell = torch.tensor(atoms.cell[:])
    nl = _AllPairs(atoms.positions, atoms.cell[:], model.cutoff)
    numbers = torch.tensor(atoms.numbers)
    out = model.compute(x, cell, torch.tensor([True] * 3), numbers, nl)
    (g,) = torch.autograd.grad(out["energy"], x)
    e_ref, f_ref = S.reference_ewald(atoms.positions, atoms.cell[:], S.charges_of(atoms))
    assert abs(float(out["energy"].detach()) - e_ref) <= 1e-6 * abs(e_ref)
    assert _rel(-g.numpy(), f_ref) <= 1e-5
    doubled = model.compute(x, cell, torch.tensor([True] * 3), numbers, nl, charges=2 * model.charges_of(numbers))
    assert float(doubled["energy"].detach()) == pytest.approx(4 * float(out["energy"].detach()), rel=1e-12)


class _AllPairs:
    """Every ordered pair (i, j, image) closer than ``rc``, found by brute force (numpy)."""

    def __init__(self, positions, cell, rc):
        ii, jj, ss = [], [], []
        for a in range(-2, 3):
            for b in range(-2, 3):
                for c in range(-2, 3):
                    s = np.array([a, b, c], dtype=np.float64)
                    r = np.linalg.norm(positions[None] + s @ cell - positions[:, None], axis=2)
                    i, j = np.nonzero((r < rc) & (r > 1e-9))
                    ii.append(i), jj.append(j), ss.append(np.tile(s, (len(i), 1)))
        self.i, self.j = torch.tensor(np.concatenate(ii)), torch.tensor(np.concatenate(jj))
        self.s = torch.tensor(np.concatenate(ss))

    def edge_index(self):
        return self.i, self.j

    def shift_vectors(self, cell):
        return self.s @ cell


# -- bad input: one line through the CLI --------------------------------------------------------
@pytest.mark.parametrize("override, words", [
    ("~model.charges.Cl", ("model.charges has no charge for Cl", "model.charges.Cl=")),
    ("model.charges.Na=nan", ("model.charges.Na is not a finite number", "give a charge in e")),
    ("model.cutoff=12", ("model.cutoff", "domains would be", "ghost width")),
])
def test_bad_input_is_one_line_naming_the_key(tmp_path, override, words):
    from ase.io import write

    write(tmp_path / "nacl.extxyz", S.nacl((4, 4, 4)))
    args = ["run", "model=coulomb", "system.file=nacl.extxyz", override, "steps=0", "quiet=true"]
    if override.startswith("model.cutoff"):
        args.append("domains=4")
    r = run_engine(args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_parameters_of_the_factory():
    from shardmd.models.coulomb import Coulomb

    with pytest.raises(ValueError, match=r"model\.method='p3m' is not a method"):
        Coulomb(CHARGES, method="p3m")
    with pytest.raises(ValueError, match=r"model\.accuracy=2\.0 is invalid"):
        Coulomb(CHARGES, accuracy=2.0)
    with pytest.raises(ValueError, match=r"model\.charges\.Xx: 'Xx' is not an element"):
        Coulomb({"Xx": 1.0})
    with pytest.raises(ValueError, match=r"model=coulomb needs a cell periodic"):
        Coulomb(CHARGES).compute(torch.zeros(2, 3, dtype=torch.float64), torch.eye(3, dtype=torch.float64) * 10,
                                 torch.tensor([True, True, False]), torch.tensor([11, 17]), None)


# -- four domains (real MPI ranks) --------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("method", METHODS)
def test_four_domains_madelung_energy(method, mpi_world):
    d = dict(np.load(mpi_world(4, "coulomb4") / f"nacl_{method}.npz"))
    assert int(np.prod(d["grid"])) == 4 and int(np.max(d["grid"])) >= 2
    want = S.madelung_energy(len(d["numbers"]))
    assert abs(float(d["energy"]) - want) <= 1e-6 * abs(want)
    assert abs(d["energies"].sum() - want) <= 1e-6 * abs(want)


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["rattled", "charged"])
@pytest.mark.parametrize("method", METHODS)
def test_four_domains_against_an_independent_ewald_sum(method, case, mpi_world):
    d = dict(np.load(mpi_world(4, "coulomb4") / f"{case}_{method}.npz"))
    q = np.where(d["numbers"] == 11, 1.0, -1.0)
    e_ref, f_ref = S.reference_ewald(d["positions"], d["cell"], q)
    assert abs(float(d["energy"]) - e_ref) <= 1e-6 * abs(e_ref)
    assert _rel(d["forces"], f_ref) <= 1e-5
    assert abs(d["energies"].sum() - e_ref) <= 1e-6 * abs(e_ref)
    # the virial on four domains equals one domain's (the strain derivative, checked above)
    atoms = getattr(S, case)()
    atoms.calc = _calc(method)
    stress = atoms.get_stress(voigt=False)
    assert np.abs(-d["virial"] / atoms.get_volume() - stress).max() <= 1e-9 * np.abs(stress).max()
