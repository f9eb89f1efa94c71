"""DFT-D3 dispersion (Grimme et al. 2010, 2011) on the engine's neighbour list, in plain PyTorch.

    E = E2 + E3,   E2 = -1/2 sum_{i != j} C6_ij(CN_i, CN_j) [s6 f6(r_ij) / r_ij^6 + s8 3 Q_i Q_j f8(r_ij) / r_ij^8]
    E3 = sum_{triangles ijk} s9 sqrt(C6_ij C6_ik C6_jk) f_ATM (3 cos a cos b cos c + 1) / (r_ij r_ik r_jk)^3

with the D3 coordination number CN_i = sum_j 1 / (1 + exp(-16 (R_cov,i + R_cov,j) / r_ij + 16)), the C6 of a
pair interpolated from reference C6 by Gaussian weights of the two CNs, and the damping f6, f8 of
``model.damping``: ``bj`` (rational, Becke-Johnson: r^n f_n = r^n / (r^n + R0^n), R0 = a1 sqrt(3 Q_i Q_j) + a2)
or ``zero`` (Chai-Head-Gordon: f_n = 1 / (1 + 6 (rs_n R_vdW,ij / r)^alp_n)). The ATM term (``three_body``)
uses zero damping with radii 4/3 R_vdW and exponent alp + 2, as s-dftd3 does. Reference data (C6 table,
radii, <r4>/<r2>, per-functional parameters with s-dftd3's aliases) come from tad-dftd3 (docs/design.md,
"DFT-D3 dispersion"); the sums are ours, over the engine's edges, so they run on any number of domains.

Keys (``model=d3 model.<key>=...``):

    ================== ======= =====================================================================
    key                default meaning
    ================== ======= =====================================================================
    functional         pbe     the DFT functional whose D3 parameters are used (s-dftd3's names)
    damping            bj      bj (rational, D3(BJ)) or zero (D3(0))
    cutoff             31.75   two-body cutoff, Å (60 Bohr, s-dftd3's ``disp2``)
    cn_cutoff          21.17   coordination-number cutoff, Å (40 Bohr, s-dftd3's ``cn``)
    three_body         false   add the Axilrod-Teller-Muto term (s-dftd3's ``atm``; s9 of the functional)
    three_body_cutoff  21.17   three-body cutoff, Å (40 Bohr, s-dftd3's ``disp3``): all three sides within it
    cutoff_width       0       two-body switching width, Å (s-dftd3's ``width2``): the pair energy times
                               x^3 (10 - 15 x + 6 x^2), x = (cutoff - r) / width, over the last width
                               before the cutoff; 0: a hard cutoff
    ================== ======= =====================================================================

Cutoffs are hard by default, as s-dftd3's (``width2 = width3 = 0``); to compare with s-dftd3 give it
the same cutoffs in Bohr (``set_realspace_cutoff(disp2, disp3, cn, width2)``). A hard two-body
cutoff makes the energy jump when a pair crosses it (MD drifts; docs/d3.md): ``cutoff_width``
removes that; the CN and three-body cutoffs stay hard, as in s-dftd3.

Outputs: ``energy`` () eV, ``energies`` (n,) eV (each pair term split half and half, each triangle
a third to each corner, as s-dftd3's atom-resolved energies), ``forces`` (n, 3) eV/Å and ``virial``
(3, 3) eV, by autograd through the decomposition (``ModelConfig.autograd_outputs``, ``strain_outputs``).

Under decomposition (docs/distributed.md): the list is receiver-owned and reaches
``max(cutoff, cn_cutoff, three_body_cutoff)`` (+ skin), so every owned atom's CN is exact from its own
edges; each ghost's CN is then copied from its owner (a ghost's own edges are not on this rank), and
every pair and triangle term of an owned atom reads only owned and ghost CNs. In the spec's halo
mode (``scatter``) the CN scatter's halo correction already does that copy; the explicit
``refresh_neighbors`` keeps the model right under any halo mode (``local`` included), for one more
exchange of one float per ghost.
The halo is therefore one list radius deep, not pair cutoff + CN cutoff.  Without the engine,
:meth:`D3Dispersion.calculate` evaluates a single structure on one process (its own image list).
"""
from __future__ import annotations

