"""Coulomb (Ewald / PME) on CPU: model=coulomb (models/coulomb.py) beside torch-pme and
nvalchemi-toolkit-ops (Warp kernels) on one process, and model=coulomb on 1, 2, 4 MPI ranks.

    python scripts/bench_coulomb.py                      # 4k and 32k ions, single process, table
    python scripts/bench_coulomb.py --sizes 5 --ranks 1 2 4   # 1000 ions; our model on 1/2/4 ranks too
    python scripts/bench_coulomb.py --sizes 8 16 --methods pme --ranks 1 2 4 --ranks-only

The system: rattled rock-salt NaCl (8 n^3 ions, a = 5.64 Å, rattle 0.05 Å), real-space cutoff
10 Å, accuracy 1e-6 (alpha = sqrt(-ln 1e-6)/10 Å = 0.372/Å for every code; k_max and the mesh as
models/coulomb.py chooses them, each library given the same alpha, k cutoff and mesh spacing).
Time: the median of 3 calls of energy + forces (ours: + virial, which its strain derivative
gives in the same backward), after one warm-up call, neighbour list excluded (ours: the
engine's list, built once; the libraries: ASE's, converted once).  Accuracy: the largest force
error over the largest force and the energy's relative error, against the tests' numpy Ewald
sum (tests/coulomb_systems.py: float64, analytic forces, its own splitting, converged to ~1e-11;
up to ~5k ions, its cost is O(N^2)).  nvalchemi-toolkit-ops is optional
(pip install nvalchemi-toolkit-ops); a library that fails prints its error in the table.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

K_E = 14.399645
CUTOFF, SKIN, ACCURACY = 10.0, 0.5, 1e-6
CHARGES = {"Na": 1.0, "Cl": -1.0}


def crystal(n: int):
    from ase.build import bulk

    atoms = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((n, n, n))
    atoms.rattle(0.05, seed=1)
    return atoms


def _timed(fn, reps=3):
    out = fn()
    times = [0.0] if reps == 0 else []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def ours(comm, atoms, method, accuracy=ACCURACY, reps=3):
    """(seconds per call, energy eV, forces (n, 3) id order on rank 0) of model=coulomb on comm's ranks."""
    from shardmd.domain.distributed_model import DistributedModel
    from shardmd.engine.run.rank_domain import RankDomain
    from shardmd.engine.run.state import State
    from shardmd.models.coulomb import Coulomb

    dm = DistributedModel(Coulomb(CHARGES, cutoff=CUTOFF, method=method, accuracy=accuracy))
    dec = RankDomain(comm, CUTOFF, SKIN)
    state = dec.distribute(State.from_atoms(atoms))
    dec.rebuild(state)

    def call():
        return dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)

    comm.barrier()
    seconds, out = _timed(call, reps)
    seconds = float(comm.all_reduce(torch.tensor([seconds], dtype=torch.float64), "max")[0])
    state.forces = out["forces"]
    full = dec.gather(state, ("forces",))
    return seconds, float(out["energy"]), None if full is None else np.asarray(full["forces"])


def _reference():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import coulomb_systems

    return coulomb_systems


def _charges(atoms) -> np.ndarray:
    return np.array([CHARGES[x] for x in atoms.get_chemical_symbols()])


def _pairs(atoms):
    from ase.neighborlist import neighbor_list

    i, j, s = neighbor_list("ijS", atoms, CUTOFF)
    return torch.tensor(i), torch.tensor(j), torch.tensor(s, dtype=torch.float64)


