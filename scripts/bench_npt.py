"""NPT step cost against NVE (and NVT) on in.lj's argon, CPU: scripts/bench_lj.py's problem and timing.

The system is bench_lj.py's (LAMMPS reduced units mapped to Å, eV, amu, fs; fcc at 0.8442, lj/cut
2.5 sigma unshifted, skin 0.3 sigma, dt 0.005 tau, T 1.44 epsilon/kB), neighbour list checked every
step (our default policy). Each integrator runs ``--steps`` steps after the set-up (first list and
forces, as LAMMPS's "Loop time"), ``--repeats`` times alternating (each repeat starting at the next
case); the table gives the medians of the loop's wall time and of the process's CPU time per step
(the robust one on a shared machine), their ratios to NVE (also the median of each repeat's ratio to
that repeat's NVE run: "paired", steadier when the load changes between repeats), the neighbour
builds and the volume change, and a split of the CPU time per step (process time, robust under load
like the total): integrator (both halves), forces (the model call), rebuilds (list builds with their
wrap, sort and ghosts), check (the per-step skin or box check with its all-reduce), rest (ghost
refresh, loop).

    verlet        NVE
    verlet sums   NVE with the energy and virial of every step (npt needs the virial every step;
                  plain NVE sums them on output steps only, as LAMMPS)
    nose-hoover   fix nvt temp 1.44 1.44 0.1 tau
    npt iso       fix npt temp 1.44 1.44 0.1 iso 1.0 1.0 5.0 (tau; Pdamp 1000 steps, LAMMPS's advice)
    npt tri       fix npt temp 1.44 1.44 0.1 tri 1.0 1.0 5.0

    .venv/bin/python scripts/bench_npt.py                    # 32,000 atoms, 100 steps, 1 thread, 3 repeats
    .venv/bin/python scripts/bench_npt.py --atoms 256000 --steps 50
    .venv/bin/python scripts/bench_npt.py --atoms 256000 --steps 50 --cases verlet "npt iso" "npt tri"
    .venv/bin/python scripts/bench_npt.py --atoms 256000 --steps 10 --interleave 16 \
        --cases verlet "verlet sums" "npt iso" "npt tri"         # one process, the cases in turn
    .venv/bin/python scripts/bench_npt.py --atoms 256000 --steps 10 --interleave 24 --equilibrate 300 \
        --cases verlet nose-hoover "npt iso" "npt tri"         # every case from one state at T* 1.44
    .venv/bin/python scripts/bench_npt.py --atoms 4000 --steps 2000 --repeats 5 --lammps \
        --cases verlet nose-hoover "npt iso"                   # LAMMPS beside each case, defaults on both sides

With --lammps every repeat also runs LAMMPS (``lmp`` of bench_lj.py's venv, one rank, one thread) on
the same problem with the same fix and LAMMPS's default neighbour settings (``neighbor 0.3 bin``,
``neigh_modify delay 0 every 1 check yes``: checked every step, as our default), and a second table
gives both sides' CPU time per step, its split (LAMMPS's Pair, Neigh, Modify and the rest against our
forces, rebuilds + check, integrator and the rest) and our speed relative to LAMMPS (> 1: faster).
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lj import EPSILON, SIGMA, cells_for, lammps_exe, parse_lammps, units

LAMMPS_FIX = {"verlet": "nve", "verlet sums": "nve", "nose-hoover": "nvt temp 1.44 1.44 0.1",
              "npt iso": "npt temp 1.44 1.44 0.1 iso 1.0 1.0 5.0"}
LAMMPS_INPUT = """\
units           lj
atom_style      atomic
lattice         fcc 0.8442
region          box block 0 {n} 0 {n} 0 {n}
create_box      1 box
create_atoms    1 box
mass            1 1.0
velocity        all create 1.44 87287 loop geom
pair_style      lj/cut 2.5
pair_coeff      1 1 1.0 1.0 2.5
neighbor        0.3 bin
neigh_modify    delay 0 every 1 check yes
fix             1 all {fix}
run             {steps}
"""

CASES = {
    "verlet": ["integrator=verlet"],
    "verlet sums": ["integrator=verlet"],   # NVE with the energy and virial summed every step (below)
    "nose-hoover": ["integrator=nose-hoover", "integrator.tdamp={tdamp}"],
    "npt iso": ["integrator=npt", "integrator.couple=iso", "integrator.pressure={p}", "integrator.pdamp={pdamp}",
                "integrator.tdamp={tdamp}"],
    "npt tri": ["integrator=npt", "integrator.couple=tri", "integrator.pressure={p}", "integrator.pdamp={pdamp}",
                "integrator.tdamp={tdamp}"],
}


def overrides(n: int, case: str, args) -> list[str]:
    from shardmd.integrators.units import EV_PER_A3_TO_BAR

    u = units()
    fill = {"tdamp": repr(0.1 * u["tau_fs"]), "pdamp": repr(5.0 * u["tau_fs"]),
            "p": repr(1.0 * EPSILON / SIGMA ** 3 * EV_PER_A3_TO_BAR)}
    return ["model=lj", f"model.epsilon={{Ar:{EPSILON}}}", f"model.sigma={{Ar:{SIGMA}}}",
            f"model.cutoff={u['cutoff']!r}", "model.shift=false", f"neighbor.skin={u['skin']!r}",
            "system.lattice=fcc", "system.element=Ar", f"system.a={u['a']!r}", f"system.repeat=[{n},{n},{n}]",
            f"dt={u['dt_fs']!r}", f"temperature={u['T_K']!r}", f"steps={args.steps}", f"threads={args.threads}",
            "device=cpu", "quiet=true", "trajectory.every=0", "thermo.every=0", "checkpoint.every=0",
            f"output={tempfile.gettempdir()}/bench_npt_{os.getpid()}_{case.replace(' ', '_')}.h5",
            *[c.format(**fill) for c in CASES[case]], *getattr(args, "extra", [])]


class CpuSplit:
    """Process CPU time (s) spent inside chosen bound methods of one simulation, per name."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def wrap(self, obj, attr: str, name: str) -> None:
        """Replace ``obj.attr`` (a bound method) by a timed call; the instance attribute shadows
        the class's, so the engine's ``self.attr(...)`` calls go through it."""
        fn = getattr(obj, attr)
        self.s.setdefault(name, 0.0)

        def timed(*a, **k):
            t = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.s[name] += time.process_time() - t
        setattr(obj, attr, timed)


