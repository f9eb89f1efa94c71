"""NPT (integrators/npt.py): state for state against LAMMPS's fix npt (iso, aniso, tri), against
an independent NumPy transcription of fix_nh, the same trajectory on 1, 2, 4 and 8 domains,
bit-exact restarts mid-NPT, and the one-line refusals.

The LAMMPS states come from scripts/lammps_reference_npt.py (tests/data/lammps_npt_lj4000.npz:
in.lj argon, 4000 atoms, 100 steps of ``fix npt temp 1.44 1.44 0.1 <couple> 1.0 1.0 0.5`` in
reduced units)."""
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import WorldTask

from shardmd.engine.config.compose import compose_config
from shardmd.engine.io.h5md import read_frames
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State
from shardmd.integrators.units import KB

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "lammps_npt_lj4000.npz"
sys.path.insert(0, str(HERE.parent / "scripts"))


def _lammps_overrides(ref, couple):
    from bench_lj import units
    from lammps_reference_nvt import start_config

    u = units()
    base = [o for o in start_config(u) if not o.startswith("integrator")]
    return [*base, "integrator=npt", f"integrator.couple={couple}",
            f"integrator.pressure={float(ref['pressure_bar'])!r}",
            f"integrator.pdamp={float(ref['pdamp_tau']) * u['tau_fs']!r}",
            f"integrator.tdamp={float(ref['tdamp_tau']) * u['tau_fs']!r}", "integrator.chain=3",
            "integrator.pchain=3", "threads=1"]


def _run_from(x0, v0, box, overrides, tmp_path, steps):
    from ase import Atoms

    cfg = compose_config([*overrides, f"steps={steps}", f"output={tmp_path / 'npt.h5'}"])
    atoms = Atoms("Ar" * len(x0), positions=x0, cell=[box] * 3, pbc=True)
    sim = Simulation(cfg, state=State.from_atoms(atoms))
    s = sim.state
    s.velocities = torch.as_tensor(v0, dtype=torch.float64)[s.ids].clone()  # exact Å/fs
    sim.run()
    order = torch.argsort(s.ids)
    return sim, s.unwrapped_positions()[order].numpy(), s.velocities[order].numpy(), s.cell.numpy()


# ~15 s each on the shared machine; aniso (a subset of tri's code path) in the full suite only
@pytest.mark.parametrize("couple", ["iso", pytest.param("aniso", marks=pytest.mark.slow), "tri"])
def test_npt_matches_lammps_fix_npt(couple, tmp_path):
    """100 steps of fix npt from one state: positions and cell to <= 1e-6 Å, velocities and the
    fix's energy f_1 to round-off growth."""
    ref = np.load(DATA)
    box = float(ref["box"])
    sim, x, v, cell = _run_from(ref["x0"], ref["v0"], box, _lammps_overrides(ref, couple), tmp_path,
                                int(ref["steps"]))
    dx = np.abs(x - ref[f"{couple}_x"]).max()
    dcell = np.abs(cell - ref[f"{couple}_cell"]).max()
    dv = np.abs(v - ref[f"{couple}_v"]).max() / np.abs(ref[f"{couple}_v"]).max()
    # LAMMPS's compute_scalar counts the barostat chain's first link as 3 kT etap[0] for iso, its
    # dynamics kT (integrators/npt.py, conserved_energy): ours is LAMMPS's less 2 kT etap[0]
    ig = sim.integrator
    iso_term = 2 * KB * ig.temperature * ig.etap[0] if couple == "iso" else 0.0
    de = abs(ig.conserved_energy() + iso_term - float(ref[f"{couple}_fix_energy"]))
    print(f"{couple}: max |dx| = {dx:.3e} Å, max |dcell| = {dcell:.3e} Å, max |dv|/max|v| = {dv:.3e}, "
          f"|d f_1| = {de:.3e} eV, cell change {np.abs(ref[f'{couple}_cell'] - box * np.eye(3)).max():.3f} Å")
    assert dx <= 1e-6 and dcell <= 1e-6, (dx, dcell)
    assert dv <= 1e-6, dv
    assert de <= 1e-6 * max(1.0, abs(float(ref[f"{couple}_fix_energy"]))), de
    # the barostat did act: the box changed by far more than the tolerance
    assert np.abs(ref[f"{couple}_cell"] - box * np.eye(3)).max() > 0.3


