"""The learned-charge example (examples/learned_charges.py: charges from a small network and
charge equilibration over the whole system, plus Ewald/PME) against an independent reference,
on 1, 2 and 4 domains, and through the engine (``model=py:learned_charges:make``).

The reference is written here from the example's equations: the charges and the local energy by
brute force (plain torch float64, every pair over explicit periodic images, no neighbour list,
no domain machinery), the Coulomb energy of those charges by the numpy Ewald sum of
tests/coulomb_systems.py (no code of models/coulomb.py); forces and the virial are central
finite differences of that reference energy.  Only the random weights and element tables are
read from the model."""
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WorldTask, run_engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "mpi"))
sys.path.insert(0, str(HERE.parent / "examples"))

import coulomb_systems as S  # noqa: E402
import learned_charge_cases as LC  # noqa: E402
import learned_charges as L  # noqa: E402

F64 = torch.float64
STEPS = 10
METHODS = ("ewald", "pme")
K_METHODS = {2: METHODS, 4: ("ewald",)}   # PME's mesh on 4 domains: tests/test_coulomb.py
PROBES = ((0, 0), (57, 1), (130, 2))    # (atom, axis) of the finite differences
FD_STEP, STRAIN_STEP = 1e-4, 1e-5     # Å, and strain (its third derivative is large: the repulsion is steep)
ENGINE_ARGS = ["model=py:learned_charges:make", f"model.cutoff={LC.CUTOFF}", "model.method=pme",
               f"system.charge={LC.TOTAL_CHARGE}", "integrator=npt", "integrator.pressure=1.0", "integrator.pdamp=100",
               "temperature=600", "dt=2.0", "steps=10", "trajectory.every=5", "checkpoint.every=0",
               "trajectory.fields=[position,velocity,force,energies]", "thermo.every=0", "quiet=true", "threads=1"]


def _structure(factory) -> Path:
    """The engine runs' input: the rattled, sheared NaCl as extxyz (written once per session)."""
    path = factory.getbasetemp() / "learned_charges_nacl.extxyz"
    if not path.exists():
        from ase.io import write

        write(path, S.rattled((3, 3, 3)))
    return path


def world_tasks(item):
    if item.originalname == "test_k_domains_equal_one_domain":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"learned_charges{k}", "learned_charge_cases", ["{out}", str(STEPS), *K_METHODS[k]])]
    if item.originalname.startswith("test_engine_route"):
        return [WorldTask(2, "learned_charges_engine2", "learned_charge_cases", [
            "engine", *ENGINE_ARGS, lambda f: f"system.file={_structure(f)}", "output={out}/run.h5"])]
    return []


# -- the reference ------------------------------------------------------------------------------------
def _pairs(pos, cell, rc):
    """(i, j, shift) of every ordered pair closer than rc, over all periodic images within reach."""
    widths = 1.0 / torch.linalg.norm(torch.linalg.inv(cell), dim=0)
    reach = [int(math.ceil(rc / float(w))) for w in widths]
    found = []
    with torch.no_grad():
        for n in torch.cartesian_prod(*[torch.arange(-m, m + 1) for m in reach]).to(F64):
            shift = n @ cell
            r = (pos[None, :, :] + shift - pos[:, None, :]).norm(dim=-1)
            if not n.any():
                r.fill_diagonal_(float("inf"))
            i, j = torch.nonzero(r < rc, as_tuple=True)
            found.append((i, j, shift.expand(len(i), 3)))
    return [torch.cat(x) for x in zip(*found)]


def reference_local(model, positions, cell, numbers, total):
    """(local energy eV, charges (n,) e) of the example's equations, by brute force (torch float64)."""
    pos, cell = torch.as_tensor(positions, dtype=F64), torch.as_tensor(cell, dtype=F64)
    z = torch.as_tensor(numbers).long()
    w, rl = model.weights, model.local_cutoff
    i, j, shift = _pairs(pos, cell, rl)
    r = (pos[j] + shift - pos[i]).norm(dim=1)
    fc = (1 - (r / rl) ** 2) ** 2
    g = torch.zeros(len(pos), L.N_BASIS, L.N_EMBED, dtype=F64)
    for k in range(L.N_BASIS):
        basis = fc * torch.exp(-((r - w["mu"][k]) / (rl / L.N_BASIS)) ** 2)
        g[:, k, :].index_add_(0, i, basis[:, None] * w["embed"][z[j]])
    h = torch.tanh(g.reshape(len(pos), -1) @ w["w1"] + w["b1"])
    chi = model.chi0[z] + h @ w["w_chi"]
    hard = model.j0[z] * torch.exp(h @ w["w_j"])
    lam = (total + (chi / hard).sum()) / (1 / hard).sum()
    q = (lam - chi) / hard
    a, rho = L.REPULSION
    energy = (chi * q + hard * q * q / 2).sum() + 0.5 * (a * fc * torch.exp(-r / rho)).sum()
    return float(energy), q.numpy()