def run(n: int, case: str, args) -> dict:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    sim = Simulation(compose_config(overrides(n, case, args)))
    if case == "verlet sums":
        # the engine asks a model that can (LJ) for the forces alone on steps with no output due,
        # as LAMMPS does; npt needs the virial every step (as fix npt makes LAMMPS's pair style
        # tally it), so this case is NVE doing the same force work as npt: every call with sums
        compute = sim.compute_forces
        sim.compute_forces = lambda energy=True: compute(energy=True)
    sim.setup()   # first list and forces: outside the timed loop
    sim.started = True
    builds0 = sim.nl.n_builds
    split = CpuSplit()
    split.wrap(sim.integrator, "first_half", "integrator")
    split.wrap(sim.integrator, "second_half", "integrator")
    split.wrap(sim.dmodel, "compute", "forces")
    split.wrap(sim.neighbors, "rebuild", "rebuilds")
    split.wrap(sim.domain, "check_and_stop", "check")   # the step loop's check (with the stop request)
    split.wrap(sim, "checkpoint", "checkpoint")
    cpu0 = time.process_time()
    sim.run()
    cpu = time.process_time() - cpu0
    s = dict(sim.summary)
    out = Path(sim.output_path)
    for path in (sim.log_path, out, out.with_name(out.stem + ".ckpt")):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    # the process CPU time around run() less its final checkpoint's CPU time (robust on a shared
    # machine; the checkpoint's wall time, subtracted before, is more than its CPU time under load)
    return {"step_s": s["wall_s"] / args.steps, "cpu_step_s": (cpu - split.s["checkpoint"]) / args.steps,
            "integrate_s": s.get("integrate", 0.0) / args.steps,
            **{f"cpu_{k}_s": v / args.steps for k, v in split.s.items()},
            "builds": sim.nl.n_builds - builds0, "volume": float(abs(sim.state.cell.det()))}


