"""A model taking per-atom charges and the total charge as inputs (plain PyTorch), and its
brute-force reference (every pair over explicit periodic images, float64, one process).

Pair energy within the cutoff rc, smoothed by s(r) = (1 - (r/rc)^2)^2:

    e_ij = [4 eps ((sigma/r)^12 - (sigma/r)^6) + K q_i q_j exp(-r/lam) / r] s(r)

plus a term coupling each atom to the total charge Q through its coordination,
``mu Q q_i sum_j s(r_ij)``, so that energies and forces depend on every input.  Per-atom
energies e_i = 1/2 sum_j e_ij + mu Q q_i sum_j s(r_ij) (eV); forces by autograd.

The model declares its inputs in ``ModelConfig(point_inputs=("charges",),
system_inputs=("charge",))`` and records the pbc and cell it is called with in
``seen`` (and, with ``record=PATH``, appends them to PATH.<rank> once per run).
"""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import torch

from shardmd.domain.api import ModelConfig, NeighborConfig, current_scope

EPS, SIGMA, K, LAM, MU = 0.0104, 3.4, 14.399645, 2.0, 0.05
CUTOFF = 6.0


def pair_terms(r, qi, qj, rc=CUTOFF):
    """(pair energy e_ij, smoothing s) of distances r (Å) and the charges (e) of both ends."""
    inside = r < rc
    rr = torch.where(inside, r, torch.full_like(r, rc))
    s = torch.where(inside, (1 - (rr / rc) ** 2) ** 2, torch.zeros_like(r))
    s6 = (SIGMA / rr) ** 6
    e = (4 * EPS * (s6 * s6 - s6) + K * qi * qj * torch.exp(-rr / LAM) / rr) * s
    return e, s


class ChargeModel(torch.nn.Module):
    """cutoff (Å); record: a path prefix the pbc and cell of the first call are written to."""

    def __init__(self, cutoff: float = CUTOFF, record: str | None = None):
        super().__init__()
        self.cutoff = float(cutoff)
        self.record = record
        self.seen: list[tuple[tuple, list]] = []
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces"),
                                        autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(self.cutoff),
                                        point_inputs=("charges",), system_inputs=("charge",))

    def compute(self, positions, cell, pbc, numbers, nl, charges=None, charge=None):
        if charges is None or charge is None:
            raise ValueError("ChargeModel needs charges and charge")
        self._note(pbc, cell)
        i, j = nl.edge_index()
        vec = positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)
        r = vec.norm(dim=1)
        e, s = pair_terms(r, charges.index_select(0, i), charges.index_select(0, j), self.cutoff)
        site = positions.new_zeros(positions.shape[0])
        site.index_add_(0, i, 0.5 * e)
        coord = positions.new_zeros(positions.shape[0])
        coord.index_add_(0, i, s)
        energies = site + MU * charge[0] * charges * coord
        system = torch.zeros(energies.shape[0], dtype=torch.int64, device=energies.device)
        energy = positions.new_zeros(1).index_add_(0, system, energies)
        return {"energy": energy[0], "energies": energies}

    def _note(self, pbc, cell):
        c = cell.as_subclass(torch.Tensor).detach().double().cpu().tolist()
        seen = ([bool(p) for p in pbc], c)
        if self.record and not self.seen:
            scope = current_scope()
            rank = scope.ctx.comm.rank if scope is not None else 0
            with open(f"{self.record}.{rank}", "a") as fh:
                fh.write(json.dumps({"pbc": seen[0], "cell": c}) + "\n")
        self.seen.append(seen)


def make(cutoff: float = CUTOFF, record: str | None = None):
    """The factory: model=py:charge_model:make (model.record=PATH writes what the model saw)."""
    return ChargeModel(cutoff, record)


# -- the reference --------------------------------------------------------------------------------
def brute_force(positions, cell, pbc, charges, total_charge, rc=CUTOFF) -> dict:
    """energy (eV), energies (n,) eV and forces (n, 3) eV/Å in float64, every ordered pair
    (i, j, image S) with |x_j + S cell - x_i| < rc summed over explicit images; no neighbour list."""
    x = torch.tensor(np.asarray(positions, dtype=np.float64), requires_grad=True)
    h = torch.tensor(np.asarray(cell, dtype=np.float64))
    q = torch.tensor(np.asarray(charges, dtype=np.float64))
    n = x.shape[0]
    widths = 1.0 / torch.linalg.norm(torch.linalg.inv(h), dim=0)
    reach = [int(math.ceil(rc / float(w))) + 1 if p else 0 for w, p in zip(widths, pbc)]
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    ii, jj = ii.reshape(-1), jj.reshape(-1)
    site = torch.zeros(n, dtype=torch.float64)
    coord = torch.zeros(n, dtype=torch.float64)
    for s in itertools.product(*(range(-k, k + 1) for k in reach)):
        shift = torch.tensor(s, dtype=torch.float64) @ h
        keep = torch.ones_like(ii, dtype=torch.bool) if any(s) else ii != jj
        i, j = ii[keep], jj[keep]
        r = (x[j] + shift - x[i]).norm(dim=1)
        near = r < rc
        i, j, r = i[near], j[near], r[near]
        e, w = pair_terms(r, q[i], q[j], rc)
        site = site.index_add(0, i, 0.5 * e)
        coord = coord.index_add(0, i, w)
    energies = site + MU * float(total_charge) * q * coord
    energy = energies.sum()
    (grad,) = torch.autograd.grad(energy, x)
    return {"energy": float(energy.detach()), "energies": energies.detach().numpy(), "forces": -grad.numpy()}


def sample(repeat=(3, 3, 3), seed=3):
    """fcc Ar (a = 5.26 Å), rattled, with random charges in [-0.6, 0.6] e as initial_charges."""
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    rng = np.random.default_rng(seed)
    atoms.set_initial_charges(rng.uniform(-0.6, 0.6, len(atoms)))
    return atoms
