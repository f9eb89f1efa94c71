"""A charge-equilibration model written the way docs/distributed.md says, and a brute-force
single-process evaluation of the same energy (plain torch: all pairs over explicit periodic
images, no neighbour list, no domain machinery) to compare it with.

Per point i (species Z_i): environment features from the neighbours within the cutoff,
electronegativity chi_i and hardness J_i > 0 from a tiny random-weight network of them,
charges from the constrained equilibration

    q_i = (lambda - chi_i) / J_i,   sum_i q_i = Q   =>   lambda = (Q + sum_i chi_i/J_i) / sum_i 1/J_i,

the energy

    E = sum_i (chi_i q_i + J_i q_i^2 / 2)                      site term (global through lambda)
      + 1/2 sum_{i != j} fc(r_ij) (A exp(-r_ij/rho) + B q_i q_j exp(-r_ij))   pair term (halo)
      + kappa S^2,   S = sum_i q_i^2                            a term of a global sum only

and per-point energies that sum to E: the site and pair terms split by point as written,
the last term shared out in proportion to each point's part of the sum it is made of,
``kappa S^2 * q_i^2 / S`` (docs/distributed.md, "Global values inside the energy").

The global sums go through the two spellings the docs give: a scatter into
``positions.new_zeros(1)`` (sum of 1/J) and ``system_sum`` (the others).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from shardmd.domain.api import SPEC_MPNN_HALO, ModelConfig, NeighborConfig, OutputKind, system_sum

F64 = torch.float64
CUTOFF = 4.5
SPECIES = (18, 36)
CHI0 = {18: 0.35, 36: -0.25}
J0 = {18: 1.6, 36: 2.3}
A, RHO, B, KAPPA = 0.8, 0.9, 0.6, 0.05
TOTAL_CHARGE = 0.3

SPEC_QEQ = SPEC_MPNN_HALO.replace(
    name="qeq-halo",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "charges": OutputKind.PER_NODE},
    owned_only_outputs={"energies", "forces", "charges"})


def weights():
    """The tiny network's fixed random weights (float64)."""
    g = torch.Generator().manual_seed(1234)
    w1 = torch.randn(2, 6, generator=g, dtype=F64) * 0.7
    b1 = torch.randn(6, generator=g, dtype=F64) * 0.1
    w_chi = torch.randn(6, generator=g, dtype=F64) * 0.3
    w_j = torch.randn(6, generator=g, dtype=F64) * 0.3
    return w1, b1, w_chi, w_j


def cutoff_fn(r):
    x = torch.clamp(r / CUTOFF, max=1.0)
    return torch.where(r < CUTOFF, (1 - x * x) ** 2, torch.zeros_like(r))


def species_params(numbers):
    chi0 = torch.zeros(len(numbers), dtype=F64)
    j0 = torch.zeros(len(numbers), dtype=F64)
    for z in SPECIES:
        m = numbers == z
        chi0[m], j0[m] = CHI0[z], J0[z]
    return chi0, j0


def site_params(feat, numbers, w):
    """(chi, J) of every point from its (n, 2) environment features."""
    w1, b1, w_chi, w_j = w
    h = torch.tanh(feat @ w1 + b1)
    chi0, j0 = species_params(numbers.cpu())
    chi = chi0.to(feat.device) + h @ w_chi
    hard = j0.to(feat.device) + torch.nn.functional.softplus(h @ w_j)
    return chi, hard


def pair_energy(r, qi, qj):
    return cutoff_fn(r) * (A * torch.exp(-r / RHO) + B * qi * qj * torch.exp(-r))


