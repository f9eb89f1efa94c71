"""Coulomb (Ewald / PME): model=coulomb (models/coulomb.py) beside torch-pme, nvalchemi-toolkit-ops
(Warp kernels) and torch-sim's EwaldModel/PMEModel on one process, CPU or one GPU; model=coulomb on
1, 2, 4 MPI ranks (CPU).

    python scripts/bench_coulomb.py                      # CPU: 4k and 32k ions, single process, table
    python scripts/bench_coulomb.py --device cuda --codes model=coulomb torch-pme nvalchemi-ops torch-sim torch-sim-rc
    python scripts/bench_coulomb.py --sizes 8 16 --ranks 1 2 4 --ranks-only   # our model on 1/2/4 CPU ranks

The system: rattled rock-salt NaCl (8 n^3 ions, a = 5.64 Å, rattle 0.05 Å), real-space cutoff
10 Å, accuracy 1e-6 (alpha = sqrt(-ln 1e-6)/10 Å = 0.372/Å; k_max and the mesh as
models/coulomb.py chooses them, torch-pme and nvalchemi-toolkit-ops given the same alpha, k cutoff
and mesh spacing; torch-sim's models choose their own: scripts/bench_coulomb_peers.py).
Time: the median of --reps calls of energy + forces (ours and torch-sim's: + virial), after one
warm-up call, neighbour list excluded (ours: the engine's list, built once; torch-pme and
nvalchemi: ASE's, converted once; torch-sim: its own, built once), float64.  Accuracy: the
largest force error over the largest force and the energy's relative error, against an Ewald sum
converged to ~1e-11 (tests/coulomb_systems.py's, float64, analytic forces, its own splitting;
on the CPU its numpy original up to ~5k ions, its cost being O(N^2); on a GPU its torch copy at
any size).  The libraries are optional; one that fails prints its error in the table.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_coulomb_peers import nvalchemi, reference, sync, timed, torch_pme, torch_sim

CUTOFF, SKIN, ACCURACY = 10.0, 0.5, 1e-6
CHARGES = {"Na": 1.0, "Cl": -1.0}
CODES = ("model=coulomb", "torch-pme", "nvalchemi-ops", "torch-sim", "torch-sim-rc")


def crystal(n: int):
    from ase.build import bulk

    atoms = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((n, n, n))
    atoms.rattle(0.05, seed=1)
    return atoms


def ours(comm, atoms, method, accuracy=ACCURACY, reps=3, profile=False):
    """(seconds per call, energy eV, forces (n, 3) id order on rank 0) of model=coulomb on comm's ranks."""
    from shardmd.domain.distributed_model import DistributedModel
    from shardmd.engine.run.rank_domain import RankDomain
    from shardmd.engine.run.state import State
    from shardmd.models.coulomb import Coulomb

    dm = DistributedModel(Coulomb(CHARGES, cutoff=CUTOFF, method=method, accuracy=accuracy))
    dec = RankDomain(comm, CUTOFF, SKIN)
    state = dec.distribute(State.from_atoms(atoms, device=comm.device))
    dec.rebuild(state)

    def call():
        return dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)

    comm.barrier()
    seconds, out = timed(call, reps, comm.device)
    seconds = float(comm.all_reduce(torch.tensor([seconds], dtype=torch.float64), "max")[0])
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            sync(comm.device)
        print(f"\n{len(atoms)} ions, {method}, one call:\n"
              + prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=60))
    state.forces = out["forces"]
    full = dec.gather(state, ("forces",))
    return seconds, float(out["energy"]), None if full is None else torch.as_tensor(full["forces"]).cpu().numpy()


