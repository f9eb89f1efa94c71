"""MD unit conversions for Å, eV, amu and fs (the engine's working units).

Velocities are in Å/fs, forces in eV/Å, masses in amu.  Derived from ``ase.units`` so the
engine and ASE agree to the last bit.
"""
from __future__ import annotations

from ase import units as _u

#: 1 fs expressed in ASE's time unit (Å sqrt(amu/eV) ~ 10.18 fs)
FS = _u.fs
#: acceleration of 1 eV/Å on 1 amu, in Å/fs^2  (F / m * FORCE_TO_ACCEL -> Å/fs^2)
FORCE_TO_ACCEL = FS**2
#: kinetic energy of 1 amu at 1 Å/fs, in eV  (0.5 * m * v^2 * MVV_TO_EV -> eV)
MVV_TO_EV = 1.0 / FS**2
#: Boltzmann constant in eV/K
KB = _u.kB
#: 1 eV/Å^3 in bar
EV_PER_A3_TO_BAR = 1.0 / _u.bar
#: ASE velocity (Å per ASE time unit) to Å/fs:  v_fs = v_ase * ASE_VEL_TO_A_PER_FS
ASE_VEL_TO_A_PER_FS = FS
