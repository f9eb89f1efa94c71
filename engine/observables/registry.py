"""The registry: every observable a run computes, declared once.

An :class:`Observable` says what the thermo table, the trajectory, ``plot`` and ``info`` need
to know of it: its name, unit (and the unit string the H5MD file stores), how its per-rank
values combine into the system's (``reduce``), what it costs, when it is computed, and its
thermo column.  The built-ins (engine/observables/builtin.py) are registered here at import,
through :func:`register_observable`, the function users call too (docs/observables.md).

reduce:
  ``sum``      the function returns this rank's partial (its own atoms); the system's value
               is the sum over ranks (one all-reduce for all of them together)
  ``max`` / ``min``  the largest / smallest partial over ranks
  ``none``     the function returns the system's value from system-wide data (cell, step,
               potential energy); rank 0's value is the one every rank uses
  ``derived``  computed after the reductions, from the reduced values of ``depends``
               (``view.values``); every rank computes it alike
when:   ``thermo`` (a column of the thermo table), ``trajectory`` (a row of
        ``/observables/<name>`` with each frame); empty: on demand only
        (``Simulation.observables(names=[...])`` or as another's dependency)
cost:   ``cheap`` ones are computed whenever observables are (thermo rows, frames, the health
        check before each checkpoint); ``expensive`` ones only when their ``when`` is due,
        and by default only with trajectory frames
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from shardmd.engine.errors import UserError
from shardmd.engine.observables import builtin

REDUCTIONS = ("sum", "max", "min", "none", "derived")
COSTS = ("cheap", "expensive")
WHEN = ("thermo", "trajectory")
#: names the thermo table and the trajectory use for other things
RESERVED = frozenset({"step", "time", "time_ps"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Observable:
    """One observable's declaration (see the module docstring for ``reduce``, ``when``, ``cost``).

    compute: ``fn(view) -> value`` (a float or an array of ``shape``; None: absent this step,
    ``derived`` only); ``view`` is a :class:`~shardmd.engine.observables.view.StateView`.
    unit: the unit in words (``eV``, ``K``, ``Å^3``); h5md_unit: the trajectory's ``unit``
    attribute (H5MD's grammar, e.g. ``"eV Angstrom-3"``; default: ``unit``).
    header / fmt: the thermo column's title and format (default ``name(unit)``, ``{:>14.6g}``,
    widened to the title); scale / shown_unit: the thermo table and ``plot`` show
    ``value * scale`` in ``shown_unit`` (pressure: bar); plot: the ``plot`` panel's label
    (curves with the same label share a panel; default ``name (shown unit)``; "" for none).
    origin: who registered it (``built-in``, ``module:function``).
    """

    name: str
    compute: Callable[[Any], Any]
    unit: str = ""
    h5md_unit: str | None = None
    reduce: str = "sum"
    depends: tuple[str, ...] = ()
    cost: str = "cheap"
    when: tuple[str, ...] = ("thermo", "trajectory")
    shape: tuple[int, ...] = ()
    header: str = ""
    fmt: str = ""
    scale: float = 1.0
    shown_unit: str = ""
    plot: str = ""
    description: str = ""
    origin: str = "built-in"
    order: float = field(default=0.0, compare=False)
    column: float = field(default=0.0, compare=False)

    @property
    def width(self) -> int:
        """Characters of the thermo column."""
        return len(self.fmt.format(0) if "d" in self.fmt else self.fmt.format(0.0))

    def cell(self, value) -> str:
        """The thermo table's text of ``value`` ('-' when absent)."""
        if value is None:
            return "-".rjust(self.width)
        return self.fmt.format(value * self.scale if self.scale != 1.0 else value)


_REGISTRY: dict[str, Observable] = {}


def _fail(name: str, text: str) -> UserError:
    return UserError(f"observable {name!r}: {text}")