# ---------------------------------------------------------------- decomposition and restarts

# a 500-atom argon box under 1000 bar, triclinic coupling (tilts grow from zero: the cell changes
# shape as well as size), fast barostat; 2 x 2 x 2 domains fit it (13 Å > cutoff + skin)
ARGS = ["model=lj", "system.repeat=[5,5,5]", "dt=2.0", "temperature=100", "integrator=npt",
        "integrator.couple=tri", "integrator.pressure=1000", "integrator.pdamp=200", "integrator.tdamp=100",
        "trajectory.every=50", "thermo.every=0", "quiet=true", "checkpoint.every=0", "threads=1"]
# the fast tier runs 4 domains (2 x 2 x 1); 2 and 8 (2 x 2 x 2) in the full suite (~70 s of wall each
# on the shared 2-core machine)
DOMAINS = [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)]


def world_tasks(item):
    """The k-domain runs (and the 2-domain split run and its restart) join the shared k-rank
    worlds (conftest.MPIWorlds)."""
    if item.originalname == "test_npt_same_trajectory_on_k_domains":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"npt_run{k}", "engine_runs", [*ARGS, "steps=500", "output={out}/run.h5"])]
    if item.originalname == "test_restart_mid_npt_on_two_domains_and_onto_one":
        return [WorldTask(2, "npt_run2", "engine_runs", [*ARGS, "steps=500", "output={out}/run.h5"]),
                WorldTask(2, "npt_split2", "engine_runs", [*ARGS, "steps=250", "output={out}/split.h5"]),
                WorldTask(2, "npt_restart2", "engine_runs", [*ARGS, "steps=500", "restart=auto",
                                                             "output={out}/../npt_split2/split.h5"])]
    return []


def _frames(path):
    return {f.info["step"]: f for f in read_frames(path)}


def _unwrapped(f):
    return f.positions + f.arrays["image"] @ f.cell.array


def _run_here(args, tmp_path, name):
    sim = Simulation(compose_config([*args, f"output={tmp_path / name}"]))
    sim.run()
    return sim


@pytest.fixture(scope="module")
def one_domain(tmp_path_factory):
    """The 1-domain reference: 500 steps straight, and 250 + a restart to 500, in this process."""
    d = tmp_path_factory.mktemp("npt1")
    _run_here([*ARGS, "steps=500"], d, "run.h5")
    _run_here([*ARGS, "steps=250"], d, "split.h5")
    _run_here([*ARGS, "steps=500", "restart=auto"], d, "split.h5")
    return d


@pytest.mark.mpi
@pytest.mark.parametrize("k", DOMAINS)
def test_npt_same_trajectory_on_k_domains(k, mpi_world, one_domain):
    """k domains give the 1-domain NPT trajectory (positions and cell) to <= 1e-10 Å over 500
    steps, while the cell changes size and shape (the domains are fractional slabs of it)."""
    a = _frames(one_domain / "run.h5")
    b = _frames(mpi_world(k, f"npt_run{k}") / "run.h5")
    assert sorted(a) == sorted(b) == list(range(0, 501, 50))
    dx = max(np.abs(_unwrapped(a[s]) - _unwrapped(b[s])).max() for s in a)
    dc = max(np.abs(a[s].cell.array - b[s].cell.array).max() for s in a)
    change = np.abs(a[500].cell.array - a[0].cell.array).max()
    tilt = np.abs(np.tril(a[500].cell.array, -1)).max()
    print(f"{k} domains vs 1: max |dx| {dx:.2e} Å, max |dcell| {dc:.2e} Å over 500 steps "
          f"(cell changed by {change:.2f} Å, tilts up to {tilt:.2f} Å)")
    assert dx <= 1e-10 and dc <= 1e-10, (dx, dc)
    assert change > 0.5 and tilt > 0.05