import difflib
import math

import numpy as np
import torch
from ase.units import Bohr, Hartree

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    ModelConfig,
    NeighborConfig,
    NeighborList,
    OutputKind,
    refresh_neighbors,
)

#: s-dftd3's default real-space cutoffs (Bohr): two-body, three-body, coordination number
DISP2_BOHR, DISP3_BOHR, CN_BOHR = 60.0, 40.0, 40.0
KCN = 16.0            # steepness of the CN counting function
WF = 4.0              # Gaussian weight factor of the CN interpolation
RS9 = 4.0 / 3.0       # ATM radius scaling (s-dftd3's rs9)
BOHR_2018 = 0.529177210903   # Å (CODATA 2018, mctc-io's): only to restore the vdW radii table
DAMPINGS = {"bj": "bj", "zero": "zero"}

SPEC_D3 = SPEC_MPNN_HALO.replace(
    name="d3", description="DFT-D3: CN by a receiver scatter, ghost CNs refreshed, pair and ATM terms on owned "
    "atoms' edges; autograd forces and strain virial; halo storage",
    output_kinds={"energy": OutputKind.PER_GRAPH, "energies": OutputKind.PER_NODE, "forces": OutputKind.PER_NODE},
    owned_only_outputs={"energies", "forces"})


def functionals() -> list[str]:
    """Every functional name tad-dftd3's parameter table knows (aliases resolve to these)."""
    from tad_dftd3.param import functional as F

    return sorted(F._load_parameters()["parameter"])


def functional_parameters(functional: str, damping: str) -> dict[str, float]:
    """The damping parameters (s6, s8, a1, a2 or rs6, rs8, alp, s9) of ``functional``; ``ValueError``
    (one line naming the key and how to list valid names) when there are none."""
    from tad_dftd3.param import get_functional_params

    if damping not in DAMPINGS:
        raise ValueError(f"model.damping={damping!r} is not a D3 damping; use bj (rational, D3(BJ)) or zero (D3(0))")
    if not isinstance(functional, str) or not functional:
        raise ValueError(f"model.functional={functional!r} is invalid; give a functional name such as pbe")
    try:
        p = get_functional_params(functional, damping=DAMPINGS[damping], dtype=torch.float64)
    except KeyError:
        close = difflib.get_close_matches(functional.lower(), functionals(), n=3)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise ValueError(f"model.functional={functional!r} has no D3 parameters{hint}; list the valid names with "
                         "python -c 'import shardmd.models.d3 as d; print(*d.functionals())' (docs/d3.md)") from None
    except ValueError:
        raise ValueError(f"model.functional={functional!r} has no D3 parameters for model.damping={damping}; "
                         f"use model.damping={'zero' if damping == 'bj' else 'bj'}") from None
    return {k: float(v) for k, v in p.items() if isinstance(v, torch.Tensor)}


def _explicit(params, damping: str) -> dict[str, float]:
    """Explicit damping parameters (``D3Dispersion(params=...)``), checked: every one the damping
    uses, finite numbers (no s9: no three-body term)."""
    if damping not in DAMPINGS:
        raise ValueError(f"model.damping={damping!r} is not a D3 damping; use bj (rational, D3(BJ)) or zero (D3(0))")
    need = ("s6", "s8", "a1", "a2") if damping == "bj" else ("s6", "s8", "rs6", "rs8", "alp")
    out = {}
    for k in need:
        v = params.get(k) if isinstance(params, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"D3 parameters {params!r}: {k} is {v!r}, not a finite number ({damping} damping needs "
                             f"{', '.join(need)})")
        out[k] = float(v)
    return out


