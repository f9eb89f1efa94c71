"""The thermo table's columns: ``thermo.columns=[step,time,temp,pe,etotal,conserved,density,temp@top]``.

Names as LAMMPS's ``thermo_style custom`` (the header shows each column's unit):

============  ===================================================  ===========
step, time    the step, the time                                    -, ps
temp          temperature (2 K / (dof kB))                          K
pe, ke        potential, kinetic energy                             eV
etotal        pe + ke                                               eV
conserved     etotal + the thermostat's / barostat's energy         eV
              (the integrator's conserved quantity; etotal for verlet)
press         pressure, tr(sum m v (x) v + W) / 3V                  bar
pxx ... pyz   the pressure tensor's components                      bar
vol, density  volume; total mass / volume                           Å^3; g/cm^3
lx, ly, lz    the cell's edges in LAMMPS's prism (xprd, yprd, zprd)  Å
============  ===================================================  ===========

Any registered observable is a column by its name (``potential_energy``, a user's ``com_vz``),
one of a vector observable by index (``vcm[2]``).  ``<column>@<group>`` is the value over the
atoms of ``groups.<group>`` alone (temp@top: the group's kinetic energy over its own degrees of
freedom, 3 per mobile atom: fixed atoms count in neither); it takes the observables that are sums
over atoms and what derives from them (temp, ke, a user's sums), not system-wide ones (pe, press,
vol).  Without ``thermo.columns`` the table is step, time and the observables whose ``when``
holds ``thermo`` (Temp PotEng KinEng TotEng Press Volume, then users').
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from shardmd.engine.errors import UserError
from shardmd.engine.observables import registry
from shardmd.integrators.units import EV_PER_A3_TO_BAR

KEY = "thermo.columns"
SPELLING = re.compile(r"([A-Za-z_]\w*)(?:\[(\d+)\])?(?:@([A-Za-z_]\w*))?")
_P = -EV_PER_A3_TO_BAR   # the pressure tensor from the stored stress (-P), in bar

#: LAMMPS-like name -> (observable, index, header, format, scale); None: the observable's own
ALIASES: dict[str, tuple] = {
    "temp": ("temperature", (), None, None, None),
    "pe": ("potential_energy", (), None, None, None),
    "ke": ("kinetic_energy", (), None, None, None),
    "etotal": ("total_energy", (), None, None, None),
    "conserved": ("conserved_energy", (), None, None, None),
    "press": ("pressure", (), None, None, None),
    "vol": ("volume", (), None, None, None),
    "density": ("density", (), None, None, None),
    **{f"p{a}{b}": ("stress", ("xyz".index(a), "xyz".index(b)), f"P{a}{b}(bar)", "{:>12.3f}", _P)
       for a, b in ("xx", "yy", "zz", "xy", "xz", "yz")},
    **{f"l{a}": ("box_lengths", ("xyz".index(a),), f"L{a}(A)", "{:>11.4f}", 1.0) for a in "xyz"},
}
LEADING = {"step": ("Step", "{:>10d}"), "time": ("Time(ps)", "{:>11.4f}")}


@dataclass(frozen=True)
class Column:
    """One column: ``spec`` as written; ``observable`` the registry's name ('' for step and
    time), ``index`` into a shaped value, ``group`` a group's name or None; the title and format
    of the table, and ``scale`` (the shown value is value x scale)."""

    spec: str
    observable: str
    index: tuple = ()
    group: str | None = None
    header: str = ""
    fmt: str = "{:>14.6g}"
    scale: float = 1.0

    @property
    def key(self) -> str:
        """The name of its value among the step's observables (``temperature@top`` per group)."""
        return self.observable + (f"@{self.group}" if self.group else "")

    @property
    def width(self) -> int:
        return max(len(self.header), len(self.fmt.format(0) if "d" in self.fmt else self.fmt.format(0.0)))

    def cell(self, step: int, time_fs: float, obs: dict) -> str:
        """The table's text of this column at one step ('-' when absent: no virial, no volume)."""
        if self.spec == "step":
            return self.fmt.format(int(step)).rjust(self.width)
        if self.spec == "time":
            return self.fmt.format(time_fs / 1000.0).rjust(self.width)
        v = obs.get(self.key)
        if v is None:
            return "-".rjust(self.width)
        if self.index:
            v = np.asarray(v)[self.index]
        return self.fmt.format(float(v) * self.scale).rjust(self.width)


