"""Bit rounding: a float array rounded to its ``keep`` leading mantissa bits (the rest zero).

``trajectory.keep_bits``: the trajectory's positions, velocities and forces keep a relative
precision of 2^-(keep + 1) (14 bits: 3e-5, ~1e-3 Å at 50 Å); the zeroed low bits are what
gzip then removes.  The file stays plain float32/float64 data any HDF5 reader opens, without a
filter of its own (the method of numcodecs' BitRound and of Klöwer et al., Nat. Comput. Sci. 1,
713 (2021)).  Rounding is to nearest, ties to even, on the bits; NaN and infinities stay.
"""
from __future__ import annotations

import numpy as np

#: mantissa bits of the two stored precisions
MANTISSA = {np.dtype(np.float32): (23, np.uint32), np.dtype(np.float64): (52, np.uint64)}


def bitround(a: np.ndarray, keep: int) -> np.ndarray:
    """A copy of float32/float64 ``a`` with ``keep`` mantissa bits (all when ``keep`` >= the dtype's)."""
    a = np.asarray(a)
    bits, uint = MANTISSA[a.dtype]
    drop = bits - int(keep)
    if drop <= 0:
        return a.copy()
    b = a.view(uint).copy()
    finite = np.isfinite(a)
    one = uint(1)
    half = (one << uint(drop - 1)) - one
    rounded = (b + ((b >> uint(drop)) & one) + half) & ~((one << uint(drop)) - one)
    b[finite] = rounded[finite]
    return b.view(a.dtype)
