"""Direct unit tests of the integrators' steps (no Simulation, no model): plain torch, float64, CPU.

Every reference is computed independently of integrators/: analytic solutions of free, uniformly
accelerated and harmonic motion, and unit constants derived from SI values (ase.units' CODATA
constants and scipy.constants), never from integrators/units.py.

Units as in the engine: Å, fs, eV, amu; velocities Å/fs, forces eV/Å, friction 1/fs.
"""
from __future__ import annotations

import math

import pytest
import torch
from ase import units as ase_units

from shardmd.integrators import INTEGRATORS, Langevin, VelocityVerlet
from shardmd.integrators.units import FORCE_TO_ACCEL, KB, MVV_TO_EV

F64 = torch.float64

# 1 eV/Å acting on 1 amu, in Å/fs^2, through SI: (e J / 1e-10 m) / (amu kg) = e/amu * 1e10 m/s^2,
# and 1 m/s^2 = 1e10 Å / (1e15 fs)^2 = 1e-20 Å/fs^2.  Uses ASE's SI constants, not ase.units.fs.
ACCEL = ase_units._e / ase_units._amu * 1e10 * 1e-20
# Boltzmann constant in eV/K through SI
KB_REF = ase_units._k / ase_units._e


def kinetic_ev(masses, velocities):
    """0.5 m v^2 in eV (per atom summed over x, y, z); 1 amu (Å/fs)^2 = 1/ACCEL eV."""
    return 0.5 * masses * (velocities ** 2).sum(1) / ACCEL


def gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- units


def test_unit_constants_against_si():
    # the engine's constants derive from ase.units.fs; check them against SI arithmetic
    assert FORCE_TO_ACCEL == pytest.approx(ACCEL, rel=1e-13)
    assert MVV_TO_EV == pytest.approx(1.0 / ACCEL, rel=1e-13)
    # 1 amu * (1 Å/fs)^2 = amu kg * (1e5 m/s)^2 J, in eV
    assert MVV_TO_EV == pytest.approx(ase_units._amu * 1e10 / ase_units._e, rel=1e-13)
    assert KB == pytest.approx(KB_REF, rel=1e-13)
    # and against another CODATA source (scipy: CODATA 2018; ASE's default is CODATA 2014, whose
    # e, amu and k differ from 2018's by up to 3.4e-7 relative)
    constants = pytest.importorskip("scipy.constants")
    accel_codata = constants.e / constants.atomic_mass * 1e-10
    assert FORCE_TO_ACCEL == pytest.approx(accel_codata, rel=1e-6)
    assert KB == pytest.approx(constants.k / constants.e, rel=1e-6)
    # a literal, so that an inverted or squared-twice constant cannot hide: 9.6485332e-3 Å/fs^2
    assert FORCE_TO_ACCEL == pytest.approx(9.6485332e-3, rel=1e-6)
    assert MVV_TO_EV == pytest.approx(103.642697, rel=1e-6)


# --------------------------------------------------------------------------- velocity Verlet


def _atoms(n, seed, spread=10.0, speed=0.05):
    g = gen(seed)
    x0 = (torch.rand(n, 3, generator=g, dtype=F64) - 0.5) * spread
    v0 = (torch.rand(n, 3, generator=g, dtype=F64) - 0.5) * 2 * speed
    masses = torch.tensor([1.008, 12.011, 15.999, 55.845, 196.97, 4.0026, 39.948][:n], dtype=F64)
    ids = torch.arange(n, dtype=torch.int64)
    return x0, v0, masses, ids


def test_verlet_free_particle_straight_line():
    dt, nsteps = 0.7, 1000
    x0, v0, m, ids = _atoms(7, 1)
    x, v = x0.clone(), v0.clone()
    f = torch.zeros_like(x)
    vv = VelocityVerlet(dt)
    for step in range(nsteps):
        vv.first_half(x, v, f, m, ids, step)
        vv.second_half(v, f, m)
    expect = x0 + v0 * (nsteps * dt)
    scale = expect.abs().max().item()
    torch.testing.assert_close(x, expect, rtol=1e-12, atol=1e-12 * scale)
    assert torch.equal(v, v0)  # zero force: velocities untouched, bit for bit
    assert not torch.equal(x, x0)