def test_restart_mid_npt_is_bit_exact_on_one_domain(one_domain):
    """500 steps straight == 250 + restart + 250 (barostat, chains, cell and the list's build cell
    come back from the checkpoint), bit for bit."""
    a, b = _frames(one_domain / "run.h5"), _frames(one_domain / "split.h5")
    assert sorted(a) == sorted(b) == list(range(0, 501, 50))
    for s in sorted(a):
        assert np.array_equal(a[s].positions, b[s].positions), s
        assert np.array_equal(a[s].get_velocities(), b[s].get_velocities()), s
        assert np.array_equal(a[s].cell.array, b[s].cell.array), s


@pytest.mark.mpi
@pytest.mark.slow   # ~60 s of CPU: two more 2-rank runs and a 1-domain continuation
def test_restart_mid_npt_on_two_domains_and_onto_one(mpi_world, one_domain, tmp_path):
    """On 2 domains: 250 + restart + 250 == 500 straight, bit for bit.  The 2-domain checkpoint
    restarted on 1 domain: the barostat's state comes back to the bit and the run continues the
    2-domain trajectory to <= 1e-10 Å (the decomposition changes the summation order only)."""
    straight = _frames(mpi_world(2, "npt_run2") / "run.h5")
    split_dir = mpi_world(2, "npt_split2")
    mpi_world(2, "npt_restart2")
    split = _frames(split_dir / "split.h5")
    assert sorted(split) == sorted(straight) == list(range(0, 501, 50))
    for s in sorted(straight):
        assert np.array_equal(straight[s].positions, split[s].positions), s
        assert np.array_equal(straight[s].get_velocities(), split[s].get_velocities()), s
        assert np.array_equal(straight[s].cell.array, split[s].cell.array), s
    # the step-250 checkpoint onto one domain
    ck = sorted((split_dir / "split.ckpt").glob("step-*250.h5"))[0]
    sim = Simulation(compose_config([*ARGS, "steps=500", f"restart={ck}", f"output={tmp_path / 'b1.h5'}"]))
    with h5py.File(ck) as f:
        stored = json.loads(f.attrs["integrator"])
    stored.pop("reference_cell"), stored.pop("grid")
    assert sim.integrator.state_dict() == stored
    sim.run()
    got = _frames(tmp_path / "b1.h5")
    dx = np.abs(_unwrapped(got[500]) - _unwrapped(straight[500])).max()
    dc = np.abs(got[500].cell.array - straight[500].cell.array).max()
    print(f"2-domain checkpoint at 250 continued on 1 domain: max |dx| {dx:.2e} Å, |dcell| {dc:.2e} Å at 500")
    assert dx <= 1e-10 and dc <= 1e-10, (dx, dc)


# ---------------------------------------------------------------- pieces and refusals


def _built_domain(x0, cell, cutoff, skin):
    """One domain (engine/run/rank_domain.py) with the box check, its list built on ``x0`` in ``cell``
    (memory order = id order: no sort)."""
    from shardmd.domain.comm import Comm
    from shardmd.engine.run.rank_domain import RankDomain

    n = len(x0)
    z = torch.zeros(n, 3, dtype=torch.float64)
    s = State(positions=torch.tensor(x0), velocities=z.clone(), forces=z.clone(),
              masses=torch.ones(n, dtype=torch.float64), numbers=torch.full((n,), 18), ids=torch.arange(n),
              images=torch.zeros(n, 3, dtype=torch.int32), cell=torch.tensor(cell), pbc=torch.ones(3, dtype=torch.bool))
    d = RankDomain(Comm(), cutoff=cutoff, skin=skin, sort="none", box_check=True)
    s = d.distribute(s)
    d.rebuild(s)
    return d, s


def _edges(nl):
    return {(int(i), int(j), tuple(int(a) for a in sh)) for i, j, sh in
            zip(nl.centers().tolist(), nl.neighbors.tolist(), nl.shifts.tolist())}


