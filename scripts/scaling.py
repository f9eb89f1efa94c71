"""Strong and weak scaling series of the engine over MPI ranks; prints a table.

    python scripts/scaling.py --launcher mpirun --ranks 1 2 4 8 --model lj --strong-atoms 256000 \
        --weak-atoms 32000 --steps 200 --device cpu

Each run is a real ``<launcher> -n R python -m engine run ...`` (launcher: mpirun/mpiexec,
or srun inside an allocation); the engine's own log line "Loop: ..." and "Time split: ..."
give atom-steps/s and the split compute / halo (comm) / neighbour / output.  Efficiency:
strong = rate(R) / (R * rate(1)); weak = (rate(R) / R) / rate(1) with atoms growing as R.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def fcc_repeat(atoms: int) -> int:
    """Cubic fcc repeat n with 4 n^3 closest to ``atoms``."""
    return max(1, round((atoms / 4) ** (1 / 3)))


def parse_loop(text: str) -> dict:
    """The engine log's summary: wall (s), steps/s, ns/day, atom-steps/s, neighbour builds, and
    the time split (phase -> s) from its "Loop:" and "Time split:" lines."""
    loop = re.search(r"Loop: ([\d.]+) s, ([\d.]+) steps/s, ([\d.]+) ns/day, ([\d.e+]+) atom-steps/s, "
                     r"(\d+) neighbour builds", text)
    line = text.split("Time split:")[1].splitlines()[0]
    return {"wall": float(loop.group(1)), "steps_per_s": float(loop.group(2)), "ns_day": float(loop.group(3)),
            "rate": float(loop.group(4)), "builds": int(loop.group(5)),
            "split": {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s \(", line)}}


def run(launcher: str, ranks: int, model: str, atoms: int, steps: int, device: str, precision: str,
        extra: list[str], workdir: Path) -> dict:
    n = fcc_repeat(atoms)
    args = [f"model={model}", f"system.repeat=[{n},{n},{n}]", f"steps={steps}", "trajectory.every=0",
            "thermo.every=0", "checkpoint.every=0", "quiet=true", f"device={device}", f"precision={precision}",
            f"output={workdir}/r{ranks}_{atoms}.h5", "overwrite=true", *extra]
    if launcher == "self":
        cmd = [sys.executable, "-m", "engine", "run", *args, f"domains={ranks}"]
    else:
        exe = shutil.which(launcher) or str(Path(sys.executable).parent / launcher)
        cmd = [exe, "-n", str(ranks)]
        if launcher == "srun":
            cmd = [exe, f"--ntasks={ranks}"]
        cmd += [sys.executable, "-m", "engine", "run", *args]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log = Path(f"{workdir}/r{ranks}_{atoms}.log")
    text = log.read_text() if log.exists() else ""
    if r.returncode != 0 or "Loop:" not in text:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    loop = parse_loop(text)
    # the thermo table's first row (step 0): step, time, T, PE, ... -> the correctness spot-check
    first = next((ln.split() for ln in text.splitlines() if ln.split()[:1] == ["0"]), None)
    pe0 = float(first[3]) if first and len(first) > 3 else float("nan")
    return {"ranks": ranks, "atoms": 4 * n**3, "wall": loop["wall"], "ns_day": loop["ns_day"],
            "rate": loop["rate"], "pe0": pe0, **{f"t_{k}": v for k, v in loop["split"].items()}}


def table(title: str, rows: list[dict], kind: str) -> str:
    base = rows[0]
    out = [f"\n{title}", f"{'ranks':>5} {'atoms':>10} {'atom-steps/s':>13} {'ns/day':>9} {'eff':>6} "
           f"{'model%':>7} {'halo%':>6} {'neigh%':>7} {'integ%':>7} {'out%':>5} {'other%':>6} {'PE(0) rel.dev':>13}"]
    for r in rows:
        ideal = base["rate"] * r["ranks"] / base["ranks"]
        # strong: rate vs ideal linear speed-up; weak: rate per rank vs the first row's
        eff = r["rate"] / ideal if kind == "strong" else (r["rate"] / r["ranks"]) / (base["rate"] / base["ranks"])
        w = r["wall"] or 1
        pct = {k: 100 * r.get(f"t_{k}", 0) / w for k in ("model", "comm", "neighbor", "integrate", "output")}
        other = 100 - sum(pct.values())
        # step-0 energy per atom vs the first row's (strong: same system, so it must agree)
        dev = abs(r["pe0"] / r["atoms"] - base["pe0"] / base["atoms"]) / abs(base["pe0"] / base["atoms"] or 1)
        out.append(f"{r['ranks']:>5} {r['atoms']:>10} {r['rate']:>13.4g} {r['ns_day']:>9.4f} {eff:>6.2f} "
                   f"{pct['model']:>7.1f} {pct['comm']:>6.1f} {pct['neighbor']:>7.1f} {pct['integrate']:>7.1f} "
                   f"{pct['output']:>5.1f} {other:>6.1f} {dev:>13.2e}")
        r["efficiency"] = eff
    return "\n".join(out)


def save(a, series: str, rows: list[dict]) -> None:
    if a.json is None:
        return
    import json

    old = json.loads(a.json.read_text()) if a.json.exists() else []
    old += [{"series": series, "model": a.model, "device": a.device, "precision": a.precision,
             "extra": a.extra, **r} for r in rows]
    a.json.write_text(json.dumps(old, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launcher", default="mpiexec", help="mpiexec | mpirun | srun | self")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model", default="lj")
    ap.add_argument("--strong-atoms", type=int, default=32000)
    ap.add_argument("--weak-atoms", type=int, default=16000, help="atoms per rank")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="float64")
    ap.add_argument("--series", choices=["strong", "weak", "both"], default="both")
    ap.add_argument("--json", type=Path, default=None,
                    help="append the rows (with series, model, device, precision) to this JSON file "
                         "for plot_scaling.py")
    ap.add_argument("--logs", type=Path, default=None, help="keep each run's engine log in this folder")
    ap.add_argument("extra", nargs="*", help="more engine overrides, e.g. neighbor.skin=0.5")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="shardmd-scaling-"))
    if a.series in ("strong", "both"):
        rows = [run(a.launcher, r, a.model, a.strong_atoms, a.steps, a.device, a.precision, a.extra, work)
                for r in a.ranks]
        print(table(f"strong scaling, {a.model}, {rows[0]['atoms']} atoms, {a.device}, {a.precision}", rows, "strong"))
        save(a, "strong", rows)
    if a.series in ("weak", "both"):
        rows = [run(a.launcher, r, a.model, a.weak_atoms * r, a.steps, a.device, a.precision, a.extra, work)
                for r in a.ranks]
        print(table(f"weak scaling, {a.model}, ~{a.weak_atoms} atoms per rank, {a.device}, {a.precision}", rows,
                    "weak"))
        save(a, "weak", rows)
    if a.logs is not None:
        a.logs.mkdir(parents=True, exist_ok=True)
        for log in work.glob("*.log"):   # r{ranks}_{atoms}.log
            shutil.copy(log, a.logs / f"{a.model}_{a.device}_{a.precision}_{log.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
