"""Nosé-Hoover chains (NVT) as LAMMPS's ``fix nvt`` integrates them (src/fix_nh.cpp).

One step (tloop = 1, drag = 0, as fix nvt's defaults):

    initial_integrate:  NHC(dt/2) with the temperature carried from the last NHC,
                        v += dt/2 F/m,  x += dt v
    -- forces --
    final_integrate:    v += dt/2 F/m,  T = 2K/(dof kB) of these velocities,  NHC(dt/2)

NHC(dt/2) is fix_nh's ``nhc_temp_integrate`` line for line: the chain's velocities are
updated from the top of the chain down with the exp(-dt/8 eta_dot[i+1]) factors around a dt/4
kick, all velocities scaled by exp(-dt/2 eta_dot[0]), the carried temperature scaled by its
square (never recomputed), eta advanced by dt/2 eta_dot and the chain swept back up.
Masses Q[0] = dof kB T / w^2, Q[i>0] = kB T / w^2 with w = 1/tdamp; the forces of the upper
links eta_dotdot[i>0] are state (set at start as LAMMPS's ``setup``, then updated in the
upward sweep only).  dof = 3N - 3, as LAMMPS's temperature compute for a momentum-conserving
system (and our verlet).

The kinetic energy is a global sum: the engine passes ``sum_fn`` (a sum over ranks of a
small int64 tensor; identity on one rank).  Each atom's m v^2 is turned into two int64
fixed-point words (2^-32 and 2^-63 eV) before summing, so the sum is exact integer
arithmetic: the same bits whatever the decomposition, and the chain variables (scalars) are
identical on every rank.  They are in :meth:`state_dict`, and :meth:`load_state_dict`
restores them for a bit-exact restart.

Units: Å, Å/fs, eV/Å, amu, fs; ``tdamp`` in fs; temperature in K.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import fused
from .units import FORCE_TO_ACCEL, KB, MVV_TO_EV

_HI, _LO = 2.0 ** 32, 2.0 ** 31
_UNIT, _UNIT6 = [1.0] * 3, [0.0] * 6   # the NPT pass's factors and strain rates where there is no barostat


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class Scratch:
    """Work arrays kept from step to step for the passes over the atoms, one per name.

    On the CPU a fresh tensor of megabytes is fresh pages from the kernel, zero-filled on first
    touch: at 256,000 atoms those page faults were most of the kinetic tensor's time (the (N, 6)
    float64 terms alone are 12 MB).  Arrays are allocated once, with head-room so that a rank's
    atom count moving with migrations does not allocate again, and handed out as views."""

    HEADROOM = 1.25

    def __init__(self):
        self._arrays: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A contiguous ``shape`` view of the array ``name`` (contents undefined)."""
        n = math.prod(shape)
        a = self._arrays.get(name)
        if a is None or a.numel() < n or a.dtype != dtype or a.device != device:
            a = torch.empty(int(n * self.HEADROOM) + 1, dtype=dtype, device=device)
            self._arrays[name] = a
        return a[:n].view(shape)


