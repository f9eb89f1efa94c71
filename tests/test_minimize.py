"""FIRE minimisation (engine/relax/minimize.py) against ASE's own FIRE (ase.optimize.FIRE) driving the
engine's ASE calculator (engine/ase_calculator.py): the same forces, ASE's optimiser and its
FixAtoms handling as the independent reference.  Energies to <= 1e-6 eV."""
import h5py
import numpy as np
import pytest
from ase.build import bulk, fcc100, fcc111
from ase.calculators.lj import LennardJones
from ase.constraints import FixAtoms
from ase.filters import FrechetCellFilter
from ase.io import read, write
from ase.optimize import FIRE as AseFIRE
from conftest import WorldTask, run_engine, run_in_process

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.engine.config.compose import compose_config
from shardmd.engine.errors import UserError
from shardmd.engine.relax.minimize import FIRE
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State
from shardmd.integrators.units import EV_PER_A3_TO_BAR

_REFERENCES: dict = {}


def _ase_fire(atoms, model, fmax, steps=500):
    """_ase_fire_once, memoised on the exact input (the LJ case serves two tests)."""
    key = (model, fmax, steps, atoms.positions.tobytes(), atoms.cell.array.tobytes(), str(atoms.constraints))
    if key not in _REFERENCES:
        _REFERENCES[key] = _ase_fire_once(atoms, model, fmax, steps)
    e, n, ref = _REFERENCES[key]
    return e, n, ref.copy()


def _ase_fire_once(atoms, model, fmax, steps):
    """(energy eV, steps, relaxed atoms) of ASE's FIRE with the engine's calculator (one torch
    thread, as the engine runs here with threads=1: OpenMP workers only wait on a busy machine)."""
    import torch

    torch.set_num_threads(1)
    ref = atoms.copy()
    ref.calc = ShardMDCalculator(model=model)
    opt = AseFIRE(ref, logfile=None)
    opt.run(fmax=fmax, steps=steps)
    return ref.get_potential_energy(), opt.nsteps, ref


def _cfg(tmp_path, *extra):
    return compose_config(["quiet=true", "threads=1", f"output={tmp_path / 'm.h5'}", "overwrite=true",
                           "trajectory.every=10", *extra])


def _same_positions(a, b, tol):
    d = a.positions - b.positions
    frac = d @ np.linalg.inv(a.cell.array)
    frac[:, a.pbc] -= np.round(frac[:, a.pbc])
    return np.abs(frac @ a.cell.array).max() < tol


def _argon():
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    a.rattle(0.2, seed=1)
    a.set_constraint(FixAtoms(indices=range(10)))
    return a


def test_fire_equals_ase_fire_lj(tmp_path):
    """LJ argon, 10 atoms fixed: the same number of steps, energy and positions as ASE's FIRE."""
    a = _argon()
    e_ref, n_ref, ref = _ase_fire(a, "lj", 1e-3)
    sim = Simulation(_cfg(tmp_path, "model=lj"), state=State.from_atoms(a))
    x0 = sim.atoms().positions   # wrapped into the cell, as the run keeps them
    r = FIRE(sim).run(fmax=1e-3, steps=500)
    assert r["converged"] and r["steps"] == n_ref and r["fmax"] < 1e-3
    assert abs(r["energy"] - e_ref) <= 1e-6, (r["energy"], e_ref)
    got = sim.atoms()
    assert _same_positions(got, ref, 1e-8)
    assert np.abs(got.positions[:10] - x0[:10]).max() == 0.0   # fixed atoms exactly where they were


