"""The two orb-models layouts models/orb.py and models/orb_files.py run on, behind one interface.

- orb-models 0.5.5 (the last for Python 3.11): ``orb_models.forcefield.{calculator, nn_util,
  atomic_system}``; the architecture functions take a ``SystemConfig`` (radius, neighbour cap)
  that the network keeps and ``ORBCalculator`` reads; its ``ForceHead`` removes the mean force
  (and the torque) from the normalised MLP output, then denormalises.
- orb-models 0.7 (Python 3.12): ``orb_models.forcefield.inference.calculator``,
  ``orb_models.common.models.nn_util``; the network no longer knows its radius and cap: a
  ``ForcefieldAtomsAdapter`` carries them and ``ORBCalculator`` takes one; its heads return
  physical units, so ``ForceHead`` denormalises first and then removes the mean (and torque);
  its orb-v3 conservative architecture sums the ZBL term over atoms where the released
  checkpoints were trained with its per-atom mean (orb-models' own loaders set it back).

Which layout is installed is read once, from whether ``orb_models.forcefield.inference`` exists;
nothing here imports orb-models until a model is built.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util


@functools.cache
def inference_layout() -> bool:
    """True for orb-models >= 0.7 (its ``forcefield.inference`` package), False for 0.5.
    Raises ModuleNotFoundError (``name`` set) without orb-models."""
    return importlib.util.find_spec("orb_models.forcefield.inference") is not None


def import_calculator_module() -> None:
    """Import the module of orb-models' ``ORBCalculator`` (the reference), whichever layout."""
    importlib.import_module("orb_models.forcefield.inference.calculator" if inference_layout()
                            else "orb_models.forcefield.calculator")


def build_architecture(pretrained, kind: str, radius: float, max_neighbors: int, args: dict):
    """orb-models' own architecture function for ``kind`` called with ``args``, on the CPU;
    0.5: the radius and cap in its SystemConfig; 0.7: they are not the network's (see
    :func:`calculator`), and an orb-v3 conservative network gets the per-atom mean ZBL term that
    0.5 builds and that 0.7's loaders of the released conservative models set."""
    build = {"v2": pretrained.orb_v2_architecture, "v3-direct": pretrained.orb_v3_direct_architecture,
             "v3-conservative": pretrained.orb_v3_conservative_architecture}[kind]
    if not inference_layout():
        from orb_models.forcefield.atomic_system import SystemConfig

        return build(device="cpu", system_config=SystemConfig(radius=radius, max_num_neighbors=int(max_neighbors)),
                     **args)
    net = build(device="cpu", **args)
    if kind == "v3-conservative":
        net.pair_repulsion_fn.node_aggregation = "mean"
    return net


def calculator(net, radius: float, max_neighbors: int):
    """orb-models' ``ORBCalculator`` on ``net`` (CPU) with the graph's radius and cap."""
    if not inference_layout():
        from orb_models.forcefield.calculator import ORBCalculator

        return ORBCalculator(net, device="cpu")   # the radius and cap: the network's SystemConfig
    from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter
    from orb_models.forcefield.inference.calculator import ORBCalculator

    return ORBCalculator(net, ForcefieldAtomsAdapter(radius=radius, max_num_neighbors=int(max_neighbors)),
                         device="cpu")


def get_cutoff():
    """orb-models' attention envelope ``get_cutoff`` (its ``nn_util`` moved in 0.7)."""
    if inference_layout():
        from orb_models.common.models.nn_util import get_cutoff as fn
    else:
        from orb_models.forcefield.nn_util import get_cutoff as fn
    return fn


def forces_denormalised_first() -> bool:
    """Whether orb-models' ``ForceHead`` denormalises before removing the mean force and torque
    (0.7) rather than after (0.5); the two differ by the normaliser's mean."""
    return inference_layout()


__all__ = ["build_architecture", "calculator", "forces_denormalised_first", "get_cutoff", "import_calculator_module",
           "inference_layout"]