def exact_mv2_sum(velocities: torch.Tensor, masses: torch.Tensor, sum_fn: Callable,
                  scratch: Scratch | None = None, columns: bool = False) -> tuple[float, int]:
    """(sum over all ranks of m v^2 in eV, global atom count), independent of the decomposition.

    m v^2 (float64, >= 0) is split into floor(x 2^32) and round(frac 2^31) (the fraction is
    exact in float64, so only bits below 2^-63 eV are lost); both are summed as int64.
    velocities: (N, 3) Å/fs; masses: (N,) amu.  scratch: kept work arrays (default: fresh ones).

    columns: form v_x^2 + v_y^2 + v_z^2 as (a + b) + c on the columns instead of torch's sum
    over the rows of 3.  That reduction costs ~5 ms at 256,000 atoms on the CPU (an inner loop of
    3), the two column adds ~0.4 ms; torch's CPU sum adds such a row left to right, the same bits,
    which the caller checks on its data before it asks for this once (:func:`columns_sum_agrees`).
    With columns, on the CPU in float64, one fused pass makes the same words (integrators/fused.py)."""
    scratch = scratch or Scratch()
    v = velocities.double()
    n, dev = v.shape[0], v.device
    if columns and fused.usable(v, masses):   # the columns path in one pass (integrators/fused.py)
        part = scratch.get("mv2_part", (fused.chunks(n), 2), torch.int64, dev)
        return mv2_total(fused.mv2_words(v, masses, MVV_TO_EV, _HI, _LO, part), n, sum_fn)
    vv = torch.mul(v, v, out=scratch.get("vv", (n, 3), torch.float64, dev))
    x = scratch.get("x", (n,), torch.float64, dev)
    if columns:
        torch.add(vv[:, 0], vv[:, 1], out=x).add_(vv[:, 2])
    else:
        torch.sum(vv, 1, out=x)
    x = torch.mul(masses.double(), x, out=x).mul_(MVV_TO_EV).mul_(_HI)   # (m sum v^2) MVV_TO_EV 2^32
    hi = torch.floor(x, out=scratch.get("hi", (n,), torch.float64, dev))
    words = scratch.get("words", (2, n), torch.int64, dev)
    words[0].copy_(hi)                              # integral: the cast is exact
    words[1].copy_(x.sub_(hi).mul_(_LO).round_())   # round half to even, as torch.round
    local = torch.cat([words.sum(1), torch.tensor([n], dtype=torch.int64, device=dev)])
    tot = sum_fn(local).cpu().tolist()
    return (tot[0] + tot[1] / _LO) / _HI, int(tot[2])


def mv2_total(words: torch.Tensor, n: int, sum_fn: Callable) -> tuple[float, int]:
    """(sum over all ranks of m v^2 in eV, global atom count) from this rank's hi and lo words
    (``words[:2]``, int64) of ``n`` atoms: :func:`exact_mv2_sum`'s reduction, none on one process."""
    if sum_fn is _identity and words.is_cpu:   # numpy's view: no torch call (each costs ~10 us after a kernel)
        w = words.numpy()
        tot = [int(w[0]), int(w[1]), n]
    else:
        tot = sum_fn(torch.cat([words[:2], torch.tensor([n], dtype=torch.int64, device=words.device)])).cpu().tolist()
    return (tot[0] + tot[1] / _LO) / _HI, int(tot[2])


def columns_sum_agrees(velocities: torch.Tensor) -> bool:
    """True when (a + b) + c on the columns of v*v gives torch's row sum bit for bit on these
    velocities (N, 3) on the CPU (checked once, at set-up; else the row sum is kept)."""
    if velocities.device.type != "cpu":
        return False
    vv = velocities.double() * velocities.double()
    return torch.equal((vv[:, 0] + vv[:, 1]) + vv[:, 2], vv.sum(1))


def chain_inward(ed: list[float], edd: list[float], m: int, dt4: float, dt8: float) -> float:
    """fix_nh's chain update before the scaling (nhc_temp_integrate and nhc_press_integrate
    share it): links m-1 .. 1, then link 0 with its new force ``edd[0]``; ``ed`` has m + 1
    entries (the last 0). Returns link 0's exp factor, which :func:`chain_outward` reuses."""
    for i in range(m - 1, 0, -1):
        expfac = math.exp(-dt8 * ed[i + 1])
        ed[i] *= expfac
        ed[i] += edd[i] * dt4
        ed[i] *= expfac
    expfac = math.exp(-dt8 * ed[1])
    ed[0] *= expfac
    ed[0] += edd[0] * dt4
    ed[0] *= expfac
    return expfac


