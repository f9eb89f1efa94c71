"""Bring your own model (1): a pure-PyTorch message-passing model with autograd forces.

The model is written for one process.  Three habits make it run unchanged under domain
decomposition, on the message-passing halo preset (or the sharded one):

- per-point buffers that receive scatters are allocated from the positions
  (``positions.new_zeros(...)``), so they inherit the positions' ShardTensor metadata and
  the halo-correction handler completes them across ranks after every layer;
- the per-system energy is a scatter into ``positions.new_zeros(n_systems)``, so the
  per-system handler counts every point once and sums over ranks;
- per-point features that are gathered by neighbour index are re-wrapped with
  ``shard_like`` (a no-op on one process), so sharded storage can fetch remote rows.

Forces are never computed here: ``model_config.autograd_outputs`` asks DistributedModel
for ``forces = -d energy / d positions``.

Run ``python examples/byo_mpnn.py [world_size ...]`` to validate it on real ranks.
"""
from __future__ import annotations

import math
import sys

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, ModelConfig, NeighborConfig, shard_like


class ToyMPNN:
    """A two-layer message-passing energy on top of a smooth Lennard-Jones-like pair term.

    cutoff: Å; features: width of the node features; layers: message-passing rounds."""

    def __init__(self, cutoff: float = 4.5, features: int = 8, layers: int = 2, n_basis: int = 6, seed: int = 0,
                 spec=SPEC_MPNN_HALO):
        g = torch.Generator().manual_seed(seed)
        f64 = dict(dtype=torch.float64)
        self.rc = float(cutoff)
        self.embed = 0.5 * torch.randn(100, features, generator=g, **f64)
        self.w_msg = [torch.randn(features, features, generator=g, **f64) / math.sqrt(features) for _ in range(layers)]
        self.w_rad = [torch.randn(n_basis, features, generator=g, **f64) for _ in range(layers)]
        self.w_out = 0.01 * torch.randn(features, generator=g, **f64)
        self.mu = torch.linspace(1.0, cutoff, n_basis, **f64)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff))
        self.distribution_spec = spec

    @property
    def cutoff(self) -> float:
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        i, j = nl.edge_index()
        vec = positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)
        r = vec.norm(dim=1)
        inside = r < self.rc
        x = torch.where(inside, r / self.rc, torch.zeros_like(r))
        envelope = torch.where(inside, (1 - x * x) ** 2, torch.zeros_like(r))   # smooth at the cutoff
        # pair term: a Lennard-Jones-like repulsion/attraction, half to each end's site energy
        s6 = (3.4 / torch.where(inside, r, torch.ones_like(r))) ** 6
        pair = 4 * 0.0104 * (s6 * s6 - s6) * envelope
        site = positions.new_zeros(positions.shape[0])          # per-point, halo-corrected
        site.index_add_(0, i, 0.5 * pair)
        # message passing
        basis = torch.exp(-((r[:, None] - self.mu) ** 2)) * envelope[:, None]
        h = shard_like(self.embed[numbers], positions)
        for w_msg, w_rad in zip(self.w_msg, self.w_rad):
            msg = (h.index_select(0, j) @ w_msg) * (basis @ w_rad)
            agg = positions.new_zeros(positions.shape[0], h.shape[1])
            agg.index_add_(0, i, msg)                            # halo correction fires here
            h = shard_like(h + torch.tanh(agg), positions)
        energies = site + torch.tanh(h) @ self.w_out
        system = torch.zeros(positions.shape[0], dtype=torch.int64, device=positions.device)
        energy = positions.new_zeros(1).index_add_(0, system, energies)   # per-system reduce fires here
        return {"energy": energy[0], "energies": energies}


def make_model():
    """Module-scope factory (trace_and_validate's workers import it by name)."""
    return ToyMPNN()


def make_sharded_model():
    from shardmd.domain.api import SPEC_MPNN_SHARDED

    return ToyMPNN(spec=SPEC_MPNN_SHARDED)


def sample_system(repeat=(4, 4, 4), seed: int = 1):
    """Rattled two-species fcc argon/krypton (256 points, 21 Å box)."""
    import numpy as np
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    rng = np.random.default_rng(seed)
    z = atoms.numbers.copy()
    z[rng.random(len(atoms)) < 0.3] = 36
    atoms.numbers = z
    return atoms


if __name__ == "__main__":
    from shardmd.domain.api import trace_and_validate

    for k in [int(a) for a in sys.argv[1:]] or [2, 3, 4]:
        rep = trace_and_validate(make_model, sample_system(), world_size=k, atol=0.0, rtol=1e-10)
        print(rep.summary())
        if not rep.ok:
            print("next:", rep.next_action)
