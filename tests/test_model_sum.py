"""``model=sum``: a sum of models on one decomposition (domain/distributed_sum.py), each term with
its own keys, cutoff and spec. The independent reference is each term alone (the ASE calculator
on the same configuration); bad terms are one line through the CLI."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import WorldTask
from faultkit import cli, one_line

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.io.h5md import read_frames

D3 = {"name": "d3", "cutoff": 8.0, "cn_cutoff": 8.0}
TERMS = "model.terms=[{name: mace}, {name: d3, cutoff: 8.0, cn_cutoff: 8.0}]"
CU = ["system.element=Cu", "system.lattice=fcc", "system.a=3.59", "system.repeat=[3,3,3]", "temperature=300"]


@pytest.mark.slow
def test_mace_plus_d3_from_the_cli_is_mace_alone_plus_d3_alone_step_for_step(tmp_path, capsys, monkeypatch):
    """Every frame of a MACE + D3 run (energy, forces) against the shipped MACE model alone plus
    D3 alone on that frame's positions, to 1e-10 relative."""
    from ase.build import bulk
    from ase.io import write

    atoms = bulk("Cu", "fcc", a=3.59, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=11)   # off the lattice: forces far from zero from step 0
    write(tmp_path / "cu.extxyz", atoms)
    code, lines = cli(["run", "model=sum", TERMS, "system.file=cu.extxyz", "temperature=300", "steps=4",
                       "trajectory.every=1", "thermo.every=1", "quiet=true", "output=s.h5"], tmp_path, capsys,
                      monkeypatch)
    assert code == 0, lines
    frames = read_frames(tmp_path / "s.h5")
    assert [f.info["step"] for f in frames] == [0, 1, 2, 3, 4]
    mace, d3 = ShardMDCalculator(model="mace"), ShardMDCalculator(model="d3", cutoff=8.0, cn_cutoff=8.0)
    for f in frames:
        e, forces = 0.0, 0.0
        for calc in (mace, d3):
            a = f.copy()
            a.calc = calc
            e, forces = e + a.get_potential_energy(), forces + a.get_forces()
        assert abs(f.info["potential_energy"] - e) <= 1e-10 * abs(e), f.info["step"]
        assert np.abs(f.get_forces() - forces).max() <= 1e-10 * np.abs(forces).max(), f.info["step"]


def test_lj_plus_morse_through_the_ase_calculator_is_their_sum():
    """The Python route (ShardMDCalculator(model="sum", terms=...)): energy, forces and stress
    of LJ + Morse equal LJ's plus Morse's, each term keeping its own cutoff."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=3)
    lj = {"epsilon": {"Cu": 0.2}, "sigma": {"Cu": 2.3}, "cutoff": 5.0}
    total = {}
    for calc in (ShardMDCalculator(model="sum", terms=[{"name": "lj", **lj}, {"name": "morse", "cutoff": 7.0}]),
                 ShardMDCalculator(model="lj", **lj), ShardMDCalculator(model="morse", cutoff=7.0)):
        a = atoms.copy()
        a.calc = calc
        total[len(total)] = (a.get_potential_energy(), a.get_forces(), a.get_stress())
    (e, f, s), parts = total[0], [total[1], total[2]]
    assert abs(e - (parts[0][0] + parts[1][0])) <= 1e-10 * abs(e)
    assert np.abs(f - (parts[0][1] + parts[1][1])).max() <= 1e-10 * np.abs(f).max()
    assert np.abs(s - (parts[0][2] + parts[1][2])).max() <= 1e-10 * np.abs(s).max()
    assert abs(parts[0][0]) > 1e-3 and abs(parts[1][0]) > 1e-3   # both terms contribute


@pytest.mark.parametrize("terms, needle", [
    ("model.terms=[{name: lj, cutof: 5.0}]", "model.terms[0]: cutof is not a key of model=lj"),
    ("model.terms=[lj]", "model.terms[0] is not a model"),
    ("model.terms=[]", "model=sum needs model.terms"),
    ("model.terms=[{name: nosuchmodel}]", "model.terms[0] (nosuchmodel)"),
    ("model.terms=[{name: mace, dtype: float32}, {name: morse}]", "give every term the same precision"),
])
def test_bad_terms_are_one_line(tmp_path, capsys, monkeypatch, terms, needle):
    code, lines = cli(["run", "model=sum", terms, *CU, "steps=1", "quiet=true"], tmp_path, capsys, monkeypatch)
    assert code == 2, lines
    one_line(lines, needle)


# half charges and an LJ wall at the ion distance: a crystal that holds its volume under the barostat
NACL_TERMS = ("model.terms=[{name: lj, epsilon: {Na: 0.1, Cl: 0.1}, sigma: {Na: 2.7, Cl: 2.7}, cutoff: 6.0}, "
              "{name: coulomb, cutoff: 6.0, accuracy: 1e-5, charges: {Na: 0.5, Cl: -0.5}}]")


def _nacl_atoms():
    from ase.build import bulk

    atoms = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.02, seed=5)
    return atoms


def _nacl_file(factory) -> str:
    """``system.file=`` of the rattled NaCl crystal, written once for the world's tasks."""
    if "path" not in _NACL:
        _NACL["path"] = factory.mktemp("nacl") / "nacl.extxyz"
        _nacl_atoms().write(_NACL["path"])
    return f"system.file={_NACL['path']}"


