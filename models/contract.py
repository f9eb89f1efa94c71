"""The model contract: what the engine needs from an interatomic model (docs/byo.md).

A model is any object with

- ``cutoff: float`` -- the interaction range in Å (neighbour lists are built for
  ``cutoff + neighbor.skin``; the halo depth follows from it);
- ``compute(positions, cell, pbc, numbers, nl) -> Mapping[str, Tensor]`` with

  ========== ================ ======== ====================================================
  key        shape            unit     required
  ========== ================ ======== ====================================================
  energy     () (0-d)         eV       yes
  forces     (n, 3)           eV/Å     yes (or computed for you: ``model_config``
                                       ``autograd_outputs={"forces": "energy"}``)
  virial     (3, 3)           eV       no: without it the run has no pressure or stress
                                       (the log says so once; the thermo shows ``-``)
  energies   (n,)             eV       no: per-atom energies
  ========== ================ ======== ====================================================

  (a model may state these units in ``ModelConfig.units``; one stating others, e.g.
  ``{"energy": "kcal/mol"}``, is refused with the conversion to make);

  positions (n, 3) Å, cell (3, 3) Å (rows are the cell vectors), pbc (3,) bool, numbers (n,)
  atomic numbers, nl the neighbour list (``nl.edge_index()`` -> (i, j),
  ``nl.shift_vectors(cell)`` -> (n_edges, 3) Å, so ``r_ij = x[j] + shift - x[i]``); cell and
  pbc are the system's on every rank (a periodic axis split into domains is still periodic);
- optionally further inputs, declared in ``model_config`` (``ModelConfig`` of
  ``shardmd.domain.api``) and received as keyword arguments of ``compute``:
  ``point_inputs=("charges",)`` per atom ((n,) e: ``system.charges`` or the structure file's
  ``initial_charges``; ghost rows their owners' values; any other name ``X``: the file's array
  ``X``) and ``system_inputs=("charge", "spin")`` per system ((1,): the total charge in e,
  ``system.charge``; the spin multiplicity 2S+1, ``system.spin``); they move with the atoms
  and are kept in checkpoints (engine/run/model_inputs.py); a model declaring none is called
  as before;
- optionally ``check_species(numbers)`` raising ``ValueError`` (one line) for atomic numbers
  it has no parameters for.

How it runs across domains is declared, not coded: a ``distribution_spec`` (an
``MLIPSpec`` of ``shardmd.domain.api``; ``model.spec=FILE`` loads a saved one), or the older
``output_kinds`` map; a model with neither runs with the message-passing halo preset
(``SPEC_MPNN_HALO``).  ``trace_and_validate`` checks a model and its spec on real ranks
before a run (docs/distributed.md).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from shardmd.domain.api import same_unit

REQUIRED_OUTPUTS = ("energy", "forces")
OPTIONAL_OUTPUTS = ("virial", "energies")
#: the units of the table above; a model declaring others (``ModelConfig.units``) is refused
CONTRACT_UNITS = {"energy": "eV", "forces": "eV/Å", "virial": "eV", "energies": "eV"}


@runtime_checkable
class Model(Protocol):
    """An interatomic model as the engine calls it (see the module docstring for the units)."""

    cutoff: float

    def compute(self, positions, cell, pbc, numbers, nl) -> Mapping[str, Any]:
        """{"energy": 0-d eV, "forces": (n, 3) eV/Å, optional "virial": (3, 3) eV, "energies": (n,) eV}."""
        ...


def check_model(model: Any, origin: str) -> Any:
    """``model`` when it meets the contract's static part, else ``ValueError`` (one line naming
    ``origin``, where the model came from, and the fix)."""
    inner = getattr(model, "model", None)   # a DistributedModel-wrapped model: check the model it wraps
    target = inner if inner is not None and type(model).__name__ == "DistributedModel" else model
    if not callable(getattr(target, "compute", None)):
        raise ValueError(f"{origin} returned {type(target).__name__}, not a model: a model has "
                         "compute(positions, cell, pbc, numbers, nl) and cutoff (docs/byo.md)")
    cutoff = getattr(target, "cutoff", None)
    if cutoff is None:
        cfg = getattr(target, "model_config", None)
        cutoff = getattr(getattr(cfg, "neighbors", None), "cutoff", None)
    try:
        ok = cutoff is not None and math.isfinite(float(cutoff)) and float(cutoff) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{origin} returned a {type(target).__name__} without a usable cutoff "
                         f"({cutoff!r}): give it an attribute cutoff, the interaction range in Å (> 0)")
    units = getattr(getattr(target, "model_config", None), "units", None) or {}
    for key, unit in units.items():
        want = CONTRACT_UNITS.get(key)
        if want is not None and not same_unit(unit, want):
            raise ValueError(f"{origin} gives {key} in {unit}, the engine (and every other model or term) in "
                             f"{want}: convert {key} to {want} in its compute and declare {key}: {want!r} "
                             "in ModelConfig.units (or leave it out)")
    return model


def has_virial(outputs: Mapping[str, Any]) -> bool:
    return outputs.get("virial") is not None


__all__ = ["CONTRACT_UNITS", "OPTIONAL_OUTPUTS", "REQUIRED_OUTPUTS", "Model", "check_model", "has_virial"]


def refuse_unknown_species(numbers, known, what: str, fix: str = "use a model trained on those elements") -> None:
    """A model's ``check_species``: raise a one-line ValueError, "<what> does not know X, Y (it
    knows A, B); <fix>", for the elements of ``numbers`` (atomic numbers, any shape) that
    ``known`` (atomic numbers) lacks."""
    import torch
    from ase.data import chemical_symbols

    have = {int(z) for z in torch.as_tensor(numbers).unique().tolist()}
    missing = sorted(have - {int(z) for z in known})
    if missing:
        raise ValueError(f"{what} does not know {', '.join(chemical_symbols[z] for z in missing)} (it knows "
                         f"{', '.join(chemical_symbols[int(z)] for z in known)}); {fix}")

