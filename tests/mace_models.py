"""Small random-weight mace-torch models for tests (independent of the shipped model)."""
from pathlib import Path

import numpy as np
import torch


def make_random_mace(path: Path, elements=(29,), r_max=4.5, channels=8, max_ell=2, correlation=2,
                     num_interactions=2, seed=0) -> Path:
    import mace  # noqa: F401
    from e3nn import o3
    from mace.modules import interaction_classes
    from mace.modules.models import ScaleShiftMACE

    torch.manual_seed(seed)
    model = ScaleShiftMACE(
        r_max=r_max, num_bessel=6, num_polynomial_cutoff=5, max_ell=max_ell,
        interaction_cls=interaction_classes["RealAgnosticResidualInteractionBlock"],
        interaction_cls_first=interaction_classes["RealAgnosticResidualInteractionBlock"],
        num_interactions=num_interactions, num_elements=len(elements),
        hidden_irreps=o3.Irreps(f"{channels}x0e+{channels}x1o"), MLP_irreps=o3.Irreps("8x0e"),
        atomic_energies=np.array([-3.0 - 0.5 * i for i in range(len(elements))]),
        avg_num_neighbors=20.0, atomic_numbers=list(elements), correlation=correlation,
        gate=torch.nn.functional.silu, atomic_inter_scale=0.5, atomic_inter_shift=0.1,
    ).double()
    torch.save(model, path)
    return path
