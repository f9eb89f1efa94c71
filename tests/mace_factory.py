"""Module-scope factory of the shipped MACE wrapper (trace_and_validate's workers import it)."""


def shipped_mace():
    from shardmd.models.mace import MaceModel

    return MaceModel()