def test_verlet_constant_force_is_exact():
    # velocity Verlet integrates a constant force exactly: x = x0 + v0 t + a t^2 / 2, v = v0 + a t
    dt, nsteps = 0.5, 400
    x0, v0, m, ids = _atoms(7, 2)
    f = (torch.rand(7, 3, generator=gen(3), dtype=F64) - 0.5) * 4.0  # eV/Å
    a = f / m[:, None] * ACCEL  # Å/fs^2
    x, v = x0.clone(), v0.clone()
    vv = VelocityVerlet(dt)
    worst_x = worst_v = 0.0
    for step in range(nsteps):
        vv.first_half(x, v, f, m, ids, step)
        vv.second_half(v, f, m)
        t = (step + 1) * dt
        ex = x0 + v0 * t + 0.5 * a * t * t
        ev = v0 + a * t
        worst_x = max(worst_x, ((x - ex).abs().max() / ex.abs().max()).item())
        worst_v = max(worst_v, ((v - ev).abs().max() / ev.abs().max()).item())
    assert worst_x < 1e-12, worst_x
    assert worst_v < 1e-12, worst_v
    # the displacement is dominated by the force, so a wrong unit constant cannot pass
    assert (0.5 * a * (nsteps * dt) ** 2).abs().max() > 10 * (v0 * nsteps * dt).abs().max()


def _harmonic(seed, n=4, omega_dt=0.1, dt=1.0):
    """n atoms in 3-D wells k_i x^2 / 2 about the origin, omega_i = sqrt(k_i/m_i) up to omega_dt/dt."""
    x0, v0, m, ids = _atoms(n, seed, spread=2.0, speed=0.02)
    omega = torch.linspace(0.5, 1.0, n, dtype=F64) * omega_dt / dt  # 1/fs
    k = m * omega ** 2 / ACCEL  # eV/Å^2
    return x0, v0, m, ids, k, omega


def _run_verlet_harmonic(x0, v0, m, ids, k, dt, nsteps, integrator=None):
    """Positions, velocities and total energies at steps 0..nsteps."""
    integ = integrator or VelocityVerlet(dt)
    x, v = x0.clone(), v0.clone()
    f = -k[:, None] * x
    xs, vs, es = [x.clone()], [v.clone()], []

    def energy():
        return (kinetic_ev(m, v) + 0.5 * k * (x ** 2).sum(1)).sum().item()

    es.append(energy())
    for step in range(nsteps):
        integ.first_half(x, v, f, m, ids, step)
        f = -k[:, None] * x
        integ.second_half(v, f, m)
        xs.append(x.clone())
        vs.append(v.clone())
        es.append(energy())
    return torch.stack(xs), torch.stack(vs), torch.tensor(es, dtype=F64)


def test_verlet_harmonic_energy_error_is_second_order():
    x0, v0, m, ids, k, omega = _harmonic(4, omega_dt=0.1, dt=1.0)
    t_end = 3 * 2 * math.pi / omega.min().item()  # three periods of the slowest atom
    errs = []
    for dt in (1.0, 0.5):
        n = int(round(t_end / dt))
        _, _, e = _run_verlet_harmonic(x0, v0, m, ids, k, dt, n)
        errs.append((e - e[0]).abs().max().item() / e[0].item())
        # shadow energy: E - E0 = (omega dt)^2/4 (PE - PE0), so |E - E0| <= (omega dt)^2/4 * E
        bound = (omega.max().item() * dt) ** 2 / 4
        assert errs[-1] <= 1.05 * bound, (dt, errs[-1], bound)
    ratio = errs[0] / errs[1]
    assert 3.5 <= ratio <= 4.5, (errs, ratio)


def test_verlet_harmonic_phase_against_analytic():
    # 1-D oscillator (motion along x only) and the 3-D ones: x(t) = x0 cos wt + v0/w sin wt
    x0, v0, m, ids, k, omega = _harmonic(5, omega_dt=0.1, dt=1.0)
    x0[0, 1:] = 0.0
    v0[0, 1:] = 0.0
    amp = torch.sqrt(x0 ** 2 + (v0 / omega[:, None]) ** 2).amax(1, keepdim=True)  # per atom
    t_end = 3 * 2 * math.pi / omega.min().item()
    errs = []
    for dt in (1.0, 0.5):
        n = int(round(t_end / dt))
        xs, vs, _ = _run_verlet_harmonic(x0, v0, m, ids, k, dt, n)
        t = torch.arange(n + 1, dtype=F64)[:, None, None] * dt
        w = omega[None, :, None]
        exact = x0 * torch.cos(w * t) + v0 / w * torch.sin(w * t)
        err = ((xs - exact).abs() / amp).max().item()
        errs.append(err)
        # numerical frequency w~ = acos(1 - (w dt)^2/2)/dt = w (1 + (w dt)^2/24 + ...): the phase
        # error after t is w t (w dt)^2 / 24, plus an O((w dt)^2) amplitude error
        wdt = omega.max().item() * dt
        bound = wdt ** 2 * (omega.max().item() * n * dt / 24 + 0.25)
        assert err <= bound, (dt, err, bound)
        assert (xs[:, 0, 1:] == 0).all()  # the 1-D oscillator stays 1-D
        # the exact discrete solution of the Verlet recurrence x_{n+1} = 2 cos(th) x_n - x_{n-1},
        # cos(th) = 1 - (w dt)^2 / 2:  x_n = x0 cos(n th) + dt v0 sin(n th) / sin(th)
        th = torch.acos(1 - (omega * dt) ** 2 / 2)[None, :, None]
        steps = torch.arange(n + 1, dtype=F64)[:, None, None]
        discrete = x0 * torch.cos(steps * th) + dt * v0 * torch.sin(steps * th) / torch.sin(th)
        assert ((xs - discrete).abs() / amp).max().item() < 1e-10
    assert 3.5 <= errs[0] / errs[1] <= 4.5, errs


