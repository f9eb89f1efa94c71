"""``model.compile=true`` (models/mace_compile.py): the mace-torch module compiled by inductor
gives the eager module's energy, forces and virial (float64, round-off: the compiled kernels
fuse and reorder operations), through a new shape (the automatic dynamic recompile), and the
same trajectory on two real MPI domains as the eager model on one, through neighbour rebuilds
and migrations; the generated code goes to a directory of the user's own, never to the
predictable ``/tmp/torchinductor_<user>``."""
import os
import stat

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.io import write
from conftest import run_engine

from shardmd.engine.io.h5md_read import read_frames
from shardmd.models.mace_compile import compiler_problem

pytestmark = pytest.mark.slow
#: the tests that compile: skipped where the model would refuse (models/mace_compile.py says why, in one line)
needs_compiler = pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None,
                                    reason=str(compiler_problem(torch.device("cpu"))))
TOL = 1e-11


def _system(n: int, seed: int):
    a = bulk("Cu", "fcc", a=3.59, cubic=True).repeat((n, n, n))
    a.rattle(0.08, seed=seed)
    return (torch.tensor(a.positions), torch.tensor(a.cell.array), torch.tensor(a.numbers))


@needs_compiler
def test_compiled_call_equals_eager_through_a_new_shape(tmp_path, monkeypatch):
    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.models.mace import MaceModel

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    eager = MaceModel(dtype=torch.float64)
    # built as model.compile=auto builds it (eager), then compiled as the engine does for a long run
    comp = MaceModel(dtype=torch.float64, compile="auto")
    assert not comp.compiled and not isinstance(comp.model, torch._dynamo.eval_frame.OptimizedModule)
    assert comp.compile_now() is None
    assert comp.compiled and isinstance(comp.model, torch._dynamo.eval_frame.OptimizedModule)
    for n, seed in ((2, 1), (3, 2), (2, 3)):   # 32, 108, then 32 atoms at other positions
        x, h, z = _system(n, seed)
        nl = build_neighbor_list(x, h, (True,) * 3, eager.cutoff + 0.5)
        want = eager.compute(x, h, (True,) * 3, z, nl)
        got = comp.compute(x, h, (True,) * 3, z, nl)
        assert abs(float(got["energy"] - want["energy"])) <= TOL * abs(float(want["energy"])), n
        scale = float(want["forces"].abs().max())
        assert float((got["forces"] - want["forces"]).abs().max()) <= TOL * scale, n
        assert float((got["virial"] - want["virial"]).abs().max()) <= TOL * float(want["virial"].abs().max()), n
    cache = tmp_path / ".cache" / "shardmd" / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and any(cache.iterdir())


def test_a_cache_directory_open_to_others_is_not_used(tmp_path, monkeypatch):
    from shardmd.models.mace_compile import private_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache" / "shardmd").mkdir(parents=True)
    (tmp_path / ".cache" / "shardmd" / "inductor").mkdir(mode=0o777)
    os.chmod(tmp_path / ".cache" / "shardmd" / "inductor", 0o777)
    got = private_cache_dir()
    assert got != tmp_path / ".cache" / "shardmd" / "inductor" and stat.S_IMODE(got.stat().st_mode) == 0o700
    got.rmdir()
    (tmp_path / ".cache" / "shardmd" / "inductor").rmdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".cache" / "shardmd" / "inductor").symlink_to(tmp_path / "elsewhere")
    got = private_cache_dir()
    assert got.parent != tmp_path / "elsewhere" and not got.is_symlink()
    got.rmdir()


@needs_compiler
@pytest.mark.mpi
def test_compiled_on_two_domains_follows_eager_on_one(tmp_path):
    """30 hot Langevin steps of 108 Cu atoms with a 0.3 Å skin (the list is rebuilt, so the
    compiled call meets new shapes on every rank; atoms migrate between the two domains)."""
    a = bulk("Cu", "fcc", a=3.59, cubic=True).repeat((3, 3, 3))
    a.rattle(0.05, seed=4)
    write(tmp_path / "cu.xyz", a)
    base = ["run", "model=mace", "precision=float64", "steps=30", "dt=2.0", "temperature=1200",
            "integrator=langevin", "trajectory.every=30", "thermo.every=0", "checkpoint.every=0", "quiet=true",
            "threads=1", "neighbor.skin=0.3", "system.file=cu.xyz"]
    env = {"HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    r = run_engine([*base, "output=eager.h5"], cwd=tmp_path, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_engine([*base, "model.compile=true", "domains=2", "output=comp.h5"], cwd=tmp_path, timeout=1500, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "comp.log").read_text()
    builds = int(log.split(" neighbour builds")[0].rsplit(" ", 1)[-1])
    assert builds >= 2 and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    eager, comp = read_frames(tmp_path / "eager.h5"), read_frames(tmp_path / "comp.h5")
    assert [f.info["step"] for f in comp] == [0, 30]
    assert np.abs(comp[-1].positions - eager[-1].positions).max() <= 1e-10
    assert abs(comp[-1].get_potential_energy() - eager[-1].get_potential_energy()) <= 1e-10 * len(a)


def test_compile_must_be_a_flag(tmp_path):
    r = run_engine(["run", "model=mace", "model.compile=maybe", "steps=1", "output=x.h5"], cwd=tmp_path)
    assert r.returncode == 2 and "model.compile" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_without_a_compiler_the_refusal_is_one_line(tmp_path):
    r = run_engine(["run", "model=mace", "model.compile=true", "steps=1", "output=x.h5"], cwd=tmp_path,
                   env={"PATH": str(tmp_path), "CXX": ""})
    assert r.returncode == 2 and "needs a C++ compiler" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_auto_compiles_long_one_domain_gpu_runs_only():
    """model.compile=auto's choice (engine/run/compile_choice.py): a GPU, one domain, one piece, one
    system, more than the CUDA graph's 50,000 atoms, and a run whose eager time is estimated long;
    the run's last step decides (a restart of the same run decides the same)."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.compile_choice import SECONDS, estimated_seconds, reason_not

    gpu, cpu = torch.device("cuda"), torch.device("cpu")

    def why(*over, atoms=100_000, ranks=1, device=gpu):
        return reason_not(compose_config(["model=mace", *over]), atoms, ranks, device)

    assert why("steps=100000") is None                       # 100k atoms: ~8,000 s eager
    assert "short" in why("steps=1000")                      # ~80 s
    assert "864 atoms" in why("steps=10000000", atoms=864)   # small: the eager CUDA graph, not auto's compile
    assert "50000 atoms" in why("steps=10000000", atoms=50_000)
    assert why("steps=10000", atoms=50_001) is None          # ~400 s
    assert why("steps=100000", device=cpu) == "not on a GPU"
    assert why("steps=100000", ranks=4) == "4 domains"
    assert why("steps=100000", "subdomains=8") == "called in parts"
    assert estimated_seconds(10**4, 10**5) >= SECONDS > estimated_seconds(10**3, 10**5)
    from shardmd.engine.run.compile_choice import SMALL
    from shardmd.models.mace import GRAPH_MAX_POINTS

    assert SMALL == GRAPH_MAX_POINTS   # the same limit: auto compiles where the graph stops


def test_auto_keeps_the_cpu_eager(tmp_path):
    """On the CPU model.compile=auto (the default) never compiles: the header says nothing of it."""
    r = run_engine(["run", "model=mace", "system.repeat=[2,2,2]", "steps=2", "output=x.h5"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (tmp_path / "x.log").read_text()
    assert "ShardMD:" in log and "compiled" not in log