def _declare(name, compute, *, unit="", h5md_unit=None, reduce="sum", depends=(), cost="cheap", when=None,
             shape=(), header=None, fmt=None, scale=1.0, shown_unit=None, plot=None, description="",
             origin="") -> Observable:
    """Check one declaration; return it completed with its defaults."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED:
        raise UserError(f"observable name {name!r} is not valid: give letters, digits and _ (not starting with a "
                        f"digit, at most 64), other than {', '.join(sorted(RESERVED))}")
    if name in _REGISTRY:
        raise _fail(name, f"registered already (by {_REGISTRY[name].origin}); give another name, or "
                          f"unregister_observable({name!r}) first")
    if not callable(compute):
        raise _fail(name, f"compute must be a function of the state view, got {type(compute).__name__}")
    if reduce not in REDUCTIONS:
        raise _fail(name, f"reduce={reduce!r} is not one of {', '.join(REDUCTIONS)}")
    if cost not in COSTS:
        raise _fail(name, f"cost={cost!r} is not one of {', '.join(COSTS)}")
    depends = (depends,) if isinstance(depends, str) else tuple(depends)
    if depends and reduce != "derived":
        raise _fail(name, f"depends={list(depends)} needs reduce='derived' (a {reduce} reduction reads the state)")
    unknown = [d for d in depends if d not in _REGISTRY]
    if unknown:
        raise _fail(name, f"depends on unknown observable {unknown[0]!r}; register it first (registered: "
                          f"{', '.join(_REGISTRY)})")
    if when is None:
        when = ("thermo", "trajectory") if cost == "cheap" else ("trajectory",)
    when = (when,) if isinstance(when, str) else tuple(when)
    bad = [w for w in when if w not in WHEN]
    if bad:
        raise _fail(name, f"when={bad[0]!r} is not one of {', '.join(WHEN)} (an empty list: on demand)")
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise _fail(name, f"shape={shape!r} is not a tuple of whole numbers") from None
    if "thermo" in when and shape != ():
        raise _fail(name, f"a thermo column holds one number; shape {shape} is for the trajectory only "
                          "(when=['trajectory'])")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale != 0):
        raise _fail(name, f"scale={scale!r} is not a finite, non-zero number")
    shown = unit if shown_unit is None else shown_unit
    header = header or (f"{name}({shown})" if shown else name)
    fmt = fmt or f"{{:>{max(14, len(header))}.6g}}"
    try:
        fmt.format(0.0)
    except (ValueError, IndexError, KeyError):
        raise _fail(name, f"fmt={fmt!r} cannot format a number; give e.g. '{{:>14.6g}}'") from None
    if plot is None:
        plot = f"{name} ({shown})" if shown else name
    return Observable(name, compute, unit=unit, h5md_unit=unit if h5md_unit is None else h5md_unit or None,
                      reduce=reduce, depends=depends, cost=cost, when=when, shape=shape, header=header, fmt=fmt,
                      scale=float(scale), shown_unit=shown, plot=plot, description=description,
                      origin=origin or _origin_of(compute))


def _origin_of(fn) -> str:
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{mod}:{qual}" if mod and qual else repr(fn)


def register_observable(name=None, compute=None, **declaration):
    """Register an observable (see :class:`Observable` for the keywords); returns it.

    ``register_observable("com_z", fn, unit="Å", reduce="derived", depends=[...])``, or as a
    decorator, ``@register_observable("xsum", unit="Å")`` (the name defaults to the function's),
    which returns the function with the declaration as its ``observable`` attribute.
    Errors (a taken name, an unknown dependency, a bad keyword value) are one line (UserError).
    """
    if callable(name) and compute is None:   # @register_observable without arguments
        name, compute = None, name
    if compute is None:
        def decorate(fn):
            register_observable(name or getattr(fn, "__name__", None), fn, **declaration)
            return fn
        return decorate
    # places in the trajectory and plot (order) and the thermo table (column, default: order);
    # the built-ins declare theirs, users' come after them, as registered
    order, column = declaration.pop("order", None), declaration.pop("column", None)
    obs = _declare(name or getattr(compute, "__name__", None), compute, **declaration)
    order = 100.0 + len(_REGISTRY) if order is None else float(order)
    obs = replace(obs, order=order, column=order if column is None else float(column))
    _REGISTRY[obs.name] = obs
    try:
        compute.observable = obs
    except (AttributeError, TypeError):   # a builtin or a bound method: nothing to mark
        pass
    return obs


def unregister_observable(name: str) -> None:
    """Take a user's observable out of the registry (the built-ins stay); one line when unknown."""
    obs = get(name)
    if obs.origin == "built-in":
        raise _fail(name, "is built in and cannot be unregistered")
    needed = [o.name for o in _REGISTRY.values() if name in o.depends]
    if needed:
        raise _fail(name, f"{needed[0]!r} depends on it; unregister that first")
    del _REGISTRY[name]


def get(name: str) -> Observable:
    """The declaration of ``name``; one line naming the registered ones when unknown."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown observable {name!r}; registered: {', '.join(_REGISTRY)}") from None


def registered() -> list[Observable]:
    """Every observable, in the trajectory's and plot's order."""
    return sorted(_REGISTRY.values(), key=lambda o: o.order)


def shown(where: str) -> list[Observable]:
    """The observables of the thermo table (``thermo``, in column order) or the trajectory
    (``trajectory``)."""
    out = [o for o in registered() if where in o.when]
    return sorted(out, key=lambda o: o.column) if where == "thermo" else out


def builtin_names() -> list[str]:
    return [o.name for o in registered() if o.origin == "built-in"]


def needed(names) -> list[Observable]:
    """``names`` and everything they depend on, in an order where dependencies come first."""
    out: dict[str, Observable] = {}

    def add(n: str) -> None:
        if n in out:
            return
        o = get(n)
        for d in o.depends:
            add(d)
        out[n] = o

    for n in names:
        add(n)
    return list(out.values())


def h5md_unit(name: str) -> str | None:
    """The trajectory's unit string of a registered observable; None when unknown or unitless."""
    o = _REGISTRY.get(name)
    return o.h5md_unit if o is not None else None


for _decl in builtin.DECLARATIONS:   # the built-ins, through the users' route
    register_observable(**_decl, origin="built-in")