class _Tables:
    """Per-species D3 data from tad-dftd3 (Bohr, Hartree): covalent radii (4/3-scaled), <r4>/<r2>
    factors, pairwise vdW radii, reference CNs (R per species, -1 = none) and C6 (R x R per pair)."""

    def __init__(self, dtype):
        from tad_dftd3 import data
        from tad_dftd3.reference import Reference
        from tad_mctc.data import radii

        ref = Reference(dtype=dtype)
        self.rcov, self.r4r2 = radii.COV_D3(dtype=dtype), data.R4R2(dtype=dtype)
        # tad-dftd3 keeps the pairwise vdW radii in single precision (~1e-7 relative off, which moves
        # zero-damping and ATM energies by ~1e-7 eV/atom); the published values are Å to 4 decimals,
        # which s-dftd3 converts with mctc-io's CODATA 2018 Bohr: restore them the same way
        rvdw_aa = torch.round(radii.VDW_PAIRWISE(dtype=torch.float64) * BOHR_2018 * 1e4) / 1e4
        self.rvdw, self.ref_cn, self.ref_c6 = (rvdw_aa / BOHR_2018).to(dtype), ref.cn, ref.c6
        self.max_z = int(self.ref_cn.shape[0]) - 1


class D3Dispersion:
    """DFT-D3 dispersion energy (eV), forces and virial by autograd. Keys: the module docstring.

    functional: s-dftd3 name (pbe, b3lyp, ...); damping: bj or zero; cutoff, cn_cutoff,
    three_body_cutoff: Å (> 0); three_body: the ATM term on or off; params: for another code's
    D3 (Python only, not a key), explicit damping parameters (bj: s6, s8, a1, a2; zero: s6, s8,
    rs6, rs8, alp) used instead of the functional's, ``functional`` then only naming them.
    """

    def __init__(self, functional: str = "pbe", damping: str = "bj", cutoff: float = DISP2_BOHR * Bohr,
                 cn_cutoff: float = CN_BOHR * Bohr, three_body: bool = False,
                 three_body_cutoff: float = DISP3_BOHR * Bohr, cutoff_width: float = 0.0,
                 params: dict[str, float] | None = None, dtype: torch.dtype = torch.float64):
        for name, value in (("cutoff", cutoff), ("cn_cutoff", cn_cutoff), ("three_body_cutoff", three_body_cutoff)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value > 0):
                raise ValueError(f"model.{name}={value!r} is invalid: give a finite number > 0 in Å")
        if not (isinstance(cutoff_width, (int, float)) and not isinstance(cutoff_width, bool)
                and 0 <= cutoff_width < cutoff):
            raise ValueError(f"model.cutoff_width={cutoff_width!r} is invalid: give a width >= 0 in Å, less than "
                             f"model.cutoff={cutoff}")
        self.width2 = float(cutoff_width)
        if not isinstance(three_body, bool):
            raise ValueError(f"model.three_body={three_body!r} is invalid: use true or false")
        self.functional, self.damping, self.three_body = functional, damping, three_body
        self.params = functional_parameters(functional, damping) if params is None else _explicit(params, damping)
        self.cutoff2, self.cutoff_cn, self.cutoff3 = float(cutoff), float(cn_cutoff), float(three_body_cutoff)
        #: the neighbour-list radius (Å): every term reads edges up to it
        self.cutoff = max(self.cutoff2, self.cutoff_cn, self.cutoff3 if three_body else 0.0)
        self.dtype = dtype
        self._tables: _Tables | None = None
        self.distribution_spec = SPEC_D3
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))

    # -- contract --------------------------------------------------------------------------------
    @property
    def tables(self) -> _Tables:
        if self._tables is None:
            self._tables = _Tables(self.dtype)
        return self._tables

    def check_species(self, numbers) -> None:
        z = torch.as_tensor(numbers)
        bad = sorted({int(v) for v in z.flatten().tolist() if not 1 <= int(v) <= self.tables.max_z})
        if bad:
            raise ValueError(f"model=d3 has no D3 reference data for atomic numbers {bad}; D3 covers "
                             f"H to Z={self.tables.max_z}")

    def compute(self, positions, cell, pbc, numbers, nl) -> dict[str, torch.Tensor]:
        """positions (n, 3) Å, cell (3, 3) Å, pbc (3,), numbers (n,), nl: the neighbour list (full,
        receiver-owned). Returns energy () eV and energies (n,) eV; forces and virial come by autograd."""
        t = self.tables
        dev = positions.device
        n = positions.shape[0]
        z = numbers.to(dev).long()
        i, j = nl.edge_index()
        d = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)) / Bohr
        r2 = (d * d).sum(1)
        in_cn = torch.nonzero((r2 <= (self.cutoff_cn / Bohr) ** 2) & (r2 > 1e-12)).flatten()
        i_cn, r_cn = i.index_select(0, in_cn), r2.index_select(0, in_cn).sqrt()
        rc = t.rcov.to(dev)[z.index_select(0, i_cn)] + t.rcov.to(dev)[z.index_select(0, j.index_select(0, in_cn))]
        count = 1.0 / (1.0 + torch.exp(-KCN * (rc / r_cn - 1.0)))
        cn = positions.new_zeros(n).index_add_(0, i_cn, count)   # exact on owned rows (receiver-owned list)
        cn = refresh_neighbors(cn)                              # ghost rows: copies of their owners' CNs
        # C6 of a pair (a, b): w_a . C(z_a, z_b) . w_b, by species present (u: (n, S, R) = w_a . C(z_a, s));
        # references are stored first, so R is cut to the most any present species has (2 for Cu, of 7)
        species, s = torch.unique(z, return_inverse=True)
        r_used = max(int((t.ref_cn[species.cpu()] >= 0).sum(1).max()), 1)
        w = self._weights(cn, z)[:, :r_used]                    # (n, R)
        c6s = t.ref_c6.to(dev)[species][:, species][:, :, :r_used, :r_used]   # (S, S, R, R)
        u = torch.einsum("na,ntab->ntb", w, c6s.index_select(0, s))
        n_s = species.shape[0]

        def pair_c6(a, b):
            rows = u.reshape(n * n_s, -1).index_select(0, a * n_s + s.index_select(0, b))
            return (rows * w.index_select(0, b)).sum(1)

        rmax = max(self.cutoff2, self.cutoff3 if self.three_body else 0.0) / Bohr
        keep = torch.nonzero((r2 <= rmax * rmax) & (r2 > 1e-12)).flatten()
        i, j, d, r2 = (x.index_select(0, keep) for x in (i, j, d, r2))
        c6 = pair_c6(i, j)
        zi, zj = z.index_select(0, i), z.index_select(0, j)
        e_edge = self._pair_energy(r2, c6, zi, zj) * self._switch(r2)
        e_edge = torch.where(r2 <= (self.cutoff2 / Bohr) ** 2, e_edge, torch.zeros_like(e_edge))
        energies = positions.new_zeros(n).index_add_(0, i, 0.5 * e_edge * Hartree)
        if self.three_body and self.params.get("s9", 0.0) != 0.0:
            centres, e3 = self._atm(n, i, j, r2, d, c6, z, pair_c6)
            energies.index_add_(0, centres, e3 * Hartree)
        system = torch.zeros(n, dtype=torch.int64, device=dev)
        energy = positions.new_zeros(1).index_add_(0, system, energies)   # a scatter: summed over ranks
        return {"energy": energy[0], "energies": energies}

    # -- pieces ----------------------------------------------------------------------------------
    def _weights(self, cn, z):
        """(n, R) Gaussian weights of each atom's reference systems, normalised; where every weight
        underflows, all weight on the reference of largest CN (s-dftd3's rule)."""
        ref_cn = self.tables.ref_cn.to(cn.device)[z]            # (n, R), -1 = no reference
        have = ref_cn >= 0
        dcn = ref_cn - cn.unsqueeze(1)
        g = torch.where(have, torch.exp(-WF * dcn * dcn), torch.zeros_like(dcn))
        norm = g.sum(1, keepdim=True)
        ok = norm > 0
        top = torch.where(have, ref_cn, torch.full_like(ref_cn, -2.0))
        fallback = (top == top.max(1, keepdim=True).values).to(g.dtype)
        return torch.where(ok, g / torch.where(ok, norm, torch.ones_like(norm)), fallback)

    def _switch(self, r2):
        """s-dftd3's two-body switch: 1 up to cutoff - width, then x^3 (10 - 15 x + 6 x^2) with
        x = (cutoff - r) / width (r2 in Bohr^2)."""
        if self.width2 <= 0.0:
            return torch.ones_like(r2)
        cut, width = self.cutoff2 / Bohr, self.width2 / Bohr
        x = ((cut - r2.sqrt()) / width).clamp(0.0, 1.0)
        return x * x * x * (10.0 + x * (-15.0 + 6.0 * x))

    def _pair_energy(self, r2, c6, zi, zj):
        """Two-body energy of each edge (Hartree, the whole pair's), distances squared in Bohr^2."""
        p, t = self.params, self.tables
        rr = 3.0 * t.r4r2.to(r2.device)[zi] * t.r4r2.to(r2.device)[zj]
        r6 = r2 * r2 * r2
        if self.damping == "bj":
            r0 = p["a1"] * rr.sqrt() + p["a2"]
            r0_2 = r0 * r0
            r0_6 = r0_2 * r0_2 * r0_2
            return -c6 * (p["s6"] / (r6 + r0_6) + p["s8"] * rr / (r6 * r2 + r0_6 * r0_2))
        rv = t.rvdw.to(r2.device)[zi, zj]
        r1 = r2.sqrt()
        f6 = 1.0 / (1.0 + 6.0 * (p["rs6"] * rv / r1) ** p["alp"])
        f8 = 1.0 / (1.0 + 6.0 * (p["rs8"] * rv / r1) ** (p["alp"] + 2.0))
        return -c6 * (p["s6"] * f6 / r6 + p["s8"] * rr * f8 / (r6 * r2))

    def _atm(self, n, i, j, r2, d, c6, z, pair_c6):
        """(centres, energies): the ATM energy (Hartree) given to each centre: a third of every
        triangle (i, j, k) whose three sides are within the three-body cutoff, from i's pairs of
        edges (each unordered pair once)."""
        p, t = self.params, self.tables
        sel = torch.nonzero(r2 <= (self.cutoff3 / Bohr) ** 2).flatten()   # still sorted by centre
        i3, j3, d3, r3, c3 = (x.index_select(0, sel) for x in (i, j, d, r2, c6))
        e3 = i3.shape[0]
        counts = torch.bincount(i3, minlength=n)
        end = (torch.cumsum(counts, 0)).index_select(0, i3)    # one past the last edge of the centre
        idx = torch.arange(e3, device=i3.device)
        later = end - idx - 1                                   # edges after this one, same centre
        a = torch.repeat_interleave(idx, later)
        first = torch.cumsum(later, 0) - later
        b = a + 1 + torch.arange(a.shape[0], device=a.device) - torch.repeat_interleave(first, later)
        v_jk = d3.index_select(0, b) - d3.index_select(0, a)
        r2jk = (v_jk * v_jk).sum(1)
        ok = torch.nonzero((r2jk <= (self.cutoff3 / Bohr) ** 2) & (r2jk > 1e-12)).flatten()
        a, b, r2jk = a.index_select(0, ok), b.index_select(0, ok), r2jk.index_select(0, ok)
        ja, kb = j3.index_select(0, a), j3.index_select(0, b)
        r2ij, r2ik = r3.index_select(0, a), r3.index_select(0, b)
        c9 = -p["s9"] * (c3.index_select(0, a) * c3.index_select(0, b) * pair_c6(ja, kb)).abs().sqrt()
        rv = t.rvdw.to(d.device)
        zi, zj, zk = z.index_select(0, i3.index_select(0, a)), z.index_select(0, ja), z.index_select(0, kb)
        r0 = RS9 ** 3 * rv[zi, zj] * rv[zi, zk] * rv[zj, zk]
        rp2 = r2ij * r2ik * r2jk
        rp1 = rp2.sqrt()
        rp3 = rp2 * rp1
        fdmp = 1.0 / (1.0 + 6.0 * (r0 / rp1) ** ((p["alp"] + 2.0) / 3.0))
        ang = (0.375 * (r2ij + r2jk - r2ik) * (r2ij - r2jk + r2ik) * (-r2ij + r2jk + r2ik) / (rp3 * rp2)
               + 1.0 / rp3)
        return i3.index_select(0, a), -ang * fdmp * c9 / 3.0

    # -- one structure, one process, no engine ---------------------------------------------------
    def calculate(self, positions, cell, pbc, numbers) -> dict[str, np.ndarray | float]:
        """Energy (eV), energies (n,) eV, forces (n, 3) eV/Å, virial (3, 3) eV and stress (3, 3)
        eV/Å^3 (``-virial / V``; None without full periodicity) of one structure: positions (n, 3)
        Å, cell (3, 3) Å (rows), pbc (3,), numbers (n,). Its own list over every periodic image."""
        pos = torch.as_tensor(np.asarray(positions), dtype=self.dtype)
        cel = torch.as_tensor(np.asarray(cell), dtype=self.dtype)
        z = torch.as_tensor(np.asarray(numbers), dtype=torch.int64)
        self.check_species(z)
        nl = image_list(pos.numpy(), cel.numpy(), np.asarray(pbc, bool), self.cutoff)
        eps = torch.zeros(3, 3, dtype=self.dtype, requires_grad=True)
        x = pos.clone().requires_grad_(True)
        strain = torch.eye(3, dtype=self.dtype) + 0.5 * (eps + eps.T)
        out = self.compute(x @ strain, cel @ strain, torch.as_tensor(pbc), z, nl)
        g_x, g_eps = torch.autograd.grad(out["energy"], (x, eps))
        virial = -g_eps.detach().numpy()
        vol = abs(float(np.linalg.det(np.asarray(cell)))) if all(pbc) else None
        return {"energy": float(out["energy"].detach()), "energies": out["energies"].detach().numpy(),
                "forces": -g_x.numpy(), "virial": virial, "stress": -virial / vol if vol else None}


