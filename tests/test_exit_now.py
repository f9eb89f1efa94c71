"""``exit_now``: how ``python -m engine`` ends once its work is done (engine/launch/parallel.py). It
skips the interpreter's teardown, so these check that nothing is lost by skipping it: the exit
status, text still in Python's buffers, an HDF5 file a caller left open (the normal exit runs
then), and MPI's own end under mpiexec."""
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from shardmd.engine.launch.parallel import find_mpiexec

pytestmark = pytest.mark.fault


def _script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "s.py"
    path.write_text("from shardmd.engine.launch.parallel import exit_now\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_status_and_buffered_output_survive(tmp_path):
    # stdout to a pipe is block-buffered: without the flush this text would be lost
    r = subprocess.run(_script(tmp_path, """
        import sys
        print("written before the end", end="")
        sys.stderr.write("and to stderr")
        exit_now(3)
    """), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (3, "written before the end", "and to stderr")


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (75, 75)])
def test_status(tmp_path, code, status):
    r = subprocess.run(_script(tmp_path, f"exit_now({code!r})"), capture_output=True, timeout=60)
    assert r.returncode == status, r.stderr


def test_an_open_hdf5_file_is_written_out(tmp_path):
    # os._exit with this file open leaves it unreadable ("bad object header version number")
    out = tmp_path / "open.h5"
    r = subprocess.run(_script(tmp_path, f"""
        import h5py, numpy as np
        f = h5py.File({str(out)!r}, "w")
        f["x"] = np.arange(10.0)
        exit_now(0)
    """), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert np.array_equal(f["x"][:], np.arange(10.0))


def _mpi_run(tmp_path, code: int) -> subprocess.CompletedProcess:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install mpich)")
    # MPI_Finalize first deletes COMM_SELF's attributes (MPI standard, "Allowing User Functions at
    # Process Termination"): the callback's file says that this rank went through it
    return subprocess.run([mpiexec, "-n", "2", *_script(tmp_path, f"""
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        def finalizing(comm, keyval, value):
            open(f"finalized.{{rank}}", "w").close()
        MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=finalizing), 1)
        MPI.COMM_WORLD.Barrier()
        exit_now({code})
    """)], capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.mpi
@pytest.mark.parametrize("code", [0, 5])
def test_mpi_ranks_finalize(tmp_path, code):
    # every rank goes through MPI_Finalize before os._exit (MPICH removes its /dev/shm segment
    # there; a rank that skips it leaves the segment behind, as a SIGKILLed one does), and the
    # status reaches mpiexec
    r = _mpi_run(tmp_path, code)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert sorted(p.name for p in tmp_path.glob("finalized.*")) == ["finalized.0", "finalized.1"], r.stderr