def run_lammps(lmp: Path, n: int, case: str, steps: int) -> dict:
    """LAMMPS's loop on the case's fix: CPU s per step, builds and its time split (s per step)."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.npt"
        inp.write_text(LAMMPS_INPUT.format(n=n, steps=steps, fix=LAMMPS_FIX[case]))
        out = subprocess.run([str(lmp), "-in", str(inp), "-log", "none"], cwd=tmp, capture_output=True,
                             text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise RuntimeError(f"LAMMPS failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    r = parse_lammps(out.stdout)
    cpu = r["cpu_s"]
    split = {k: cpu * r["split_pct"].get(k, 0.0) / 100.0 / steps for k in ("pair", "neigh", "modify")}
    return {"cpu_step_s": cpu / steps, "builds": r["builds"], **{f"lmp_{k}_s": v for k, v in split.items()}}


def lammps_table(results: dict, lmp_results: dict) -> None:
    """Both sides' CPU ms per step and split, medians over the repeats; speed = LAMMPS / ours."""
    print("| case | side | CPU ms/step | forces / Pair | lists / Neigh | integrator / Modify | rest | builds | "
          "speed vs LAMMPS, paired |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for case, ls in lmp_results.items():
        rs = results[case]
        ours = [med(r[k] for r in rs) for k in ("cpu_step_s", "cpu_forces_s")]
        # the builds against LAMMPS's Neigh; the per-step check stays in "rest", where LAMMPS's
        # Neighbor::decide() falls (timed with the step's Comm)
        lists = med(r["cpu_rebuilds_s"] for r in rs)
        integ = med(r["cpu_integrator_s"] for r in rs)
        speed = med(b["cpu_step_s"] / a["cpu_step_s"] for a, b in zip(rs, ls))
        print(f"| {case} | ours | {1e3 * ours[0]:.3f} | {1e3 * ours[1]:.3f} | {1e3 * lists:.3f} | {1e3 * integ:.3f} | "
              f"{1e3 * (ours[0] - ours[1] - lists - integ):.3f} | {rs[0]['builds']} | **{speed:.2f}** |")
        lc = med(r["cpu_step_s"] for r in ls)
        lp = [med(r[f"lmp_{k}_s"] for r in ls) for k in ("pair", "neigh", "modify")]
        print(f"| {case} | LAMMPS | {1e3 * lc:.3f} | {1e3 * lp[0]:.3f} | {1e3 * lp[1]:.3f} | {1e3 * lp[2]:.3f} | "
              f"{1e3 * (lc - sum(lp)):.3f} | {ls[0]['builds']} | |")


def equilibrated(n: int, args):
    """in.lj's start after ``--equilibrate`` steps of the nose-hoover case (ase.Atoms with
    velocities): every case then starts at T* = 1.44, where NVE stays. From the lattice NVE
    cools to T* ~ 0.7 while the thermostat holds 1.44; the faster atoms use up the skin sooner
    (~25 % more list builds), a cost of the state, not of the integrator."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    eq = Simulation(compose_config(overrides(n, "nose-hoover", argparse.Namespace(
        **{**vars(args), "steps": args.equilibrate + 1}))))
    eq.setup()
    for _ in range(args.equilibrate):
        eq.step()
    atoms = eq.atoms()
    eq.close()
    for path in (eq.log_path, eq.output_path):
        path.unlink(missing_ok=True)
    return atoms


def interleaved(n: int, cases: list[str], args) -> None:
    """All cases' simulations in this process at once, stepped in turn ``--interleave`` rounds of
    ``--steps`` steps (each round starting at the next case): every case sees the same load and
    the same memory, and each round's CPU time per step is divided by that round's NVE one."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation
    from shardmd.engine.run.state import State

    sims = {}
    # steps= of the whole benchmark run: a step at or past it counts as an output step (energy and virial)
    whole = argparse.Namespace(**{**vars(args), "steps": args.steps * args.interleave + 1})
    start = equilibrated(n, args) if args.equilibrate else None
    for case in cases:
        given = None if start is None else State.from_atoms(start)
        sim = Simulation(compose_config(overrides(n, case, whole)), state=given)
        if case == "verlet sums":
            compute = sim.compute_forces
            sim.compute_forces = lambda energy=True, compute=compute: compute(energy=True)
        sim.setup()
        sim.started = True
        sim._lazy_energy = True   # as run()'s loop: force calls without the sums off output steps
        sims[case] = (sim, sim.nl.n_builds)
    per_step: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(args.interleave):
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:
            sim = sims[case][0]
            t = time.process_time()
            for _ in range(args.steps):
                sim.step()
            per_step[case].append((time.process_time() - t) / args.steps)
    print("| integrator | CPU ms/step | vs NVE, paired | builds |")
    print("|---|---|---|---|")
    for case in cases:
        sim, b0 = sims[case]
        paired = statistics.median(a / b for a, b in zip(per_step[case], per_step["verlet"]))
        print(f"| {case} | {1e3 * statistics.median(per_step[case]):.2f} | {paired:.3f} | {sim.nl.n_builds - b0} |")
    for sim, _ in sims.values():
        sim.close()
        out = Path(sim.output_path)
        for path in (sim.log_path, out, out.with_name(out.stem + ".ckpt")):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--atoms", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES),
                    help="integrators to run (verlet, the reference, always runs)")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="all cases in one process, stepped in turn ROUNDS rounds of --steps steps "
                         "(interleaved(): the same load for every case); 0: separate runs")
    ap.add_argument("--equilibrate", type=int, default=0, metavar="STEPS",
                    help="with --interleave: every case starts from in.lj's state after STEPS steps of "
                         "nose-hoover at T* 1.44 (the same temperature for all; equilibrated())")
    ap.add_argument("--lammps", action="store_true", help="also run LAMMPS on each case (not npt tri)")
    ap.add_argument("--lammps-venv", default="/tmp/lmpvenv")
    ap.add_argument("--extra", nargs="+", default=[], metavar="KEY=VALUE",
                    help="more engine settings for every case of ours (e.g. malloc=keep)")
    args = ap.parse_args()
    if args.lammps and args.interleave:
        ap.error("--lammps runs separate processes: leave out --interleave")
    if args.equilibrate and not args.interleave:
        ap.error("--equilibrate applies to --interleave runs; add --interleave ROUNDS")
    cases = ["verlet", *[c for c in args.cases if c != "verlet"]]
    n = cells_for(args.atoms)
    if args.interleave:
        print(f"in.lj argon, {4 * n ** 3} atoms, {args.interleave} interleaved rounds of {args.steps} steps, CPU, "
              f"{args.threads} thread(s); {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
        interleaved(n, cases, args)
        return
    print(f"in.lj argon, {4 * n ** 3} atoms, {args.steps} steps, CPU, {args.threads} thread(s), "
          f"{args.repeats} alternating repeats; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          + (f"; ours with {' '.join(args.extra)}" if args.extra else ""))
    results: dict[str, list[dict]] = {c: [] for c in cases}
    lmp = lammps_exe(Path(args.lammps_venv)) if args.lammps else None
    lmp_results: dict[str, list[dict]] = {c: [] for c in cases if lmp and c in LAMMPS_FIX}
    for r in range(args.repeats):
        # each repeat starts at another case (a fixed order put NVE first every time, and a case
        # may pay for memory an earlier one left), and the simulation of one case is collected
        # before the next starts (its timers are reference cycles)
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:
            results[case].append(run(n, case, args))
            gc.collect()
            if case in lmp_results:
                lmp_results[case].append(run_lammps(lmp, n, case, args.steps))
    base = statistics.median(r["step_s"] for r in results["verlet"])
    cbase = statistics.median(r["cpu_step_s"] for r in results["verlet"])
    parts = ("integrator", "forces", "rebuilds", "check")
    print("| integrator | wall ms/step | vs NVE | CPU ms/step | vs NVE | vs NVE, paired | CPU: integrator | forces | "
          "rebuilds | check | rest | builds | V_end / V_0 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    v0 = (units()["a"] * n) ** 3
    for case, rs in results.items():
        t = statistics.median(r["step_s"] for r in rs)
        c = statistics.median(r["cpu_step_s"] for r in rs)
        split = [statistics.median(r[f"cpu_{k}_s"] for r in rs) for k in parts]
        cols = " | ".join(f"{1e3 * x:.2f}" for x in split)
        # each repeat's CPU time over that repeat's NVE run: load that changes between repeats
        # moves both, so the median of these ratios is steadier than the ratio of medians
        paired = statistics.median(r["cpu_step_s"] / b["cpu_step_s"] for r, b in zip(rs, results["verlet"]))
        print(f"| {case} | {1e3 * t:.2f} | {t / base:.3f} | {1e3 * c:.2f} | {c / cbase:.3f} | {paired:.3f} | {cols} | "
              f"{1e3 * (c - sum(split)):.2f} | {rs[0]['builds']} | {rs[0]['volume'] / v0:.4f} |")
    if lmp_results:
        print()
        lammps_table(results, lmp_results)


if __name__ == "__main__":
    main()
