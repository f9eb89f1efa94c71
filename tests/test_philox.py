"""The counter-based generator of integrators/random.py: Philox4x32 known answers and the
documented mapping (seed, step, stream, atom id) -> 32-bit words -> uniforms -> Gaussians.

Known-answer vectors: Random123's tests/kat_vectors (D. E. Shaw Research,
https://github.com/DEShawResearch/random123, commit 9545ff6413f258be2f04c1d319d99aaef7521150,
lines 24-29), read from that file; columns are name, rounds, CTR (4 words), KEY (2 words), EXPECTED.
"""
from __future__ import annotations

import math

import pytest
import torch

import shardmd.integrators.random as rnd
from shardmd.integrators.random import STREAM_INIT_VELOCITY, STREAM_LANGEVIN, gaussian_noise, philox4x32

KAT_VECTORS = """
philox4x32 7 00000000 00000000 00000000 00000000 00000000 00000000   5f6fb709 0d893f64 4f121f81 4f730a48
philox4x32 7 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   5207ddc2 45165e59 4d8ee751 8c52f662
philox4x32 7 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   4dfccaba 190a87f0 c47362ba b6b5242a
philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
"""


def _kat():
    rows = []
    for line in KAT_VECTORS.strip().splitlines():
        name, rounds, *words = line.split()
        assert name == "philox4x32" and len(words) == 10
        w = [int(x, 16) for x in words]
        rows.append((int(rounds), w[0:4], (w[4], w[5]), w[6:10]))
    return rows


KAT = _kat()
MASK = 0xFFFFFFFF


def ref_philox4x32(ctr, key, rounds=10):
    """Plain-integer Philox4x32 (Salmon et al., SC11), written from the published algorithm."""
    x0, x1, x2, x3 = ctr
    k0, k1 = key
    for r in range(rounds):
        if r > 0:  # key schedule: bump by the Weyl constants before every round but the first
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * x0, 0xCD9E8D57 * x2
        x0, x1, x2, x3 = ((p1 >> 32) ^ x1 ^ k0, p1 & MASK, (p0 >> 32) ^ x3 ^ k1, p0 & MASK)
    return [x0, x1, x2, x3]


def _words(t):
    return [int(w) for w in t.tolist()]


@pytest.mark.parametrize("rounds,ctr,key,expect", KAT, ids=[f"r{r}-{i % 3}" for i, (r, *_) in enumerate(KAT)])
def test_philox_known_answers(rounds, ctr, key, expect):
    got = philox4x32(torch.tensor([ctr], dtype=torch.int64), key, rounds=rounds)
    assert got.dtype == torch.int64 and got.shape == (1, 4)
    assert _words(got[0]) == expect, [hex(w) for w in _words(got[0])]
    assert ref_philox4x32(ctr, key, rounds) == expect  # the reference below is right too
    if rounds == 10:  # 10 rounds is the default
        assert _words(philox4x32(torch.tensor([ctr], dtype=torch.int64), key)[0]) == expect


def test_philox_known_answers_batched():
    # a batch is element-wise: all three KAT counters in one call under each KAT key; the row
    # that belongs to that key gives its known answer, the others agree with the reference
    for rounds in (7, 10):
        rows = [r for r in KAT if r[0] == rounds]
        ctr = torch.tensor([c for _, c, _, _ in rows], dtype=torch.int64)
        for i, (_, _, key, expect) in enumerate(rows):
            out = philox4x32(ctr, key, rounds=rounds)
            assert _words(out[i]) == expect
            for j, (_, c, _, _) in enumerate(rows):
                assert _words(out[j]) == ref_philox4x32(c, key, rounds)


def test_philox_matches_reference_on_random_inputs():
    g = torch.Generator().manual_seed(1)
    n = 300
    ctr = torch.randint(0, 1 << 32, (n, 4), generator=g, dtype=torch.int64)
    ctr[:20] = MASK - torch.randint(0, 3, (20, 4), generator=g)  # edge words near 2^32 - 1
    ctr[20:40] = torch.randint(0, 3, (20, 4), generator=g)
    for key in ((0x12345678, 0x9ABCDEF0), (MASK, 0), (0, MASK), (7, 11)):
        out = philox4x32(ctr, key)
        assert out.min() >= 0 and out.max() <= MASK
        for i in range(n):
            assert _words(out[i]) == ref_philox4x32(_words(ctr[i]), key), i