def image_list(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> NeighborList:
    """Full list of every (i, j, image S) with |x_j + S @ cell - x_i| <= cutoff (Å), i != j or S != 0,
    by brute force over the images a cutoff sphere can reach (plane spacings of the cell)."""
    n = positions.shape[0]
    reps = np.zeros(3, dtype=int)
    if pbc.any():
        inv = np.linalg.inv(cell)
        spacing = 1.0 / np.linalg.norm(inv, axis=0)            # distance between lattice planes
        reps = np.where(pbc, np.ceil(cutoff / spacing).astype(int), 0)
    rows, cols, shifts = [], [], []
    delta = positions[None, :, :] - positions[:, None, :]       # x_j - x_i
    for s in np.array(np.meshgrid(*[np.arange(-r, r + 1) for r in reps], indexing="ij")).reshape(3, -1).T:
        dist2 = ((delta + s @ cell) ** 2).sum(-1)
        ii, jj = np.nonzero(dist2 <= cutoff * cutoff)
        if not s.any():
            keep = ii != jj
            ii, jj = ii[keep], jj[keep]
        rows.append(ii)
        cols.append(jj)
        shifts.append(np.broadcast_to(s, (ii.size, 3)))
    i, j, sh = np.concatenate(rows), np.concatenate(cols), np.concatenate(shifts)
    order = np.argsort(i, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(i, minlength=n))])
    return NeighborList(torch.as_tensor(offsets, dtype=torch.int32), torch.as_tensor(j[order], dtype=torch.int32),
                        torch.as_tensor(sh[order], dtype=torch.int32), cutoff=cutoff, n_points=n)


__all__ = ["SPEC_D3", "D3Dispersion", "functional_parameters", "functionals", "image_list"]