def known() -> str:
    """The names the error of an unknown column lists."""
    scalars = [o.name for o in registry.registered() if o.shape == ()]
    return (f"{', '.join([*LEADING, *ALIASES])}; registered observables: {', '.join(scalars)}; "
            "name[i] for a vector observable; any of them @<group> per group")


def _fail(spec: str, text: str) -> UserError:
    return UserError(f"{KEY}: {spec!r}: {text}")


def _group_problem(name: str) -> str | None:
    """Why observable ``name`` has no per-group value (None: it has one)."""
    system = [o.name for o in registry.needed([name]) if o.reduce == "none"]
    if system:
        what = f"{name} is" if system[0] == name else f"{name} needs {system[0]},"
        return (f"{what} a system-wide value (reduce none), not a sum over atoms; per-group columns take temp, "
                "ke and observables summed over atoms")
    return None


def parse_one(spec: str, groups) -> Column:
    """The column ``spec`` names; one-line UserError (with the known names) when it names none."""
    m = SPELLING.fullmatch(str(spec).strip())
    if not m:
        raise _fail(spec, f"not a column name; known: {known()}")
    name, index, group = m[1], m[2], m[3]
    if name in LEADING:
        if index or group:
            raise _fail(spec, f"{name} takes no index or group")
        return Column(name, "", header=LEADING[name][0], fmt=LEADING[name][1])
    obs, idx, header, fmt, scale = ALIASES.get(name) or (name, (), None, None, None)
    o = registry._REGISTRY.get(obs)
    if o is None:
        raise _fail(spec, f"unknown column; known: {known()}")
    if index is not None:
        if len(o.shape) != 1 or name in ALIASES:
            raise _fail(spec, f"{name} is not a vector observable; an index takes one of shape (k,)")
        if int(index) >= o.shape[0]:
            raise _fail(spec, f"index {index} is outside {name}'s {o.shape[0]} values (0..{o.shape[0] - 1})")
        idx = (int(index),)
    elif o.shape != () and not idx:
        raise _fail(spec, f"{name} has shape {o.shape}; name one value, e.g. {name}[0]")
    if group is not None:
        if group not in groups:
            raise _fail(spec, f"no group {group!r}; define it, e.g. groups.{group}={{species: [Cu]}} (groups: "
                              f"{', '.join(groups) or 'none'})")
        bad = _group_problem(obs)
        if bad:
            raise _fail(spec, bad)
    header = header or (o.header if not idx else f"{name}[{idx[0]}]" + (f"({o.shown_unit})" if o.shown_unit else ""))
    if group is not None:
        header = header.replace("(", f"@{group}(", 1) if "(" in header else f"{header}@{group}"
    return Column(str(spec), obs, idx, group, header, fmt or o.fmt, o.scale if scale is None else scale)


def parse(specs, groups=()) -> list[Column]:
    """The table's columns: ``specs`` (``thermo.columns``) or, when None, the default ones."""
    if specs is None:
        specs = ["step", "time", *(o.name for o in registry.shown("thermo"))]
    cols = [parse_one(s, groups) for s in specs]
    seen = set()
    for c in cols:
        if c.spec in seen:
            raise _fail(c.spec, "named twice; give each column once")
        seen.add(c.spec)
    return cols


def header(cols: list[Column]) -> str:
    return " ".join(f"{c.header:>{c.width}}" for c in cols)


def row(cols: list[Column], step: int, time_fs: float, obs: dict) -> str:
    return " ".join(c.cell(step, time_fs, obs) for c in cols)


def needs(cols: list[Column]) -> tuple[list[str], dict[str, list[str]]]:
    """(observables of the system, {group: observables}) the columns read."""
    system = [c.observable for c in cols if c.observable and c.group is None]
    per_group: dict[str, list[str]] = {}
    for c in cols:
        if c.group is not None:
            per_group.setdefault(c.group, []).append(c.observable)
    return system, per_group
