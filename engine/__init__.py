"""ShardMD engine: run loop, state, CLI, I/O.

This folder is installed twice: as ``shardmd.engine`` (the real package) and as a
top-level ``engine`` alias so that ``python -m engine`` works from any directory.  Every
module imports through ``shardmd.*``, so a user's own ``models.py`` or ``domain/`` in the
working directory is never picked up.
"""
__version__ = "0.1.0"


def __getattr__(name):  # lazy: `python -m engine --help` must not pay for torch/warp
    if name == "Simulation":
        from shardmd.engine.simulation import Simulation

        return Simulation
    if name == "compose_config":
        from shardmd.engine.config import compose_config

        return compose_config
    if name == "State":
        from shardmd.engine.state import State

        return State
    raise AttributeError(name)


__all__ = ["Simulation", "State", "compose_config", "__version__"]
