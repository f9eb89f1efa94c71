"""L-BFGS and BFGS (engine/relax/quasi_newton.py) against ASE's own LBFGS and BFGS driving the
engine's ASE calculator (engine/ase_calculator.py) on one process: the same forces, ASE's
optimisers, constraints (FixAtoms, FixSymmetry) and FrechetCellFilter as the independent
reference.  Energies to <= 1e-6 eV; the space group by spglib; the refusals in one line."""
import numpy as np
import pytest
import spglib
from ase.build import bulk, fcc100, fcc111
from ase.constraints import FixAtoms, FixSymmetry
from ase.filters import FrechetCellFilter
from ase.io import read, write
from ase.optimize import BFGS as AseBFGS
from ase.optimize import FIRE as AseFIRE
from ase.optimize import LBFGS as AseLBFGS
from ase.utils import atoms_to_spglib_cell
from conftest import WorldTask, run_in_process

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.relax.minimize import FIRE
from shardmd.engine.relax.quasi_newton import BFGS, LBFGS
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State
from shardmd.integrators.units import EV_PER_A3_TO_BAR

OURS = {"lbfgs": LBFGS, "bfgs": BFGS, "fire": FIRE}
ASE = {"lbfgs": AseLBFGS, "bfgs": AseBFGS, "fire": AseFIRE}
_STRAIN = np.array([[1.03, 0.01, 0.0], [0.0, 0.98, 0.02], [0.0, 0.0, 1.01]])   # 1-3 % and two shears


def _ase(method, atoms, model, fmax, cell=False, pressure=0.0, symmetry=False, steps=1000):
    """(energy eV, steps, relaxed atoms) of ASE's optimiser with the engine's calculator (one
    torch thread, as the engine runs here with threads=1)."""
    import torch

    torch.set_num_threads(1)
    ref = atoms.copy()
    ref.calc = ShardMDCalculator(model=model)
    if symmetry:
        ref.set_constraint(FixSymmetry(ref, symprec=0.01))
    target = FrechetCellFilter(ref, scalar_pressure=pressure / EV_PER_A3_TO_BAR) if cell else ref
    opt = ASE[method](target, logfile=None)
    opt.run(fmax=fmax, steps=steps)
    return ref.get_potential_energy(), opt.nsteps, ref


def _sim(tmp_path, atoms, *extra):
    cfg = compose_config(["quiet=true", "threads=1", f"output={tmp_path / 'm.h5'}", "overwrite=true",
                          "trajectory.every=10", "model=lj", *extra])
    return Simulation(cfg, state=State.from_atoms(atoms))


def _same_positions(a, b, tol):
    d = a.positions - b.positions
    frac = d @ np.linalg.inv(a.cell.array)
    frac[:, a.pbc] -= np.round(frac[:, a.pbc])
    return np.abs(frac @ a.cell.array).max() < tol


def _argon(fixed=True, strained=False, repeat=3, rattle=0.2):
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((repeat,) * 3)
    a.rattle(rattle, seed=1)
    if strained:
        a.set_cell(a.cell.array @ _STRAIN, scale_atoms=True)
    a.info.clear()
    if fixed:
        a.set_constraint(FixAtoms(indices=range(10)))
    return a


def _group(atoms, symprec):
    return spglib.get_symmetry_dataset(atoms_to_spglib_cell(atoms), symprec=symprec)


@pytest.mark.parametrize("method,cell,fixed,pressure", [
    ("lbfgs", False, True, 0.0), ("bfgs", False, True, 0.0), ("lbfgs", True, False, 5000.0), ("bfgs", True, True, 0.0)])
