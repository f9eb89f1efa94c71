"""One process group for everything, derived from MPI.

Rank and size come from mpi4py (so ``mpirun``, ``mpiexec`` and ``srun`` all work, whatever
MPI the site has).  ``torch.distributed`` is initialised from them: rank 0 picks a free port
and broadcasts it with its host address; gloo on CPU, NCCL on GPU.  The same group carries
the engine's migration and halo traffic and a model's halo operations.

GPU choice: local rank (from an MPI shared-memory split) modulo the visible device count.
When a node has more ranks than GPUs, NCCL cannot be used (it refuses two ranks on one
GPU), so the group falls back to gloo and exchanges are staged through host memory
(``Comm.staged``).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .launcher_env import detect as detect_launcher
from .shm_janitor import watch_segments
from .stale_shm import remove_stale_segments


def under_torchrun() -> bool:
    """True in a worker started by torchrun (its rendezvous, no MPI)."""
    return detect_launcher().kind == "torchrun"


def under_launcher() -> bool:
    """True when this process was started by mpirun/mpiexec/srun with MPI wiring, or by torchrun
    (a consistent launcher environment: domain/launcher_env.py; stray variables do not count)."""
    return detect_launcher().kind in ("mpi", "torchrun")


@dataclass
class Comm:
    """This rank's place in the job and the process group all traffic uses."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    staged: bool = False   # exchanges go through host memory (gloo with CUDA tensors)
    group: object = None
    mpi: object = None
    #: small host reductions (:meth:`_over_mpi`) and the point-to-point exchanges of host
    #: tensors (domain/exchange.py) through MPI instead of the group where the node has a core per
    #: rank (``SHARDMD_HOST_OVER_MPI``: ``auto`` by default, ``1`` always, ``0`` never; init_comm,
    #: :func:`_host_over_mpi`).
    #: Both together or neither: MPI's polling waits beside gloo's sleeping ones made 4 ranks on
    #: 2 cores 1.6x slower (docs/design.md, "The CPU LJ kernel: measured changes").
    host_over_mpi: bool = False

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- collectives on small tensors (always valid, also for size 1) ------------------
    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """New tensor: reduction of ``t`` over ranks (sum, max or min), on ``t``'s device.

        With :attr:`host_over_mpi`, host reductions go through MPI where an MPI world exists
        and the result cannot depend on the order ranks are combined in (:meth:`_over_mpi`):
        one MPI ``Allreduce`` of a few values costs ~5-13 µs on 2 local ranks (MPICH, shared
        memory), ~20 µs through this method, the same through gloo 0.05-1 ms on a loaded
        2-vCPU host (scripts/bench_collectives.py). The CPU step loop does one per step."""
        if self.size == 1:
            return t.clone()
        if self._over_mpi(t, op):
            return _reduce_over_mpi(self.mpi, t, op)
        x = t.to(self._dev(), copy=True)
        dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                               "min": dist.ReduceOp.MIN}[op], group=self.group)
        return x.to(t.device)

    def any(self, flag: bool) -> bool:
        if self.size == 1:
            return bool(flag)
        return bool(self.all_reduce(torch.tensor([int(flag)], dtype=torch.int64, device=self._dev()), "max")[0])

    def _dev(self) -> torch.device:
        return torch.device("cpu") if (self.staged or self.backend != "nccl") else self.device

    def _over_mpi(self, t: torch.Tensor, op: str) -> bool:
        """Whether :meth:`all_reduce` takes MPI: the group reduces on the host (gloo; not NCCL,
        which reduces on the device), ``t`` needs no gradient, its dtype is one MPI reduces,
        and the result is the same bits whatever the order of the ranks: a max or a min, an
        integer sum, or a float sum over two ranks (a + b = b + a). A float sum over more
        ranks stays on the group, whose order of additions trajectories were made with."""
        if (not self.host_over_mpi or self.mpi is None or self._dev().type != "cpu" or t.requires_grad
                or t.dtype not in _MPI_DTYPES):
            return False
        return op != "sum" or not t.is_floating_point() or self.size == 2

    # Objects (pickled) travel over MPI where it can carry any size: torch's object collectives
    # pickle too, but then move the bytes as tensors through the group (through the GPU with
    # NCCL), a detour that makes checkpoint gathers several times slower (docs/benchmarks.md,
    # "Gathers for checkpoints and frames over mpi4py").
    def _objects_over_mpi(self) -> bool:
        return self.mpi is not None and _large_messages(self.mpi)

    def gather_object(self, obj, root: int = 0):
        """List of every rank's ``obj`` on ``root`` (None elsewhere)."""
        if self.size == 1:
            return [obj]
        if self._objects_over_mpi():
            return self.mpi.COMM_WORLD.gather(obj, root=root)
        out = [None] * self.size if self.rank == root else None
        dist.gather_object(obj, out, dst=root, group=self.group)
        return out

    def all_gather_object(self, obj):
        if self.size == 1:
            return [obj]
        if self._objects_over_mpi():
            return self.mpi.COMM_WORLD.allgather(obj)
        out = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj, root: int = 0):
        if self.size == 1:
            return obj
        if self._objects_over_mpi():
            return self.mpi.COMM_WORLD.bcast(obj, root=root)
        box = [obj]
        dist.broadcast_object_list(box, src=root, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (after an error on this one)."""
        if self.mpi is not None and self.size > 1:
            self.mpi.COMM_WORLD.Abort(code)
        os._exit(code)


#: dtypes :meth:`Comm.all_reduce` reduces through MPI (numpy views of the tensor's memory)
_MPI_DTYPES = (torch.float64, torch.float32, torch.int64, torch.int32)


def _mpi_all_reduce(mpi, a: np.ndarray, op: str) -> None:
    """Reduce the 1-d array ``a`` over the world, in place, the same bits on every rank.

    A float max or min carries a NaN flag per value: MPI's MAX compares (``a > b ? a : b``),
    so a NaN on one rank would survive on some ranks and vanish on others (each rank combines
    in its own order), and ranks that disagree go separate ways. With the flags a NaN on any
    rank is a NaN on all (the skin check's and the health measure's readers test for it)."""
    mop = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN}[op]
    if op == "sum" or a.dtype.kind != "f":
        mpi.COMM_WORLD.Allreduce(mpi.IN_PLACE, a, op=mop)
        return
    n, nan = a.size, np.isnan(a)
    big = -np.inf if op == "max" else np.inf          # loses to every value, never wins
    buf = np.concatenate([np.where(nan, big, a), nan.astype(a.dtype) * (1 if op == "max" else -1)])
    mpi.COMM_WORLD.Allreduce(mpi.IN_PLACE, buf, op=mop)
    a[:] = buf[:n]
    a[buf[n:] != 0] = np.nan


@functools.cache
def _large_messages(mpi) -> bool:
    """Whether mpi4py can send pickles over 2 GiB: mpi4py 4 on an MPI-4 library (large
    counts). Older pairs cap a message at 2**31 bytes; there torch's collectives are used."""
    import mpi4py

    return int(mpi4py.__version__.split(".")[0]) >= 4 and mpi.Get_version()[0] >= 4


def _host_address() -> str:
    for var in ("SHARDMD_MASTER_ADDR", "MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    host = socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_comm(device: str = "cpu", timeout_s: float = 120.0) -> Comm:
    """The job's :class:`Comm`: a single-rank one without a launcher, else from MPI."""
    if not under_launcher():
        return Comm(device=_pick_device(device, 0))
    if under_torchrun():
        return _init_torchrun(device, timeout_s)
    for path in remove_stale_segments():   # a requeued SLURM job's killed earlier start
        print(f"shardmd: removed {path}, left by a killed earlier start of this SLURM job step "
              "(MPI would have failed to start on it)", file=sys.stderr, flush=True)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    watch_segments(local, local_rank)   # MPI's /dev/shm segment goes after any end (shm_janitor.py)
    local.Free()
    dev = _pick_device(device, local_rank)
    if size == 1:
        return Comm(device=dev, mpi=MPI)
    staged = False
    backend = "gloo"
    if dev.type == "cuda":
        n_gpu = torch.cuda.device_count()
        if local_size <= n_gpu:
            backend = "nccl"
        else:
            staged = True  # more ranks than GPUs on this node: gloo through host memory
    timeout = timedelta(seconds=timeout_s)
    # Rank 0 binds the rendezvous store itself before announcing the port: no other process
    # can take the port in between (a free-port probe followed by a later bind can race).
    store = None
    if rank == 0:
        addr = _host_address()
        for _ in range(20):
            port = _free_port()
            try:
                store = dist.TCPStore(addr, port, size, is_master=True, timeout=timeout, wait_for_workers=False)
                break
            except (RuntimeError, OSError):
                continue
        else:
            addr = port = None
        world.bcast((addr, port), root=0)
    else:
        addr, port = world.bcast(None, root=0)
    if port is None:
        raise RuntimeError("could not open a rendezvous port on rank 0")
    if store is None:
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=timeout)
    if backend == "nccl":
        torch.cuda.set_device(dev)
    _before_first_group()
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size, timeout=timeout)
    _STORES.append(store)  # outlives the process group (see shutdown)
    return Comm(rank=rank, size=size, local_rank=local_rank, device=dev, backend=backend,
                staged=staged, group=dist.group.WORLD, mpi=MPI,
                host_over_mpi=_host_over_mpi(local_size))


