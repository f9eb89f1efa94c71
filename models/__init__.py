"""Interatomic models.  Each model meets :mod:`shardmd.models.contract`: ``cutoff`` (Å) and
``compute(positions, cell, pbc, numbers, nl) -> {"energy", "forces", optional "virial",
"energies"}``.  Models use only ``shardmd.domain``'s public API and run without the engine."""
from .contract import Model, check_model
from .registry import MODELS, build_model, model_origin, registered_names

__all__ = ["MODELS", "Model", "build_model", "check_model", "model_origin", "registered_names"]