def _outside(x, cell, pbc, radius, edges):
    """(distance, i, j, S) of the pairs closer than ``radius`` that are not in ``edges`` (found with
    the engine's list builder: they only choose the test's displacements; brute force judges)."""
    from shardmd.domain.neighbors import build_neighbor_list

    nl = build_neighbor_list(torch.tensor(x), torch.tensor(cell), torch.tensor(pbc), radius)
    found = _edges(nl) - edges
    return [(float(np.linalg.norm(x[j] + np.array(sh) @ cell - x[i])), i, j, sh) for i, j, sh in found]


# cells: tilted (LAMMPS's form, tilts up to 0.3); sheared (tilts up to 1, i.e. 45 degrees, and rigidly
# rotated: a general matrix); small (edges 6-7 Å with a 4.5 Å list radius: images beyond the first,
# which LAMMPS's corner rule could not follow); strains: random (shear and rotation included), or a
# shrinking cell (iso, or along one axis)
# (~3-5 s each on the quiet machine; the fast tier runs one of each cell)
BOX_CASES = [("tilted", 0, "random"), pytest.param("tilted", 1, "random", marks=pytest.mark.slow),
             pytest.param("tilted", 2, "shrink", marks=pytest.mark.slow),
             pytest.param("sheared", 3, "random", marks=pytest.mark.slow), ("sheared", 4, "shrink"),
             ("small", 5, "random"), pytest.param("small", 6, "shrink", marks=pytest.mark.slow)]


@pytest.mark.parametrize("shape,seed,strain", BOX_CASES)
def test_box_check_keeps_the_list_complete(shape, seed, strain):
    """The box check of a changing cell (engine/run/rank_domain.py ``displacement``): after a strain of
    the cell (atoms remapped with it, x0 h0^-1 h) and displacements of the atoms' own up to the
    trigger (skin - ||T - I|| (cutoff + skin)) / 2, every pair within the cutoff (brute force) is
    still an edge of the list built before; past the trigger, a rebuild is asked for."""
    from reference import brute_force_pairs, random_cell, random_positions

    rng = np.random.default_rng(seed)
    lengths, tilt = {"tilted": ((12.0, 15.0), 0.3), "sheared": ((14.0, 17.0), 1.0), "small": ((6.0, 7.0), 0.2)}[shape]
    cell = random_cell(rng, lengths=lengths, max_tilt=tilt, rotate=shape == "sheared")
    pbc = np.array([True, True, True])
    cutoff, skin = 3.5, 1.0
    d, s = _built_domain(random_positions(rng, 250 if shape != "small" else 60, cell, pbc), cell, cutoff, skin)
    x0 = s.positions.numpy().copy()          # wrapped by the rebuild
    edges = _edges(d.nl.current)
    for trial in range(5):
        if strain == "random":
            new = cell @ (np.eye(3) + rng.normal(scale=0.004, size=(3, 3)))
        else:   # shrinking: all axes, or one (a lattice vector; for the rotated cell a Cartesian axis)
            f = np.ones(3) * (1 - 0.002 * (trial + 1)) if trial % 2 == 0 else 1 - 0.01 * np.eye(3)[trial % 3]
            new = cell @ np.diag(f) if shape == "sheared" else cell * f[:, None]
        x = x0 @ np.linalg.inv(cell) @ new   # the remap: fractions kept
        s.positions, s.cell = torch.tensor(x), torch.tensor(new)
        affine_left, trig = d.displacement(s)
        assert float(affine_left) < 1e-12 and 0 < trig < 0.5 * skin, (float(affine_left), trig)
        # the atoms' own displacements, up to 0.999 trigger: the pairs outside the list that the strain
        # brought closest (a greedy matching) move straight towards each other, the rest at random
        u = rng.normal(size=x.shape)
        u *= (rng.uniform(0.5, 0.999, size=len(x)) * trig / np.linalg.norm(u, axis=1))[:, None]
        used = set()
        for r, i, j, sh in sorted(_outside(x, new, pbc, cutoff + skin + 2 * trig, edges)):
            if i != j and i not in used and j not in used:
                used |= {i, j}
                step = (x[j] + np.array(sh) @ new - x[i]) * (0.999 * trig / r)
                u[i], u[j] = step, -step
        s.positions = torch.tensor(x + u)
        assert float(d.displacement(s)[0]) <= trig
        assert not d.needs_rebuild(s)
        missing = brute_force_pairs(x + u, new, pbc, cutoff) - edges
        assert not missing, (trial, sorted(missing)[:5])
        s.positions = torch.tensor(x + u * (1.01 * trig / np.linalg.norm(u, axis=1).max()))
        assert d.needs_rebuild(s)
    s.positions, s.cell = torch.tensor(x0 * 1.3), torch.tensor(cell * 1.3)   # 0.3 R > skin
    assert d.displacement(s)[1] < 0 and d.needs_rebuild(s)   # a large change: rebuild whatever the atoms did


