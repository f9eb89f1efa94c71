"""The cell half of fix_nh's remap() (integrators/npt.py): LAMMPS's box h advanced by half a
step in Python floats, and the map that carries the atoms with it.  Its own module so that
npt.py keeps to the barostat's dynamics."""
from __future__ import annotations

import math

from .mat3 import inv3, matmul3


def remap_rows(c: list[list[float]], od: list[float], dto: float, pstyle: str):
    """(new cell rows, map of the positions x' = x c^-1 new) after dto fs (half a step) of the
    strain rates ``od`` (Voigt, 1/fs) on the cell rows ``c`` (Å, float64 as Python floats):
    iso's map is its scale factor (any cell scaled uniformly), aniso's and tri's the
    lower-triangular matrix (LAMMPS's form: rows a along x, b in the xy plane)."""
    if pstyle == "iso":
        e = math.exp(dto * od[0])
        new = [[x * e for x in row] for row in c]
    else:
        # LAMMPS's h: 0 xprd, 1 yprd, 2 zprd, 3 yz, 4 xz, 5 xy (our rows: c[1][0] = xy ...)
        h = [c[0][0], c[1][1], c[2][2], c[2][1], c[2][0], c[1][0]]
        dto2, dto4, dto8 = dto / 2.0, dto / 4.0, dto / 8.0
        tri = pstyle == "tri"

        def tilts():
            if not tri:
                return
            e = math.exp(dto8 * od[0])
            h[4] = (h[4] * e + dto4 * (od[5] * h[3] + od[4] * h[2])) * e
            e = math.exp(dto4 * od[1])
            h[3] = (h[3] * e + dto2 * (od[3] * h[2])) * e
            e = math.exp(dto4 * od[0])
            h[5] = (h[5] * e + dto2 * (od[5] * h[1])) * e
            e = math.exp(dto8 * od[0])
            h[4] = (h[4] * e + dto4 * (od[5] * h[3] + od[4] * h[2])) * e

        # both tilt passes see the old diagonal: fix_nh scales boxlo/boxhi, and h[0..2] follow
        # only at set_global_box(), after the second pass
        tilts()
        e0, e1, e2 = (math.exp(dto * od[i]) for i in range(3))
        if not tri:   # fix_nh's default tilt scaling (scalexy, scalexz, scaleyz) for aniso
            h[5] *= e1
            h[4] *= e2
            h[3] *= e2
        tilts()
        h[0] *= e0
        h[1] *= e1
        h[2] *= e2
        new = [[h[0], 0.0, 0.0], [h[5], h[1], 0.0], [h[4], h[3], h[2]]]
    if pstyle == "iso":
        return new, e                      # x' = x c^-1 (e c): fractions kept
    return new, matmul3(inv3(c), new)      # lower-triangular for LAMMPS's form