@pytest.mark.slow
def test_fire_mace_slab_one_domain_equals_ase(tmp_path):
    """The issue's acceptance on one domain: a rattled Cu(111) slab (27 atoms, bottom layer
    fixed) with the shipped MACE model relaxes to ASE's FIRE energy within 1e-6 eV."""
    a = fcc111("Cu", size=(3, 3, 3), vacuum=5.0, a=3.61)
    a.rattle(0.1, seed=3)
    a.set_constraint(FixAtoms(mask=a.get_tags() >= 3))
    e_ref, n_ref, ref = _ase_fire(a, "mace", 0.02)
    sim = Simulation(_cfg(tmp_path, "model=mace"), state=State.from_atoms(a))
    r = FIRE(sim).run(fmax=0.02, steps=300)
    print(f"\nMACE slab, 1 domain: ours {r['energy']:.12f} eV in {r['steps']} steps, ASE {e_ref:.12f} eV in {n_ref}")
    assert r["converged"] and r["steps"] == n_ref
    assert abs(r["energy"] - e_ref) <= 1e-6
    assert _same_positions(sim.atoms(), ref, 1e-6)


def test_minimize_cli_writes_structure_and_trajectory(tmp_path, capfd, monkeypatch):
    """`python -m engine minimize`: the relaxed structure (extxyz, energy and FixAtoms kept) and an
    H5MD trajectory with frames every trajectory.every steps and at the end; ASE's energy."""
    a = _argon()
    write(tmp_path / "in.extxyz", a)
    e_ref, n_ref, _ = _ase_fire(a, "lj", 1e-3)
    code, lines = run_in_process(["minimize", "model=lj", f"system.file={tmp_path / 'in.extxyz'}",
                                  "minimize.fmax=1e-3", "output=relax.h5", "trajectory.every=20", "quiet=true"],
                                 tmp_path, capfd, monkeypatch)
    assert code == 0 and not lines, lines
    out = read(tmp_path / "relax.extxyz")
    assert abs(out.get_potential_energy() - e_ref) <= 1e-6
    assert [type(c).__name__ for c in out.constraints] == ["FixAtoms"]
    assert list(out.constraints[0].get_indices()) == list(range(10))
    with h5py.File(tmp_path / "relax.h5") as f:
        steps = list(f["particles/all/position/step"][()])
        energy = f["observables/potential_energy/value"][()]
        assert "velocity" not in f["particles/all"]
    assert steps == [*range(0, n_ref, 20), n_ref] and abs(energy[-1] - e_ref) <= 1e-6
    assert f"FIRE converged: {n_ref} steps" in (tmp_path / "relax.log").read_text()


def _slab():
    """A rattled Cu(100) slab, 75 atoms, bottom layer fixed (a 2x2 grid on 4 domains)."""
    a = fcc100("Cu", size=(5, 5, 3), vacuum=4.0, a=3.61)
    a.rattle(0.1, seed=3)
    a.info.clear()
    a.set_constraint(FixAtoms(mask=a.get_tags() >= 3))
    return a


_FILES: dict = {}


def _file(name, make):
    """``system.file=`` of ``make()`` written once (for the shared worlds' tasks)."""
    def arg(factory) -> str:
        if name not in _FILES:
            _FILES[name] = factory.mktemp("minimize") / name
            write(_FILES[name], make())
        return f"system.file={_FILES[name]}"
    return arg


def world_tasks(item):
    """The relaxations on k domains join the shared k-rank worlds (tests/mpi/engine_runs.py:
    ``python -m engine minimize`` on the world's ranks; the 4-rank world has imported MACE)."""
    if item.originalname == "test_minimize_cli_four_domains_mace_equals_ase":
        return [WorldTask(4, "min_mace4", "engine_runs", [
            "minimize", "model=mace", _file("slab.extxyz", _slab), "minimize.fmax=0.01", "minimize.steps=300",
            "output={out}/relax.h5", "quiet=true"])]
    if item.originalname == "test_minimize_cli_cell_on_k_domains_equals_ase":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"min_cell{k}", "engine_runs", [
            "minimize", "model=lj", _file("ar.extxyz", lambda: _strained_argon(4)), "minimize.cell=true",
            "minimize.fmax=1e-4", "minimize.steps=1000", "output={out}/relax.h5", "quiet=true"])]
    return []


