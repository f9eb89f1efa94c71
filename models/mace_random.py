"""Random-weight mace-torch models, for tests and speed benchmarks (no training data needed).

Speed does not depend on the weights' values, and the multi-domain tests compare a model with
itself on one domain, so random weights of the right shape serve both.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def make_random_mace(path: Path, elements=(29,), r_max: float = 4.5, channels: int = 8, max_ell: int = 2,
                     correlation: int = 2, num_interactions: int = 2, num_bessel: int = 6,
                     mlp_channels: int = 8, avg_num_neighbors: float = 20.0, e0: tuple[float, ...] | None = None,
                     scale: float = 0.5, shift: float = 0.1, seed: int = 0,
                     heads: tuple[str, ...] | None = None, pair_repulsion: bool = False) -> Path:
    """Save a float64 ``ScaleShiftMACE`` (hidden irreps ``channels x (0e + 1o)``) to ``path``.

    elements: atomic numbers; r_max: cutoff, Å; e0: per-element reference energies, eV
    (default -3.0, -3.5, ...); scale, shift: of the interaction energy, eV. The defaults make a
    small, fast model; MACE-MP-medium's shape is channels=128, max_ell=3, correlation=3.
    heads: names of the readout heads of a multi-head model (mace-torch's ``heads``; each head
    gets its own E0s, shifted by -0.25 eV per head, and its own scale and shift); None: one
    head, ``Default``. pair_repulsion: mace-torch's ZBL pair term (as several foundation models)."""
    import mace  # noqa: F401  (imported first: mace sets up e3nn's defaults)
    from e3nn import o3
    from mace.modules import interaction_classes
    from mace.modules.models import ScaleShiftMACE

    torch.manual_seed(seed)
    block = interaction_classes["RealAgnosticResidualInteractionBlock"]
    energies = np.array(e0 if e0 is not None else [-3.0 - 0.5 * i for i in range(len(elements))])
    extra = {}
    if heads:
        nh = len(heads)
        energies = np.stack([energies - 0.25 * h for h in range(nh)])
        scale = [scale * (1 + 0.2 * h) for h in range(nh)]
        shift = [shift - 0.1 * h for h in range(nh)]
        extra["heads"] = list(heads)
    if pair_repulsion:
        extra["pair_repulsion"] = True
    model = ScaleShiftMACE(
        r_max=r_max, num_bessel=num_bessel, num_polynomial_cutoff=5, max_ell=max_ell,
        interaction_cls=block, interaction_cls_first=block, num_interactions=num_interactions,
        num_elements=len(elements), hidden_irreps=o3.Irreps(f"{channels}x0e+{channels}x1o"),
        MLP_irreps=o3.Irreps(f"{mlp_channels}x0e"), atomic_energies=energies,
        avg_num_neighbors=avg_num_neighbors, atomic_numbers=list(elements), correlation=correlation,
        gate=torch.nn.functional.silu, atomic_inter_scale=scale, atomic_inter_shift=shift, **extra,
    ).double()
    torch.save(model, path)
    return Path(path)
