"""Which launcher started this process, read from its environment, and which variables are strays.

A launcher is believed only when its variables form a consistent whole, one that MPI (or torch's
rendezvous) can actually wire ranks from:

- **MPI through PMI** (MPICH's hydra ``mpiexec``, ``srun --mpi=pmi2``, MVAPICH): a rank and a
  size (``PMI_RANK``/``PMI_SIZE``, ``MV2_COMM_WORLD_RANK``/``..._SIZE``) and the process
  manager's wiring, ``PMI_FD`` (an open descriptor) or ``PMI_PORT``;
- **MPI through PMIx** (Open MPI's ``mpirun``, ``srun --mpi=pmix``): ``PMIX_RANK`` or
  ``OMPI_COMM_WORLD_RANK``/``..._SIZE`` and the server's address, ``PMIX_SERVER_URI*`` (or
  Open MPI 4's ``OMPI_MCA_orte_hnp_uri``);
- **torchrun**: ``TORCHELASTIC_RUN_ID``, or all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  MASTER_PORT;
- **a SLURM step without MPI wiring** (``srun --mpi=none`` with several tasks: each task would
  run the whole job alone, on one output): ``SLURM_JOB_ID``, ``SLURM_STEP_ID`` and
  ``SLURM_PROCID``/``SLURM_NTASKS`` > 1. Refused, naming the variables.

Anything else (``SLURM_PROCID`` exported by hand or left from a batch script outside any
``srun`` step, ``PMI_RANK`` without ``PMI_FD``, ``OMPI_*`` copied from another shell, an MPI
module's ``I_MPI_HYDRA_HOST_FILE``) is a stray: a plain run ignores it, with one warning naming
it. No MPI is needed to decide; the answer depends on the environment only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

#: what torchrun (torch.distributed.run) sets in every worker it starts
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: rank and size variables of each MPI family (rank, size)
PMI_PAIRS = (("PMI_RANK", "PMI_SIZE"), ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))
PMIX_PAIRS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))
SLURM_PAIR = ("SLURM_PROCID", "SLURM_NTASKS")
#: every variable some launcher sets that, alone, made earlier versions believe in one
LAUNCHER_HINTS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


@dataclass(frozen=True)
class Launcher:
    """What the environment says. kind: "mpi", "torchrun", "slurm-no-mpi" (refused) or None
    (a plain process); rank, size: this process's place (0, 1 for a plain one); stray: the
    launcher variables that were ignored, as NAME=value; refusal: why a run cannot go on."""

    kind: str | None = None
    rank: int = 0
    size: int = 1
    stray: tuple[str, ...] = ()
    refusal: str | None = None
    found: tuple[str, ...] = field(default=())

    @property
    def active(self) -> bool:
        return self.kind is not None

    def warning(self) -> str | None:
        """One line naming the ignored variables and what is missing (None when there are none)."""
        if not self.stray:
            return None
        names = " ".join(self.stray)
        missing = []
        if "PMI_" in names or "MV2_" in names or "MPI_LOCALNRANKS" in names:
            missing.append("no PMI_FD or PMI_PORT from an MPI launcher")
        if "OMPI_" in names or "PMIX_" in names:
            missing.append("no PMIX_SERVER_URI from mpirun")
        if "SLURM_" in names:
            missing.append("not inside an srun step (SLURM_JOB_ID and SLURM_STEP_ID are not both set)")
        return (f"ignoring {', '.join(self.stray)}: {'; '.join(missing)}; this is a plain run, not one rank of "
                "a launcher's job (domains=N starts its own ranks); unset these variables to silence this warning")


def _int(env, name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _pair(env, rank_var: str, size_var: str) -> tuple[int, int] | None:
    rank, size = _int(env, rank_var), _int(env, size_var)
    if rank is None or size is None or size < 1 or not 0 <= rank < size:
        return None
    return rank, size


def _fd_open(value: str | None) -> bool:
    try:
        os.fstat(int(value))
        return True
    except (TypeError, ValueError, OSError):
        return False


def _shown(env, names) -> tuple[str, ...]:
    return tuple(f"{n}={env[n]}" for n in names if n in env)


def torchrun(env=os.environ) -> bool:
    """True in a worker started by torchrun (its rendezvous, no MPI)."""
    return "TORCHELASTIC_RUN_ID" in env or all(v in env for v in TORCHRUN_ENV)


def detect(env=os.environ) -> Launcher:
    """The launcher this environment shows (module docstring), and the strays beside it."""
    hints = _shown(env, LAUNCHER_HINTS)
    pmi_wired = _fd_open(env.get("PMI_FD")) or bool(env.get("PMI_PORT"))
    pmix_wired = any(k.startswith("PMIX_SERVER_URI") for k in env) or "OMPI_MCA_orte_hnp_uri" in env
    for wired, pairs in ((pmi_wired, PMI_PAIRS), (pmix_wired, PMIX_PAIRS)):
        for rank_var, size_var in pairs:
            got = _pair(env, rank_var, size_var) if wired else None
            if got is not None:
                return Launcher("mpi", *got, found=_shown(env, (rank_var, size_var)))
    if pmix_wired and _int(env, "PMIX_RANK") is not None:
        # srun --mpi=pmix: a rank and the server; the size is the step's task count
        rank, size = _int(env, "PMIX_RANK"), _int(env, "SLURM_NTASKS") or 1
        return Launcher("mpi", rank, max(size, rank + 1), found=_shown(env, ("PMIX_RANK", "SLURM_NTASKS")))
    if torchrun(env):   # MPI variables beside it are not read (torch's rendezvous is used)
        return Launcher("torchrun", _int(env, "RANK") or 0, _int(env, "WORLD_SIZE") or 1,
                        found=_shown(env, ("RANK", "WORLD_SIZE")))
    slurm = _pair(env, *SLURM_PAIR)
    step = env.get("SLURM_JOB_ID") and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"))
    if slurm is not None and slurm[1] > 1 and step:
        job = f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID') or env.get('SLURM_STEPID')}"
        return Launcher("slurm-no-mpi", *slurm, found=_shown(env, SLURM_PAIR), refusal=(
            f"this process is task {slurm[0]} of {slurm[1]} of SLURM step {job} "
            f"(SLURM_PROCID={slurm[0]}, SLURM_NTASKS={slurm[1]}) but srun gave it no MPI wiring (no PMI_FD, "
            "PMI_PORT or PMIX_SERVER_URI): every task would run the whole job alone; start it with "
            "srun --mpi=pmi2 (or pmix), or with one task (srun -n 1) and domains=N"))
    if (_int(env, "SLURM_NTASKS") or 1) <= 1:   # a batch script's or a 1-task step's: says no more ranks
        hints = tuple(h for h in hints if not h.startswith("SLURM_"))
    return Launcher(None, stray=hints)

