"""Write H5MD frames in an endless loop; the SIGKILL test in tests/test_h5md.py kills it.

Usage: python h5md_writer_loop.py OUT.h5 [N_ATOMS=1000] [DTYPE=float64] [MODE=w] [MAX_FRAMES=100000]

Frame ``i`` has step ``STRIDE * i`` (continuing after the last frame when MODE is "a"),
time ``DT_FS * step`` fs and the arrays of :func:`frame_data`.  After ``write_frame``
returns, the script prints ``wrote <step>`` and flushes stdout.
"""
from __future__ import annotations

import sys

import numpy as np

STRIDE = 10
DT_FS = 0.5


def system(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(species (n,), masses (n,) amu, ids (n,)) of the test system."""
    species = np.where(np.arange(n) % 3 == 0, 8, 1)
    masses = np.where(species == 8, 15.999, 1.008)
    ids = np.arange(n, dtype=np.int64) * 7 + 3
    return species, masses, ids


def frame_data(step: int, n: int) -> dict[str, np.ndarray]:
    """Deterministic frame for ``step``: cell (3,3) Å, positions Å, images, velocities Å/fs,
    forces eV/Å, potential energy eV."""
    rng = np.random.default_rng(12345 + step)
    cell = np.array([[12.0, 0.0, 0.0], [3.0, 11.0, 0.0], [-2.0, 1.5, 10.0]])
    cell = cell * (1.0 + 0.01 * rng.random())
    frac = rng.random((n, 3))
    return {
        "cell": cell,
        "positions": frac @ cell,
        "images": rng.integers(-3, 4, size=(n, 3)).astype(np.int32),
        "velocities": rng.normal(scale=0.01, size=(n, 3)),
        "forces": rng.normal(size=(n, 3)),
        "potential_energy": float(-3.0 * n + rng.normal()),
    }


def main(argv: list[str]) -> None:
    from shardmd.engine.io.h5md import H5MDWriter

    path = argv[1]
    n = int(argv[2]) if len(argv) > 2 else 1000
    dtype = argv[3] if len(argv) > 3 else "float64"
    mode = argv[4] if len(argv) > 4 else "w"
    max_frames = int(argv[5]) if len(argv) > 5 else 100000
    species, masses, ids = system(n)
    with H5MDWriter(path, species=species, masses=masses, ids=ids, pbc=[True, True, False],
                    dtype=dtype, config={"run": {"n_atoms": n, "dt_fs": DT_FS}},
                    mode=mode) as w:
        start = 0
        if w.last_step is not None:  # restart from the last complete frame, as the engine
            w.truncate_after(w.last_step)  # does from its checkpoint step
            start = w.last_step + STRIDE
        print(f"start {start}", flush=True)
        for i in range(max_frames):
            step = start + STRIDE * i
            d = frame_data(step, n)
            w.write_observables(step, step * DT_FS, {"potential_energy": d["potential_energy"]})
            w.write_frame(step, step * DT_FS, d["cell"], positions=d["positions"],
                          images=d["images"], velocities=d["velocities"], forces=d["forces"])
            print(f"wrote {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