def test_philox_raw_bits_balanced():
    # sequential counters (as atom ids give): every one of the 4 x 32 output bits is set half the
    # time, and the words are uniform in [0, 2^32): mean and variance within 5 standard errors
    n = 100_000
    ctr = torch.zeros(n, 4, dtype=torch.int64)
    ctr[:, 0] = torch.arange(n)
    ctr[:, 2] = 17
    out = philox4x32(ctr, (2024, 0))
    bits = ((out[:, :, None] >> torch.arange(32)) & 1).to(torch.float64).mean(0)  # (4, 32)
    assert (bits - 0.5).abs().max() < 5 * 0.5 / math.sqrt(n)
    u = out.to(torch.float64) / 2.0 ** 32
    assert (u.mean(0) - 0.5).abs().max() < 5 * math.sqrt(1 / 12 / n)
    assert (u.var(0) - 1 / 12).abs().max() < 5 * math.sqrt(1 / 180 / n)  # Var((u - 1/2)^2) = 1/80 - 1/144 = 1/180
    assert len(set(_words(out[:, 0]))) > n - 10  # no structure: almost no repeated word


# --------------------------------------------------------------------------- gaussian_noise


def ref_gaussian(seed, step, stream, atom_id):
    """The documented mapping, in plain Python: counter (id lo, id hi, step lo, stream << 16 |
    step bits 32..47), key (seed lo, seed hi); uniforms u = (w + 1) / 2^32 in (0, 1]; Box-Muller
    on (u0, u1) for two numbers and on (u2, u3) for the third."""
    ctr = [atom_id & MASK, (atom_id >> 32) & MASK, step & MASK, (stream << 16) | ((step >> 32) & 0xFFFF)]
    w = ref_philox4x32(ctr, (seed & MASK, (seed >> 32) & MASK))
    u = [(x + 1) / 2.0 ** 32 for x in w]
    r1, r2 = math.sqrt(-2 * math.log(u[0])), math.sqrt(-2 * math.log(u[2]))
    return [r1 * math.cos(2 * math.pi * u[1]), r1 * math.sin(2 * math.pi * u[1]),
            r2 * math.cos(2 * math.pi * u[3])]


def test_gaussian_noise_matches_documented_mapping():
    ids = torch.tensor([0, 1, 2, 12345, MASK, 1 << 32, (1 << 40) + 99, (1 << 62) + 5], dtype=torch.int64)
    for seed, step, stream in ((0, 0, 0), (42, 7, STREAM_LANGEVIN), ((1 << 40) + 3, (1 << 33) + 11, 9),
                               (MASK, (1 << 48) - 1, (1 << 16) - 1), (5, 123456, STREAM_INIT_VELOCITY)):
        z = gaussian_noise(seed, step, stream, ids)
        assert z.shape == (len(ids), 3) and z.dtype == torch.float64
        for i, atom in enumerate(_words(ids)):
            expect = ref_gaussian(seed, step, stream, atom)
            for got, want in zip(z[i].tolist(), expect):
                assert got == pytest.approx(want, rel=1e-13, abs=1e-13), (seed, step, stream, atom)


def test_gaussian_noise_counter_and_key_layout(monkeypatch):
    # the exact words handed to Philox, as random.py's docstring documents them
    seen = []
    real = rnd.philox4x32

    def spy(counter, key, rounds=10):
        seen.append((counter.clone(), tuple(key), rounds))
        return real(counter, key, rounds)

    monkeypatch.setattr(rnd, "philox4x32", spy)
    atom, seed, step, stream = (3 << 32) + 77, (9 << 32) + 5, (0xABCD << 32) + 0x1234, 0x55
    gaussian_noise(seed, step, stream, torch.tensor([atom]))
    (counter, key, rounds), = seen
    assert rounds == 10
    assert _words(counter[0]) == [77, 3, 0x1234, (0x55 << 16) | 0xABCD]
    assert key == (5, 9)


