"""Inputs of tests/test_mattersim.py: a small Cu/Ag structure, a MatterSim checkpoint written the way
users get one (MatterSim's own ``Potential.save``, of a small M3GNet with random weights), and a
float64 reference by MatterSim's own code.  Everything offline; a few seconds on 2 cores.

MatterSim runs float32 only (mattersim 1.2.3's ``M3Gnet.forward`` casts the periodic offsets and
the one-hot to float32, its graphs are ``FloatTensor``s), so its calculator checks the float32
route at float32 tolerance.  :func:`reference64` evaluates MatterSim's own ``M3Gnet.forward`` in
float64 on MatterSim's own graph (its neighbour list, its three-body builder): the weights cast
to float64, the one-hot method returning float64, the positions float64 and the cell kept
float32, which is exact for the cells used here (a = 3.625 Å: every cell entry and offset
product is a float32 number), so nothing is rounded to float32.  mattersim 1.2.4 on casts the
offsets to the positions' dtype instead, so there the cell goes float64 (the same numbers).  It
gives energies and forces (a strain would make the cell float64, which 1.2.3's float32 offsets
cannot meet).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

#: the random model (models/mattersim.py ``factory`` keywords): small, MatterSim's architecture
KWARGS = {"random": True, "num_blocks": 2, "units": 16, "max_l": 3, "max_n": 3, "cutoff": 4.0,
          "threebody_cutoff": 3.0, "seed": 3, "scale": 200.0, "shift": {"Cu": -3.5, "Ag": -2.8}}
A = 3.625   # Å: cell entries exact in float32 (reference64)


def cuag(n: int = 3, seed: int = 1, rattle: float = 0.08):
    """fcc Cu with ~40 % Ag on random sites, n x n x n cubic cells (4 n^3 atoms), rattled (Å)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=A, cubic=True).repeat((n, n, n))
    atoms.numbers[np.random.default_rng(seed).random(len(atoms)) < 0.4] = 47
    atoms.rattle(rattle, seed=seed)
    return atoms


def make_checkpoint(model, path: Path) -> Path:
    """``Potential.save`` of the wrapper's network (float32, as MatterSim trains and saves)."""
    from mattersim.forcefield.potential import Potential

    calc = model.ase_calculator()   # MatterSim's Potential around a float32 copy of the weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Potential(calc.potential.model, device="cpu").save(str(path))
    return Path(path)


def _offsets_follow_positions() -> bool:
    """Whether ``M3Gnet.forward`` casts the periodic offsets to the positions' dtype (mattersim
    1.2.4 on) rather than to float32 (1.2.3)."""
    from importlib.metadata import version

    return tuple(int(x) for x in version("mattersim").split(".")[:3]) >= (1, 2, 4)


def reference64(model, atoms) -> tuple[float, np.ndarray]:
    """(energy eV, forces (n, 3) eV/Å) of MatterSim's own ``M3Gnet.forward`` in float64 on its
    own graph of ``atoms`` (module docstring)."""
    import copy

    import torch
    import torch.nn.functional as F
    from mattersim.datasets.utils.build import build_dataloader
    from mattersim.forcefield.potential import batch_to_dict

    net = copy.deepcopy(model.net).double()
    net.one_hot_atoms = lambda z: F.one_hot(z, num_classes=net.max_z + 1).double()
    a = atoms.copy()
    a.set_scaled_positions(np.mod(a.get_scaled_positions(), 1))   # what MatterSim's convertor does
    assert np.array_equal(a.cell.array.astype(np.float32).astype(np.float64), a.cell.array), "cell not float32-exact"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = build_dataloader([a], model_type="m3gnet", cutoff=model.cutoff,
                                  threebody_cutoff=model.threebody_cutoff, batch_size=1, only_inference=True)
        data = batch_to_dict(next(iter(loader)), device="cpu")
    data["atom_pos"] = torch.tensor(a.positions, dtype=torch.float64, requires_grad=True)
    if _offsets_follow_positions():
        data["cell"] = data["cell"].double()
    energy = net(data)[0]
    (grad,) = torch.autograd.grad(energy, data["atom_pos"])
    return float(energy.detach()), -grad.numpy()