def torch_pme(atoms, method, params, pairs):
    import torchpme

    i, j, s = pairs
    pot = torchpme.CoulombPotential(smearing=1 / (math.sqrt(2) * params["alpha"])).to(dtype=torch.float64)
    if method == "ewald":
        # torch-pme's Ewald takes its k vectors as a mesh's FFT frequencies, |n_a| < ns_a / 2 with
        # ns_a = 2 |a| / lr_wavelength: pi / k_max reaches k_max (2 pi / k_max reached half of it)
        calc = torchpme.EwaldCalculator(pot, lr_wavelength=math.pi / params["k_max"], full_neighbor_list=True)
    else:
        from torchpme.lib.kvectors import get_ns_mesh

        if int(get_ns_mesh(torch.tensor(atoms.cell[:]), 2 * params["mesh_spacing"]).prod()) > 2 ** 24:
            raise MemoryError("not run: torch-pme's power-of-two mesh over 256^3 points (GBs on this machine)")
        # torch-pme's mesh has 2 |a| / mesh_spacing + 1 points a side, rounded up to a power of two:
        # twice our spacing gives it at least our mesh
        calc = torchpme.PMECalculator(pot, mesh_spacing=2 * params["mesh_spacing"], interpolation_nodes=7,
                                      full_neighbor_list=True)
    cell = torch.tensor(atoms.cell[:])
    q = torch.tensor([CHARGES[x] for x in atoms.get_chemical_symbols()], dtype=torch.float64)[:, None]
    x0 = torch.tensor(atoms.positions)

    def call():
        x = x0.clone().requires_grad_(True)
        d = (x[j] + s @ cell - x[i]).norm(dim=1)
        e = K_E * (q * calc(q, cell, x, torch.stack([i, j], 1), d)).sum()
        (g,) = torch.autograd.grad(e, x)
        return float(e.detach()), -g.numpy()

    t, (e, f) = _timed(call)
    return t, e, f


def nvalchemi(atoms, method, params, pairs):
    from nvalchemiops.torch.interactions.electrostatics import ewald, pme

    i, j, s = pairs
    order = torch.argsort(i, stable=True)
    i, j, s = i[order], j[order], s[order]
    ptr = torch.zeros(len(atoms) + 1, dtype=torch.int32)
    ptr[1:] = torch.cumsum(torch.bincount(i, minlength=len(atoms)), 0)
    nl = torch.stack([i, j]).to(torch.int32)
    cell = torch.tensor(atoms.cell[:])[None]
    q = torch.tensor([CHARGES[x] for x in atoms.get_chemical_symbols()], dtype=torch.float64)
    x0 = torch.tensor(atoms.positions)
    kw = dict(alpha=params["alpha"], neighbor_list=nl, neighbor_ptr=ptr, neighbor_shifts=s.to(torch.int32))

    def call():
        x = x0.clone().requires_grad_(True)
        if method == "ewald":
            e = ewald.ewald_summation(x, q, cell, k_cutoff=params["k_max"], **kw)
        else:
            e = pme.particle_mesh_ewald(x, q, cell, mesh_spacing=params["mesh_spacing"], **kw)
        e = K_E * e.sum()
        (g,) = torch.autograd.grad(e, x)
        return float(e.detach()), -g.numpy()

    t, (e, f) = _timed(call)
    return t, e, f


CODES = ("model=coulomb", "torch-pme", "nvalchemi-ops")


