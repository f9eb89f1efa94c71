"""NPT: Martyna-Tobias-Klein barostat with Nosé-Hoover chains, as LAMMPS's ``fix npt`` integrates
them (src/fix_nh.cpp; Shinoda, Shiga & Mikami, PRB 69, 134103 (2004); Tuckerman et al., J. Phys.
A 39, 5629 (2006)).  Defaults as fix npt's: tchain = pchain = 3, tloop = ploop = 1, mtk yes,
drag 0, dilate all, no deviatoric (target stress hydrostatic), ``couple`` iso / aniso / tri, or
x / y / z / xy: fix npt's x, y, z keywords (xy: ``couple xy``), the other axes fixed, in an
orthorhombic cell, where their deviatoric force is zero (docs/design.md).

One step (fix_nh's initial_integrate / final_integrate, the same order):

    initial:  NHC_p(dt/2)                barostat's chain, scales omega_dot
              NHC_t(dt/2)                thermostat chain (integrators/nose_hoover.py), scales v
              P = (K_ab + W_ab) / V      K of these velocities (*), W the virial of the current forces
              omega_dot(dt/2)            nh_omega_dot
              v: nh_v_press(dt/2)        v_a *= exp(-dt/4 (omega_dot_a + mtk2)) twice, tri coupling between
              v += dt/2 F/m
              remap(dt/2), x += dt v, remap(dt/2)     h_dot = omega_dot h; atoms move with h (x h^-1 kept)
    -- forces and virial at the new positions and cell --
    final:    v += dt/2 F/m,  nh_v_press(dt/2),  T and P measured,  omega_dot(dt/2),
              NHC_t(dt/2), NHC_p(dt/2)

(*) fix_nh sums the kinetic energy again after the chain's scaling; we scale the carried sum by
the chain's factor squared instead (equal to round-off: 1e-12 Å against LAMMPS after 100 steps),
so a step has one global sum of the kinetic energy, as NVT, not two.

Equations (Voigt order of fix_nh: xx yy zz yz xz xy; i < 3 the diagonal, i >= 3 the tilts):

    omega_dot_i += dt/2 [ (P_i - P_hydro) V / W_i + mtk1 / W_i ]     (i < 3, barostatted)
    omega_dot_i += dt/2 P_i V / W_i                                  (tri: i >= 3, target 0)
    mtk1 = sum_a K_aa / (pdim N)        (iso: dof kB T_current / (pdim N), T carried by the chain)
    mtk2 = sum_{i<3} omega_dot_i / (pdim N)
    W_i  = (N + 1) kB T / pfreq^2,  pfreq = 1 / pdamp
    Q_p[k] = kB T / pfreq^2 (the barostat's chain, pchain links; its target kinetic energy is kB T
             for iso and (barostatted dof) kB T otherwise, as fix_nh's nhc_press_integrate)
    h (upper-triangular in LAMMPS: xprd yprd zprd yz xz xy) advanced by exp(dt/2 omega_dot)
    per diagonal element, the tilts by fix_nh's symmetric split (remap()).

The pressure is the one fix npt computes with the thermostat's temperature: K_ab = sum m v_a v_b
(eV) of the velocities at that moment (the global exact fixed-point sum of nose_hoover.py, the
same bits on any decomposition), W_ab the model's virial (eV, global), V the cell volume.  iso
takes tr(K + W) / 3V; aniso and tri the diagonal (and tri the off-diagonal) components.

Cells (rows = lattice vectors, ``x = f @ cell``): LAMMPS's h in our row form is
``[[xprd, 0, 0], [xy, yprd, 0], [xz, yz, zprd]]``.  iso scales any cell uniformly (what LAMMPS
does to a triclinic box with its default tilt scaling); aniso and tri need the LAMMPS form
(lower-triangular rows: a along x, b in the xy plane), refused otherwise.  The cell's origin is
the fixed point of the dilation (LAMMPS dilates about the box centre: the same motion up to a
translation of everything).  Positions are remapped as ``x' = x h_old^-1 h_new``, unwrapped or
not (the images scale with the cell), so fractional coordinates are kept by the remap.

Variables (units):

    ============== ============ ===============================================
    pressure       eV/Å^3       target (the config gives bar; the engine converts)
    pdamp, tdamp   fs           LAMMPS's Pdamp, Tdamp
    omega_dot      1/fs         strain rates (Voigt, 6)
    omega          1            log-strain bookkeeping (not used by the dynamics)
    W (omega_mass) eV fs^2      barostat masses
    etap, etap_dot 1, 1/fs      barostat chain
    cell           Å            (3, 3) rows; replaced (a new tensor) by each remap
    virial         eV           (3, 3) global, set by the engine after every force call
    ============== ============ ===============================================

The engine hands the integrator the cell (``cell``) and the virial (``virial``) before each
half step and takes the new cell back after :meth:`first_half`.  All barostat variables are
Python floats, identical on every rank (they depend only on exact global sums and the global
virial).  :meth:`state_dict` / :meth:`load_state_dict` carry them (and the chain's) for bit-exact
restarts.  Units: Å, Å/fs, eV/Å, amu, fs, K.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from . import fused
from .kinetic_tensor import exact_kinetic_tensor
from .mat3 import det3
from .nose_hoover import _HI, _LO, NoseHoover, Scratch, _identity, chain_inward, chain_outward, mv2_total
from .npt_box import remap_rows
from .units import FORCE_TO_ACCEL, KB, MVV_TO_EV

#: couple -> the barostatted components (Voigt xx yy zz yz xz xy); x, y, z and xy hold the other
#: axes fixed, as fix npt's ``x``/``y``/``z`` keywords (xy: ``x P P d y P P d couple xy``)
COUPLINGS = {"iso": (1, 1, 1, 0, 0, 0), "aniso": (1, 1, 1, 0, 0, 0), "tri": (1, 1, 1, 1, 1, 1),
             "x": (1, 0, 0, 0, 0, 0), "y": (0, 1, 0, 0, 0, 0), "z": (0, 0, 1, 0, 0, 0), "xy": (1, 1, 0, 0, 0, 0)}


class NPT:
    name = "npt"
    conserves_momentum = True
    barostat = True   # the engine hands over the cell and the virial

    def __init__(self, dt: float, temperature: float, pressure: float, tdamp: float, pdamp: float,
                 couple: str = "iso", chain: int = 3, pchain: int = 3,
                 sum_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """pressure: eV/Å^3; tdamp, pdamp: fs; temperature: K."""
        if couple not in COUPLINGS:
            raise ValueError(f"integrator.couple={couple!r}: use iso, aniso, tri, x, y, z or xy")
        if not pdamp > 0:
            raise ValueError(f"integrator.pdamp must be > 0 fs, got {pdamp}")
        if int(pchain) < 0:
            raise ValueError(f"integrator.pchain must be >= 0, got {pchain}")
        if not math.isfinite(pressure):
            raise ValueError(f"integrator.pressure must be a finite number, got {pressure}")
        self.thermostat = NoseHoover(dt, temperature, tdamp, chain, sum_fn)
        self.dt = float(dt)
        self.temperature = float(temperature)
        self.pressure = float(pressure)
        self.tdamp, self.pdamp = float(tdamp), float(pdamp)
        self.couple = couple
        self.pchain = int(pchain)
        self.sum_fn = sum_fn or _identity
        self.pstyle = couple if couple in ("iso", "tri") else "aniso"   # fix_nh's pstyle
        self.p_flag = list(COUPLINGS[couple])
        self.pdim = sum(self.p_flag[:3])
        self.p_freq = [1.0 / self.pdamp if f else 0.0 for f in self.p_flag]
        self.p_freq_max = max(self.p_freq)
        self.p_target = [self.pressure] * 3 + [0.0] * 3
        self.p_hydro = self.pressure
        self.omega = [0.0] * 6
        self.omega_dot = [0.0] * 6
        self.omega_mass = [0.0] * 6
        m = self.pchain
        self.etap = [0.0] * m
        self.etap_dot = [0.0] * (m + 1)
        self.etap_dotdot = [0.0] * m
        self.etap_mass = [0.0] * m
        self.mtk_term1 = self.mtk_term2 = 0.0
        self.p_current = [0.0] * 6
        self.n_atoms: int | None = None   # global; set at the first step
        self.vol0: float | None = None
        self.cell: torch.Tensor | None = None     # (3, 3) Å, set by the engine
        self.virial: torch.Tensor | None = None   # (3, 3) eV global, set by the engine
        self._mvv: list[float] | None = None      # aniso, tri: the kinetic tensor carried (eV)
        self._scratch = Scratch()                 # per-atom work arrays, kept between steps
        self._cell_seen = self._cell_rows = self._vol = None   # _rows()'s cache of self.cell
        self._cell_version = -1                   # and that tensor's version counter (in-place writes)
        self._part: torch.Tensor | None = None    # _fused_second's partial sums (a view of a scratch array)

    def degrees_of_freedom(self, n_atoms: int) -> int:
        return max(3 * n_atoms - 3, 1)

    # -- pressure -----------------------------------------------------------------------
    def _rows(self) -> list[list[float]]:
        """``self.cell`` as Python floats (float64), read from the tensor once per new cell."""
        if self.cell is not self._cell_seen or self.cell._version != self._cell_version:
            self._cell_rows = self.cell.tolist()   # float32's values are exact as Python floats
            self._cell_seen, self._vol = self.cell, abs(det3(self._cell_rows))
            self._cell_version = self.cell._version
        return self._cell_rows

    def _volume(self) -> float:
        self._rows()
        return self._vol

    def _pressure(self, mvv: list[float] | float) -> None:
        """fix_nh's compute pressure (scalar for iso, vector otherwise) and couple(), from the
        kinetic energy ``mvv`` (eV): iso sum m v^2, else the tensor (xx yy zz xy xz yz)."""
        if self.virial is None:
            raise ValueError("integrator=npt needs the model's virial")
        w = self.virial.tolist()   # Python floats: float32's exactly, as .double() would give
        vol = self._volume()
        if self.pstyle == "iso":
            p = (mvv + w[0][0] + w[1][1] + w[2][2]) / 3.0 / vol
            self.p_current[0] = self.p_current[1] = self.p_current[2] = p
            return
        k = mvv
        t = [(k[0] + w[0][0]) / vol, (k[1] + w[1][1]) / vol, (k[2] + w[2][2]) / vol,
             (k[3] + w[0][1]) / vol, (k[4] + w[0][2]) / vol, (k[5] + w[1][2]) / vol]
        self.p_current[0], self.p_current[1], self.p_current[2] = t[0], t[1], t[2]
        if self.couple == "xy":   # fix_nh's couple(), pcouple XY
            self.p_current[0] = self.p_current[1] = 0.5 * (t[0] + t[1])
        if self.pstyle == "tri":   # LAMMPS's xy xz yz -> Voigt yz xz xy
            self.p_current[3], self.p_current[4], self.p_current[5] = t[5], t[4], t[3]
        if not all(math.isfinite(x) for x in self.p_current):
            raise ValueError("non-numeric pressure: the run is unstable (reduce dt or raise pdamp)")

    def _chain(self, velocities) -> None:
        """The thermostat chain's half step (nose_hoover.py's nhc_temp_integrate), in place."""
        factor = self._chain_factor()
        if fused.usable(velocities):   # a Warp pass: the same bits as mul_, a fraction of its dispatch
            fused.scale(velocities, factor)
            return
        velocities.mul_(factor)

    def _chain_factor(self) -> float:
        """The chain's half step but the scaling of the velocities: the factor they are to be
        scaled by; the carried kinetic tensor (aniso, tri) is scaled by the factor squared."""
        th = self.thermostat
        t0 = th.t_current
        factor = th.nhc_factor()
        if self._mvv is not None and t0:
            scale = th.t_current / t0
            self._mvv = [k * scale for k in self._mvv]
        return factor

    def _measure(self, velocities, masses) -> None:
        """The kinetic energy after the half kick and nh_v_press, in one global sum: the chain's
        temperature, and (aniso, tri) the tensor the pressure and mtk1 use."""
        th = self.thermostat
        if self.pstyle == "iso":
            th.measure(velocities, masses)   # m v^2 by column adds in kept arrays (nose_hoover.py)
            return
        self._mvv = exact_kinetic_tensor(velocities, masses, self.sum_fn, self._scratch)
        th.t_current = (self._mvv[0] + self._mvv[1] + self._mvv[2]) / (th.dof * KB)

    # -- set-up -------------------------------------------------------------------------------
    def _setup(self, velocities, masses) -> None:
        """fix_nh's setup(): T, the masses, the chains' initial forces."""
        th = self.thermostat
        th._setup(velocities, masses)
        self.n_atoms = (th.dof + 3) // 3   # dof = 3N - 3 (1 for a single atom)
        if self.pstyle != "iso":
            self._mvv = exact_kinetic_tensor(velocities, masses, self.sum_fn, self._scratch)
        self.check_cell(self.cell)
        if self.vol0 is None:
            self.vol0 = self._volume()
        kt = KB * self.temperature
        self._set_masses()
        if self.pchain:
            for i in range(1, self.pchain):
                self.etap_dotdot[i] = (self.etap_mass[i - 1] * self.etap_dot[i - 1] ** 2 - kt) / self.etap_mass[i]

    def _set_masses(self) -> None:
        """fix_nh's barostat masses: W = (N + 1) kT / pfreq^2 per driven component, the
        barostat chain's kT / pfreq_max^2 (set up and again on a restart)."""
        kt = KB * self.temperature
        nkt = (self.n_atoms + 1) * kt
        for i in range(6):
            if self.p_flag[i]:
                self.omega_mass[i] = nkt / (self.p_freq[i] * self.p_freq[i])
        if self.pchain:
            self.etap_mass = [kt / (self.p_freq_max * self.p_freq_max)] * self.pchain

    def check_cell(self, cell: torch.Tensor) -> None:
        """ValueError (one line) for a cell this coupling cannot drive: aniso and tri need
        LAMMPS's form (rows a along x, b in the xy plane); x, y, z and xy an orthorhombic cell
        (where fix_nh's deviatoric force on the barostatted axes is zero: not integrated here)."""
        c = cell
        if self.pstyle != "iso" and bool((c[0, 1] != 0) | (c[0, 2] != 0) | (c[1, 2] != 0)):
            raise ValueError(f"integrator.couple={self.couple} needs a cell in LAMMPS's form (a along x, b in "
                             "the xy plane: cell[0,1] = cell[0,2] = cell[1,2] = 0); rotate the cell or use couple=iso")
        if self.couple in ("x", "y", "z", "xy") and bool((c[1, 0] != 0) | (c[2, 0] != 0) | (c[2, 1] != 0)):
            raise ValueError(f"integrator.couple={self.couple} needs an orthorhombic cell (cell vectors along x, y "
                             "and z); use couple=aniso or tri for a tilted cell")
        if not math.isfinite(det3(c.double().cpu().tolist())):
            raise ValueError("the cell is not finite")

    # -- the barostat's pieces (fix_nh, line for line) -------------------------------------------
    def _nhc_press(self) -> None:
        """nhc_press_integrate() (nc_pchain = 1, drag 0)."""
        if not self.pchain:
            return
        m, dt = self.pchain, self.dt
        dthalf, dt4, dt8 = 0.5 * dt, 0.25 * dt, 0.125 * dt
        kt = KB * self.temperature
        w, od = self.omega_mass, self.omega_dot
        ed, edd, eta, q = self.etap_dot, self.etap_dotdot, self.etap, self.etap_mass
        flagged = [i for i in range(6) if self.p_flag[i]]
        kecurrent = sum(w[i] * od[i] * od[i] for i in flagged)
        lkt_press = kt if self.pstyle == "iso" else len(flagged) * kt
        edd[0] = (kecurrent - lkt_press) / q[0]
        expfac = chain_inward(ed, edd, m, dt4, dt8)
        for i in range(m):
            eta[i] += dthalf * ed[i]
        factor = math.exp(-dthalf * ed[0])
        for i in flagged:
            od[i] *= factor
        kecurrent = sum(w[i] * od[i] * od[i] for i in flagged)
        edd[0] = (kecurrent - lkt_press) / q[0]
        chain_outward(ed, edd, q, m, kt, expfac, dt4, dt8)

    def _omega_dot(self) -> None:
        """nh_omega_dot() (no deviatoric target, drag 0)."""
        vol = self._volume()
        n, pdim = self.n_atoms, self.pdim
        th = self.thermostat
        if self.pstyle == "iso":
            mtk1 = th.dof * KB * th.t_current / (pdim * n)
        else:
            mtk1 = sum(self._mvv[i] for i in range(3) if self.p_flag[i]) / (pdim * n)
        self.mtk_term1 = mtk1
        dthalf = 0.5 * self.dt
        od, w = self.omega_dot, self.omega_mass
        for i in range(3):
            if self.p_flag[i]:
                f = (self.p_current[i] - self.p_hydro) * vol / w[i] + mtk1 / w[i]
                od[i] += f * dthalf
        self.mtk_term2 = sum(od[i] for i in range(3) if self.p_flag[i]) / (pdim * n)
        if self.pstyle == "tri":
            for i in range(3, 6):
                if self.p_flag[i]:
                    od[i] += self.p_current[i] * vol / w[i] * dthalf

    def _press_factors(self) -> list[float]:
        """nh_v_press()'s three scaling factors exp(-dt/4 (omega_dot_a + mtk2))."""
        dt4, od = 0.25 * self.dt, self.omega_dot
        return [math.exp(-dt4 * (od[i] + self.mtk_term2)) for i in range(3)]

    def _v_press(self, velocities: torch.Tensor) -> None:
        """nh_v_press(): the barostat's half-step scaling of the velocities, in place."""
        dthalf, od = 0.5 * self.dt, self.omega_dot
        factors = self._press_factors()
        if fused.usable(velocities):   # one pass, the same bits (integrators/fused.py)
            fused.v_press(velocities, factors, od, dthalf, self.pstyle == "tri")
            return
        f = torch.tensor(factors, dtype=velocities.dtype, device=velocities.device)
        velocities.mul_(f)
        if self.pstyle == "tri":
            self._tilt_coupling(velocities, dthalf, od)
        velocities.mul_(f)

    def _tilt_coupling(self, velocities: torch.Tensor, dthalf: float, od: list[float]) -> None:
        """tri's off-diagonal terms of nh_v_press, in place on velocities (N, 3) Å/fs:
            v_x += -dthalf (v_y od_xy + v_z od_xz);  v_y += -dthalf v_z od_yz
        with the same floating-point operations, in the same order, as those expressions
        written with temporaries; two kept (N,) work arrays instead of six fresh ones."""
        n, dt_, dev = velocities.shape[0], velocities.dtype, velocities.device
        a = self._scratch.get("vp_a", (n,), dt_, dev)
        b = self._scratch.get("vp_b", (n,), dt_, dev)
        vx, vy, vz = velocities[:, 0], velocities[:, 1], velocities[:, 2]
        torch.mul(vy, od[5], out=a)
        torch.mul(vz, od[4], out=b)
        vx.add_(a.add_(b).mul_(-dthalf))
        torch.mul(vz, -dthalf, out=a)
        vy.add_(a.mul_(od[3]))

    def _remap(self, positions: torch.Tensor) -> None:
        """remap(): the cell by half a step (dto = dt/2), the atoms with it (fractions kept)."""
        self._apply_remap(positions, self._remap_cell())

    def _remap_cell(self, publish: bool = True) -> float | list[list[float]]:
        """remap()'s cell half: omega and ``self.cell`` advanced by half a step; returns the map
        of the positions, x' = x c^-1 new: iso's scale factor, else the lower-triangular matrix.
        The 3 x 3 algebra is done in Python floats and applied to the atoms by broadcasting:
        no LAPACK/BLAS call on tiny matrices (with several threads those wait on their workers).
        publish=False (a float64 cell): the new rows only in :meth:`_rows`'s cache, the tensor
        made by :meth:`_publish` (a step's two remaps make one tensor)."""
        dto = 0.5 * self.dt
        for i in range(6):
            self.omega[i] += dto * self.omega_dot[i]
        old = self.cell
        c = self._rows()
        new, m = remap_rows(c, self.omega_dot, dto, self.pstyle)
        if old.dtype == torch.float64:   # the tensor holds these bits: kept as _rows()'s
            self._cell_rows, self._vol = new, abs(det3(new))
        if publish or old.dtype != torch.float64:
            self._publish(new)
        return m

    def _publish(self, rows: list[list[float]]) -> None:
        """``self.cell`` made from ``rows`` (the cached ones stay _rows()'s where float64)."""
        old = self.cell
        if old.dtype == torch.float64 and old.is_cpu:   # numpy's conversion: ~4 us against torch.tensor's ~10
            self.cell = torch.from_numpy(np.array(rows, dtype=np.float64))
        else:
            self.cell = torch.tensor(rows, dtype=old.dtype, device=old.device)
        if old.dtype == torch.float64:
            self._cell_seen, self._cell_version = self.cell, self.cell._version

    @staticmethod
    def _apply_remap(positions: torch.Tensor, m: float | list[list[float]]) -> None:
        """x' = x m in place on positions (N, 3) Å; m from :meth:`_remap_cell`."""
        if isinstance(m, float):
            positions.mul_(m)
            return
        if fused.usable(positions):   # one pass, the same bits (integrators/fused.py)
            fused.remap(positions, m)
            return
        x, y, z = positions[:, 0], positions[:, 1], positions[:, 2]
        x.mul_(m[0][0]).add_(y, alpha=m[1][0]).add_(z, alpha=m[2][0])   # x first: it reads the old y, z
        y.mul_(m[1][1]).add_(z, alpha=m[2][1])
        z.mul_(m[2][2])

    # -- the step ------------------------------------------------------------------------------
    def first_half(self, positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor,
                   masses: torch.Tensor, ids: torch.Tensor, step: int) -> None:
        """fix_nh's initial_integrate: chains, pressure, omega_dot, velocity scaling, kick,
        remap / drift / remap; in place (``self.cell`` becomes the new cell)."""
        th = self.thermostat
        if th.t_current is None or self.n_atoms is None:
            self._setup(velocities, masses)
        self._nhc_press()
        fast = fused.usable(positions, velocities, forces, masses)   # one pass, the same bits (fused.py)
        chain = self._chain_factor()   # the velocities scaled by it below (in press_kick_drift where fast)
        # fix_nh measures the kinetic energy again here; the chain scaled every velocity by one
        # factor, so it is the carried one scaled by factor^2 (the same to round-off, no reduction)
        self._pressure(th.dof * KB * th.t_current if self.pstyle == "iso" else self._mvv)
        self._omega_dot()
        if fast:   # the cell's two remaps first (scalars alone), then the atoms in one pass
            factors = self._press_factors()
            m1 = self._remap_cell(publish=False)
            m2 = self._remap_cell(publish=False)
            fused.press_kick_drift(positions, velocities, forces, masses, factors, self.omega_dot, 0.5 * self.dt,
                                   self.pstyle == "tri", 0.5 * self.dt * FORCE_TO_ACCEL, chain, m1, self.dt, m2)
            if self.cell is self._cell_seen:
                self._publish(self._cell_rows)
            return
        velocities.mul_(chain)
        self._v_press(velocities)
        velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
        self._remap(positions)
        positions.add_(velocities, alpha=self.dt)
        self._remap(positions)

    def second_half(self, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor) -> None:
        """fix_nh's final_integrate (``self.virial`` is the new forces' virial)."""
        th = self.thermostat
        if not self._fused_second(velocities, forces, masses):
            velocities.add_(forces / masses[:, None], alpha=0.5 * self.dt * FORCE_TO_ACCEL)
            self._v_press(velocities)
            self._measure(velocities, masses)
        self._pressure(th.dof * KB * th.t_current if self.pstyle == "iso" else self._mvv)
        self._omega_dot()
        self._chain(velocities)
        self._nhc_press()

    def _fused_second(self, velocities, forces, masses) -> bool:
        """second_half's kick, nh_v_press and measurement in one pass (integrators/fused.py), the
        same bits as the torch path; False where that path must run (not the CPU in float64, or
        iso on a rank whose m v^2 keeps torch's row sum: nose_hoover.columns_sum_agrees)."""
        th = self.thermostat
        tensor = self.pstyle != "iso"
        if not fused.usable(velocities, forces, masses) or not (tensor or th._columns):
            return False
        n, dev = velocities.shape[0], velocities.device
        part = self._part
        if part is None or part.shape[0] != fused.chunks(n) or part.device != dev:
            part = self._part = self._scratch.get("half_part", (fused.chunks(n), 12), torch.int64, dev)
        words = fused.kick_press_measure(
            velocities, forces, masses, 0.5 * self.dt * FORCE_TO_ACCEL, self._press_factors(), self.omega_dot,
            0.5 * self.dt, self.pstyle == "tri", tensor, (MVV_TO_EV * _HI, MVV_TO_EV, _HI, _LO), part)
        if tensor:   # as _measure with exact_kinetic_tensor
            tot = self.sum_fn(words).cpu().tolist()
            self._mvv = [(tot[k] + tot[6 + k] / _LO) / _HI for k in range(6)]
            th.t_current = (self._mvv[0] + self._mvv[1] + self._mvv[2]) / (th.dof * KB)
            return True
        th.measured(*mv2_total(words, n, self.sum_fn))   # as _measure with NoseHoover.measure
        return True

    def conserved_energy(self) -> float:
        """fix_nh's compute_scalar (eV): the chains' and the barostat's energy, P (V - V0) included;
        add K + U for the conserved quantity.  One term differs from LAMMPS's for iso: the
        barostat chain's first link counts kT etap[0], the kinetic energy its dynamics drive
        3 W omega_dot^2 towards (nhc_press_integrate's lkt_press); compute_scalar counts 3 kT
        etap[0], with which K + U + its value drifts by 2 kT etap[0] (aniso and tri agree)."""
        th = self.thermostat
        e = th.conserved_energy()
        if self.n_atoms is None:
            return e
        kt = KB * self.temperature
        vol = self._volume()
        lkt_press = 0.0
        for i in range(6):
            if self.p_flag[i]:
                e += 0.5 * self.omega_dot[i] ** 2 * self.omega_mass[i]
                if i < 3:
                    e += self.p_hydro * (vol - self.vol0) / self.pdim
                lkt_press += kt
        if self.pstyle == "iso":
            lkt_press = kt
        if self.pchain:
            e += lkt_press * self.etap[0] + 0.5 * self.etap_mass[0] * self.etap_dot[0] ** 2
            for i in range(1, self.pchain):
                e += kt * self.etap[i] + 0.5 * self.etap_mass[i] * self.etap_dot[i] ** 2
        if self.pdim < 3:   # fix_nh's strain energy 0.5 Tr(sigma h h^T): -P V0 / 2 per fixed axis (a constant)
            e -= 0.5 * (3 - self.pdim) * self.p_hydro * self.vol0
        return e

    def state_dict(self) -> dict:
        return {"name": self.name, "dt": self.dt, "temperature": self.temperature, "pressure": self.pressure,
                "tdamp": self.tdamp, "pdamp": self.pdamp, "couple": self.couple, "pchain": self.pchain,
                "thermostat": self.thermostat.state_dict(), "omega": list(self.omega),
                "omega_dot": list(self.omega_dot), "etap": list(self.etap), "etap_dot": list(self.etap_dot),
                "etap_dotdot": list(self.etap_dotdot), "n_atoms": self.n_atoms, "vol0": self.vol0,
                "mvv": None if self._mvv is None else list(self._mvv)}

    def load_state_dict(self, d: dict) -> None:
        """The barostat and chains of a checkpoint (same coupling and chain lengths); else a fresh start."""
        if (d.get("name") != self.name or d.get("couple") != self.couple or int(d.get("pchain", -1)) != self.pchain
                or d.get("n_atoms") is None):
            return
        self.thermostat.load_state_dict(d["thermostat"])
        if self.thermostat.t_current is None:
            return
        self.omega = [float(x) for x in d["omega"]]
        self.omega_dot = [float(x) for x in d["omega_dot"]]
        self.etap = [float(x) for x in d["etap"]]
        self.etap_dot = [float(x) for x in d["etap_dot"]]
        self.etap_dotdot = [float(x) for x in d["etap_dotdot"]]
        self.vol0 = float(d["vol0"])
        self.n_atoms = int(d["n_atoms"])
        self._mvv = None if d.get("mvv") is None else [float(x) for x in d["mvv"]]
        self._set_masses()