def test_equals_ase_lj(method, cell, fixed, pressure, tmp_path):
    """LJ argon (108 atoms, rattled; 10 fixed where asked; strained by 1-3 % with shears when the
    cell relaxes): the same number of steps, energy (<= 1e-6 eV), positions and cell as ASE's
    optimiser; fixed atoms exactly in place (or, with the cell, at their fractional coordinates)."""
    a = _argon(fixed=fixed, strained=cell)
    e_ref, n_ref, ref = _ase(method, a, "lj", 1e-3, cell=cell, pressure=pressure)
    sim = _sim(tmp_path, a)
    x0, f0 = sim.atoms().positions, sim.atoms().get_scaled_positions()
    r = OURS[method](sim, cell=cell, pressure=pressure).run(fmax=1e-3, steps=1000)
    got = sim.atoms()
    print(f"\n{method} cell={cell}: ours {r['energy']:.12f} eV in {r['steps']} steps, ASE {e_ref:.12f} eV in {n_ref}")
    assert r["converged"] and r["steps"] == n_ref and r["fmax"] < 1e-3
    assert abs(r["energy"] - e_ref) <= 1e-6
    assert _same_positions(got, ref, 1e-6) and np.abs(got.cell.array - ref.cell.array).max() <= 1e-6
    if fixed and not cell:
        assert np.abs(got.positions[:10] - x0[:10]).max() == 0.0
    if fixed and cell:
        assert np.abs(got.get_scaled_positions()[:10] - f0[:10]).max() < 1e-12
    if cell:
        assert np.abs(got.cell.array - a.cell.array).max() > 0.1   # the cell did relax


def _cu_slab():
    a = fcc111("Cu", size=(3, 3, 3), vacuum=5.0, a=3.61)
    a.rattle(0.1, seed=3)
    a.set_constraint(FixAtoms(mask=a.get_tags() >= 3))
    return a


def test_lbfgs_mace_slab_equals_ase_in_fewer_force_calls_than_fire(tmp_path):
    """The issue's acceptance: a rattled Cu(111) slab (27 atoms, bottom layer fixed) with the
    shipped MACE model relaxes by L-BFGS to ASE's own L-BFGS result with our ASE calculator
    (<= 1e-6 eV, the same steps) in fewer force calls than FIRE takes to the same fmax."""
    a = _cu_slab()
    e_ref, n_ref, ref = _ase("lbfgs", a, "mace", 0.01)
    r = LBFGS(_sim(tmp_path, a, "model=mace")).run(fmax=0.01, steps=500)
    fire = FIRE(_sim(tmp_path, a, "model=mace")).run(fmax=0.01, steps=500)
    print(f"\nMACE slab: L-BFGS {r['energy']:.12f} eV in {r['steps'] + 1} force calls (ASE's {e_ref:.12f} eV in "
          f"{n_ref + 1}), FIRE {fire['energy']:.12f} eV in {fire['steps'] + 1}")
    assert r["converged"] and fire["converged"] and r["steps"] == n_ref
    assert abs(r["energy"] - e_ref) <= 1e-6
    assert r["steps"] + 1 < fire["steps"] + 1   # force calls: one per step and the first


def _distorted_cu():
    """fcc Cu (8 atoms) in a monoclinic cell (strain with a shear) with a 1e-3 Å rattle: C2/m
    at spglib's 0.01 Å, P1 at 1e-5 Å."""
    a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    a.set_cell(a.cell.array @ np.array([[1.04, 0.02, 0.0], [0.02, 0.99, 0.0], [0.0, 0.0, 0.97]]), scale_atoms=True)
    a.positions += np.random.default_rng(0).normal(0.0, 1e-3, a.positions.shape)
    return a


def test_symmetry_cell_relaxation_keeps_space_group_mace(tmp_path):
    """The issue's acceptance: L-BFGS with the cell and fixed symmetry on a distorted fcc cell
    (the shipped MACE model) keeps its space group (C2/m at 0.01 Å: the relaxed structure is
    C2/m at spglib's 1e-5 Å) and equals ASE's LBFGS on FrechetCellFilter with FixSymmetry;
    without FixSymmetry ASE's relaxation leaves the group (as a check that the case tests it)."""
    a = _distorted_cu()
    start = _group(a, 0.01)
    assert (start.number, _group(a, 1e-5).number) == (12, 1)
    e_ref, n_ref, ref = _ase("lbfgs", a, "mace", 1e-3, cell=True, symmetry=True)
    sim = _sim(tmp_path, a, "model=mace")
    r = LBFGS(sim, cell=True, symmetry=True).run(fmax=1e-3, steps=500)
    got = sim.atoms()
    print(f"\nsymmetry: ours {r['energy']:.12f} eV in {r['steps']} steps, ASE {e_ref:.12f} eV in {n_ref}; "
          f"{_group(got, 1e-5).international}")
    assert r["converged"] and r["steps"] == n_ref and abs(r["energy"] - e_ref) <= 1e-6
    assert np.abs(got.cell.array - ref.cell.array).max() <= 1e-6
    assert _group(got, 1e-5).number == start.number
    assert np.abs(got.cell.array - a.cell.array).max() > 0.05   # the cell did relax
    _, _, free = _ase("lbfgs", a, "mace", 1e-3, cell=True)
    assert _group(free, 1e-5).number != start.number


