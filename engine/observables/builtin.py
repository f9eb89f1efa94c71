"""The built-in observables, as declarations the registry registers (engine/observables/registry.py).

kinetic tensor  sum m v (x) v                      (eV; per-rank partials, summed over ranks)
kinetic energy  K = 1/2 tr(sum m v (x) v)          (eV)
temperature     T = 2 K / (dof kB)                 (K); dof from the integrator (3N-3 NVE, 3N Langevin)
pressure tensor P = (sum m v (x) v + W) / V        (eV/Å^3), W = model virial = sum r_ij (x) f_ij
pressure        p = tr(P) / 3                      (eV/Å^3; the thermo table shows bar; None without a virial)
stress          sigma = -P                         (ASE's sign convention: positive = tensile)
conserved       K + U + E_coupling                 (eV); E_coupling: the energy a thermostat or
                barostat exchanged with the system, from the integrator (0 for NVE)
density         sum m / V                          (g/cm^3)
box lengths     (lx, ly, lz) of LAMMPS's prism     (Å): |a|, |a x b| / |a|, V / |a x b|

Only these two reductions cross ranks: the kinetic tensor (a sum) and, for the ``none``
observables, rank 0's potential energy and volume (the same on every rank); the rest derive
from them on every rank alike.  torch is imported when a value is computed, not here (``info``
and ``plot`` read the declarations without it).
"""
from __future__ import annotations

from ase.units import _amu

from shardmd.integrators.units import EV_PER_A3_TO_BAR, KB

#: 1 amu/Å^3 in g/cm^3 (1 Å^3 = 1e-24 cm^3)
AMU_PER_A3_TO_G_PER_CM3 = _amu * 1e3 / 1e-24


def kinetic_tensor(velocities, masses):
    """(3, 3) sum m v (x) v in eV of torch tensors, summed in float64."""
    from shardmd.integrators.units import MVV_TO_EV

    v = velocities.double()
    return (masses.double()[:, None, None] * v[:, :, None] * v[:, None, :]).sum(0) * MVV_TO_EV


def _kinetic_tensor(view):
    return kinetic_tensor(view.tensor("velocities"), view.tensor("masses"))


def _volume(view):
    from shardmd.domain.cell import volume

    return float(volume(view.tensor("cell").double()))


def _kinetic_energy(view):
    import torch

    return 0.5 * float(torch.trace(torch.as_tensor(view.values["kinetic_tensor"])))


def _temperature(view):
    ke = view.values["kinetic_energy"]
    return 2.0 * ke / (view.dof * KB) if view.dof > 0 else 0.0


def _pressure_tensor(view):
    """(kt + W) / V (a torch tensor), None without a virial."""
    w = view.tensor("virial")
    if w is None:   # a model without a virial: no pressure, no stress (absent, not zero)
        return None
    import torch

    kt = torch.as_tensor(view.values["kinetic_tensor"])
    return (kt + w.to(kt.device).double()) / view.values["volume"]


def _pressure(view):
    import torch

    p = _pressure_tensor(view)
    return None if p is None else float(torch.trace(p)) / 3.0


def _stress(view):
    p = _pressure_tensor(view)
    return None if p is None else (-p).cpu().numpy()


def _box_lengths(view):
    """(lx, ly, lz) Å of the cell rotated into LAMMPS's prism (a along x, b in the xy plane):
    LAMMPS's xprd, yprd, zprd; the box edges of an orthorhombic cell."""
    import numpy as np

    a, b, c = view.cell
    ab = float(np.linalg.norm(np.cross(a, b)))
    la = float(np.linalg.norm(a))
    return np.array([la, ab / la if la else 0.0, abs(float(np.dot(np.cross(a, b), c))) / ab if ab else 0.0])


