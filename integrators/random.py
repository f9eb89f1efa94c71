"""Counter-based Gaussian noise: Philox4x32-10 keyed by (seed, step, stream, atom id).

The same (seed, step, stream, id) always gives the same three numbers, whatever the order
of atoms in memory, the device or the domain an atom lives on; no generator state
has to be saved in checkpoints beyond the seed.  Integer arithmetic is done in int64 with
explicit 32-bit masks, so CPU and CUDA give identical bits.

Counter words: (id low 32 bits, id high 32 bits, step low 32 bits, stream << 16 | step bits
32..47); key: (seed low 32 bits, seed high 32 bits).
"""
from __future__ import annotations

import math

import torch

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF

def frame_seed(seed: int, frame: int) -> int:
    """The seed of the structure at index ``frame`` of an input (each system of a many-system
    run, or one run of ``system.index=frame``): ``seed`` itself for frame 0 and for a negative
    index (the last-frame default), else ``seed`` moved by ``frame`` times the 64-bit golden
    ratio (mod 2^63), so every frame draws its own numbers, never dependent on its batch."""
    if frame <= 0:
        return int(seed)
    return (int(seed) + int(frame) * 0x9E3779B97F4A7C15) % (1 << 63)


#: streams: independent noise for each use at a step
STREAM_LANGEVIN = 1
STREAM_INIT_VELOCITY = 2
STREAM_CSVR = 3


def _mulhilo(a: int, b: torch.Tensor):
    p = b * a  # wraps modulo 2^64: the low 64 bits of the product are exact
    return (p >> 32) & _MASK, p & _MASK


def philox4x32(counter: torch.Tensor, key: tuple[int, int], rounds: int = 10) -> torch.Tensor:
    """Philox4x32 on a batch of counters.

    counter: (n, 4) int64 holding 32-bit unsigned words; key: two 32-bit words.
    Returns (n, 4) int64 holding 32-bit unsigned words.
    """
    c0, c1, c2, c3 = (counter[:, k] for k in range(4))
    k0, k1 = key[0] & _MASK, key[1] & _MASK   # ints, or (n,) int64 tensors (a key per counter)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack([c0, c1, c2, c3], dim=1)


def gaussian_noise(seed: int, step: int, stream: int, ids: torch.Tensor,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(n, 3) standard normal numbers for atoms with global ``ids`` (n,) at ``step``.

    Box-Muller on the four 32-bit words of one Philox block per atom; uniforms are in
    (0, 1], so the logarithm is finite.  Computed in float64, returned in ``dtype``.
    """
    if step < 0 or step >= 1 << 48 or not 0 <= stream < 1 << 16:
        raise ValueError("step must be in [0, 2^48) and stream in [0, 2^16)")
    return _noise((seed & _MASK, (seed >> 32) & _MASK), step, stream, ids.to(torch.int64), dtype)


def gaussian_noise_keyed(seeds: torch.Tensor, steps: torch.Tensor, stream: int, ids: torch.Tensor,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """:func:`gaussian_noise` with a seed and a step per atom (``seeds``, ``steps``: (n,) int64):
    many systems in one pass (engine/batch/joined.py), each atom's numbers the bits its own
    system's ``gaussian_noise(seed, step, stream, ids)`` gives.  The caller keeps steps in
    [0, 2^48) (a run's step count)."""
    seeds, steps = seeds.to(torch.int64), steps.to(torch.int64)
    return _noise((seeds & _MASK, (seeds >> 32) & _MASK), steps, stream, ids.to(torch.int64), dtype)


def _noise(key, step, stream: int, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Box-Muller on Philox words; ``key`` words and ``step`` ints or (n,) int64 tensors."""
    n = ids.shape[0]
    ctr = torch.empty(n, 4, dtype=torch.int64, device=ids.device)
    ctr[:, 0] = ids & _MASK
    ctr[:, 1] = (ids >> 32) & _MASK
    ctr[:, 2] = step & _MASK
    ctr[:, 3] = (stream << 16) | ((step >> 32) & 0xFFFF)
    words = philox4x32(ctr, key)
    u = (words.to(torch.float64) + 1.0) * (1.0 / 4294967296.0)  # (0, 1]
    r1 = torch.sqrt(-2.0 * torch.log(u[:, 0]))
    r2 = torch.sqrt(-2.0 * torch.log(u[:, 2]))
    t1, t2 = 2.0 * math.pi * u[:, 1], 2.0 * math.pi * u[:, 3]
    z = torch.stack([r1 * torch.cos(t1), r1 * torch.sin(t1), r2 * torch.cos(t2)], dim=1)
    return z.to(dtype)
