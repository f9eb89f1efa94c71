"""The CPU step loop's all-reduces: how many per step, through which path, and the stop
they carry (engine/run/rebuild.py ``stop_agreed``, engine/run/rank_domain.py ``check_and_stop``,
domain/comm.py ``Comm.all_reduce``).

On 2 MPI ranks with the per-step skin check, a step without output does one all-reduce
(the check's, which carries the stop request) at a check step and one (the stop request
alone) at a step between checks. With ``Comm.host_over_mpi`` none of them goes through the
process group (``torch.distributed.all_reduce``, 0.05-1 ms on gloo against ~20 µs through MPI:
scripts/bench_collectives.py). A regression that adds a collective per step, or sends them
back through gloo where MPI was asked for, fails here."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import mpiexec_cmd

from shardmd.domain.comm import Comm, _host_over_mpi, _mpi_all_reduce

STEPS = 12

WORKER = textwrap.dedent('''
    import json, os, sys
    import torch.distributed as dist
    from shardmd.domain.comm import init_comm, shutdown
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    out, steps = sys.argv[1], int(sys.argv[2])
    comm = init_comm("cpu")
    default_over_mpi = comm.host_over_mpi
    counts = {"comm": 0, "group": 0, "p2p": 0}
    plain_reduce, plain_group, plain_p2p = comm.all_reduce, dist.all_reduce, dist.batch_isend_irecv

    def counted(t, op="sum"):
        counts["comm"] += 1
        return plain_reduce(t, op)

    def counted_group(*a, **k):
        counts["group"] += 1
        return plain_group(*a, **k)

    def counted_p2p(*a, **k):
        counts["p2p"] += 1
        return plain_p2p(*a, **k)

    comm.all_reduce = counted          # comm.any goes through it too
    dist.all_reduce = counted_group
    dist.batch_isend_irecv = counted_p2p
    results = {}
    # (name, neighbor.every, step whose forces see a stop request on rank 1 or None, host_over_mpi)
    cases = [("every1", 1, None, False), ("every4", 4, None, False), ("every1_mpi", 1, None, True),
             ("every4_mpi", 4, None, True), ("stop_every1", 1, 6, False), ("stop_every4_mpi", 4, 8, True)]
    for name, every, stop_at, over_mpi in cases:
        comm.host_over_mpi = over_mpi
        cfg = compose_config(["model=lj", "system.repeat=[4,4,4]", "dt=2.0", f"steps={steps}",
                              "temperature=90", "quiet=true", "threads=1", "trajectory.every=0",
                              "thermo.every=0", "checkpoint.every=0", f"neighbor.every={every}",
                              f"output={out}/{name}.h5"])
        cfg.domains = comm.size
        sim = Simulation(cfg, comm=comm)
        per_step = []
        step, forces = sim.step, sim.compute_forces

        def counted_step(step=step):
            per_step.append(dict(counts))
            return step()

        def forces_with_signal(*a, sim=sim, stop_at=stop_at, forces=forces, **k):
            # a signal between the step's check and its end (while the forces are computed)
            if stop_at is not None and comm.rank == 1 and sim.state.step == stop_at:
                sim.stop.signal_name = "SIGTERM"
            return forces(*a, **k)

        sim.step, sim.compute_forces = counted_step, forces_with_signal
        sim.run()
        per_step.append(dict(counts))
        results[name] = {"step": sim.state.step, "exit": sim.exit_code,
                         "comm": [b["comm"] - a["comm"] for a, b in zip(per_step, per_step[1:])],
                         "group": [b["group"] - a["group"] for a, b in zip(per_step, per_step[1:])],
                         "p2p": [b["p2p"] - a["p2p"] for a, b in zip(per_step, per_step[1:])],
                         "x": sim.state.positions.tolist()}
        del sim
    results["default_over_mpi"] = default_over_mpi
    with open(f"{out}/rank{comm.rank}.json", "w") as f:
        json.dump(results, f)
    shutdown(comm)
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("step_collectives")
    (d / "worker.py").write_text(WORKER)
    r = subprocess.run(mpiexec_cmd(2, [str(d / "worker.py"), str(d), str(STEPS)]), capture_output=True,
                       text=True, timeout=600, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((d / f"rank{k}.json").read_text()) for k in range(2)]


@pytest.mark.mpi
def test_one_all_reduce_per_step_on_two_ranks(two_ranks):
    for res in two_ranks:
        for name in ("every1", "every4", "every1_mpi", "every4_mpi"):
            r = res[name]
            assert r["step"] == STEPS and r["exit"] == 0
            # every step before the last (which writes the final thermo line): one all-reduce,
            # the check's carrying the stop request, or the stop request alone between checks
            assert r["comm"][:-1] == [1] * (STEPS - 1), (name, r["comm"])
            if name.endswith("_mpi"):   # and none through the process group (gloo): they take MPI,
                assert r["group"] == [0] * STEPS, (name, r["group"])
                assert r["p2p"] == [0] * STEPS, (name, r["p2p"])    # the halo's exchanges too
            else:
                assert r["group"] == r["comm"], (name, r["group"])
                assert all(n >= 1 for n in r["p2p"]), (name, r["p2p"])   # a halo refresh per step


@pytest.mark.mpi
def test_host_traffic_takes_mpi_by_default_and_moves_the_same_bits(two_ranks):
    """Host traffic takes MPI by default where each rank has a core (2 ranks here); the
    positions after the run are the same bits either way."""
    for res in two_ranks:
        assert res["default_over_mpi"] is _host_over_mpi(2)
        for a, b in (("every1", "every1_mpi"), ("every4", "every4_mpi")):
            assert res[a]["x"] == res[b]["x"], (a, b)


@pytest.mark.mpi
def test_stop_after_the_check_is_honoured_at_the_next_step_on_every_rank(two_ranks):
    """A request on rank 1 while step k's forces are computed (after k's check): every rank
    stops after step k + 1, at the next step's check (every=1) or at the stop's own all-reduce
    of a step between checks (every=4, k = 8 a check step)."""
    for name, k in (("stop_every1", 6), ("stop_every4_mpi", 8)):
        steps = [res[name]["step"] for res in two_ranks]
        assert steps == [k + 1, k + 1], (name, steps)
        assert [res[name]["exit"] for res in two_ranks] == [75, 75]


def test_host_traffic_takes_mpi_where_asked_and_auto_where_each_rank_has_a_core(monkeypatch):
    monkeypatch.delenv("SHARDMD_HOST_OVER_MPI", raising=False)   # unset: auto
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _host_over_mpi(1) and _host_over_mpi(2) and not _host_over_mpi(4)   # 4 pollers on 2 cores
    monkeypatch.setenv("SHARDMD_HOST_OVER_MPI", "auto")
    assert _host_over_mpi(2) and not _host_over_mpi(3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})   # bound to a core by the launcher
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert _host_over_mpi(8) and not _host_over_mpi(65)
    monkeypatch.setenv("SHARDMD_HOST_OVER_MPI", "0")
    assert not _host_over_mpi(1)
    monkeypatch.setenv("SHARDMD_HOST_OVER_MPI", "1")
    assert _host_over_mpi(100)
    monkeypatch.setenv("SHARDMD_HOST_OVER_MPI", "yes")    # not 1 or auto: off
    assert not _host_over_mpi(1)


def test_host_reductions_take_mpi_only_where_order_cannot_matter():
    class World:   # Comm._over_mpi looks only at whether an MPI module is there
        pass

    two, three = (Comm(size=n, backend="gloo", mpi=World, host_over_mpi=True) for n in (2, 3))
    f, i = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)
    assert two._over_mpi(f, "max") and two._over_mpi(f, "sum") and two._over_mpi(i, "sum")
    assert three._over_mpi(f, "max") and three._over_mpi(i, "sum")
    assert not three._over_mpi(f, "sum")   # a float sum over 3 ranks: the group's order of additions
    assert not Comm(size=2, backend="gloo", mpi=World)._over_mpi(f, "max")      # not asked for (the default)
    assert not Comm(size=2, backend="gloo", host_over_mpi=True)._over_mpi(f, "max")      # no MPI world (torchrun)
    assert not Comm(size=2, backend="nccl", device=torch.device("cuda", 0), mpi=World,
                    host_over_mpi=True)._over_mpi(f, "max")
    assert not two._over_mpi(f.requires_grad_(), "max")
    assert not two._over_mpi(torch.zeros(2, dtype=torch.bool), "max")


def test_nan_flags_make_a_nan_on_any_rank_a_nan_on_all():
    """_mpi_all_reduce with a one-rank stand-in world whose Allreduce combines the buffers of
    two 'ranks' in either order, as MPI's MAX (a > b ? a : b) does: the same bits both ways."""
    class Op:
        def __init__(self, f):
            self.f = f

    class World:
        SUM, MAX, MIN = Op(np.add), Op(lambda a, b: np.where(a > b, a, b)), Op(lambda a, b: np.where(a < b, a, b))
        IN_PLACE = object()

        def __init__(self, other, first):
            self.other, self.first = other, first
            self.COMM_WORLD = self

        def Allreduce(self, _in_place, buf, op):
            o = self.other(buf.size)
            buf[:] = op.f(o, buf) if self.first else op.f(buf, o)

    def reduce(mine, theirs, op, first):
        a = np.array(mine, dtype=np.float64)
        flags = {"max": 1.0, "min": -1.0}
        their = np.array(theirs, dtype=np.float64)
        nan = np.isnan(their)
        big = -np.inf if op == "max" else np.inf
        packed = np.concatenate([np.where(nan, big, their), nan * flags[op]])
        _mpi_all_reduce(World(lambda n: packed, first), a, op)
        return a

    for op in ("max", "min"):
        for first in (True, False):
            out = reduce([np.nan, 1.0, 2.0], [0.5, 3.0, np.nan], op, first)
            assert np.isnan(out[0]) and np.isnan(out[2])
            assert out[1] == (3.0 if op == "max" else 1.0)
            both = reduce([np.nan, 1.0], [np.nan, -1.0], op, first)
            assert np.isnan(both[0]) and both[1] == (1.0 if op == "max" else -1.0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