def test_symmetry_argon_bfgs_in_log(tmp_path):
    """BFGS with FixSymmetry (positions only) on LJ argon: ASE's result, and the log names the
    group, the refinement and the method."""
    a = _argon(fixed=False, strained=True, repeat=2, rattle=0.0)
    a.positions[0] += [0.1, 0.0, 0.0]   # a symmetric-breaking shift spglib sees (lower group kept)
    e_ref, n_ref, _ = _ase("bfgs", a, "lj", 1e-4, symmetry=True)
    sim = _sim(tmp_path, a)
    r = BFGS(sim, symmetry=True).run(fmax=1e-4, steps=500)
    assert r["steps"] == n_ref and abs(r["energy"] - e_ref) <= 1e-6
    log = (tmp_path / "m.log").read_text()
    assert "BFGS minimisation (ASE's BFGS on rank 0, FixSymmetry)" in log
    assert f"Symmetry: space group {_group(a, 0.01).international}" in log and "refined to it" in log


# -- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    (["minimize.method=lbfgs", "minimize.symmetry=true", "system.pbc=[true,true,false]"],
     "minimize.symmetry=true needs a cell periodic on all three axes (a space group); axis z is not"),
    (["minimize.method=lbfgs", "minimize.symmetry=true", "fix.ids=[0,1]"],
     "minimize.symmetry=true cannot hold atoms fixed"),
    (["minimize.method=bfgs", "system.repeat=[8,8,8]"],
     "minimize.method=bfgs keeps a (3N)^2 Hessian on rank 0: 2048 atoms need 0.3 GiB and its eigendecomposition "
     "every step; use minimize.method=lbfgs (bfgs takes at most 2000 atoms)"),
    (["minimize.method=lbfgs", "minimize.symmetry=true", "system.repeat=[10,10,10]"],
     "minimize.symmetry=true: space group Fm-3m has 192000 operations in this cell"),
    (["minimize.method=lbfgs", "minimize.maxstep=1.5"], "minimize.maxstep=1.5: L-BFGS takes a step of 0 < maxstep"),
    (["minimize.method=lbfgs", "minimize.memory=0"], "minimize.memory=0 is invalid: give a whole number >= 1"),
    (["minimize.method=bfgs", "minimize.symprec=0"], "minimize.symprec=0.0 is invalid: give a tolerance > 0 in Å"),
])
def test_hostile_is_one_line(extra, needle, tmp_path, capfd, monkeypatch):
    code, lines = run_in_process(["minimize", "model=lj", "system.repeat=[3,3,3]", "quiet=true", *extra], tmp_path,
                                 capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "run.h5").exists() and not (tmp_path / "run.extxyz").exists()


def test_api_hostile(tmp_path):
    def sim(atoms=None):
        return _sim(tmp_path, atoms if atoms is not None else _argon(fixed=False), "trajectory.every=0")

    for cls, kwargs, needle in [(LBFGS, {"memory": 2.5}, "minimize.memory=2.5: give a whole number >= 1"),
                                (LBFGS, {"alpha": -1.0}, "minimize.alpha=-1.0: give a curvature > 0"),
                                (BFGS, {"maxstep": 0.0}, "minimize.maxstep=0.0: BFGS takes a step of 0 < maxstep"),
                                (BFGS, {"symmetry": "yes"}, "minimize.symmetry='yes': use true or false"),
                                (LBFGS, {"cell": True, "pressure": float("nan")}, "minimize.pressure=nan")]:
        with pytest.raises(UserError, match=needle):
            cls(sim(), **kwargs)
    s = sim()
    s.run(1)
    with pytest.raises(UserError, match="L-BFGS needs a Simulation that has not run yet"):
        LBFGS(s)