@pytest.mark.mpi
@pytest.mark.slow
def test_minimize_cli_four_domains_mace_equals_ase(mpi_world):
    """The issue's acceptance on 4 domains: a rattled Cu(100) slab (75 atoms, bottom layer fixed:
    a 2x2 grid) with the shipped MACE model, `minimize` on 4 real ranks, against ASE's FIRE on
    one process: energy within 1e-6 eV, the fixed atoms exactly in place."""
    a = _slab()
    e_ref, n_ref, ref = _ase_fire(a, "mace", 0.01)
    out_dir = mpi_world(4, "min_mace4")
    log = (out_dir / "relax.log").read_text()
    assert "domains 4" in log
    out = read(out_dir / "relax.extxyz")
    print(f"MACE slab, 4 domains: ours {out.get_potential_energy():.12f} eV, ASE {e_ref:.12f} eV in {n_ref} steps")
    assert abs(out.get_potential_energy() - e_ref) <= 1e-6
    assert f"FIRE converged: {n_ref} steps" in log
    fixed = a.get_tags() >= 3
    with h5py.File(out_dir / "relax.h5") as f:
        pos = f["particles/all/position/value"][()]
    assert np.abs(pos[-1][fixed] - pos[0][fixed]).max() == 0.0 and np.abs(pos[-1] - pos[0]).max() > 0.05
    assert _same_positions(out, ref, 1e-6)   # extxyz keeps 8 decimals


@pytest.mark.parametrize("extra,needle", [
    (["minimize.fmax=0"], "minimize.fmax=0.0 is invalid: give a force > 0 in eV/Å"),
    (["minimize.fmax=-1"], "minimize.fmax=-1.0 is invalid"),
    (["minimize.steps=-3"], "minimize.steps=-3 is invalid"),
    (["minimize.cell=true", "minimize.pressure=nan"], "minimize.pressure=nan is invalid: give a pressure in bar"),
    (["minimize.cell=true", "system.pbc=[true,true,false]"],
     "minimize.cell=true needs a cell periodic on all three axes; axis z is not"),
    (["minimize.method=newton"], "minimize.method='newton' is invalid: use fire, lbfgs or bfgs"),
    (["minimize.symmetry=true"], "minimize.symmetry=true keeps the space group through ASE's FixSymmetry, which "
                                 "acts on ASE's optimisers: use minimize.method=lbfgs or bfgs"),
])
def test_minimize_cli_hostile(extra, needle, tmp_path, capfd, monkeypatch):
    code, lines = run_in_process(["minimize", "model=lj", "system.repeat=[3,3,3]", *extra], tmp_path, capfd,
                                 monkeypatch)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "run.h5").exists()


def test_fire_api_hostile(tmp_path):
    def sim():
        return Simulation(_cfg(tmp_path, "model=lj", "trajectory.every=0"), state=State.from_atoms(_argon()))

    for kwargs, needle in [({"dt": -1.0}, "FIRE dt=-1.0: give a number > 0"),
                           ({"maxstep": 0}, "FIRE maxstep=0: give a number > 0"),
                           ({"fa": float("nan")}, "FIRE fa=nan"),
                           ({"Nmin": 5}, "FIRE has no parameter 'Nmin'")]:
        with pytest.raises(UserError, match=needle):
            FIRE(sim(), **kwargs)
    for kwargs, needle in [({"fmax": 0.0}, r"fmax=0.0: give a force > 0"),
                           ({"fmax": -0.1}, r"fmax=-0.1"), ({"steps": -1}, r"steps=-1")]:
        with pytest.raises(UserError, match=needle):
            FIRE(sim()).run(**kwargs)
    s = sim()
    s.run(1)
    with pytest.raises(UserError, match="FIRE needs a Simulation that has not run yet"):
        FIRE(s)