def chain_outward(ed: list[float], edd: list[float], q: list[float], m: int, kt: float, expfac: float,
                  dt4: float, dt8: float) -> None:
    """fix_nh's chain update after the scaling: link 0 (its force ``edd[0]`` recomputed by
    the caller), then links 1 .. m-1 with their forces from the link below (masses ``q``)."""
    ed[0] *= expfac
    ed[0] += edd[0] * dt4
    ed[0] *= expfac
    for i in range(1, m):
        expfac = math.exp(-dt8 * ed[i + 1])
        ed[i] *= expfac
        edd[i] = (q[i - 1] * ed[i - 1] * ed[i - 1] - kt) / q[i]
        ed[i] += edd[i] * dt4
        ed[i] *= expfac


class NoseHoover:
    name = "nose-hoover"
    conserves_momentum = True

    def __init__(self, dt: float, temperature: float, tdamp: float, chain: int = 3,
                 sum_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if not dt > 0:
            raise ValueError(f"dt must be > 0 fs, got {dt}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 K for nose-hoover, got {temperature}")
        if not tdamp > 0:
            raise ValueError(f"integrator.tdamp must be > 0 fs, got {tdamp}")
        if int(chain) < 1:
            raise ValueError(f"integrator.chain must be >= 1, got {chain}")
        self.dt = float(dt)
        self.temperature = float(temperature)
        self.tdamp = float(tdamp)
        self.chain = int(chain)
        self.sum_fn = sum_fn or _identity
        m = self.chain
        self.eta = [0.0] * m
        self.eta_dot = [0.0] * (m + 1)      # eta_dot[m] = 0 closes the chain (as fix_nh)
        self.eta_dotdot = [0.0] * m
        self.t_current: float | None = None  # carried from the last NHC; None until the first
        self.dof: int | None = None
        self._scratch = Scratch()            # per-atom work arrays of the kinetic sum, kept between steps
        self._columns: bool | None = None    # m v^2 by column adds (checked at the first use, per rank)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        return max(3 * n_atoms - 3, 1)

    # -- the chain ---------------------------------------------------------------------
    def measure(self, velocities, masses) -> None:
        """The current temperature (``t_current``, K) and ``dof`` from the velocities (N, 3) Å/fs
        and masses (N,) amu of every rank (NPT's iso barostat measures through it too)."""
        if self._columns is None:   # per rank: one that fails keeps torch's row sum, the same bits
            self._columns = columns_sum_agrees(velocities)
        self.measured(*exact_mv2_sum(velocities, masses, self.sum_fn, self._scratch, self._columns))

    def measured(self, mv2: float, n: int) -> None:
        """``t_current`` and ``dof`` from sum m v^2 (eV, :func:`exact_mv2_sum`) of ``n`` atoms."""
        self.dof = self.degrees_of_freedom(n)
        self.t_current = mv2 / (self.dof * KB)

    def _setup(self, velocities, masses) -> None:
        """fix_nh's setup(): temperature, masses and the upper links' forces."""
        self.measure(velocities, masses)
        self.set_up()

    def set_up(self) -> None:
        """fix_nh's setup() once the temperature is measured: the upper links' forces."""
        q = self._masses()
        kt = KB * self.temperature
        for i in range(1, self.chain):
            self.eta_dotdot[i] = (q[i - 1] * self.eta_dot[i - 1] ** 2 - kt) / q[i]

    def _masses(self) -> list[float]:
        w = 1.0 / self.tdamp
        kt_w2 = KB * self.temperature / (w * w)
        return [self.dof * kt_w2] + [kt_w2] * (self.chain - 1)

    def _nhc(self, velocities: torch.Tensor) -> None:
        """fix_nh's nhc_temp_integrate() (nc_tchain = 1, drag 0): half a step of the chain."""
        velocities.mul_(self.nhc_factor())

    def nhc_factor(self) -> float:
        """Half a step of the chain (:meth:`_nhc`) but the scaling of the velocities: the
        factor they are to be scaled by (integrators/batched.py scales many systems' at once)."""
        m, dt = self.chain, self.dt
        dthalf, dt4, dt8 = 0.5 * dt, 0.25 * dt, 0.125 * dt
        q = self._masses()
        kt = KB * self.temperature
        ke_target = self.dof * kt
        ed, edd, eta = self.eta_dot, self.eta_dotdot, self.eta
        kecurrent = self.dof * KB * self.t_current
        edd[0] = (kecurrent - ke_target) / q[0] if q[0] > 0 else 0.0
        expfac = chain_inward(ed, edd, m, dt4, dt8)
        factor = math.exp(-dthalf * ed[0])
        self.t_current *= factor * factor
        kecurrent = self.dof * KB * self.t_current
        edd[0] = (kecurrent - ke_target) / q[0] if q[0] > 0 else 0.0
        for i in range(m):
            eta[i] += dthalf * ed[i]
        chain_outward(ed, edd, q, m, kt, expfac, dt4, dt8)
        return factor

    # -- the step ------------------------------------------------------------------------
    def first_half(self, positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor,
                   masses: torch.Tensor, ids: torch.Tensor, step: int) -> None:
        """NHC(dt/2), half kick, drift; in place."""
        if self.t_current is None:
            self._setup(velocities, masses)
        if fused.usable(positions, velocities, forces, masses):   # one pass, the same bits (fused.py)
            fused.scale_kick_drift(positions, velocities, forces, masses, self.nhc_factor(),
                                   0.5 * self.dt * FORCE_TO_ACCEL, self.dt)
            return
        self._nhc(velocities)
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
        positions.add_(velocities, alpha=self.dt)

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        """Half kick, the temperature of the kicked velocities, NHC(dt/2); in place."""
        if not self._fused_second(velocities, forces, masses):
            velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
            self.measure(velocities, masses)
        self._nhc(velocities)

    def _fused_second(self, velocities, forces, masses) -> bool:
        """The kick and the measurement in one pass (fused.py's NPT pass with unit factors: x 1.0
        is exact), the same words as :meth:`measure`'s column sums; False where the torch path
        runs (not the CPU in float64, or a rank whose m v^2 keeps torch's row sum)."""
        if not self._columns or not fused.usable(velocities, forces, masses):   # _columns: set at set-up
            return False
        n = velocities.shape[0]
        part = self._scratch.get("half_part", (fused.chunks(n), 12), torch.int64, velocities.device)
        words = fused.kick_press_measure(velocities, forces, masses, 0.5 * self.dt * FORCE_TO_ACCEL, _UNIT, _UNIT6,
                                         0.0, False, False, (MVV_TO_EV * _HI, MVV_TO_EV, _HI, _LO), part)
        self.measured(*mv2_total(words, n, self.sum_fn))
        return True

    def conserved_energy(self) -> float:
        """The chain's energy (eV): sum Q eta_dot^2 / 2 + dof kT eta[0] + kT sum eta[1:]
        (fix_nh's compute_scalar for nvt); add K + U for the conserved quantity."""
        if self.dof is None:
            return 0.0
        q, kt = self._masses(), KB * self.temperature
        e = sum(0.5 * q[i] * self.eta_dot[i] ** 2 for i in range(self.chain))
        return e + self.dof * kt * self.eta[0] + kt * sum(self.eta[1:])

    def state_dict(self) -> dict:
        return {"name": self.name, "dt": self.dt, "temperature": self.temperature, "tdamp": self.tdamp,
                "chain": self.chain, "eta": list(self.eta), "eta_dot": list(self.eta_dot),
                "eta_dotdot": list(self.eta_dotdot), "t_current": self.t_current, "dof": self.dof}

    def load_state_dict(self, d: dict) -> None:
        """The chain of a checkpoint (same chain length); a state without one starts afresh."""
        if d.get("name") != self.name or int(d.get("chain", -1)) != self.chain or d.get("t_current") is None:
            return
        self.eta = [float(x) for x in d["eta"]]
        self.eta_dot = [float(x) for x in d["eta_dot"]]
        self.eta_dotdot = [float(x) for x in d["eta_dotdot"]]
        self.t_current = float(d["t_current"])
        self.dof = int(d["dof"])