def test_uniform_range_and_extreme_words(monkeypatch):
    # words 0 and 2^32 - 1 map to u = 2^-32 and u = 1: finite, |z| <= sqrt(2 ln 2^32)
    words = torch.tensor([[0, 0, 0, 0], [MASK, MASK, MASK, MASK], [0, MASK, MASK, 0]], dtype=torch.int64)
    monkeypatch.setattr(rnd, "philox4x32", lambda counter, key, rounds=10: words[: counter.shape[0]])
    z = gaussian_noise(1, 2, 3, torch.arange(3))
    assert torch.isfinite(z).all()
    rmax = math.sqrt(-2 * math.log(2.0 ** -32))  # 6.66
    u0 = 2.0 ** -32
    assert z[0].tolist() == pytest.approx([rmax * math.cos(2 * math.pi * u0), rmax * math.sin(2 * math.pi * u0),
                                           rmax * math.cos(2 * math.pi * u0)], rel=1e-14)
    assert (z[1] == 0).all()  # u0 = u2 = 1: radius exactly 0
    assert z[2].tolist() == pytest.approx([rmax * math.cos(2 * math.pi), rmax * math.sin(2 * math.pi), 0.0],
                                          abs=1e-12)
    assert z.abs().max() <= rmax * (1 + 1e-15)


def test_gaussian_noise_statistics():
    n = 100_000
    ids = torch.arange(n, dtype=torch.int64)
    z = gaussian_noise(7, 1000, STREAM_LANGEVIN, ids)
    assert torch.isfinite(z).all() and z.abs().max() <= math.sqrt(64 * math.log(2))
    se = 1 / math.sqrt(n)
    assert (z.mean(0)).abs().max() < 5 * se
    assert (z.var(0) - 1).abs().max() < 5 * math.sqrt(2) * se
    assert ((z ** 4).mean(0) - 3).abs().max() < 5 * math.sqrt(96) * se  # Var(z^4) = 105 - 9
    c = torch.corrcoef(z.T)  # the three components of one atom are uncorrelated
    assert (c - torch.eye(3, dtype=c.dtype)).abs().max() < 5 * se
    # tails: P(|z| > 2) = 0.0455 (binomial standard error)
    p = (z.abs() > 2).double().mean().item()
    p_exact = math.erfc(2 / math.sqrt(2))
    assert abs(p - p_exact) < 5 * math.sqrt(p_exact * (1 - p_exact) / (3 * n))
    # the next step, another stream, the next atom id: uncorrelated with these
    for other in (gaussian_noise(7, 1001, STREAM_LANGEVIN, ids), gaussian_noise(7, 1000, STREAM_INIT_VELOCITY, ids),
                  gaussian_noise(7, 1000, STREAM_LANGEVIN, ids + 1)[:-1]):
        m = min(len(other), n)
        assert (z[:m] * other[:m]).mean(0).abs().max() < 5 * se


def test_gaussian_noise_keyed_by_seed_step_stream_id():
    ids = torch.tensor([0, 5, 1000, (1 << 32) + 5, (1 << 45) + 1], dtype=torch.int64)
    base = dict(seed=11, step=123, stream=STREAM_LANGEVIN)
    z = gaussian_noise(ids=ids, **base)
    assert torch.equal(z, gaussian_noise(ids=ids.clone(), **base))  # same inputs, same bits
    changes = [dict(seed=12), dict(seed=11 + (1 << 32)), dict(step=124), dict(step=123 + (1 << 32)),
               dict(stream=STREAM_INIT_VELOCITY), dict(stream=0)]
    for change in changes:
        other = gaussian_noise(ids=ids, **(base | change))
        assert (other != z).all(), change
    # each atom's numbers depend on its own id only (not on its neighbours in the batch)
    assert (gaussian_noise(ids=ids + 1, **base) != z).all()
    assert (gaussian_noise(ids=ids ^ (1 << 33), **base) != z).all()  # the id's high word counts
    perm = torch.tensor([3, 0, 4, 2, 1])
    assert torch.equal(gaussian_noise(ids=ids[perm], **base), z[perm])
    for i in range(len(ids)):
        assert torch.equal(gaussian_noise(ids=ids[i:i + 1], **base)[0], z[i])
    # dtype: computed in float64, returned in the dtype asked for
    z32 = gaussian_noise(ids=ids, dtype=torch.float32, **base)
    assert z32.dtype == torch.float32 and torch.equal(z32, z.to(torch.float32))


def test_gaussian_noise_argument_ranges():
    ids = torch.arange(3)
    gaussian_noise(0, (1 << 48) - 1, (1 << 16) - 1, ids)  # the largest allowed values work
    for step, stream in ((-1, 1), (1 << 48, 1), (0, 1 << 16), (0, -1)):
        with pytest.raises(ValueError):
            gaussian_noise(0, step, stream, ids)