def reference_energy(model, positions, cell, numbers, total):
    """(energy eV, charges e): the local part by brute force plus the numpy Ewald sum of its charges."""
    local, q = reference_local(model, positions, cell, numbers, total)
    return local + S.reference_ewald(positions, cell, q, alpha=0.4)[0], q


def finite_differences(model, atoms, total):
    """Central differences of the reference energy: forces at PROBES (eV/Å), virial xx and xy (eV)."""
    x, cell = atoms.positions, atoms.cell.array
    forces, virial = [], []
    for atom, axis in PROBES:
        e = []
        for s in (FD_STEP, -FD_STEP):
            p = x.copy()
            p[atom, axis] += s
            e.append(reference_energy(model, p, cell, atoms.numbers, total)[0])
        forces.append(-(e[0] - e[1]) / (2 * FD_STEP))
    for a, b in ((0, 0), (0, 1)):   # W_ab = -dE/d(eps_ab), x -> x F, cell -> cell F, F = 1 + (eps + eps^T)/2
        e = []
        for s in (STRAIN_STEP, -STRAIN_STEP):
            eps = np.zeros((3, 3))
            eps[a, b] = s
            f = np.eye(3) + (eps + eps.T) / 2
            e.append(reference_energy(model, x @ f, cell @ f, atoms.numbers, total)[0])
        virial.append(-(e[0] - e[1]) / (2 * STRAIN_STEP))
    return np.array(forces), np.array(virial)


@pytest.fixture(scope="module")
def reference():
    atoms = LC.initial_atoms()
    model = LC.model()
    energy, q = reference_energy(model, atoms.positions, atoms.cell.array, atoms.numbers, LC.TOTAL_CHARGE)
    forces, virial = finite_differences(model, atoms, LC.TOTAL_CHARGE)
    return {"energy": energy, "charges": q, "forces": forces, "virial": virial}


@pytest.fixture(scope="module")
def one_domain():
    from shardmd.domain.comm import Comm

    return {m: LC.run_md(Comm(), m, STEPS) for m in METHODS}


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _at_probes(forces):
    return np.array([forces[atom, axis] for atom, axis in PROBES])


# -- one domain against the reference -----------------------------------------------------------------
def test_the_reference_charges_depend_on_every_atom_and_the_total():
    """The reference is not trivial: a charge moves when a far atom moves (the global sums), the
    constraint holds, and Q shifts every charge."""
    atoms = LC.initial_atoms()
    model = LC.model()
    args = (atoms.cell.array, atoms.numbers)
    _, q = reference_local(model, atoms.positions, *args, LC.TOTAL_CHARGE)
    far = atoms.positions.copy()
    far[200] += 0.05                              # atom 200 is > 6 Å from atom 0
    assert atoms.get_distance(0, 200, mic=True) > 6.0
    _, q_far = reference_local(model, far, *args, LC.TOTAL_CHARGE)
    _, q0 = reference_local(model, atoms.positions, *args, 0.0)
    assert abs(q.sum() - LC.TOTAL_CHARGE) < 1e-12 and abs(q0.sum()) < 1e-12
    assert 1e-9 < abs(q_far[0] - q[0]) and np.abs(q - q0).min() > 1e-4
    assert 0.5 < np.abs(q).mean() < 1.2            # ionic charges


def test_an_element_without_parameters_is_named():
    with pytest.raises(ValueError, match="no electronegativity or hardness for K; give model.electronegativity.K"):
        L.make().check_species([11, 17, 19])
    L.make().check_species([11, 17])


def test_one_domain_equals_the_reference_at_high_accuracy(reference):
    """Ewald at accuracy 1e-10 through DistributedModel on one domain: energy, charges, forces and
    the virial against the reference and its finite differences."""
    from shardmd.domain.comm import Comm

    d = LC.run_md(Comm(), "ewald", 0, accuracy=1e-10)
    e_err = abs(d["energy"][0] - reference["energy"]) / abs(reference["energy"])
    q_err = np.abs(d["charges"][0] - reference["charges"]).max()
    f_err = np.abs(_at_probes(d["forces"][0]) - reference["forces"]).max()
    v = d["virial"][0]
    w_err = np.abs(np.array([v[0, 0], (v[0, 1] + v[1, 0]) / 2]) - reference["virial"]).max()
    print(f"vs reference: energy {e_err:.1e} relative, charges {q_err:.1e} e, forces {f_err:.1e} eV/Å, "
          f"virial {w_err:.1e} eV (|F| max {np.abs(d['forces'][0]).max():.2f}, |W| {np.abs(v).max():.2f})")
    assert e_err <= 1e-10 and q_err <= 1e-10 and f_err <= 1e-6 and w_err <= 1e-6
    assert np.abs(reference["forces"]).min() > 1e-2 and np.abs(reference["virial"]).min() > 1e-1
    assert abs(d["energies"][0].sum() - d["energy"][0]) <= 1e-10 * abs(d["energy"][0])