def test_verlet_time_reversible():
    x0, v0, m, ids, k, omega = _harmonic(6, omega_dt=0.2, dt=1.0)
    n = 2000
    xs, vs, _ = _run_verlet_harmonic(x0, v0, m, ids, k, 1.0, n)
    assert (xs[-1] - x0).abs().max() > 0.1  # it went somewhere
    back_x, back_v, _ = _run_verlet_harmonic(xs[-1], -vs[-1], m, ids, k, 1.0, n)
    scale = x0.abs().max().item()
    torch.testing.assert_close(back_x[-1], x0, rtol=0, atol=1e-12 * scale)
    torch.testing.assert_close(-back_v[-1], v0, rtol=0, atol=1e-12 * v0.abs().max().item())


def test_verlet_state_and_dof():
    vv = VelocityVerlet(0.25)
    assert vv.state_dict() == {"name": "verlet", "dt": 0.25}
    assert INTEGRATORS["verlet"] is VelocityVerlet and vv.conserves_momentum
    # 3N - 3 (total momentum conserved); a single atom has none (T 0 K: tests/test_faults_minor.py)
    assert [vv.degrees_of_freedom(n) for n in (0, 1, 2, 10, 1000)] == [0, 0, 3, 27, 2997]
    with pytest.raises(ValueError):
        VelocityVerlet(0.0)


# --------------------------------------------------------------------------- Langevin (BAOAB)


def test_langevin_state_and_dof():
    lg = Langevin(dt=0.5, temperature=300.0, friction=0.01, seed=42)
    sd = lg.state_dict()
    assert sd == {"name": "langevin", "dt": 0.5, "temperature": 300.0, "friction": 0.01, "seed": 42,
                  "energy_change": 0.0}   # the O steps' energy (its conserved quantity)
    assert INTEGRATORS["langevin"] is Langevin and not lg.conserves_momentum
    # 3N: the thermostat does not conserve momentum; never below 1
    assert [lg.degrees_of_freedom(n) for n in (0, 1, 2, 10, 1000)] == [1, 3, 6, 30, 3000]
    for bad in (dict(dt=0.0), dict(temperature=-1.0), dict(friction=-0.1), dict(friction=float("nan"))):
        kw = dict(dt=0.5, temperature=300.0, friction=0.01, seed=1) | bad
        with pytest.raises(ValueError):
            Langevin(**kw)


def test_langevin_zero_friction_is_velocity_verlet():
    # gamma = 0: c1 = 1, c2 = 0, the O step is the identity and B A O A B = B A A B, which is
    # velocity Verlet with the drift split in two halves.  Same trajectory up to rounding (the
    # two half drifts round differently from one full drift), whatever the temperature and seed.
    x0, v0, m, ids, k, omega = _harmonic(7, omega_dt=0.2, dt=1.0)
    n = 1000
    xs, vs, _ = _run_verlet_harmonic(x0, v0, m, ids, k, 1.0, n)
    lg = Langevin(dt=1.0, temperature=1000.0, friction=0.0, seed=3)
    ls, lv, _ = _run_verlet_harmonic(x0, v0, m, ids, k, 1.0, n, integrator=lg)
    torch.testing.assert_close(ls, xs, rtol=0, atol=1e-12 * x0.abs().max().item())
    torch.testing.assert_close(lv, vs, rtol=0, atol=1e-12 * v0.abs().max().item())