_NACL: dict = {}
NPT_SUM = ["model=sum", NACL_TERMS, _nacl_file, "integrator=npt", "integrator.pressure=1.0", "integrator.pdamp=200",
           "temperature=300", "dt=2.0", "trajectory.every=10", "checkpoint.every=10", "thermo.every=0", "quiet=true"]


def world_tasks(item):
    """The NPT runs join the shared 4-rank world (tests/mpi/engine_runs.py: the CLI's run on the
    world's ranks, one launch for every 4-rank test)."""
    if item.originalname != "test_npt_of_lj_plus_coulomb_on_4_domains_restarts_bit_exact":
        return []
    return [WorldTask(4, "sum_npt_a", "engine_runs", [*NPT_SUM, "steps=20", "output={out}/a.h5"]),
            WorldTask(4, "sum_npt_b", "engine_runs", [*NPT_SUM, "steps=10", "output={out}/b.h5"]),
            WorldTask(4, "sum_npt_b20", "engine_runs", [*NPT_SUM, "steps=20", "restart=auto",
                                                         "output={out}/../sum_npt_b/b.h5"])]


@pytest.mark.mpi
@pytest.mark.slow
def test_npt_of_lj_plus_coulomb_on_4_domains_restarts_bit_exact(mpi_world):
    """NaCl under NPT with LJ + Ewald on 4 domains (real ranks): 20 steps straight, and 10 steps
    then a restart to 20, give the same bits (positions, velocities, cell) at step 20."""
    a_dir, b_dir = mpi_world(4, "sum_npt_a"), mpi_world(4, "sum_npt_b")
    mpi_world(4, "sum_npt_b20")
    a, b = read_frames(a_dir / "a.h5")[-1], read_frames(b_dir / "b.h5")[-1]
    assert a.info["step"] == b.info["step"] == 20
    assert np.array_equal(a.positions, b.positions) and np.array_equal(a.get_velocities(), b.get_velocities())
    assert np.array_equal(a.cell.array, b.cell.array)
    assert not np.allclose(a.cell.array, _nacl_atoms().cell.array, rtol=0, atol=1e-6)   # the barostat moved it


# a model stating its units (ModelConfig.units): Morse in kcal/mol, or in the engine's own units
UNITS_MODEL = '''
from shardmd.domain.api import ModelConfig, NeighborConfig
from shardmd.models.morse import Morse


def make(energy="kcal/mol", forces="kcal/mol/Å"):
    m = Morse(D=0.34, a=1.36, r0=2.6, cutoff=6.0)
    m.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                 neighbors=NeighborConfig(6.0), units={"energy": energy, "forces": forces})
    return m
'''


@pytest.mark.parametrize("terms, needle", [
    ("model.terms=[{name: morse}, {name: 'py:unitsmodel:make'}]", "gives energy in kcal/mol, the engine"),
    ("model.terms=[{name: 'py:unitsmodel:make', energy: eV, forces: eV/Angstrom}, {name: morse}]", None),
])
def test_a_term_in_other_units_is_one_line(tmp_path, capsys, monkeypatch, terms, needle):
    """kcal/mol beside eV is refused naming the term, the unit and the conversion; a term that
    states the engine's units (in another spelling) runs."""
    (tmp_path / "unitsmodel.py").write_text(UNITS_MODEL)
    code, lines = cli(["run", "model=sum", terms, *CU, "steps=1", "quiet=true", "output=u.h5"], tmp_path, capsys,
                      monkeypatch)
    if needle is None:
        assert code == 0, lines
        return
    assert code == 2, lines
    line = one_line(lines, needle)
    assert "model.terms[1]" in line and "convert energy to eV" in line, line


def test_a_single_model_in_other_units_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "unitsmodel.py").write_text(UNITS_MODEL)
    code, lines = cli(["run", "model=py:unitsmodel:make", *CU, "steps=1", "quiet=true"], tmp_path, capsys, monkeypatch)
    assert code == 2, lines
    one_line(lines, "gives energy in kcal/mol")


def test_terms_of_a_sum_in_different_units_are_refused_by_the_domain_api():
    """Without the engine (domain/distributed_sum.py): two terms naming different units for one
    output, and the caller's default for a term that names none."""
    from shardmd.domain.api import DistributedSum, ModelConfig, NeighborConfig
    from shardmd.models.morse import Morse

    def morse(units):
        m = Morse(D=0.34, a=1.36, r0=2.6, cutoff=6.0)
        m.model_config = ModelConfig(outputs=("energy", "forces"), neighbors=NeighborConfig(6.0), units=units)
        return m

    with pytest.raises(ValueError, match=r"term 2 of the sum \(Morse\) gives energy in kcal/mol, term 1 in eV"):
        DistributedSum([morse({"energy": "eV"}), morse({"energy": "kcal/mol"})])
    with pytest.raises(ValueError, match="term 2 of the sum"):
        DistributedSum([Morse(0.34, 1.36, 2.6, 6.0), morse({"energy": "Ha"})], units={"energy": "eV"})
    DistributedSum([Morse(0.34, 1.36, 2.6, 6.0), morse({"forces": "eV/Angstrom"})], units={"forces": "eV/Å"})