#: keyword arguments of register_observable, in dependency order; ``order``: the place in the
#: trajectory and plot (energies first), ``column`` in the thermo table (Temp PotEng KinEng TotEng
#: Press Volume)
DECLARATIONS = [
    dict(name="kinetic_tensor", compute=_kinetic_tensor, unit="eV", reduce="sum", when=(), shape=(3, 3),
         plot="", order=9, description="sum m v (x) v over the atoms"),
    dict(name="potential_energy", compute=lambda view: float(view.potential_energy), unit="eV", reduce="none",
         header="PotEng(eV)", fmt="{:>15.6f}", plot="energy (eV)", order=1,
         description="the model's energy of the system"),
    dict(name="volume", compute=_volume, unit="Å^3", h5md_unit="Angstrom+3", reduce="none", when=("thermo",),
         header="Volume(A3)", fmt="{:>13.2f}", order=6, description="the cell's volume"),
    dict(name="kinetic_energy", compute=_kinetic_energy, unit="eV", reduce="derived", depends=("kinetic_tensor",),
         header="KinEng(eV)", fmt="{:>13.6f}", plot="energy (eV)", order=2, description="1/2 sum m v^2"),
    dict(name="total_energy", compute=lambda view: view.values["potential_energy"] + view.values["kinetic_energy"],
         unit="eV", reduce="derived", depends=("potential_energy", "kinetic_energy"), header="TotEng(eV)",
         fmt="{:>15.6f}", plot="energy (eV)", order=3, description="potential + kinetic energy"),
    dict(name="temperature", compute=_temperature, unit="K", reduce="derived", depends=("kinetic_energy",),
         header="Temp(K)", fmt="{:>11.3f}", plot="temperature (K)", order=4, column=0.5, description="2 K / (dof kB)"),
    dict(name="pressure", compute=_pressure, unit="eV/Å^3", h5md_unit="eV Angstrom-3", reduce="derived",
         depends=("kinetic_tensor", "volume"), header="Press(bar)", fmt="{:>12.3f}", scale=EV_PER_A3_TO_BAR,
         shown_unit="bar", plot="pressure (bar)", order=5,
         description="tr(sum m v (x) v + W) / 3V (none without the model's virial W)"),
    dict(name="stress", compute=_stress, unit="eV/Å^3", h5md_unit="eV Angstrom-3", reduce="derived",
         depends=("kinetic_tensor", "volume"), when=("trajectory",), shape=(3, 3), plot="", order=7,
         description="-(sum m v (x) v + W) / V (ASE's sign: positive = tensile)"),
    dict(name="conserved_energy", compute=lambda view: view.values["total_energy"] + view.coupling_energy,
         unit="eV", reduce="derived", depends=("total_energy",), when=("trajectory",), header="Conserved(eV)",
         fmt="{:>15.6f}", plot="conserved energy (eV)", order=3.5,
         description="total energy + the energy the thermostat/barostat exchanged (the integrator's "
                     "conserved quantity; the total energy under verlet)"),
    dict(name="total_mass", compute=lambda view: view.masses.sum(), unit="amu", reduce="sum", when=(), plot="",
         order=10, description="sum of the atoms' masses"),
    dict(name="density", compute=lambda view: view.values["total_mass"] / view.values["volume"]
         * AMU_PER_A3_TO_G_PER_CM3 if view.values["volume"] > 0 else None, unit="g/cm^3",
         h5md_unit="g cm-3", reduce="derived", depends=("total_mass", "volume"), when=(), header="Density(g/cm3)",
         fmt="{:>14.6f}", plot="", order=11, description="total mass / volume"),
    dict(name="box_lengths", compute=_box_lengths, unit="Å", h5md_unit="Angstrom", reduce="derived", when=(),
         shape=(3,), plot="", order=12, description="lx, ly, lz of the cell in LAMMPS's prism (xprd, yprd, zprd)"),
    # H5MD has no place for the frame interval; MDAnalysis's H5MD reader takes its ``dt`` from an
    # observable of this name (else it assumes 1 ps: a diffusion coefficient 1/dt off)
    dict(name="dt", compute=lambda view: view.frame_interval / 1000.0, unit="ps", reduce="derived",
         when=("trajectory",), plot="", order=8,
         description="time between trajectory frames, trajectory.every x dt (MDAnalysis's dt)"),
]
