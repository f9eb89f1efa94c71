"""Inputs of tests/test_orb.py: small Cu/Ag structures, ORB models of orb-models' own orb-v3
architecture with random weights (small widths; no download), a checkpoint written the way
orb-models releases them (a bare ``state_dict`` saved with ``torch.save``, float32), and the
evaluation of a calculator (ours or orb-models' ``ORBCalculator``).

orb-models builds its graph in the process's default dtype (``ase_atoms_to_atom_graphs``), as
its ``precision="float64"`` sets it; :func:`evaluate` does the same around each evaluation.
Everything offline; the models build in well under a second.

Usage (also as a script): ``python tests/orb_cases.py DIR`` writes DIR/orb-random.ckpt.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import numpy as np

#: the random models of the tests (models/orb.py ``factory`` keywords): orb-v3, 2 layers, cap 20
KWARGS = {"random": True, "latent_dim": 16, "mlp_hidden_dim": 24, "head_hidden_dim": 16, "num_layers": 2, "seed": 3}
KWARGS_CONSERVATIVE = {**KWARGS, "conservative": True, "seed": 4}
A = 3.7   # Å: fcc lattice constant of the structures (4 cells = 14.8 Å: two domains of 7.4 Å > 6.4 Å ghosts)


def cuag(repeat=(4, 4, 2), seed: int = 1, rattle: float = 0.08):
    """fcc Cu with ~40 % Ag on random sites, ``repeat`` cubic cells (4 atoms each), rattled (Å)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=A, cubic=True).repeat(tuple(repeat))
    atoms.numbers[np.random.default_rng(seed).random(len(atoms)) < 0.4] = 47
    if rattle:
        atoms.rattle(rattle, seed=seed)
    return atoms


def write_checkpoint(model, path: Path) -> Path:
    """The network's state dict, float32, as orb-models releases its models (``torch.load``
    of it is a plain dict of tensors)."""
    import torch

    state = {k: (v.float() if v.is_floating_point() else v) for k, v in model.net.state_dict().items()}
    torch.save(state, path)
    return Path(path)


def write_v2_checkpoint(path: Path, layers: int = 2, seed: int = 0) -> Path:
    """An orb-v2 network (orb-models' ``orb_v2_architecture``: its fixed widths, ``layers``
    message-passing steps) with random weights, saved as orb-models releases it."""
    import torch
    from orb_models.forcefield.atomic_system import SystemConfig
    from orb_models.forcefield.pretrained import orb_v2_architecture

    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        net = orb_v2_architecture(num_message_passing_steps=layers, device="cpu",
                                  system_config=SystemConfig(radius=6.0, max_num_neighbors=20))
    torch.save(net.state_dict(), path)
    return Path(path)


@contextlib.contextmanager
def default_dtype(dtype):
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def evaluate(calc, atoms, dtype=None):
    """(energy eV, forces (n, 3) eV/Å, virial (3, 3) eV) of a fresh evaluation of ``atoms``
    (periodic), under the default ``dtype`` (float64 unless given)."""
    import torch
    from ase import Atoms

    a = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=True)
    a.calc = calc
    calc.reset()
    with warnings.catch_warnings(), default_dtype(dtype or torch.float64):
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces(), -a.get_stress(voigt=False) * a.get_volume()


def orb_graph(model, atoms) -> set:
    """orb-models' own graph of ``atoms`` for ``model``'s cap (its ``compute_pbc_radius_graph``,
    knn_scipy as on CPU): the set of (sender, receiver, image shift) of every edge."""
    import torch
    from orb_models.forcefield.featurization_utilities import compute_pbc_radius_graph, map_to_pbc_cell

    pos = torch.tensor(atoms.positions, dtype=torch.float64)
    cell = torch.tensor(atoms.cell.array, dtype=torch.float64)
    wrapped = map_to_pbc_cell(pos, cell)
    edges, _, shifts = compute_pbc_radius_graph(positions=wrapped, cell=cell, pbc=torch.tensor([True] * 3),
                                                radius=model.cutoff, max_number_neighbors=model.max_neighbors,
                                                float_dtype=torch.float64, device="cpu")
    # orb-models' shifts are for the wrapped positions: give them for the positions as they are
    frac_move = torch.round(torch.linalg.solve(cell.T, (wrapped - pos).T).T)
    shifts = shifts + frac_move[edges[1]] - frac_move[edges[0]]
    return {(int(s), int(r), *(int(round(float(v))) for v in sh)) for s, r, sh in zip(edges[0], edges[1], shifts)}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from shardmd.models.orb import factory

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(write_checkpoint(factory(**KWARGS), out / "orb-random.ckpt"))