def test_cli_lbfgs_structure_and_zero_steps(tmp_path, capfd, monkeypatch):
    """`minimize minimize.method=lbfgs`: the relaxed structure at ASE's energy with its FixAtoms;
    steps=0 evaluates only."""
    a = _argon()
    write(tmp_path / "in.extxyz", a)
    e_ref, n_ref, _ = _ase("lbfgs", a, "lj", 1e-3)
    code, lines = run_in_process(["minimize", "model=lj", "system.file=in.extxyz", "minimize.method=lbfgs",
                                  "minimize.fmax=1e-3", "quiet=true"], tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    out = read(tmp_path / "run.extxyz")
    assert abs(out.get_potential_energy() - e_ref) <= 1e-6
    assert list(out.constraints[0].get_indices()) == list(range(10))
    assert f"L-BFGS converged: {n_ref} steps" in (tmp_path / "run.log").read_text()
    r = LBFGS(_sim(tmp_path, a)).run(fmax=1e-3, steps=0)
    assert r["steps"] == 0 and not r["converged"]


# -- several domains: rank 0's optimiser, the same result -------------------------------------------
def _slab100():
    a = fcc100("Cu", size=(5, 5, 3), vacuum=4.0, a=3.61)
    a.rattle(0.1, seed=3)
    a.info.clear()
    a.set_constraint(FixAtoms(mask=a.get_tags() >= 3))
    return a


def _file(name, make):
    def arg(factory) -> str:
        path = factory.getbasetemp() / f"qn-{name}"
        if not path.exists():
            write(path, make())
        return f"system.file={path}"
    return arg


def world_tasks(item):
    if item.originalname == "test_lbfgs_on_four_domains_equals_one":
        return [WorldTask(4, "qn_mace4", "engine_runs", [
            "minimize", "model=mace", _file("slab100.extxyz", _slab100), "minimize.method=lbfgs",
            "minimize.fmax=0.01", "output={out}/relax.h5", "quiet=true"])]
    return []


@pytest.mark.mpi
@pytest.mark.slow
def test_lbfgs_on_four_domains_equals_one(mpi_world, tmp_path):
    """L-BFGS on 4 real ranks (a rattled Cu(100) slab, 75 atoms, bottom layer fixed, the shipped
    MACE model; a 2x2 grid) against the same relaxation on one domain and ASE's own L-BFGS:
    the same steps, energy <= 1e-6 eV, positions <= 1e-6 Å, fixed atoms exactly in place."""
    a = _slab100()
    e_ref, n_ref, ref = _ase("lbfgs", a, "mace", 0.01)
    one = _sim(tmp_path, a, "model=mace")
    r1 = LBFGS(one).run(fmax=0.01, steps=1000)
    out_dir = mpi_world(4, "qn_mace4")
    log = (out_dir / "relax.log").read_text()
    out = read(out_dir / "relax.extxyz")
    print(f"\nL-BFGS MACE slab, 4 domains: {out.get_potential_energy():.12f} eV, 1 domain {r1['energy']:.12f} eV in "
          f"{r1['steps']}, ASE {e_ref:.12f} eV in {n_ref}")
    assert "domains 4" in log and f"L-BFGS converged: {n_ref} steps" in log and r1["steps"] == n_ref
    assert abs(out.get_potential_energy() - r1["energy"]) <= 1e-6 and abs(r1["energy"] - e_ref) <= 1e-6
    assert _same_positions(out, ref, 1e-6)   # extxyz keeps 8 decimals
    fixed = a.get_tags() >= 3
    assert _same_positions(out[fixed], a[fixed], 1e-8)   # fixed atoms where they were (to extxyz's 8 decimals)