def single_process(sizes, methods, codes=CODES):
    from shardmd.domain.comm import Comm
    from shardmd.models.coulomb import ewald_parameters

    params = ewald_parameters(CUTOFF, ACCURACY)
    rows = []
    for n in sizes:
        atoms = crystal(n)
        ref = None
        cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_coulomb_reference_{len(atoms)}.npz"
        if len(atoms) <= 5000 and cache.exists():   # the reference of an earlier run (minutes at 4k ions)
            with np.load(cache) as z:
                ref = (float(z["energy"]), z["forces"])
        elif len(atoms) <= 5000:   # tests/coulomb_systems.py's numpy Ewald sum, converged to ~1e-11
            t = time.perf_counter()
            ref = _reference().reference_ewald(atoms.positions, atoms.cell[:], _charges(atoms), alpha=0.3, tol=1e-11)
            np.savez(cache, energy=ref[0], forces=ref[1])
            print(f"  {len(atoms)} reference: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        pairs = _pairs(atoms)
        for method in methods:
            for code, fn in (("model=coulomb", lambda a=atoms, m=method: ours(Comm(), a, m)),
                             ("torch-pme", lambda a=atoms, m=method, p=pairs: torch_pme(a, m, params, p)),
                             ("nvalchemi-ops", lambda a=atoms, m=method, p=pairs: nvalchemi(a, m, params, p))):
                if code not in codes:
                    continue
                if method == "ewald" and len(atoms) > 5000:
                    rows.append((len(atoms), method, code, None, None, None, "not run: O(N n_k) with n_k ~ N"))
                    continue
                try:
                    t, e, f = fn()
                except Exception as exc:  # noqa: BLE001 - a library that cannot run here is a row saying why
                    rows.append((len(atoms), method, code, None, None, None, f"{type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:70] if str(exc) else ''}"))
                    continue
                de = abs(e - ref[0]) / abs(ref[0]) if ref else None
                df = float(np.abs(f - ref[1]).max() / np.abs(ref[1]).max()) if ref else None
                rows.append((len(atoms), method, code, t, de, df, ""))
                print(f"  {len(atoms)} {method} {code}: {t:.3f} s", file=sys.stderr, flush=True)
    return rows


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_single(rows):
    print(f"{'ions':>7} {'method':>6} {'code':>14} {'s/call':>8} {'|dE|/E':>9} {'max|dF|/max|F|':>15}  note")
    for n, m, code, t, de, df, note in rows:
        print(f"{n:>7} {m:>6} {code:>14} {_fmt(t, '8.3f')} {_fmt(de, '9.1e')} {_fmt(df, '15.1e')}  {note}")


def ranks_worker(argv):
    """Under mpiexec: our model on this world's ranks; rank 0 prints 'ions method ranks seconds'."""
    from shardmd.domain.comm import init_comm, shutdown

    comm = init_comm("cpu")
    torch.set_num_threads(1)
    sizes, methods = [int(x) for x in argv[0].split(",")], argv[1].split(",")
    for n in sizes:
        atoms = crystal(n)
        for method in methods:
            if method == "ewald" and len(atoms) > 5000:
                continue
            t, _, _ = ours(comm, atoms, method)
            if comm.is_root:
                print(f"RESULT {len(atoms)} {method} {comm.size} {t:.4f}", flush=True)
    shutdown(comm)


def multi_rank(sizes, methods, ranks):
    from shardmd.engine.launch.parallel import launch_command

    out = []
    for k in ranks:
        cmd = launch_command(k, [])
        cmd = cmd[: cmd.index(sys.executable)] + [sys.executable, str(Path(__file__).resolve()), "--worker",
                                                   ",".join(map(str, sizes)), ",".join(methods)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if r.returncode != 0:
            print(f"{k} ranks failed: {r.stderr[-500:]}", file=sys.stderr)
        out += [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("RESULT")]
    print(f"\n{'ions':>7} {'method':>6} {'ranks':>5} {'s/call':>8}   (model=coulomb, 1 thread a rank)")
    for n, m, k, t in out:
        print(f"{n:>7} {m:>6} {k:>5} {float(t):8.3f}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return ranks_worker(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16], help="NaCl cells per axis (8 n^3 ions)")
    ap.add_argument("--methods", nargs="+", default=["ewald", "pme"])
    ap.add_argument("--ranks", type=int, nargs="*", default=[], help="also our model on these MPI rank counts")
    ap.add_argument("--codes", nargs="+", default=list(CODES), choices=CODES)
    ap.add_argument("--ranks-only", action="store_true", help="only the multi-rank table")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the single-process runs (0: torch's)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"CPU, {torch.get_num_threads()} torch threads, float64, cutoff {CUTOFF} Å, accuracy {ACCURACY}")
    if not a.ranks_only:
        print_single(single_process(a.sizes, a.methods, a.codes))
    if a.ranks:
        multi_rank(a.sizes, a.methods, a.ranks)


if __name__ == "__main__":
    main()
