"""Thermostats (NVT): Nosé-Hoover chains state for state against LAMMPS's fix nvt, CSVR's exact
kinetic-energy resampling, canonical kinetic-energy distributions, decomposition independence
and bit-exact restarts.

The LAMMPS states come from scripts/lammps_reference_nvt.py (tests/data/lammps_nvt_lj4000.npz:
in.lj argon, 4000 atoms, 100 steps of ``fix nvt temp 1.44 1.44 0.1`` in reduced units)."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_engine, run_in_process
from scipy import stats

from shardmd.engine.config.compose import compose_config
from shardmd.engine.io.h5md import read_frames
from shardmd.engine.run.simulation import Simulation
from shardmd.engine.run.state import State
from shardmd.integrators import CSVR, NoseHoover, csvr
from shardmd.integrators.csvr import gamma_draw, resample_kinetic, resample_kinetic_many
from shardmd.integrators.nose_hoover import exact_mv2_sum
from shardmd.integrators.units import KB

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "lammps_nvt_lj4000.npz"
sys.path.insert(0, str(HERE.parent / "scripts"))


# ---------------------------------------------------------------- against LAMMPS fix nvt


def _lammps_case():
    from bench_lj import units
    from lammps_reference_nvt import start_config

    return np.load(DATA), start_config(units())


def _run_from(x0, v0, box, overrides, tmp_path, steps):
    from ase import Atoms

    cfg = compose_config([*overrides, f"steps={steps}", f"output={tmp_path / 'nvt.h5'}"])
    atoms = Atoms("Ar" * len(x0), positions=x0, cell=[box] * 3, pbc=True)
    state = State.from_atoms(atoms)
    state.velocities = torch.as_tensor(v0, dtype=torch.float64).clone()   # exact Å/fs, no ASE round trip
    sim = Simulation(cfg, state=state)
    s = sim.state
    s.velocities = torch.as_tensor(v0, dtype=torch.float64)[s.ids].clone()  # whatever the engine did to them
    sim.run()
    order = torch.argsort(s.ids)
    return sim, s.unwrapped_positions()[order].numpy(), s.velocities[order].numpy()


def test_nose_hoover_matches_lammps_fix_nvt(tmp_path):
    """100 steps of fix nvt (chain 3, Tdamp 0.1 tau) from one state: positions to 1e-8 of the box,
    velocities and the thermostat's energy to round-off growth."""
    ref, ov = _lammps_case()
    box = float(ref["box"])
    sim, x, v = _run_from(ref["x0"], ref["v0"], box, ov, tmp_path, int(ref["steps"]))
    dx = np.abs(x - ref["x"]).max()
    dv = np.abs(v - ref["v"]).max() / np.abs(ref["v"]).max()
    print(f"max |dx| = {dx:.3e} Å ({dx / box:.3e} of the box), max |dv|/max|v| = {dv:.3e}")
    assert dx / box <= 1e-8, dx
    assert dx <= 1e-8, dx
    assert dv <= 1e-8, dv
    # fix nvt's f_1 (the chain's energy) against ours
    assert sim.integrator.conserved_energy() == pytest.approx(float(ref["fix_energy"]), rel=1e-8, abs=1e-10)
    # the LAMMPS run did thermostat: the final state is far from NVE's
    assert np.abs(ref["x"] - ref["x0"]).max() > 0.1


def _nhc_numpy(x, v, m, force, dt, T, tdamp, dof, steps, chain=3):
    """fix_nh's nvt step (initial_integrate, final_integrate, nhc_temp_integrate) in plain
    NumPy float64, written from LAMMPS's source independently of integrators/; SI-derived
    units (as test_integrators.py): kB in eV/K, 1 eV/Å/amu in Å/fs^2."""
    from ase import units as au

    accel = au._e / au._amu * 1e10 * 1e-20
    kb = au._k / au._e
    w = 1.0 / tdamp
    qm = [dof * kb * T / w**2] + [kb * T / w**2] * (chain - 1)
    eta, ed, edd = np.zeros(chain), np.zeros(chain + 1), np.zeros(chain)
    for i in range(1, chain):
        edd[i] = (qm[i - 1] * ed[i - 1] ** 2 - kb * T) / qm[i]
    t_cur = (m[:, None] * v * v).sum() / accel / (dof * kb)

    def nhc(v, t_cur):
        edd[0] = (dof * kb * t_cur - dof * kb * T) / qm[0]
        for i in range(chain - 1, 0, -1):
            f = math.exp(-dt / 8 * ed[i + 1])
            ed[i] = (ed[i] * f + edd[i] * dt / 4) * f
        f = math.exp(-dt / 8 * ed[1])
        ed[0] = (ed[0] * f + edd[0] * dt / 4) * f
        s = math.exp(-dt / 2 * ed[0])
        v = v * s
        t_cur *= s * s
        edd[0] = (dof * kb * t_cur - dof * kb * T) / qm[0]
        eta[:] += dt / 2 * ed[:chain]
        ed[0] = (ed[0] * f + edd[0] * dt / 4) * f
        for i in range(1, chain):
            f = math.exp(-dt / 8 * ed[i + 1])
            edd[i] = (qm[i - 1] * ed[i - 1] ** 2 - kb * T) / qm[i]
            ed[i] = (ed[i] * f + edd[i] * dt / 4) * f
        return v, t_cur

    f = force(x)
    for _ in range(steps):
        v, t_cur = nhc(v, t_cur)
        v = v + dt / 2 * f / m[:, None] * accel
        x = x + dt * v
        f = force(x)
        v = v + dt / 2 * f / m[:, None] * accel
        t_cur = (m[:, None] * v * v).sum() / accel / (dof * kb)
        v, t_cur = nhc(v, t_cur)
    return x, v, eta, ed