_WAITING: list = [None]


@contextlib.contextmanager
def mpi_wait():
    """Marks the main thread as blocked in an MPI call of the step loop (:func:`mpi_waiting_since`).

    A rank waiting in MPI does not see its partner die (a gloo call's connection breaks; an
    MPI wait on a killed peer can last for ever under srun): the launcher's heartbeat thread
    reads this mark and ends the job when a peer's process ended during such a wait."""
    _WAITING[0] = time.monotonic()
    try:
        yield
    finally:
        _WAITING[0] = None


def mpi_waiting_since() -> float | None:
    """Monotonic time at which the current :func:`mpi_wait` began; None when not waiting."""
    return _WAITING[0]


def _reduce_over_mpi(mpi, t: torch.Tensor, op: str) -> torch.Tensor:
    """:meth:`Comm.all_reduce` through MPI (a new tensor on ``t``'s device). Never traced:
    domain/shard_tensor.guard_for_compile makes it a graph break (its numpy view of the buffer
    would be traced as a copy, MPI writing elsewhere)."""
    x = t.detach().to("cpu", copy=True).contiguous()
    with mpi_wait():
        _mpi_all_reduce(mpi, x.view(-1).numpy(), op)
    return x.to(t.device)


def _host_over_mpi(local_size: int) -> bool:
    """Whether host traffic takes MPI (:attr:`Comm.host_over_mpi`): ``SHARDMD_HOST_OVER_MPI``
    ``1`` always, ``0`` never, unset or ``auto`` where every rank on this node can have a core:
    MPI waits by polling, and with more ranks than cores the pollers take the cores the ranks
    they wait for need (8 ranks on 2 cores spent half the machine in the kernel, yielding),
    where gloo's waits sleep. A rank bound to one core (srun, mpirun --bind-to core) counts
    the node's. Any other value is off."""
    asked = os.environ.get("SHARDMD_HOST_OVER_MPI", "auto")
    if asked != "auto":
        return asked == "1"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return local_size <= usable or (usable == 1 and local_size <= (os.cpu_count() or 1))


