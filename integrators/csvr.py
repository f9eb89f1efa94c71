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
from .random import STREAM_CSVR, gaussian_noise, philox4x32
from .units import FORCE_TO_ACCEL, KB

_BATCH = 8   # Marsaglia-Tsang candidates drawn at a time (each accepted with p > 0.95)


def _uniforms(seed: int, step: int, stream: int, ids: torch.Tensor) -> torch.Tensor:
    """(n,) uniforms in (0, 1] from the first Philox word, same counter layout as gaussian_noise."""
    ctr = torch.empty(ids.shape[0], 4, dtype=torch.int64)
    ctr[:, 0] = ids & 0xFFFFFFFF
    ctr[:, 1] = (ids >> 32) & 0xFFFFFFFF
    ctr[:, 2] = step & 0xFFFFFFFF
    ctr[:, 3] = (stream << 16) | ((step >> 32) & 0xFFFF)
    w = philox4x32(ctr, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    return (w[:, 0].to(torch.float64) + 1.0) * (1.0 / 4294967296.0)


def gamma_draw(shape: float, seed: int, step: int, stream: int) -> float:
    """One Gamma(shape, 1) number (shape >= 1), Marsaglia & Tsang (2000), counter-based."""
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    start = 1
    while True:
        ids = torch.arange(start, start + _BATCH, dtype=torch.int64)
        xs = gaussian_noise(seed, step, stream, ids)[:, 0].tolist()
        us = _uniforms(seed, step, stream, ids + (1 << 32)).tolist()
        for x, u in zip(xs, us):
            v = 1.0 + c * x
            if v <= 0.0:
                continue
            v = v * v * v
            if math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
                return d * v
        start += _BATCH


def resample_kinetic(kk: float, sigma: float, ndeg: int, taut: float, seed: int, step: int,
                     stream: int = STREAM_CSVR) -> float:
    """The new kinetic energy: Bussi's ``resamplekin(kk, sigma, ndeg, taut)``; taut in steps."""
    factor = math.exp(-1.0 / taut) if taut > 0.1 else 0.0
    z = gaussian_noise(seed, step, stream, torch.zeros(1, dtype=torch.int64))[0].tolist()
    rr = z[0]
    nn = ndeg - 1
    if nn < 2 + 1e-4:   # GROMACS: a few squared normals; else 2 Gamma(nn/2)
        s = sum(g * g for g in z[1:1 + max(round(nn), 0)])
    else:
        s = 2.0 * gamma_draw(0.5 * nn, seed, step, stream)
    return (kk + (1.0 - factor) * (sigma * (s + rr * rr) / ndeg - kk)
            + 2.0 * rr * math.sqrt(kk * sigma / ndeg * (1.0 - factor) * factor))


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
        ndeg = self.degrees_of_freedom(n)
        sigma = 0.5 * ndeg * KB * self.temperature
        new = resample_kinetic(kk, sigma, ndeg, self.tau / self.dt, self.seed, step)
        alpha = math.sqrt(max(new, 0.0) / kk)
        self.energy_change += new - kk
        return alpha

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