def test_fire_zero_steps_evaluates_only(tmp_path):
    s = Simulation(_cfg(tmp_path, "model=lj"), state=State.from_atoms(_argon()))
    x0 = s.atoms().positions
    r = FIRE(s).run(fmax=1e-3, steps=0, structure=str(tmp_path / "zero.extxyz"))
    assert r["steps"] == 0 and not r["converged"] and r["fmax"] > 1e-3
    assert np.abs(read(tmp_path / "zero.extxyz").positions - x0).max() < 1e-8   # extxyz keeps 8 decimals


# -- cell relaxation: ASE's FIRE on its FrechetCellFilter as the reference ---------------------------------
_STRAIN = np.array([[1.03, 0.01, 0.0], [0.0, 0.98, 0.02], [0.0, 0.0, 1.01]])   # 1-3 % and two shears


def _strained_argon(repeat: int, fixed: bool = False):
    a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((repeat,) * 3)
    a.rattle(0.05, seed=repeat)
    a.set_cell(a.cell.array @ _STRAIN, scale_atoms=True)
    a.info.clear()
    if fixed:
        a.set_constraint(FixAtoms(indices=range(10)))
    return a


def _ase_lj():
    """ASE's own Lennard-Jones with the engine's model=lj defaults (argon, cutoff 8.5 Å, shifted)."""
    return LennardJones(epsilon=0.0104, sigma=3.4, rc=8.5, smooth=False)


def _ase_cell_fire(atoms, calc, fmax, pressure_bar, steps=1000):
    """(energy eV, steps, relaxed atoms) of ASE's FIRE on FrechetCellFilter(scalar_pressure)."""
    import torch

    torch.set_num_threads(1)
    ref = atoms.copy()
    ref.calc = calc
    opt = AseFIRE(FrechetCellFilter(ref, scalar_pressure=pressure_bar / EV_PER_A3_TO_BAR), logfile=None)
    assert opt.run(fmax=fmax, steps=steps)
    return ref.get_potential_energy(), opt.nsteps, ref


@pytest.mark.parametrize("pressure,fixed,calc", [(0.0, False, "ase"), (5000.0, True, "ours"), (-2000.0, False, "ours")])
def test_fire_cell_equals_ase_frechet_filter(pressure, fixed, calc, tmp_path):
    """FIRE on the atoms and the cell (minimize.cell) against ASE's FIRE on FrechetCellFilter: LJ
    argon (108 atoms) strained by 1-3 % with shears, relaxed at 0 bar (ASE's own LJ calculator),
    5000 bar with 10 atoms fixed and -2000 bar (tension), with our calculator.  The same number of
    steps, energy <= 1e-6 eV, cell and positions <= 1e-4 Å; fixed atoms keep their fractional
    coordinates (ASE's FixAtoms under the filter moves them with the cell)."""
    a = _strained_argon(3, fixed)
    e_ref, n_ref, ref = _ase_cell_fire(a, _ase_lj() if calc == "ase" else ShardMDCalculator(model="lj"), 1e-4,
                                       pressure)
    sim = Simulation(_cfg(tmp_path, "model=lj"), state=State.from_atoms(a))
    f0 = sim.atoms().get_scaled_positions()
    r = FIRE(sim, cell=True, pressure=pressure).run(fmax=1e-4, steps=1000)
    got = sim.atoms()
    print(f"\ncell FIRE {pressure} bar: ours {r['energy']:.12f} eV in {r['steps']} steps, ASE {e_ref:.12f} eV in "
          f"{n_ref}; cell {np.abs(got.cell.array - ref.cell.array).max():.2e} Å")
    assert r["converged"] and r["steps"] == n_ref
    assert abs(r["energy"] - e_ref) <= 1e-6
    assert np.abs(got.cell.array - ref.cell.array).max() <= 1e-4
    assert np.abs(got.cell.array - a.cell.array).max() > 0.1   # the cell did relax
    assert _same_positions(got, ref, 1e-4)
    if fixed:
        assert np.abs(got.get_scaled_positions()[:10] - f0[:10]).max() < 1e-12


