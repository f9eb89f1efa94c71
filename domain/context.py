"""The decomposition context a model call runs in: this rank's points and how to talk to the others."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .comm import Comm
from .decomposition import DomainGrid
from .halo import HaloPlan, halo_forward, halo_reverse


@dataclass
class DomainContext:
    """comm: process group; grid: domain grid; plan: this rank's halo plan;
    cell: (3, 3) Å current cell; pbc: global periodic axes; local_pbc: axes the rank's own
    neighbour search treats as periodic (unsplit periodic axes)."""

    comm: Comm
    grid: DomainGrid
    plan: HaloPlan
    cell: torch.Tensor
    pbc: tuple
    local_pbc: tuple

    @property
    def n_owned(self) -> int:
        return self.plan.n_owned

    @property
    def n_padded(self) -> int:
        return self.plan.n_padded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(n_owned, *F) -> (n_padded, *F) (differentiable)."""
        return halo_forward(self.comm, self.plan, x)

    def reverse(self, g: torch.Tensor) -> torch.Tensor:
        """(n_padded, *F) -> (n_owned, *F), ghost rows summed into owners (differentiable)."""
        return halo_reverse(self.comm, self.plan, g)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(t)