def _before_first_group() -> None:
    """Import ``torch.distributed.nn.functional`` while no group exists.

    Its functions take ``group=group.WORLD`` as a default argument, evaluated at import: imported
    after the group is made (torch._dynamo imports it, and mace-torch/e3nn import torch._dynamo),
    ten function defaults hold the group for the life of the process, so ``shutdown`` can never
    free it and gloo's worker threads outlive it. Imported first, the defaults are ``None``.
    (Found with a profile hook on the group's reference count; ~16 ms.)"""
    import torch.distributed.nn.functional  # noqa: F401


def _init_torchrun(device: str, timeout_s: float) -> Comm:
    """The group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT);
    objects travel through torch's collectives (no MPI here)."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    dev = _pick_device(device, local_rank)
    if size == 1:
        return Comm(device=dev)
    backend, staged = "gloo", False
    if dev.type == "cuda":
        if local_size <= torch.cuda.device_count():
            backend = "nccl"
            torch.cuda.set_device(dev)
        else:
            staged = True
    if not dist.is_initialized():
        _before_first_group()
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
    return Comm(rank=rank, size=size, local_rank=local_rank, device=dev, backend=backend, staged=staged,
                group=dist.group.WORLD)


def _pick_device(device: str, local_rank: int) -> torch.device:
    d = torch.device(device)
    if d.type != "cuda":
        return d
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device}: CUDA is not available on this machine; use device=cpu")
    if d.index is not None:
        return d
    return torch.device("cuda", local_rank % torch.cuda.device_count())


_STORES: list = []


def shutdown(comm: Comm) -> None:
    """Tear the group down in step: every rank finishes its traffic (barrier) before the
    group goes; the rendezvous store object lives until the process exits.

    ``comm.group`` is dropped too: gloo's worker threads are joined only when the group object
    is freed, and ``destroy_process_group`` alone leaves ours referenced here. A worker still
    alive at interpreter shutdown may release a tensor's Python object then; Python ends that
    thread and the C++ runtime aborts the process ("terminate called without an active
    exception"; how it was found: docs/design.md, "Ending the process group")."""
    if comm.size > 1 and dist.is_initialized():
        dist.barrier(group=comm.group)
        dist.destroy_process_group()
    comm.group = None
    # a reference to the group inside a reference cycle (a frame of a finished traceback, a
    # closure) would keep its workers alive until some later collection: collect now
    import gc

    gc.collect()
