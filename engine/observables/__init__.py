"""Observables: one registry of what a run computes and shows (docs/observables.md).

    from shardmd.engine.observables import register_observable

    @register_observable("x_sum", unit="Å", reduce="sum")
    def x_sum(view):                    # view: StateView, this rank's atoms
        return view.positions[:, 0].sum()

The thermo table, the trajectory's ``/observables``, ``plot`` and ``info`` read the registry
(engine/observables/registry.py); the built-ins are declared in builtin.py; the run computes
and reduces them over ranks in engine/run/measure.py.  This room sits below ``config``, ``io``
and ``launch`` and above ``errors``: everything that shows an observable may read it.
"""
from shardmd.engine.observables.registry import (
    Observable,
    get,
    register_observable,
    registered,
    shown,
    unregister_observable,
)
from shardmd.engine.observables.view import StateView

__all__ = ["Observable", "StateView", "get", "register_observable", "registered", "shown", "unregister_observable"]
