"""ShardMD engine: it wires the models, the domain and the integrators into runs.

Its rooms, top to bottom (each may import only those below it; pyproject.toml's import
contracts hold it):

    cli/            the command line: ``python -m engine run|minimize|info|plot|convert``, sweeps
    ase_calculator  the ASE calculator (the Python face beside the command line)
    relax/          minimisation (FIRE, the cell filter) on the run loop's domains
    run/            the run loop: set-up, state, domains, steps, observables, reporting, restarts
    config/         the configuration schema, composition and the code guard
    io/ launch/     files (H5MD, checkpoints, ASE formats); launching and joining MPI ranks,
                    signals and stops
    observables/    the registry of observables (built-ins and users'): what the thermo
                    table, the trajectory, plot and info show
    errors          the one-line errors and their exit codes

This folder is ``shardmd.engine`` (through the link ``shardmd/engine``) and, for ``python -m
engine`` from any directory, also the top-level ``engine`` whose ``__main__`` alone runs;
every module imports through ``shardmd.*``, so a user's own ``models.py`` or ``domain/`` in
the working directory is never picked up.  ``from shardmd.engine import Simulation,
compose_config`` is the Python API's entry.
"""
__version__ = "0.1.0"


def __getattr__(name):  # lazy: `python -m engine --help` must not pay for torch/warp
    if name == "Simulation":
        from shardmd.engine.run.simulation import Simulation

        return Simulation
    if name == "compose_config":
        from shardmd.engine.config.compose import compose_config

        return compose_config
    if name == "State":
        from shardmd.engine.run.state import State

        return State
    raise AttributeError(name)


__all__ = ["Simulation", "State", "compose_config", "__version__"]