def _reference(atoms, device):
    """(energy, forces) of the converged Ewald sum, cached in TMPDIR; None where not run (CPU, > 5k ions)."""
    cpu = torch.device(device).type == "cpu"
    if cpu and len(atoms) > 5000:
        return None
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_coulomb_reference_{len(atoms)}.npz"
    if cache.exists():   # the reference of an earlier run (minutes at 4k ions on a CPU)
        with np.load(cache) as z:
            return float(z["energy"]), z["forces"]
    t = time.perf_counter()
    q = np.array([CHARGES[x] for x in atoms.get_chemical_symbols()])
    if cpu:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import coulomb_systems

        ref = coulomb_systems.reference_ewald(atoms.positions, atoms.cell[:], q, alpha=0.3, tol=1e-11)
    else:
        ref = reference(atoms.positions, atoms.cell[:], q, alpha=0.3, tol=1e-11, device=device)
    np.savez(cache, energy=ref[0], forces=ref[1])
    print(f"  {len(atoms)} reference: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return ref


def single_process(sizes, methods, codes=CODES, device="cpu", reps=3, profile=False):
    from shardmd.domain.comm import Comm
    from shardmd.models.coulomb import ewald_parameters

    params = ewald_parameters(CUTOFF, ACCURACY)
    dev = torch.device(device)
    args = dict(charges=CHARGES, cutoff=CUTOFF, device=dev, reps=reps)
    rows = []
    for n in sizes:
        atoms = crystal(n)
        ref = _reference(atoms, dev)
        for method in methods:
            for code, fn in (
                    ("model=coulomb", lambda a=atoms, m=method: ours(Comm(device=dev), a, m, reps=reps,
                                                                    profile=profile)),
                    ("torch-pme", lambda a=atoms, m=method: torch_pme(a, m, params, **args)),
                    ("nvalchemi-ops", lambda a=atoms, m=method: nvalchemi(a, m, params, **args)),
                    ("torch-sim", lambda a=atoms, m=method: torch_sim(a, m, accuracy=ACCURACY, **args)),
                    ("torch-sim-rc", lambda a=atoms, m=method: torch_sim(a, m, accuracy=ACCURACY, own_cutoff=True,
                                                                         **args))):
                if code not in codes:
                    continue
                if method == "ewald" and len(atoms) > 5000 and dev.type == "cpu":
                    rows.append((len(atoms), method, code, None, None, None, "not run: O(N n_k) with n_k ~ N"))
                    continue
                try:
                    t, e, f, *note = fn()
                except Exception as exc:  # noqa: BLE001 - a library that cannot run here is a row saying why
                    rows.append((len(atoms), method, code, None, None, None, f"{type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:90] if str(exc) else ''}"))
                    continue
                finally:
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                de = abs(e - ref[0]) / abs(ref[0]) if ref else None
                df = float(np.abs(f - ref[1]).max() / np.abs(ref[1]).max()) if ref else None
                rows.append((len(atoms), method, code, t, de, df, note[0] if note else ""))
                print(f"  {len(atoms)} {method} {code}: {t:.4f} s", file=sys.stderr, flush=True)
    return rows


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_single(rows):
    print(f"{'ions':>7} {'method':>6} {'code':>14} {'ms/call':>10} {'|dE|/E':>9} {'max|dF|/max|F|':>15}  note")
    for n, m, code, t, de, df, note in rows:
        t = None if t is None else t * 1e3
        print(f"{n:>7} {m:>6} {code:>14} {_fmt(t, '10.2f')} {_fmt(de, '9.1e')} {_fmt(df, '15.1e')}  {note}")


def ranks_worker(argv):
    """Under mpiexec: our model on this world's ranks; rank 0 prints 'ions method ranks seconds'."""
    from shardmd.domain.comm import init_comm, shutdown

    comm = init_comm("cpu")
    torch.set_num_threads(1)
    sizes, methods, reps = [int(x) for x in argv[0].split(",")], argv[1].split(","), int(argv[2])
    for n in sizes:
        atoms = crystal(n)
        for method in methods:
            if method == "ewald" and len(atoms) > 5000:
                continue
            t, _, _ = ours(comm, atoms, method, reps=reps)
            if comm.is_root:
                print(f"RESULT {len(atoms)} {method} {comm.size} {t:.4f}", flush=True)
    shutdown(comm)


def multi_rank(sizes, methods, ranks, reps):
    from shardmd.engine.launch.parallel import launch_command

    got = {}
    for k in ranks:
        cmd = launch_command(k, [])
        cmd = cmd[: cmd.index(sys.executable)] + [sys.executable, str(Path(__file__).resolve()), "--worker",
                                                   ",".join(map(str, sizes)), ",".join(methods), str(reps)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if r.returncode != 0:
            print(f"{k} ranks failed: {r.stderr[-500:]}", file=sys.stderr)
        for line in r.stdout.splitlines():
            if line.startswith("RESULT"):
                n, m, size, t = line.split()[1:]
                got[(int(n), m, int(size))] = float(t)
                print(f"  {n} {m} {size} ranks: {float(t):.3f} s", file=sys.stderr, flush=True)
    print(f"\n{'ions':>7} {'method':>6} " + " ".join(f"{f'{k} rank(s)':>10}" for k in ranks)
          + "   s/call, model=coulomb, 1 thread a rank")
    for n in sorted({8 * s ** 3 for s in sizes}):
        for m in methods:
            note = "  not run: O(N n_k) with n_k ~ N" if m == "ewald" and n > 5000 else ""
            print(f"{n:>7} {m:>6} " + " ".join(_fmt(got.get((n, m, k)), "10.3f") for k in ranks) + note)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return ranks_worker(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16], help="NaCl cells per axis (8 n^3 ions)")
    ap.add_argument("--methods", nargs="+", default=["ewald", "pme"])
    ap.add_argument("--device", default="cpu", help="cpu or cuda: the single-process runs")
    ap.add_argument("--ranks", type=int, nargs="*", default=[], help="also our model on these MPI rank counts (CPU)")
    ap.add_argument("--codes", nargs="+", default=list(CODES[:3]), choices=CODES)
    ap.add_argument("--ranks-only", action="store_true", help="only the multi-rank table")
    ap.add_argument("--reps", type=int, default=3, help="timed calls (the median is printed)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the single-process runs (0: torch's)")
    ap.add_argument("--profile", action="store_true", help="a torch.profiler table of one call of our model")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else "CPU"
    print(f"{where}, {torch.get_num_threads()} torch threads, float64, cutoff {CUTOFF} Å, accuracy {ACCURACY}")
    if not a.ranks_only:
        print_single(single_process(a.sizes, a.methods, a.codes, a.device, a.reps, a.profile))
    if a.ranks:
        multi_rank(a.sizes, a.methods, a.ranks, a.reps)


if __name__ == "__main__":
    main()
