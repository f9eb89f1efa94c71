"""Thermodynamic observables from the state and the model's virial.

kinetic energy  K = 1/2 sum m v^2                  (eV)
temperature     T = 2 K / (dof kB)                 (K); dof from the integrator (3N-3 NVE, 3N Langevin)
pressure tensor P = (sum m v (x) v + W) / V        (eV/Å^3), W = model virial = sum r_ij (x) f_ij
pressure        p = tr(P) / 3                      (eV/Å^3; the thermo table shows bar; None without a virial)
stress          sigma = -P                         (ASE's sign convention: positive = tensile)
"""
from __future__ import annotations

import torch

from shardmd.domain.cell import volume
from shardmd.integrators.units import KB, MVV_TO_EV


def kinetic_tensor(velocities: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """(3, 3) sum m v (x) v in eV, summed in float64."""
    v = velocities.double()
    return (masses.double()[:, None, None] * v[:, :, None] * v[:, None, :]).sum(0) * MVV_TO_EV


def thermo(velocities, masses, cell, potential_energy, virial, dof: int) -> dict[str, object]:
    """Observables for the thermo table and the trajectory (floats and a (3,3) stress)."""
    return thermo_from(kinetic_tensor(velocities, masses), cell, potential_energy, virial, dof)


def thermo_from(kt: torch.Tensor, cell, potential_energy, virial, dof: int) -> dict[str, object]:
    """Observables from the (already reduced) kinetic tensor ``kt`` (3, 3) eV; ``virial`` None
    (a model without one) gives ``pressure`` and ``stress`` None."""
    ke = 0.5 * float(torch.trace(kt))
    vol = float(volume(cell.double()))
    pe = float(potential_energy)
    if virial is None:   # a model without a virial: no pressure, no stress (absent, not zero)
        pressure = stress = None
    else:
        ptensor = (kt + virial.to(kt.device).double()) / vol
        pressure, stress = float(torch.trace(ptensor)) / 3.0, (-ptensor).cpu().numpy()
    return {
        "potential_energy": pe,
        "kinetic_energy": ke,
        "total_energy": pe + ke,
        "temperature": 2.0 * ke / (dof * KB) if dof > 0 else 0.0,
        "pressure": pressure,
        "stress": stress,
        "volume": vol,
    }
