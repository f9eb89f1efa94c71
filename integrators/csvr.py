"""Stochastic velocity rescaling (CSVR; Bussi, Donadio & Parrinello, J. Chem. Phys. 126,
014101 (2007)), around velocity Verlet.

One step:  K -> K' (exact resampling over dt, below),  v *= sqrt(K'/K),
           v += dt/2 F/m,  x += dt v  -- forces --  v += dt/2 F/m

The kinetic energy is resampled exactly as in the authors' reference code and GROMACS's
``vrescale_resamplekin`` (c = exp(-dt/tau), Kt = dof kT/2 the target, R a standard normal,
S the sum of dof - 1 squared standard normals):

    K' = K + (1 - c) (Kt (S + R^2) / dof - K) + 2 R sqrt(K Kt / dof (1 - c) c)

S is drawn as a sum of squared normals for dof - 1 < 2 and otherwise as 2 Gamma((dof - 1)/2)
(Marsaglia & Tsang's exact method), as GROMACS does.  All draws come from the counter-based
Philox generator keyed by (seed, step, STREAM_CSVR): one scalar draw set per step, the same
on every rank, with "ids" that number the draws (0: R and the small-dof normals; 1, 2, ...:
Marsaglia-Tsang candidates, their uniforms at ids 2^32 + k).  K is the exact (integer
fixed-point) global sum of integrators/nose_hoover.py, so the scale factor, and the
trajectory, do not depend on the decomposition.  Nothing to checkpoint but the seed and
the step; ``energy_change`` (the kinetic energy the thermostat put in, eV, for the
conserved quantity) is reported in the state dict.

dof = 3N - 3 (a uniform scaling keeps zero total momentum zero).  Units: Å, Å/fs, eV/Å,
amu, fs; ``tau`` in fs; temperature in K.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .nose_hoover import Scratch, _identity, columns_sum_agrees, exact_mv2_sum
from .random import STREAM_CSVR, gaussian_noise, gaussian_noise_keyed, philox4x32
from .units import FORCE_TO_ACCEL, KB

_BATCH = 8   # Marsaglia-Tsang candidates drawn at a time (each accepted with p > 0.95)


def _uniforms(seed, step, stream: int, ids: torch.Tensor) -> torch.Tensor:
    """(n,) uniforms in (0, 1] from the first Philox word, same counter layout as gaussian_noise;
    ``seed`` and ``step`` ints, or (n,) int64 tensors (a system's per row, its own bits)."""
    ctr = torch.empty(ids.shape[0], 4, dtype=torch.int64)
    ctr[:, 0] = ids & 0xFFFFFFFF
    ctr[:, 1] = (ids >> 32) & 0xFFFFFFFF
    ctr[:, 2] = step & 0xFFFFFFFF
    ctr[:, 3] = (stream << 16) | ((step >> 32) & 0xFFFF)
    w = philox4x32(ctr, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    return (w[:, 0].to(torch.float64) + 1.0) * (1.0 / 4294967296.0)


def _accept(shape: float, xs: list[float], us: list[float]) -> float | None:
    """The first Marsaglia-Tsang candidate (normal x, uniform u) accepted for Gamma(shape), or None."""
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    for x, u in zip(xs, us):
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        if math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v
    return None


def gamma_draw(shape: float, seed: int, step: int, stream: int) -> float:
    """One Gamma(shape, 1) number (shape >= 1), Marsaglia & Tsang (2000), counter-based."""
    start = 1
    while True:
        ids = torch.arange(start, start + _BATCH, dtype=torch.int64)
        xs = gaussian_noise(seed, step, stream, ids)[:, 0].tolist()
        us = _uniforms(seed, step, stream, ids + (1 << 32)).tolist()
        g = _accept(shape, xs, us)
        if g is not None:
            return g
        start += _BATCH


def _resampled(kk: float, sigma: float, ndeg: int, taut: float, rr: float, s: float) -> float:
    factor = math.exp(-1.0 / taut) if taut > 0.1 else 0.0
    return (kk + (1.0 - factor) * (sigma * (s + rr * rr) / ndeg - kk)
            + 2.0 * rr * math.sqrt(kk * sigma / ndeg * (1.0 - factor) * factor))


def _squares(z: list[float], nn: float) -> float:
    """GROMACS's few squared normals for nn = dof - 1 < 2."""
    return sum(g * g for g in z[1:1 + max(round(nn), 0)])


def resample_kinetic(kk: float, sigma: float, ndeg: int, taut: float, seed: int, step: int,
                     stream: int = STREAM_CSVR) -> float:
    """The new kinetic energy: Bussi's ``resamplekin(kk, sigma, ndeg, taut)``; taut in steps."""
    z = gaussian_noise(seed, step, stream, torch.zeros(1, dtype=torch.int64))[0].tolist()
    nn = ndeg - 1
    s = _squares(z, nn) if nn < 2 + 1e-4 else 2.0 * gamma_draw(0.5 * nn, seed, step, stream)
    return _resampled(kk, sigma, ndeg, taut, z[0], s)


def resample_kinetic_many(kks: list[float], sigmas: list[float], ndegs: list[int], tauts: list[float],
                          seeds: list[int], steps: list[int], stream: int = STREAM_CSVR) -> list[float]:
    """:func:`resample_kinetic` for many systems, each its own bits: the draws of all of them in
    two Philox passes (keyed per row) instead of ~1 ms of small tensor calls per system; a system
    whose first Marsaglia-Tsang candidates all fail (p < 1e-10) falls back to its own loop."""
    n = len(kks)
    sd, st = torch.tensor(seeds, dtype=torch.int64), torch.tensor(steps, dtype=torch.int64)
    z = gaussian_noise_keyed(sd, st, stream, torch.zeros(n, dtype=torch.int64)).tolist()
    big = [k for k in range(n) if ndegs[k] - 1 >= 2 + 1e-4]
    xs = us = []
    if big:
        rows = torch.tensor(big, dtype=torch.int64).repeat_interleave(_BATCH)
        ids = torch.arange(1, 1 + _BATCH, dtype=torch.int64).repeat(len(big))
        xs = gaussian_noise_keyed(sd[rows], st[rows], stream, ids)[:, 0].tolist()
        us = _uniforms(sd[rows], st[rows], stream, ids + (1 << 32)).tolist()
    out, j = [], 0
    for k in range(n):
        nn = ndegs[k] - 1
        if nn < 2 + 1e-4:
            s = _squares(z[k], nn)
        else:
            g = _accept(0.5 * nn, xs[j * _BATCH:(j + 1) * _BATCH], us[j * _BATCH:(j + 1) * _BATCH])
            s = 2.0 * (g if g is not None else gamma_draw(0.5 * nn, seeds[k], steps[k], stream))
            j += 1
        out.append(_resampled(kks[k], sigmas[k], ndegs[k], tauts[k], z[k][0], s))
    return out


def csvr_factors(thermostats: list, mv2s: list[float], ns: list[int], steps: list[int]) -> list[float]:
    """Each :class:`CSVR`'s :meth:`CSVR.factor` (its energy change counted), the draws of all
    in one pass (engine/batch/joined.py: many systems' thermostats at one step)."""
    live = [k for k, mv2 in enumerate(mv2s) if 0.5 * mv2 > 0.0]
    out = [1.0] * len(thermostats)
    if not live:
        return out
    kks = [0.5 * mv2s[k] for k in live]
    sigmas, ndegs, tauts = zip(*(thermostats[k]._target(ns[k]) for k in live))
    new = resample_kinetic_many(kks, list(sigmas), list(ndegs), list(tauts), [thermostats[k].seed for k in live],
                                [int(steps[k]) for k in live])
    for k, kk, knew in zip(live, kks, new):
        out[k] = thermostats[k]._scaled(kk, knew)
    return out


class CSVR:
    name = "csvr"
    conserves_momentum = True

    def __init__(self, dt: float, temperature: float, tau: float, seed: int,
                 sum_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if not dt > 0:
            raise ValueError(f"dt must be > 0 fs, got {dt}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 K, got {temperature}")
        if not tau >= 0:
            raise ValueError(f"integrator.tau must be >= 0 fs, got {tau}")
        self.dt = float(dt)
        self.temperature = float(temperature)
        self.tau = float(tau)
        self.seed = int(seed)
        self.sum_fn = sum_fn or _identity
        self.energy_change = 0.0
        self._scratch = Scratch()            # per-atom work arrays of the kinetic sum, kept between steps
        self._columns: bool | None = None    # m v^2 by column adds (checked at the first use, per rank)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        return max(3 * n_atoms - 3, 1)

    def rescale(self, velocities: torch.Tensor, masses: torch.Tensor, step: int) -> float:
        """Resample the kinetic energy over dt and scale the velocities to it; returns the factor."""
        if self._columns is None:   # as NoseHoover.measure: the row sum's bits, without its ~5 ms at 256k atoms
            self._columns = columns_sum_agrees(velocities)
        alpha = self.factor(*exact_mv2_sum(velocities, masses, self.sum_fn, self._scratch, self._columns), step)
        if alpha != 1.0:
            velocities.mul_(alpha)
        return alpha

    def factor(self, mv2: float, n: int, step: int) -> float:
        """The scale factor of :meth:`rescale` from sum m v^2 (eV) of ``n`` atoms at ``step``
        (its energy change counted); 1.0 when there is no kinetic energy to scale
        (integrators/batched.py scales many systems' velocities at once)."""
        kk = 0.5 * mv2
        if not kk > 0.0:
            return 1.0
        return self._scaled(kk, resample_kinetic(kk, *self._target(n), self.seed, step))

    def _target(self, n: int) -> tuple[float, int, float]:
        """(sigma = dof kT/2 eV, dof, tau in steps) of ``n`` atoms: resample_kinetic's arguments."""
        ndeg = self.degrees_of_freedom(n)
        return 0.5 * ndeg * KB * self.temperature, ndeg, self.tau / self.dt

    def _scaled(self, kk: float, new: float) -> float:
        """The velocity factor taking kinetic energy ``kk`` to ``new`` (eV), the change counted."""
        self.energy_change += new - kk
        return math.sqrt(max(new, 0.0) / kk)

    def first_half(self, positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor,
                   masses: torch.Tensor, ids: torch.Tensor, step: int) -> None:
        """Rescale (keyed by ``step``), half kick, drift; in place."""
        self.rescale(velocities, masses, step)
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
        positions.add_(velocities, alpha=self.dt)

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)

    def conserved_energy(self) -> float:
        """-(kinetic energy the thermostat put in), eV; add K + U for the conserved quantity."""
        return -self.energy_change

    def state_dict(self) -> dict:
        return {"name": self.name, "dt": self.dt, "temperature": self.temperature, "tau": self.tau,
                "seed": self.seed, "energy_change": self.energy_change}

    def load_state_dict(self, d: dict) -> None:
        if d.get("name") == self.name:
            self.energy_change = float(d.get("energy_change", 0.0))
