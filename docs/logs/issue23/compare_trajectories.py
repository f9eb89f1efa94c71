"""Bit-for-bit comparison of trajectories written by two versions of ShardMD (issue 23:
the rebuild controller and the boundary changes must not change a single bit).

    python docs/logs/issue23/compare_trajectories.py OLD_COMMIT [NEW_COMMIT]

Checks out OLD_COMMIT (and NEW_COMMIT; default: this working tree) into temporary worktrees,
runs the same cases with both versions (through `shardmd` package views on PYTHONPATH) and
compares every frame's
positions, velocities, forces and every observable with np.array_equal.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
HOT = ["model=lj", "system.element=Ar", "system.lattice=fcc", "system.a=5.8", "system.repeat=[4,4,4]",
       "temperature=900", "dt=4.0", "neighbor.skin=0.6", "model.cutoff=7.0", "thermo.every=10",
       "trajectory.every=5", "checkpoint.every=0", "quiet=true", "overwrite=true", "steps=200"]
# name: (overrides, planner) ; planner "over": plans as if atoms never moved (forces rollbacks)
CASES = {
    "per-step check": ([*HOT, "neighbor.deferred=false"], None),
    "deferred": ([*HOT, "neighbor.deferred=true", "neighbor.deferred_max=20"], None),
    "deferred, rollbacks": ([*HOT, "neighbor.deferred=true"], "over"),
    "deferred, pipelined, rollbacks": ([*HOT, "neighbor.deferred=true"], "over-pipelined"),
    "langevin, deferred": ([*HOT, "integrator=langevin", "neighbor.deferred=true"], None),
    "langevin, 2 domains (mpiexec)": ([*HOT, "integrator=langevin", "domains=2"], "mpi"),
}
RUNNER = r'''
import sys
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
from shardmd.engine.skin_check import DeferredSkinCheck
planner, args = sys.argv[1], sys.argv[2:]
class Over(DeferredSkinCheck):
    def plan(self, step, last, lead=1):
        return last > self.half_skin
    def schedule(self, step, current):
        self.next_check = step + self.max_every
sim = Simulation(compose_config(args))
if planner.startswith("over"):
    sim.deferred = Over(sim.deferred.half_skin, 50)
    sim.deferred.pipelined = planner.endswith("pipelined")
sim.run()
c = sim.deferred
print("rollbacks", c.rollbacks if c else "-", "reads", c.reads if c else "-", "builds", sim.nl.n_builds)
'''


def view(src: Path, dst: Path) -> Path:
    (dst / "shardmd").mkdir(parents=True)
    (dst / "shardmd" / "__init__.py").write_text("")
    for p in ("engine", "domain", "models", "integrators", "configs"):
        (dst / "shardmd" / p).symlink_to(src / p, target_is_directory=True)
    (dst / "engine").symlink_to(src / "engine", target_is_directory=True)
    return dst


def run(pythonpath: Path, out: Path, args, planner) -> str:
    env = {"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    if planner == "mpi":
        cmd = [sys.executable, "-m", "engine", "run", *args, f"output={out}"]
    else:
        cmd = [sys.executable, "-c", RUNNER, planner or "-", *args, f"output={out}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent, timeout=900)
    if r.returncode:
        raise SystemExit(f"{cmd} failed:\n{r.stderr[-2000:]}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def datasets(path: Path) -> dict:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def main():
    old = sys.argv[1]
    new = sys.argv[2] if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {"old": old} | ({"new": new} if new else {})
        for name, commit in trees.items():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp / name), commit],
                           check=True, capture_output=True)
        try:
            views = {"old": view(tmp / "old", tmp / "view_old"),
                     "new": view(tmp / "new" if new else ROOT, tmp / "view_new")}
            print(f"old = {old}, new = {new or f'working tree of {ROOT}'}")
            print("| case | frames | datasets | bit-identical | old run | new run |\n|---|---|---|---|---|---|")
            bad = 0
            for name, (args, planner) in CASES.items():
                files, notes = {}, {}
                for ver, pp in views.items():
                    d = tmp / f"{ver}-{abs(hash(name))}"
                    d.mkdir()
                    files[ver] = d / "run.h5"
                    notes[ver] = run(pp, files[ver], args, planner)
                a, b = datasets(files["old"]), datasets(files["new"])
                keys = sorted(k for k in a if "parameters" not in k and "creator" not in k)
                same = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in keys)
                frames = len(a.get("particles/all/position/step", []))
                bad += not same
                verdict = "yes" if same else "NO"
                print(f"| {name} | {frames} | {len(keys)} | {verdict} | {notes['old']} | {notes['new']} |")
        finally:
            for name in trees:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / name)],
                               capture_output=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
