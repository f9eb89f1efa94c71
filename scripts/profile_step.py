"""Where a GPU step's time goes, and whether it synchronises with the host.

Runs the engine (in-process, or one process per rank under mpirun) for --warmup steps, then
profiles --steps steady-state steps with torch.profiler and prints:

- wall ms per step (CUDA synchronised before and after the profiled window);
- host<->device synchronisations per step: CUDA runtime calls that block the host
  (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy*) counted in
  the trace, plus torch's own sync-debug report of the Python lines that triggered them;
- the top GPU kernels by total device time, and the share of the step the GPU was busy.

    python scripts/profile_step.py --model lj --atoms 1000000 --precision float32
    python scripts/profile_step.py --model lj --atoms 1000000 neighbor.deferred=false   # per-step check
    mpirun -n 2 python scripts/profile_step.py --model mace --atoms 864000 --precision float32
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
import warnings

import torch

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lj", choices=["lj", "mace"])
    ap.add_argument("--atoms", type=int, default=1_000_000)
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("extra", nargs="*", help="engine overrides, e.g. neighbor.deferred=false")
    a = ap.parse_args(argv)

    from shardmd.domain.comm import init_comm
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    cuda = torch.cuda.is_available()  # without CUDA: a dry run of this script on the CPU
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    comm = init_comm("cuda" if cuda else "cpu")
    n = max(1, round((a.atoms / 4) ** (1 / 3)))
    lj = []
    if a.model == "lj":  # LAMMPS's in.lj, from the one place its units are converted
        from bench_lj import EPSILON, SIGMA, units

        u = units()
        lj = ["system.element=Ar", f"system.a={u['a']!r}", f"model.cutoff={u['cutoff']!r}", "model.shift=false",
              f"neighbor.skin={u['skin']!r}", f"dt={u['dt_fs']!r}", f"temperature={u['T_K']!r}",
              f"model.epsilon={{Ar:{EPSILON}}}", f"model.sigma={{Ar:{SIGMA}}}"]
    cfg = compose_config([f"model={a.model}", f"system.repeat=[{n},{n},{n}]", *lj, f"precision={a.precision}",
                          f"device={'cuda' if cuda else 'cpu'}", f"domains={comm.size}", "trajectory.every=0",
                          "thermo.every=0", "checkpoint.every=0", "quiet=true", "overwrite=true",
                          f"steps={a.warmup + a.steps + 10}", "output=/tmp/profile_step.h5", *a.extra])
    sim = Simulation(cfg, comm=comm)
    sim.setup()
    sim.started = True
    sim._last_step = int(cfg.steps)
    for _ in range(a.warmup):
        sim.step()
    sync()

    # which Python lines synchronise (torch's own sync debug mode, as warnings)
    sites: collections.Counter = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        orig = warnings.showwarning
        for _ in range(5):
            sim.step()
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = orig
    for w in caught:
        if "synchroniz" in str(w.message):
            sites[f"{w.filename.split('/shardmd/')[-1]}:{w.lineno}"] += 1
    sync()

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(a.steps):
            sim.step()
        sync()
        wall = time.perf_counter() - t
    ev = prof.key_averages()
    syncs = {e.key: e.count for e in ev if e.key.startswith(SYNC_CALLS)}
    gpu = sorted((e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA or
                  getattr(e, "self_device_time_total", 0) > 0), key=lambda e: -getattr(e, "self_device_time_total", 0))
    busy = sum(getattr(e, "self_device_time_total", 0) for e in gpu) / 1e6
    if comm.is_root:
        atoms = sim.n_global
        print(f"{a.model}, {atoms} atoms, {a.precision}, {comm.size} GPU(s), {a.steps} profiled steps, "
              f"extra: {' '.join(a.extra) or '-'}")
        print(f"  wall {1e3 * wall / a.steps:.3f} ms/step, {atoms * a.steps / wall:.4g} atom-steps/s; GPU busy "
              f"{1e3 * busy / a.steps:.3f} ms/step ({100 * busy / wall:.0f} % of wall)")
        per = {k: v / a.steps for k, v in sorted(syncs.items())}
        print("  blocking CUDA runtime calls per step: " +
              (", ".join(f"{k} {v:.2f}" for k, v in per.items()) or "none"))
        print("  torch sync-debug sites over 5 steps: " +
              (", ".join(f"{k} x{v}" for k, v in sites.most_common(8)) or "none"))
        chk = sim.deferred
        if chk is not None:
            print(f"  deferred skin check: {chk.reads} read-backs, {chk.rollbacks} rollbacks so far")
        print("  top GPU kernels (ms per step):")
        for e in gpu[:8]:
            print(f"    {getattr(e, 'self_device_time_total', 0) / 1e3 / a.steps:8.3f}  {e.key[:90]}")
    sim.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - print any failure, exit 1
        traceback.print_exc()
        sys.exit(1)