@pytest.mark.parametrize("axis", [0, 2])
def test_box_check_is_tight_for_a_shrinking_cell(axis):
    """Two atoms just beyond the list radius R at the build, the cell shrinking along their axis by
    a fraction e and each atom moving towards the other by A: their distance is (R + δ)(1 - e) - 2A.
    At A = 0.999 trigger it stays above the cutoff (no rebuild asked, none needed); at
    A = trigger + δ it is below the cutoff and the pair is not in the list: the check asks for the
    rebuild.  So the trigger (skin - e R) / 2 is the exact limit for this motion."""
    cutoff, skin, delta, e = 3.5, 1.0, 1e-6, 0.004
    big = 30.0
    cell = np.eye(3) * big
    x0 = np.full((2, 3), 5.0)
    x0[1, axis] += cutoff + skin + delta
    d, s = _built_domain(x0, cell, cutoff, skin)
    assert not _edges(d.nl.current)
    f = np.ones(3)
    f[axis] = 1 - e
    new = cell * f[:, None]
    x = x0 * f
    s.cell = torch.tensor(new)
    s.positions = torch.tensor(x)
    trig = d.displacement(s)[1]
    assert trig == pytest.approx(0.5 * (skin - e * (cutoff + skin)), rel=1e-12)
    toward = np.zeros((2, 3))
    toward[0, axis], toward[1, axis] = 1.0, -1.0
    for a, rebuild in ((0.999 * trig, False), (trig + delta, True)):
        s.positions = torch.tensor(x + a * toward)
        r = np.linalg.norm(s.positions[1].numpy() - s.positions[0].numpy())
        assert bool(r < cutoff) is rebuild, (a, r)
        assert d.needs_rebuild(s) is rebuild


def _byo_model(tmp_path, monkeypatch):
    """The tutorial's model file (docs/byo.md: energy and forces, no virial) as a module here."""
    import re

    text = (HERE.parent / "docs" / "byo.md").read_text()
    src = next(b for lang, b in re.findall(r"```(\w+)\n(.*?)\n```", text, re.S)
               if lang == "python" and b.startswith("# mymodel.py"))
    name = f"npt_novirial_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_npt_refusals_are_one_line(tmp_path, capfd, monkeypatch):
    from ase.build import bulk
    from ase.io import write
    from conftest import run_in_process

    small = ["run", "system.repeat=[3,3,3]", "steps=2", "quiet=true", "threads=1", "integrator=npt"]
    cases = [
        (["model=lj", "neighbor.deferred=true"], "neighbor.deferred=false"),
        (["model=lj", "fix.ids=[0,1]"], "cannot hold atoms fixed"),
        (["model=lj", "integrator.couple=xyz"], "integrator.couple"),
        (["model=lj", "integrator.pdamp=0"], "pdamp"),
        ([f"model=py:{_byo_model(tmp_path, monkeypatch)}:make"], "needs the model's virial"),
    ]
    # aniso / tri need LAMMPS's cell form: the fcc primitive cell is not in it
    write(tmp_path / "prim.extxyz", bulk("Ar", "fcc", a=5.26).repeat((4, 4, 4)))
    cases.append((["model=lj", "system.file=prim.extxyz", "integrator.couple=tri"], "LAMMPS's form"))
    for extra, needle in cases:
        code, lines = run_in_process([*small, *extra, f"output={tmp_path / 'r.h5'}", "overwrite=true"],
                                     tmp_path, capfd, monkeypatch)
        assert code == 2 and len(lines) == 1 and needle in lines[0], (extra, code, lines)


