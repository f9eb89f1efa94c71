"""The lines a run prints after its loop: rates, the time split, the deferred skin check's
counts and the GPU memory peak; also returned as numbers (``Simulation.summary``)."""
from __future__ import annotations

import torch


def loop_summary(sim, wall: float, builds: int, timed: dict) -> tuple[list[str], dict]:
    """(lines, numbers) of ``sim``'s loop: ``wall`` s of it, ``builds`` neighbour builds,
    ``timed`` its parts' seconds at the loop's end (the final checkpoint and frame come after).
    Collective (the migration count and the GPU peak are reduced over ranks)."""
    s = sim.state
    rates = sim.reporter.rates(s.step, sim.integrator.dt, sim.n_global, elapsed=wall)
    migrated = sim.domain.migrated()
    lines = [f"Loop: {wall:.3f} s, {rates['steps_per_s']:.3f} steps/s, {rates['ns_per_day']:.4f} ns/day, "
             f"{rates['atom_steps_per_s']:.4g} atom-steps/s, {builds} neighbour builds, "
             f"{migrated} atom migrations"]
    total = max(sum(timed.values()), 1e-12)
    # the timed parts are disjoint; "other" is the loop's untimed rest (its bookkeeping, the
    # progress line), so the split adds up to the loop's wall time
    parts = {**timed, "other": max(wall - total, 0.0)}
    lines.append("Time split: " + ", ".join(
        f"{k} {v:.3f} s ({100 * v / max(wall, 1e-12):.1f}%)" for k, v in sorted(parts.items())))
    if sim.deferred is not None:
        c = sim.deferred
        lines.append(f"Skin check: deferred, read back {c.reads} times in {s.step - sim._step0} steps "
                     f"({c.posted} without waiting), {c.rollbacks} rollback(s)")
    peak = peak_gpu_bytes(sim.comm, s.positions.device)
    if peak is not None:
        lines.append(f"Memory: peak GPU {peak / 2**30:.3f} GiB per rank (max over ranks; torch allocator)")
    return lines, {"wall_s": wall, "builds": builds, "migrated": migrated, **rates, **timed,
                   "timed_s": total, "peak_gpu_bytes": peak}


def peak_gpu_bytes(comm, device: torch.device) -> int | None:
    """Largest torch-allocator peak on any rank's GPU since start (bytes); None on CPU."""
    if device.type != "cuda":
        return None
    local = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.int64, device=device)
    return int(comm.all_reduce(local, "max")[0])
