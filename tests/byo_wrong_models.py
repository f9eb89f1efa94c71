"""A user's 2-interaction-layer SchNet-like model in plain PyTorch (no ShardMD import in the
model itself), and the three wrong wrappings that the validator must
diagnose by their root cause:

- ``schnet_local``: no per-layer exchange (the spec's halo mode is ``local``);
- ``schnet_torch_zeros``: the per-layer scatter target is made with ``torch.zeros`` (a plain
  tensor: the halo correction never fires);
- ``schnet_sum_over_ghosts``: ``energy = energies.sum()`` over every row, ghost copies included.

``schnet_ok`` is the correct wrapping (the control).  Module-scope factories: the validator's
workers import them by name."""
from __future__ import annotations

import math

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, HaloStorage, ModelConfig, NeighborConfig


class SchNetLike:
    """Two continuous-filter interaction layers; site energies from the final features.

    alloc: how per-point scatter targets are made ('new_zeros': from the positions, so they
    carry the decomposition; 'torch.zeros': a plain tensor); total: how the energy is reduced
    ('scatter': into ``positions.new_zeros(1)``; 'sum': ``energies.sum()`` over every row)."""

    def __init__(self, spec=SPEC_MPNN_HALO, alloc: str = "new_zeros", total: str = "scatter", cutoff: float = 4.5,
                 features: int = 8, n_rbf: int = 8, layers: int = 2, seed: int = 3):
        g = torch.Generator().manual_seed(seed)
        f64 = dict(dtype=torch.float64)
        self.rc, self.alloc, self.total = float(cutoff), alloc, total
        self.embed = 0.5 * torch.randn(100, features, generator=g, **f64)
        self.filters = [torch.randn(n_rbf, features, generator=g, **f64) / math.sqrt(n_rbf) for _ in range(layers)]
        self.updates = [torch.randn(features, features, generator=g, **f64) / math.sqrt(features)
                        for _ in range(layers)]
        self.readout = 0.05 * torch.randn(features, generator=g, **f64)
        self.centres = torch.linspace(0.5, cutoff, n_rbf, **f64)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff))
        self.distribution_spec = spec

    @property
    def cutoff(self) -> float:
        return self.rc

    def _zeros(self, positions, *shape):
        if self.alloc == "torch.zeros":
            return torch.zeros(*shape, dtype=positions.dtype, device=positions.device)
        return positions.new_zeros(*shape)

    def compute(self, positions, cell, pbc, numbers, nl):
        i, j = nl.edge_index()
        r = (positions[j] + nl.shift_vectors(cell) - positions[i]).norm(dim=1)
        inside = r < self.rc
        cut = torch.where(inside, 0.5 * (torch.cos(math.pi * r / self.rc) + 1), torch.zeros_like(r))
        rbf = torch.exp(-4.0 * (r[:, None] - self.centres) ** 2) * cut[:, None]
        h = self.embed[numbers]
        for w_f, w_u in zip(self.filters, self.updates):
            msg = h[j] * (rbf @ w_f)
            agg = self._zeros(positions, positions.shape[0], h.shape[1])
            agg.index_add_(0, i, msg)
            h = h + torch.tanh(agg @ w_u)
        energies = torch.tanh(h) @ self.readout
        if self.total == "sum":
            energy = energies.sum()
        else:
            system = torch.zeros(positions.shape[0], dtype=torch.int64, device=positions.device)
            energy = positions.new_zeros(1).index_add_(0, system, energies)[0]
        return {"energy": energy, "energies": energies}


def schnet_ok():
    return SchNetLike()


def schnet_local():
    """(a) no per-layer exchange: halo mode 'local' (ghost features from truncated neighbourhoods)."""
    return SchNetLike(spec=SPEC_MPNN_HALO.with_storage(HaloStorage("local")))


def schnet_torch_zeros():
    """(b) scatter targets from torch.zeros: plain tensors the halo correction never sees."""
    return SchNetLike(alloc="torch.zeros")


def schnet_sum_over_ghosts():
    """(c) energy = energies.sum() over every row: ghost copies counted."""
    return SchNetLike(total="sum")


def sample(repeat=(4, 4, 4), seed: int = 2):
    """Rattled fcc Ar/Kr, 256 points in a 21 Å box."""
    import numpy as np
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    z = atoms.numbers.copy()
    z[np.random.default_rng(seed).random(len(atoms)) < 0.3] = 36
    atoms.numbers = z
    return atoms