def test_nose_hoover_matches_an_independent_numpy_fix_nh():
    """Harmonic wells (anisotropic, so the chain has work): our integrator against the NumPy
    transcription of fix_nh above, 400 steps, to round-off."""
    g = np.random.default_rng(3)
    n = 50
    x0 = g.normal(size=(n, 3))
    m = g.uniform(1.0, 60.0, n)
    k = g.uniform(0.5, 3.0, (n, 3))        # eV/Å^2
    v0 = g.normal(size=(n, 3)) * 0.01
    dt, T, tdamp, steps = 1.0, 300.0, 20.0, 400
    xr, vr, eta_r, ed_r = _nhc_numpy(x0, v0, m, lambda x: -k * x, dt, T, tdamp, 3 * n - 3, steps)

    integ = NoseHoover(dt=dt, temperature=T, tdamp=tdamp, chain=3)
    x, v = torch.tensor(x0), torch.tensor(v0)
    mt, kt = torch.tensor(m), torch.tensor(k)
    ids = torch.arange(n)
    f = -kt * x
    for step in range(steps):
        integ.first_half(x, v, f, mt, ids, step)
        f = -kt * x
        integ.second_half(v, f, mt)
    assert np.abs(x.numpy() - xr).max() < 1e-10
    assert np.abs(v.numpy() - vr).max() < 1e-12
    np.testing.assert_allclose(integ.eta, eta_r, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(integ.eta_dot, ed_r, rtol=1e-9, atol=1e-14)
    assert abs(integ.eta[0]) > 1e-3   # the thermostat acted


# ---------------------------------------------------------------- pieces


def test_exact_kinetic_sum_is_order_and_split_independent():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(1001, 3, generator=g, dtype=torch.float64) * 0.01
    m = torch.rand(1001, generator=g, dtype=torch.float64) * 50 + 1
    whole, n = exact_mv2_sum(v, m, lambda t: t)
    perm = torch.randperm(1001, generator=g)
    parts = [exact_mv2_sum(v[perm][a:b], m[perm][a:b], lambda t: t) for a, b in ((0, 333), (333, 1001))]
    # a split into "ranks": add the integer words, as an all-reduce would
    import shardmd.integrators.nose_hoover as nh

    words = [None]

    def grab(t):
        words[0] = t if words[0] is None else words[0] + t
        return t

    for a, b in ((0, 333), (333, 700), (700, 1001)):
        exact_mv2_sum(v[perm][a:b], m[perm][a:b], grab)
    tot = words[0].tolist()
    split = (tot[0] + tot[1] / nh._LO) / nh._HI
    assert split == whole and n == 1001 and sum(p[1] for p in parts) == 1001
    ref = float((m[:, None] * v * v).sum()) * nh.MVV_TO_EV
    assert whole == pytest.approx(ref, rel=1e-14)


def test_gamma_draws_follow_the_gamma_distribution():
    a = 5.5
    xs = np.array([gamma_draw(a, seed=11, step=s, stream=3) for s in range(4000)])
    assert stats.kstest(xs, stats.gamma(a).cdf).pvalue > 1e-3


def test_many_systems_draw_each_systems_own_bits(monkeypatch):
    """resample_kinetic_many (a batch's CSVR step) gives each system the bits resample_kinetic
    gives it alone, for few (squared normals) and many (Gamma) degrees of freedom, any tau, seeds
    and steps over 32 bits; also where a system's first Marsaglia-Tsang candidates all fail."""
    rng = np.random.default_rng(3)
    n = 300
    args = [rng.uniform(0.01, 10, n).tolist(), rng.uniform(0.01, 10, n).tolist(),
            rng.choice([1, 2, 3, 4, 9, 191, 3000], n).tolist(), rng.choice([0.0, 0.05, 4.0, 100.0], n).tolist(),
            [int(x) for x in rng.integers(0, 2 ** 63, n, dtype=np.int64)],
            [int(x) for x in rng.integers(0, 2 ** 40, n, dtype=np.int64)]]
    alone = [resample_kinetic(*a) for a in zip(*args)]
    assert resample_kinetic_many(*args) == alone
    real, calls = csvr._accept, []

    def first_fails(shape, xs, us):   # the batch's first candidates for the first Gamma system rejected
        calls.append(shape)
        return None if len(calls) == 1 else real(shape, xs, us)
    monkeypatch.setattr(csvr, "_accept", first_fails)
    assert resample_kinetic_many(*args) == alone and len(calls) > 1


@pytest.mark.slow   # a statistical test of ~15 s: the full suite's
def test_csvr_resampling_is_bussis_distribution():
    """From any K, many steps of the exact resampling with tau = 0 give K ~ Gamma(dof/2, kT):
    (factor 0: K' = Kt (S + R^2)/dof), and for tau > 0 the stationary distribution is the same."""
    dof, kt = 30, KB * 200.0
    sigma = 0.5 * dof * kt
    # 2,000 draws as 2,000 systems of one batch (resample_kinetic_many), and a 10,000-step chain
    # (500 decorrelated samples) of single draws, ~1 ms of CPU each
    k0 = resample_kinetic_many([3.0 * sigma] * 2000, [sigma] * 2000, [dof] * 2000, [0.0] * 2000, [5] * 2000,
                               list(range(2000)))
    assert stats.kstest(k0, stats.gamma(dof / 2, scale=kt).cdf).pvalue > 1e-3
    k, chain = sigma, []
    for s in range(10000):
        k = resample_kinetic(k, sigma, dof, 4.0, seed=6, step=s)
        chain.append(k)
    chain = np.array(chain[::20])   # decorrelated (tau = 4 steps)
    assert stats.kstest(chain, stats.gamma(dof / 2, scale=kt).cdf).pvalue > 1e-3


def _two_rank_sum(v, m, cut):
    """What an all-reduce over two ranks holding atoms [:cut] and [cut:] returns."""
    words = []
    for sl in (slice(0, cut), slice(cut, None)):
        exact_mv2_sum(v[sl], m[sl], lambda t: words.append(t) or t)
    total = words[0] + words[1]
    return lambda t: total


def test_csvr_draws_are_the_same_for_every_decomposition():
    """The scale factor depends on (seed, step) and the global kinetic energy only."""
    g = torch.Generator().manual_seed(2)
    v = torch.randn(200, 3, generator=g, dtype=torch.float64) * 0.01
    m = torch.full((200,), 39.948, dtype=torch.float64)
    one = CSVR(dt=2.0, temperature=100.0, tau=50.0, seed=9)
    v1 = v.clone()
    f1 = one.rescale(v1, m, step=17)
    rank1 = CSVR(dt=2.0, temperature=100.0, tau=50.0, seed=9, sum_fn=_two_rank_sum(v, m, 90))
    v2 = v[90:].clone()
    f2 = rank1.rescale(v2, m[90:], step=17)
    assert f1 == f2 != 1.0 and torch.equal(v1[90:], v2)
    assert one.rescale(v.clone(), m, step=18) != f1   # a new draw at each step


# ---------------------------------------------------------------- ensembles


def _thermo_rows(overrides, tmp_path, every=5):
    cfg = compose_config(["model=lj", "system.repeat=[4,4,4]", "quiet=true", "trajectory.every=0",
                          f"thermo.every={every}", f"output={tmp_path / 'run.h5'}", *overrides])
    sim = Simulation(cfg)
    rows = []
    sim.reporter.thermo = lambda step, t, obs: rows.append((t, obs["kinetic_energy"], obs["temperature"]))
    return sim, rows


@pytest.mark.slow
@pytest.mark.parametrize("integrator", [
    pytest.param(["integrator=nose-hoover", "integrator.tdamp=200"], id="nose-hoover"),
    pytest.param(["integrator=csvr", "integrator.tau=100"], id="csvr")])
def test_canonical_temperature_and_fluctuations(integrator, tmp_path):
    """As the Langevin test (tests/test_dynamics.py): <T> = target within 3 block errors and
    Var(K) = dof (kT)^2 / 2 (the canonical value) within 3 block errors + 5 %."""
    T = 90.0
    sim, rows = _thermo_rows([*integrator, f"temperature={T}", "dt=2.0", "steps=8000", "seed=7"], tmp_path)
    sim.run()
    a = np.array(rows)[200:]  # drop 2 ps
    dof = sim.integrator.degrees_of_freedom(sim.state.n_atoms)
    temps, ke = a[:, 2], a[:, 1]
    means = np.array([b.mean() for b in np.array_split(temps, 10)])
    sem = means.std(ddof=1) / np.sqrt(len(means))
    assert abs(temps.mean() - T) < 3 * sem + 1e-9, (temps.mean(), sem)
    var_expected = dof * (KB * T) ** 2 / 2
    var_blocks = np.array([np.var(b) for b in np.array_split(ke, 10)])
    rel = var_blocks.mean() / var_expected
    rel_err = var_blocks.std(ddof=1) / np.sqrt(10) / var_expected
    print(f"{integrator[0]}: <T> = {temps.mean():.3f} K +- {sem:.3f} (target {T}), "
          f"Var(K)/canonical = {rel:.4f} +- {rel_err:.4f}")
    assert abs(rel - 1) < 3 * rel_err + 0.05, (rel, rel_err)


# ---------------------------------------------------------------- decomposition, restart

BASE = ["model=lj", "system.repeat=[5,5,5]", "dt=2.0", "temperature=100", "trajectory.every=20",
        "thermo.every=50", "quiet=true", "checkpoint.every=0", "neighbor.skin=0.6"]
THERMOSTATS = ["integrator=nose-hoover", "integrator=csvr"]
#: the same, CSVR's runs in the slow tier (the fast tier keeps one thermostat's; ~20 s each)
FAST_NHC = ["integrator=nose-hoover", pytest.param("integrator=csvr", marks=pytest.mark.slow)]


def _unwrapped(path):
    return {f.info["step"]: (f.positions + f.arrays["image"] @ f.cell.array, f.get_velocities())
            for f in read_frames(path)}


@pytest.mark.mpi
@pytest.mark.parametrize("integrator", FAST_NHC)
def test_one_and_two_domains_give_the_same_trajectory(integrator, tmp_path):
    args = [*BASE, integrator, "integrator.tdamp=50" if "nose" in integrator else "integrator.tau=50",
            "steps=200"]
    r1 = run_engine(["run", *args, "output=d1.h5"], cwd=tmp_path)
    assert r1.returncode == 0, r1.stderr
    r2 = run_engine(["run", *args, "+domains=2", "output=d2.h5"], cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    a, b = _unwrapped(tmp_path / "d1.h5"), _unwrapped(tmp_path / "d2.h5")
    assert sorted(a) == sorted(b) == list(range(0, 201, 20))
    worst = max(np.abs(a[s][0] - b[s][0]).max() for s in a)
    print(f"{integrator}: 1 vs 2 domains, max |dx| over 200 steps = {worst:.3e} Å")
    assert worst <= 1e-10, worst


@pytest.mark.parametrize("integrator", FAST_NHC)
def test_restart_mid_run_is_bit_exact(integrator, tmp_path):
    """200 steps straight == 100 + restart + 100 (the chain comes back from the checkpoint)."""
    args = [*BASE, integrator]
    assert run_engine(["run", *args, "steps=200", "output=straight.h5"], cwd=tmp_path).returncode == 0
    r = run_engine(["run", *args, "steps=100", "output=split.h5"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_engine(["run", *args, "steps=200", "output=split.h5", "restart=auto"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    a, b = read_frames(tmp_path / "straight.h5"), read_frames(tmp_path / "split.h5")
    fa, fb = {f.info["step"]: f for f in a}, {f.info["step"]: f for f in b}
    assert sorted(fa) == sorted(fb) == list(range(0, 201, 20))
    for s in sorted(fa):
        assert np.array_equal(fa[s].positions, fb[s].positions), s
        assert np.array_equal(fa[s].get_velocities(), fb[s].get_velocities()), s


def test_bad_thermostat_settings_are_one_line(tmp_path, capfd, monkeypatch):
    for args, needle in [
        (["integrator.tdamp=0"], "tdamp"),
        (["temperature=0"], "temperature must be > 0"),
        # the deferred skin check's rollbacks do not restore the chain yet: refused, not wrong
        (["neighbor.deferred=true"], "neighbor.deferred=false"),
    ]:
        code, lines = run_in_process(["run", "model=lj", "integrator=nose-hoover", *args, "steps=1"], tmp_path,
                                     capfd, monkeypatch)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines