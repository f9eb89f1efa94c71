"""The shipped LJ run's trajectory (``python -m engine run model=lj``, its defaults: 4,000 atoms,
11 frames) stored small: float32 with gzip alone (lossless for float32) ~2.9x smaller than
today's default (float64, uncompressed), and with ``trajectory.keep_bits=14`` (a relative
precision of 3e-5) over 4x; our reader, ASE and MDAnalysis open it, each value within that
precision of the float64 run's.  Bit rounding against numcodecs' BitRound where installed."""
import warnings

import ase.io
import h5py
import numpy as np
import pytest
from conftest import cli_in_process

from shardmd.engine.io.bitround import bitround
from shardmd.engine.io.h5md import read_frames

SMALL = ["trajectory.precision=float32", "trajectory.compression=gzip"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compression")
    with pytest.MonkeyPatch.context() as mp:
        from shardmd.engine.cli.main import main

        mp.chdir(d)
        for out, extra in (("plain.h5", []), ("small.h5", SMALL), ("bits.h5", [*SMALL, "trajectory.keep_bits=14"])):
            assert main(["run", "model=lj", f"output={out}", "quiet=true", "threads=1", *extra]) == 0
    return d


@pytest.mark.slow   # three runs of the shipped defaults (4,000 atoms, 1,000 steps): ~30 s on one core
def test_four_times_smaller_and_every_reader_opens_it(runs):
    plain, small, bits = ((runs / n).stat().st_size for n in ("plain.h5", "small.h5", "bits.h5"))
    print(f"default {plain} B; float32+gzip {small} B ({plain / small:.2f}x); keep_bits=14 {bits} B "
          f"({plain / bits:.2f}x)")
    assert plain / small > 3.0 and plain / bits >= 4.0, (plain, small, bits)
    ref = read_frames(runs / "plain.h5")
    got = read_frames(runs / "bits.h5")
    assert len(ref) == len(got) == 11
    for a, b in zip(ref, got):
        assert b.info["step"] == a.info["step"]
        for x, y in ((a.positions, b.positions), (a.get_velocities(), b.get_velocities()),
                     (a.get_forces(), b.get_forces())):
            # float32 rounding (2^-24) of the kJ/(mol Å) forces, then 14 bits kept: |err| <= 2^-15 |x|
            np.testing.assert_array_less(np.abs(y - x), 2.0 ** -14.9 * np.abs(x) + 1e-30)
        assert np.array_equal(a.numbers, b.numbers) and np.allclose(a.cell.array, b.cell.array, rtol=1e-7)
    with h5py.File(runs / "bits.h5") as f:
        v = f["particles/all/position/value"]
        assert v.dtype == np.float32 and v.compression == "gzip" and f["particles/all/id"].compression == "gzip"
        low = v[-1].view(np.uint32) & np.uint32((1 << 9) - 1)
        assert not low.any()   # the 9 dropped mantissa bits are zero
    back = ase.io.read(str(runs / "bits.h5"), ":")
    assert len(back) == 11 and np.array_equal(back[-1].positions, got[-1].positions)
    assert back[-1].get_potential_energy() == got[-1].get_potential_energy()
    mda = pytest.importorskip("MDAnalysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(str(runs / "bits.h5"), format="H5MD", topology_format="MINIMAL", n_atoms=4000)
    assert u.trajectory.n_frames == 11 and u.trajectory.dt == pytest.approx(0.1)
    u.trajectory[-1]
    np.testing.assert_array_equal(u.atoms.positions, got[-1].positions.astype(np.float32))
    u.trajectory.close()


def test_bitround_is_round_to_nearest_even_on_the_bits():
    rng = np.random.default_rng(0)
    for dtype, bits in ((np.float32, 23), (np.float64, 52)):
        a = (rng.normal(size=1000) * 10.0 ** rng.integers(-5, 5, 1000)).astype(dtype)
        a[:3] = [np.nan, np.inf, -np.inf]
        for keep in (1, 7, 14, bits - 1, bits, bits + 3):
            r = bitround(a, keep)
            assert r.dtype == dtype and np.isnan(r[0]) and r[1] == np.inf and r[2] == -np.inf
            fin = np.isfinite(a)
            assert np.all(np.abs(r[fin] - a[fin]) <= 2.0 ** -(min(keep, bits) + 1) * np.abs(a[fin]) * (1 + 1e-12))
            np.testing.assert_array_equal(bitround(r, keep), r)   # idempotent
    # a tie goes to the even neighbour: 1 + 2^-12 + 2^-13 (float32) kept to 12 bits -> 1 + 2^-11
    x = np.array([1 + 2.0 ** -12 + 2.0 ** -13, 1 + 2.0 ** -13], dtype=np.float32)
    np.testing.assert_array_equal(bitround(x, 12), np.array([1 + 2.0 ** -11, 1.0], dtype=np.float32))


def test_bitround_equals_numcodecs():
    numcodecs = pytest.importorskip("numcodecs", reason="numcodecs (an optional reference) is not installed")
    a = np.random.default_rng(1).normal(size=4096).astype(np.float32)
    np.testing.assert_array_equal(bitround(a, 10), numcodecs.BitRound(keepbits=10).encode(a))


def test_bad_keep_bits_is_one_line(tmp_path, capfd, monkeypatch):
    r = cli_in_process(["run", "model=lj", "trajectory.keep_bits=0", "steps=0"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "trajectory.keep_bits=0 is invalid: give a number of bits from 1 to 52, or null" in r.stderr