@pytest.mark.mpi
@pytest.mark.slow   # the full suite's (the fast tier keeps the 1-domain cases)
@pytest.mark.parametrize("k", [2, 4])
def test_minimize_cli_cell_on_k_domains_equals_ase(k, mpi_world):
    """`minimize minimize.cell=true` on k real ranks (256 argon atoms strained by 1-3 %): ASE's
    FIRE on FrechetCellFilter with ASE's LJ on one process as the reference, energy <= 1e-6 eV
    and cell <= 1e-4 Å (the H5MD's last frame)."""
    e_ref, n_ref, ref = _ase_cell_fire(_strained_argon(4), _ase_lj(), 1e-4, 0.0)
    out_dir = mpi_world(k, f"min_cell{k}")
    log = (out_dir / "relax.log").read_text()
    assert f"domains {k}" in log and f"FIRE converged: {n_ref} steps" in log
    out = read(out_dir / "relax.extxyz")
    with h5py.File(out_dir / "relax.h5") as f:
        cell = f["particles/all/box/edges/value"][-1]
    print(f"cell FIRE, {k} domains: ours {out.get_potential_energy():.12f} eV, ASE {e_ref:.12f} eV in {n_ref} steps; "
          f"cell {np.abs(cell - ref.cell.array).max():.2e} Å")
    assert abs(out.get_potential_energy() - e_ref) <= 1e-6
    assert np.abs(cell - ref.cell.array).max() <= 1e-4


@pytest.mark.mpi
@pytest.mark.slow   # 20 s: four ranks relaxing until the cell collapses
def test_minimize_cell_shrinking_below_the_grid_is_one_line(tmp_path):
    """A target pressure that squeezes the cell below what 2 domains allow (ghost width 10.4 Å:
    skin 1.9) ends the relaxation with one line (exit status 2), not a traceback or a hang."""
    write(tmp_path / "ar.extxyz", _strained_argon(4))
    r = run_engine(["minimize", "model=lj", "system.file=ar.extxyz", "domains=2", "minimize.cell=true",
                    "minimize.pressure=100000", "neighbor.skin=1.9", "minimize.steps=1000", "quiet=true"],
                   cwd=tmp_path, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "the cell shrank" in lines[0] and "the relaxed cell does not fit 2 domains: relax on fewer" in lines[0]


def test_fire_cell_api_hostile(tmp_path):
    def sim(atoms=None):
        return Simulation(_cfg(tmp_path, "model=lj", "trajectory.every=0"),
                          state=State.from_atoms(atoms if atoms is not None else _strained_argon(3)))

    for kwargs, needle in [({"cell": True, "pressure": float("nan")}, "minimize.pressure=nan: give a finite"),
                           ({"cell": True, "pressure": float("inf")}, "minimize.pressure=inf"),
                           ({"cell": "yes"}, "minimize.cell='yes': use true or false")]:
        with pytest.raises(UserError, match=needle):
            FIRE(sim(), **kwargs)
    slab = _strained_argon(3)
    slab.pbc = [True, False, True]
    with pytest.raises(UserError, match="axis y is not: make it periodic or drop minimize.cell"):
        FIRE(sim(slab), cell=True)



def test_minimize_cell_without_a_virial_is_one_line(tmp_path, capfd, monkeypatch):
    """docs/byo.md's tutorial model (energy and forces, no virial) cannot drive the cell."""
    from test_npt import _byo_model

    code, lines = run_in_process(["minimize", f"model=py:{_byo_model(tmp_path, monkeypatch)}:make",
                                  "system.repeat=[3,3,3]", "minimize.cell=true", "quiet=true"], tmp_path, capfd,
                                 monkeypatch)
    assert code == 2 and len(lines) == 1 and "minimize.cell=true needs the model's virial" in lines[0], lines