def test_langevin_zero_temperature_is_pure_friction():
    # T = 0, no force: each step is x += dt/2 v; v *= c1 = exp(-gamma dt); x += dt/2 v, so
    # v_n = v0 c1^n and x_n = x0 + dt/2 (1 + c1) v0 (1 - c1^n) / (1 - c1)
    dt, gamma, n = 0.5, 0.02, 300
    x0, v0, m, ids = _atoms(7, 8)
    x, v = x0.clone(), v0.clone()
    f = torch.zeros_like(x)
    lg = Langevin(dt=dt, temperature=0.0, friction=gamma, seed=9)
    for step in range(n):
        lg.first_half(x, v, f, m, ids, step)
        lg.second_half(v, f, m)
    c1 = math.exp(-gamma * dt)
    torch.testing.assert_close(v, v0 * c1 ** n, rtol=1e-12, atol=0)
    expect = x0 + 0.5 * dt * (1 + c1) * v0 * (1 - c1 ** n) / (1 - c1)
    torch.testing.assert_close(x, expect, rtol=1e-12, atol=1e-12 * expect.abs().max().item())


def test_baoab_reference_formulas():
    """The closed forms used below, checked against the exact covariance recursion of BAOAB.

    For a harmonic well (omega) the BAOAB step is linear: (x, v) -> M (x, v) + N xi.  Its
    stationary covariance S = M S M^T + N N^T gives <x^2> = kT/k (exact for any dt < 2/omega)
    and, for the velocity at the end of a step, <v^2> = kT/m (1 - (omega dt)^2 / 4); the velocity
    right after the O step (between first_half and second_half) has exactly kT/m.
    """
    for wdt, gdt in ((0.3, 0.1), (0.6, 0.5), (1.0, 2.0)):
        c = math.exp(-gdt)
        s = math.sqrt(1 - c * c)
        # units: omega = 1, kT/m = 1, dt = wdt; covariance [[xx, xv], [xv, vv]]
        h = wdt

        def B(S, h=h):
            xx, xv, vv = S
            # v -= h/2 x
            return xx, xv - h / 2 * xx, vv - h * xv + h * h / 4 * xx

        def A(S, h=h):
            xx, xv, vv = S
            return xx + h * xv + h * h / 4 * vv, xv + h / 2 * vv, vv

        def O(S, c=c, s=s):  # noqa: E743 (the BAOAB letter)
            xx, xv, vv = S
            return xx, c * xv, c * c * vv + s * s

        S = (0.0, 0.0, 0.0)
        for _ in range(5000):
            S = B(A(O(A(B(S)))))
        assert S[0] == pytest.approx(1.0, rel=1e-9)
        assert S[2] == pytest.approx(1 - wdt ** 2 / 4, rel=1e-9)
        assert O(A(B(S)))[2] == pytest.approx(1.0, rel=1e-9)


def test_langevin_harmonic_ensemble_temperatures():
    """20000 independent 3-D harmonic atoms at 300 K, BAOAB with omega dt = 0.6.

    Leimkuhler & Matthews (2013; Appl. Math. Res. Express 2013, 34-56, and J. Chem. Phys. 138,
    174102): BAOAB samples the configurational distribution of a harmonic system exactly at any
    stable dt, so <k x^2> = kB T per degree of freedom.  The kinetic temperature is exact for the
    velocities right after the O step (what the arrays hold between first_half and second_half);
    the end-of-step velocities carry the O((omega dt)^2) bias factor 1 - (omega dt)^2 / 4 (see
    test_baoab_reference_formulas).  At omega dt = 0.6 that is 9 %, well outside the tolerance,
    so this test also tells BAOAB apart from splittings with a configurational bias (e.g.
    OBABO, velocity Verlet between two half O steps: <k x^2> = kT / (1 - (omega dt)^2 / 4)).

    Tolerance: per snapshot, k x^2 / kT over 3n independent degrees of freedom is a mean of
    chi^2_1 variables, standard error sqrt(2 / 3n); the time average of correlated snapshots
    has a standard error no larger than that (Cauchy-Schwarz), so 5 of those is a safe bound.
    """
    n, dt, temp, gamma, wdt = 20000, 1.0, 300.0, 0.5, 0.6
    g = gen(11)
    m = 1.0 + 39.0 * torch.rand(n, generator=g, dtype=F64)
    omega = wdt / dt
    k = m * omega ** 2 / ACCEL  # eV/Å^2, same omega for all atoms
    ids = torch.arange(n, dtype=torch.int64) * 3 + 5
    x = torch.zeros(n, 3, dtype=F64)
    v = torch.zeros(n, 3, dtype=F64)
    f = -k[:, None] * x
    lg = Langevin(dt=dt, temperature=temp, friction=gamma, seed=2024)
    kt = KB_REF * temp
    n_eq, n_sample = 40, 30  # second moments relax as exp(-gamma t): e^-20 after equilibration
    # light and heavy halves separately too, so that a mass-independent noise amplitude (right on
    # average over all masses) cannot pass
    light = m < m.median()
    groups = {"all": torch.ones(n, dtype=torch.bool), "light": light, "heavy": ~light}
    sums = {(g_, q): 0.0 for g_ in groups for q in ("conf", "mid", "end")}

    def accumulate(q, per_atom):
        for name, sel in groups.items():
            sums[name, q] += (per_atom[sel].mean() / kt).item() / n_sample

    for step in range(n_eq + n_sample):
        lg.first_half(x, v, f, m, ids, step)
        if step >= n_eq:
            accumulate("mid", (m[:, None] * v ** 2).mean(1) / ACCEL)
        f = -k[:, None] * x
        lg.second_half(v, f, m)
        if step >= n_eq:
            accumulate("conf", (k[:, None] * x ** 2).mean(1))
            accumulate("end", (m[:, None] * v ** 2).mean(1) / ACCEL)
    bias = 1 - wdt ** 2 / 4
    for name, sel in groups.items():
        tol = 5 * math.sqrt(2 / (3 * int(sel.sum())))
        t_conf, t_mid, t_end = (sums[name, q] for q in ("conf", "mid", "end"))
        assert abs(t_conf - 1) < tol, (name, t_conf, tol)
        assert abs(t_mid - 1) < tol, (name, t_mid, tol)
        assert abs(t_end - bias) < tol, (name, t_end, bias, tol)
        assert abs(t_end - 1) > tol  # the test can tell the biased value from the target


