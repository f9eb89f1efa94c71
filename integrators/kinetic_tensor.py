"""The global kinetic tensor sum m v_a v_b as exact fixed-point words (integrators/npt.py's
pressure): the same bits on any decomposition. Units: Å/fs, amu, eV."""
from __future__ import annotations

from collections.abc import Callable

import torch

from . import fused
from .nose_hoover import _HI, _LO, Scratch
from .units import MVV_TO_EV

# the tensor's components as velocity-column pairs, Voigt order of LAMMPS's temperature vector
_PAIRS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def exact_kinetic_tensor(velocities: torch.Tensor, masses: torch.Tensor, sum_fn: Callable,
                         scratch: Scratch | None = None) -> list[float]:
    """Global sum m v_a v_b in eV, Voigt order as LAMMPS's temperature vector (xx yy zz xy xz yz),
    as exact integer fixed-point words (2^-32 and 2^-63 eV), the same bits on any decomposition.

    velocities: (N, 3) Å/fs; masses: (N,) amu.  Each atom's term is (v_a v_b) (m MVV_TO_EV 2^32),
    split into an integer high word and a rounded 2^-31 low word; the words are summed as int64,
    exactly, so neither the summation order nor the layout changes a bit.  The terms are laid out
    (6, N), a contiguous row per component, in ``scratch``'s arrays (made once, not per step); the
    low word is made in place.  256,000 atoms: 42-44 -> 7-9 ms of CPU against the (N, 6) stack.
    On the CPU in float64 one fused pass makes the same words (integrators/fused.py): 0.7-0.9 ms."""
    scratch = scratch or Scratch()
    v = velocities.double()
    n, dev = v.shape[0], v.device
    m = torch.mul(masses.double(), MVV_TO_EV * _HI, out=scratch.get("m", (n,), torch.float64, dev))
    if fused.usable(v, m):   # the same words in one pass (integrators/fused.py)
        local = fused.kinetic_words(v, m, _LO, scratch.get("kt_part", (fused.chunks(n), 12), torch.int64, dev))
        tot = sum_fn(local).cpu().tolist()
        return [(tot[k] + tot[6 + k] / _LO) / _HI for k in range(6)]
    comps = scratch.get("comps", (6, n), torch.float64, dev)
    for k, (a, b) in enumerate(_PAIRS):
        torch.mul(v[:, a], v[:, b], out=comps[k])
    comps.mul_(m)
    hi = torch.floor(comps, out=scratch.get("hi", (6, n), torch.float64, dev))
    words = scratch.get("words", (2, 6, n), torch.int64, dev)
    words[0].copy_(hi)                              # integral: the cast is exact
    words[1].copy_(comps.sub_(hi).mul_(_LO).round_())   # round half to even, as torch.round
    local = words.sum(2).reshape(12)                # hi xx..yz, then lo xx..yz
    tot = sum_fn(local).cpu().tolist()
    return [(tot[k] + tot[6 + k] / _LO) / _HI for k in range(6)]