def test_a_cell_shrunk_below_the_grid_is_refused_in_one_line():
    """At a rebuild after the cell changed, every split domain must still be at least the ghost
    width thick (engine/run/rank_domain.py): a 2 x 1 x 1 grid on a cell shrunk to 2 x 9 Å slabs with a
    9.5 Å ghost width is refused with one line naming the fix."""
    from shardmd.domain.comm import Comm
    from shardmd.domain.decomposition import DomainGrid
    from shardmd.engine.errors import CollectiveError
    from shardmd.engine.run.rank_domain import RankDomain

    d = RankDomain(Comm(), cutoff=8.5, skin=1.0, box_check=True)
    d.grid = DomainGrid((2, 1, 1))
    d._check_grid(torch.diag(torch.tensor([19.5, 30.0, 30.0], dtype=torch.float64)))   # 9.75 Å slabs: fine
    with pytest.raises(CollectiveError) as err:
        d._check_grid(torch.diag(torch.tensor([18.0, 30.0, 30.0], dtype=torch.float64)))
    msg = str(err.value)
    assert "\n" not in msg and "9.00 Å thin" in msg and "fewer domains" in msg, msg


@pytest.mark.parametrize("seed", [0, 1])
def test_fused_passes_give_the_torch_bits(seed, monkeypatch):
    """integrators/fused.py's one-pass kernels (CPU, float64) against the torch expressions they
    replace, bit for bit: NPT's nh_v_press (iso, tri), tri's remap, the kinetic tensor's and m v^2's
    fixed-point sums; random velocities over four decades, strain rates of both signs, a tilted cell."""
    from shardmd.integrators import fused
    from shardmd.integrators.nose_hoover import exact_mv2_sum
    from shardmd.integrators.npt import NPT, exact_kinetic_tensor

    if not fused.usable(torch.zeros(1, 3, dtype=torch.float64)):
        pytest.skip("Warp is not available: the torch code runs")
    g = torch.Generator().manual_seed(seed)
    n = 3 * fused.CHUNK + 17   # several chunks and a partial one
    v = torch.randn(n, 3, dtype=torch.float64, generator=g) * 10.0 ** torch.empty(n, 1).uniform_(-4, 0, generator=g)
    masses = torch.rand(n, dtype=torch.float64, generator=g) * 100.0 + 1.0
    x = torch.rand(n, 3, dtype=torch.float64, generator=g) * 40.0 - 5.0
    od = (torch.rand(6, generator=g, dtype=torch.float64) * 2e-3 - 1e-3).tolist()

    def run(enabled: bool, couple: str):
        monkeypatch.setattr(fused, "ENABLED", enabled)
        npt = NPT(2.0, 100.0, 0.0, 100.0, 1000.0, couple=couple)
        npt.cell = torch.tensor([[40.0, 0.0, 0.0], [1.5, 38.0, 0.0], [-0.7, 2.1, 41.0]], dtype=torch.float64)
        npt.omega_dot, npt.mtk_term2 = list(od), od[0] * 0.1
        vv, xx = v.clone(), x.clone()
        npt._v_press(vv)
        npt._remap(xx)
        return (vv, xx, npt.cell, torch.tensor(exact_kinetic_tensor(v, masses, lambda t: t)),
                torch.tensor(exact_mv2_sum(v, masses, lambda t: t, columns=True)[0]))

    def steps(enabled: bool, couple: str):   # whole steps: the fused half steps against the torch ones
        monkeypatch.setattr(fused, "ENABLED", enabled)
        npt = NPT(2.0, 100.0, 1e-3, 100.0, 1000.0, couple=couple)
        npt.cell = torch.tensor([[40.0, 0.0, 0.0], [1.5, 38.0, 0.0], [-0.7, 2.1, 41.0]], dtype=torch.float64)
        if couple in ("z", "xy"):   # these take an orthorhombic cell
            npt.cell = torch.diag(torch.diagonal(npt.cell))
        npt.virial = torch.tensor([[3.0, 0.2, -0.1], [0.2, -2.0, 0.3], [-0.1, 0.3, 1.0]], dtype=torch.float64)
        vv, xx, ff = v.clone(), x.clone(), v.flip(0) * 50.0
        for step in range(3):
            npt.first_half(xx, vv, ff, masses, torch.arange(n), step)
            npt.second_half(vv, ff.roll(1, 0), masses)
        return vv, xx, npt.cell, torch.tensor([npt.thermostat.t_current, *npt.omega_dot, *(npt._mvv or [])])

    for couple in ("iso", "tri"):
        for a, b in zip(run(True, couple), run(False, couple)):
            assert torch.equal(a, b), couple
    for couple in ("iso", "aniso", "tri", "z", "xy"):
        for a, b in zip(steps(True, couple), steps(False, couple)):
            assert torch.equal(a, b), couple