def _langevin_run(x0, v0, m, ids, k, seed, nsteps, first_step=0, temp=300.0, gamma=0.05):
    lg = Langevin(dt=1.0, temperature=temp, friction=gamma, seed=seed)
    x, v = x0.clone(), v0.clone()
    f = -k[:, None] * x
    for step in range(first_step, first_step + nsteps):
        lg.first_half(x, v, f, m, ids, step)
        f = -k[:, None] * x
        lg.second_half(v, f, m)
    return x, v


def _noise_system(n=64):
    g = gen(12)
    x0 = torch.randn(n, 3, generator=g, dtype=F64)
    v0 = 0.01 * torch.randn(n, 3, generator=g, dtype=F64)
    m = 1.0 + 30.0 * torch.rand(n, generator=g, dtype=F64)
    k = m * 0.1 ** 2 / ACCEL
    # ids far from memory order, some above 2^32 (the counter's high id word)
    ids = torch.randperm(10 * n, generator=g)[:n].to(torch.int64) * 7919 + 3
    ids[::5] += 1 << 33
    return x0, v0, m, ids, k


def test_langevin_deterministic_and_seeded():
    x0, v0, m, ids, k = _noise_system()
    a = _langevin_run(x0, v0, m, ids, k, seed=7, nsteps=50)
    b = _langevin_run(x0, v0, m, ids, k, seed=7, nsteps=50)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = _langevin_run(x0, v0, m, ids, k, seed=8, nsteps=50)
    assert (a[0] != c[0]).all() and (a[1] != c[1]).all()
    c = _langevin_run(x0, v0, m, ids, k, seed=7 + (1 << 32), nsteps=50)  # high seed word
    assert (a[1] != c[1]).all()
    d = _langevin_run(x0, v0, m, ids, k, seed=7, nsteps=50, first_step=1000)  # step keys noise
    assert (a[1] != d[1]).all()


def test_langevin_noise_independent_of_memory_order():
    x0, v0, m, ids, k = _noise_system()
    ref = _langevin_run(x0, v0, m, ids, k, seed=5, nsteps=50)
    perm = torch.randperm(len(ids), generator=gen(13))
    px, pv = _langevin_run(x0[perm], v0[perm], m[perm], ids[perm], k[perm], seed=5, nsteps=50)
    inv = torch.argsort(perm)
    assert torch.equal(px[inv], ref[0]) and torch.equal(pv[inv], ref[1])
    # a subset of the atoms (as on another domain) also follows the very same trajectories
    sub = perm[:10]
    sx, sv = _langevin_run(x0[sub], v0[sub], m[sub], ids[sub], k[sub], seed=5, nsteps=50)
    assert torch.equal(sx, ref[0][sub]) and torch.equal(sv, ref[1][sub])
    # while handing the same arrays other ids changes them
    ox, ov = _langevin_run(x0, v0, m, ids + 1, k, seed=5, nsteps=50)
    assert (ov != ref[1]).all()