class QEqModel:
    """The model a single-process author writes; made multi-domain by ``SPEC_QEQ`` alone."""

    def __init__(self, spec=SPEC_QEQ):
        self.cutoff = CUTOFF
        self.w = weights()
        self.model_config = ModelConfig(outputs=("energy", "energies", "charges", "forces"),
                                        autograd_outputs={"forces": "energy"}, neighbors=NeighborConfig(CUTOFF))
        self.distribution_spec = spec

    def compute(self, positions, cell, pbc, numbers, nl):
        n = positions.shape[0]
        i, j = nl.edge_index()
        r = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        fc = cutoff_fn(r)
        # environment features of the receivers (the halo correction refreshes the ghost rows)
        feat = positions.new_zeros((n, 2))
        feat.index_add_(0, i, torch.stack([fc, fc * torch.exp(-r)], dim=1))
        chi, hard = site_params(feat, numbers, self.w)
        # the global sums: a scatter into positions.new_zeros(1), and system_sum
        batch = torch.zeros(n, dtype=torch.int64, device=positions.device)
        inv_j = positions.new_zeros(1).index_add_(0, batch, 1.0 / hard)
        chi_j = system_sum(chi / hard, batch, 1)
        lam = (TOTAL_CHARGE + chi_j) / inv_j
        q = (lam[0] - chi) / hard
        site = chi * q + 0.5 * hard * q * q
        pair = 0.5 * positions.new_zeros(n).index_add_(0, i, pair_energy(r, q[i], q[j]))
        q2 = q * q
        s2 = system_sum(q2, batch, 1)
        glob = KAPPA * s2 * s2
        energies = site + pair + glob[0] * q2 / s2[0]     # each point's share of the global term
        energy = positions.new_zeros(1).index_add_(0, batch, energies)
        return {"energy": energy, "energies": energies, "charges": q}


def qeq_model():
    return QEqModel()


# -- brute force ---------------------------------------------------------------------------------
def _images(cell: torch.Tensor, pbc, rc: float) -> torch.Tensor:
    inv = torch.linalg.inv(cell)
    widths = 1.0 / torch.linalg.norm(inv, dim=0)      # plane spacings
    reach = [int(math.ceil(rc / float(w))) if p else 0 for w, p in zip(widths, pbc)]
    rng = [torch.arange(-m, m + 1) for m in reach]
    return torch.cartesian_prod(*rng).to(F64)


def brute_force(positions, cell, numbers, pbc=(True, True, True)) -> dict:
    """Energy, per-point energies, charges and forces (-dE/dx by autograd) of the same model
    evaluated over every pair and periodic image, float64, one process."""
    pos = torch.as_tensor(np.asarray(positions), dtype=F64).clone().requires_grad_(True)
    cell = torch.as_tensor(np.asarray(cell), dtype=F64)
    numbers = torch.as_tensor(np.asarray(numbers), dtype=torch.int64)
    energy, energies, q = brute_energy(pos, cell, numbers, pbc)
    (g,) = torch.autograd.grad(energy, pos)
    return {"energy": float(energy.detach()), "energies": energies.detach().numpy(), "charges": q.detach().numpy(),
            "forces": (-g).numpy()}


def brute_pairs(pos, cell, pbc=(True, True, True)):
    """(i, j, image shift) of every ordered pair closer than the cutoff, found by checking all
    pairs against all periodic images (no autograd)."""
    found = []
    with torch.no_grad():
        for shift in _images(cell, pbc, CUTOFF) @ cell:
            d = pos[None, :, :] + shift - pos[:, None, :]
            r = d.norm(dim=-1)
            if float(shift.abs().sum()) == 0:
                r.fill_diagonal_(float("inf"))
            ii, jj = torch.nonzero(r < CUTOFF, as_tuple=True)
            found.append((ii, jj, shift.expand(ii.shape[0], 3)))
    return tuple(torch.cat(x) for x in zip(*found)) if found else None


def brute_energy(pos, cell, numbers, pbc=(True, True, True)):
    n = pos.shape[0]
    ii, jj, shift = brute_pairs(pos.detach(), cell, pbc)
    r = (pos[jj] + shift - pos[ii]).norm(dim=1)
    fc = cutoff_fn(r)
    feat = torch.zeros(n, 2, dtype=F64).index_add(0, ii, torch.stack([fc, fc * torch.exp(-r)], dim=1))
    chi, hard = site_params(feat, numbers, weights())
    lam = (TOTAL_CHARGE + (chi / hard).sum()) / (1.0 / hard).sum()
    q = (lam - chi) / hard
    site = chi * q + 0.5 * hard * q * q
    pair = 0.5 * torch.zeros(n, dtype=F64).index_add(0, ii, pair_energy(r, q[ii], q[jj]))
    s2 = (q * q).sum()
    energies = site + pair + KAPPA * s2 * s2 * (q * q) / s2
    return energies.sum(), energies, q


def sample(repeat=(4, 4, 4), seed: int = 3):
    """Rattled two-species fcc (256 points, 21 Å box)."""
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    rng = np.random.default_rng(seed)
    z = atoms.numbers.copy()
    z[rng.random(len(atoms)) < 0.4] = 36
    atoms.numbers = z
    return atoms