def test_cell_read_again_after_a_write_in_place():
    """NPT keeps the cell's rows as Python floats between steps (read once per new cell): a cell
    written in place, or replaced, is read again (its volume and the next remap follow it)."""
    from shardmd.integrators.npt import NPT

    npt = NPT(2.0, 100.0, 0.0, 100.0, 1000.0)
    npt.cell = torch.diag(torch.tensor([40.0, 38.0, 41.0], dtype=torch.float64))
    assert npt._volume() == 40.0 * 38.0 * 41.0
    npt.cell.mul_(2.0)
    assert npt._volume() == 8 * 40.0 * 38.0 * 41.0
    npt.cell = torch.diag(torch.tensor([10.0, 10.0, 10.0], dtype=torch.float64))
    assert npt._volume() == 1000.0
    npt.omega_dot = [1e-4, 1e-4, 1e-4, 0.0, 0.0, 0.0]
    m = npt._remap_cell()
    assert npt.cell[0, 0].item() == 10.0 * m and npt._volume() == pytest.approx(float(torch.det(npt.cell)), rel=1e-14)


def test_fused_box_check_matches_the_torch_norm():
    """integrators/fused.py's one-pass box check (max |x - x0 T|) against torch's mm + norm + amax on
    random rows (several chunks), a tilted T and a diagonal one: equal to 1e-14 relative; a NaN row
    gives NaN (engine/run/health.py reads it as an unhealthy step)."""
    from shardmd.integrators import fused

    if not fused.usable(torch.zeros(1, 3, dtype=torch.float64)):
        pytest.skip("Warp is not available: the torch code runs")
    g = torch.Generator().manual_seed(5)
    n = 2 * fused.CHUNK + 5
    x0 = torch.rand(n, 3, dtype=torch.float64, generator=g) * 60.0
    work = torch.empty(n, dtype=torch.float64)
    for t in ([[1.01, 0.0, 0.0], [0.0, 0.99, 0.0], [0.0, 0.0, 1.002]],
              [[1.01, 0.0, 0.0], [0.02, 0.99, 0.0], [-0.01, 0.03, 1.0]]):
        tt = torch.tensor(t, dtype=torch.float64)
        x = x0 @ tt + torch.randn(n, 3, dtype=torch.float64, generator=g) * 0.1
        ref = torch.linalg.vector_norm(x0 @ tt - x, dim=1).amax()
        got = fused.strain_displacement(x, x0, t, work)
        assert abs(float(got - ref)) <= 1e-14 * float(ref), (float(got), float(ref))
        x[n - 3, 2] = float("nan")
        assert torch.isnan(fused.strain_displacement(x, x0, t, work))
