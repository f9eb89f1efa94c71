"""Interatomic models.  Each model offers ``cutoff`` (Å) and
``compute(positions, cell, pbc, numbers, nl) -> {"energy", "forces", "virial", "energies"}``.
Models use only ``shardmd.domain``'s public API and run without the engine."""
from .registry import MODELS, build_model

__all__ = ["MODELS", "build_model"]