@pytest.mark.parametrize("method", METHODS)
def test_one_domain_default_accuracy_equals_the_reference(method, one_domain, reference):
    """Ewald and PME at the default accuracy (1e-6), the first step of the MD runs."""
    d = one_domain[method]
    e_err = abs(d["energy"][0] - reference["energy"]) / abs(reference["energy"])
    f_err = np.abs(_at_probes(d["forces"][0]) - reference["forces"]).max()
    print(f"{method} at 1e-6 vs reference: energy {e_err:.1e} relative, forces {f_err:.1e} eV/Å")
    assert e_err <= {"ewald": 1e-7, "pme": 5e-7}[method] and f_err <= 1e-5
    assert np.abs(d["charges"][0] - reference["charges"]).max() <= 1e-10
    assert np.abs(d["charges"].sum(1) - LC.TOTAL_CHARGE).max() <= 1e-12     # every step


# -- 2 and 4 domains against one ----------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 4])
def test_k_domains_equal_one_domain(k, mpi_world, one_domain):
    out = mpi_world(k, f"learned_charges{k}")
    for method in K_METHODS[k]:
        d, ref = dict(np.load(out / f"{method}.npz")), one_domain[method]
        assert np.prod(d["grid"]) == k and len(d["energy"]) == STEPS + 1 and int(d["migrated"]) > 0, method
        errs = {key: _rel(d[key], ref[key]) for key in ("energy", "forces", "charges", "energies", "virial")}
        errs["positions"] = float(np.abs(d["positions"] - ref["positions"]).max())
        print(f"{k} domains, {method}, {STEPS} steps, {int(d['migrated'])} migrations: largest relative "
              "difference from one domain " + ", ".join(f"{key} {v:.1e}" for key, v in errs.items()))
        assert max(errs.values()) <= 1e-10, (method, errs)
        assert np.abs(d["positions"][-1] - d["positions"][0]).max() > 0.05, method   # the atoms moved


# -- the engine: model=py:learned_charges:make ----------------------------------------------------------
@pytest.fixture(scope="module")
def engine_one_domain(tmp_path_factory):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.io.h5md import read_frames
    from shardmd.engine.run.simulation import Simulation

    out = tmp_path_factory.mktemp("learned_engine1") / "run.h5"
    sim = Simulation(compose_config([*ENGINE_ARGS, f"system.file={_structure(tmp_path_factory)}", f"output={out}"]))
    sim.run()
    assert sim.exit_code == 0
    return read_frames(str(out))


def _frames_equal(frames, ref) -> float:
    assert [f.info["step"] for f in frames] == [f.info["step"] for f in ref] == [0, 5, 10]
    worst = 0.0
    for a, b in zip(frames, ref):
        worst = max(worst, np.abs(a.positions - b.positions).max(), np.abs(a.cell.array - b.cell.array).max(),
                    _rel(a.get_forces(), b.get_forces()), _rel(a.get_potential_energies(), b.get_potential_energies()))
    return worst


@pytest.mark.mpi
def test_engine_route_on_two_domains_equals_one_domain_and_the_reference(mpi_world, engine_one_domain):
    """model.cutoff, model.method and system.charge reach the model; NPT moves the cell; 2 domains
    (the engine on the world's ranks) equal one."""
    from shardmd.engine.io.h5md import read_frames

    two = read_frames(str(mpi_world(2, "learned_charges_engine2") / "run.h5"))
    worst = _frames_equal(two, engine_one_domain)
    first, last = engine_one_domain[0], engine_one_domain[-1]
    model = L.make(cutoff=LC.CUTOFF)
    ref, _ = reference_energy(model, first.positions, first.cell.array, first.numbers, LC.TOTAL_CHARGE)
    e_err = abs(first.get_potential_energy() - ref) / abs(ref)
    cell_moved = np.abs(last.cell.array - first.cell.array).max()
    print(f"engine, PME, NPT: 2 domains vs 1 {worst:.1e}; step 0 energy vs reference {e_err:.1e} relative; "
          f"the cell moved {cell_moved:.1e} Å")
    assert worst <= 1e-10 and e_err <= 5e-7 and cell_moved > 1e-4


@pytest.mark.slow
@pytest.mark.mpi
def test_engine_route_self_launched_from_the_cli(tmp_path, mpi_world, tmp_path_factory):
    """python -m engine run model=py:learned_charges:make ... domains=2, from a folder holding the
    example: the same trajectory as the engine on the world's two ranks."""
    from shardmd.engine.io.h5md import read_frames

    shutil.copy(HERE.parent / "examples" / "learned_charges.py", tmp_path / "learned_charges.py")
    r = run_engine(["run", *ENGINE_ARGS, f"system.file={_structure(tmp_path_factory)}", "domains=2",
                    "output=cli.h5"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    worst = _frames_equal(read_frames(str(tmp_path / "cli.h5")),
                          read_frames(str(mpi_world(2, "learned_charges_engine2") / "run.h5")))
    assert worst <= 1e-10, worst
