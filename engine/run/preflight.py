"""Checks that run before any rank starts: outputs that can be written, a domain count that
fits the system and this machine.

The self-launching process runs them before it starts ``domains`` local ranks, so a bad
request costs a second, not ``domains`` Python processes; ranks started by a launcher run
them too (each rank alike, so the error is printed once). Every failure is one line.
"""
from __future__ import annotations

import os
from pathlib import Path

from shardmd.engine.errors import UserError

#: local ranks the engine starts itself: at most this many per core ...
RANKS_PER_CORE = 8
#: ... and one per this much available memory (a CPU rank with torch and Warp loaded: ~280 MB)
RANK_BYTES = 300 * 2**20


def output_paths(output: str | os.PathLike) -> dict[str, Path]:
    """The files a run writes: the trajectory, the log beside it and the checkpoint folder."""
    from shardmd.engine.io.checkpoint import checkpoint_dir

    out = Path(output)
    return {"output": out, "log": out.with_suffix(".log"), "checkpoint folder": checkpoint_dir(out)}


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _identity(p: Path) -> tuple[Path, tuple[int, int] | None]:
    """(the path with every symbolic link resolved, (st_dev, st_ino) if it exists)."""
    try:
        st = os.stat(p)
        key = (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        key = None
    try:
        return p.resolve(), key
    except (OSError, RuntimeError):   # a loop of links: its absolute path still compares
        return p.absolute(), key


def _same(a: tuple, b: tuple) -> str | None:
    """How two identities are one file: '' (one path), 'by a link' (one inode), or None."""
    if a[0] == b[0]:
        return ""
    if a[1] is not None and a[1] == b[1]:
        return " (the same file by a link)"
    return None


def check_outputs(cfg, structure: str | os.PathLike | None = None) -> None:
    """Trajectory, log and checkpoint folder (and ``structure``, the relaxed structure of
    ``minimize``): distinct, of the right kind, writable, and none of them an input (the
    structure file or the checkpoint restarted from), by resolved path and by inode (symbolic
    and hard links)."""
    from shardmd.engine.io.output_lock import lock_path

    paths = output_paths(cfg.output)
    if structure is not None:
        paths["relaxed structure (minimize.structure)"] = Path(structure)
    paths["output lock"] = lock_path(cfg.output)
    seen: list[tuple[str, Path, tuple]] = []
    for what, p in paths.items():
        ident = _identity(p)
        for other, _q, oid in seen:
            how = _same(ident, oid)
            if how is not None:
                fix = ("give minimize.structure= another name" if "structure" in what + other
                       else "give output= a name ending in .h5, e.g. output=run.h5")
                raise UserError(f"output={cfg.output!r}: the {what} would be the same path as the {other} "
                                f"({p}{how}); {fix}")
        seen.append((what, p, ident))
    _check_inputs(cfg, seen)
    _check_kinds(cfg, paths)


def _check_inputs(cfg, outputs: list[tuple[str, Path, tuple]]) -> None:
    """No input (system.file, restart.file) is one of ``outputs`` (what, path, identity)."""
    inputs = []
    if cfg.system.get("file"):
        inputs.append(("system.file", cfg.system.file, "structure"))
    if cfg.restart.file and cfg.restart.file != "auto":
        inputs.append(("restart.file", cfg.restart.file, "checkpoint"))
    for key, given, kind in inputs:
        ident = _identity(Path(given))
        for what, p, oid in outputs:
            how = _same(ident, oid)
            if how is None:
                continue
            fix = ("give minimize.structure= another name (e.g. relaxed.extxyz)" if "structure" in what
                   else "give another output= (or copy the file)")
            raise UserError(f"{key}={given!r} is also this run's {what} ({str(p)!r}{how}): the run would "
                            f"overwrite the {kind} it starts from; {fix}")


def _check_kinds(cfg, paths: dict[str, Path]) -> None:
    out, log, ckpt = paths["output"], paths["log"], paths["checkpoint folder"]
    for what, p in (("output", out), ("log", log)):
        if p.is_dir():
            raise UserError(f"output={cfg.output!r}: the {what} {str(p)!r} is a directory; give a file name, "
                            f"e.g. output={p / 'run.h5'}")
    if ckpt.exists() and not ckpt.is_dir():
        raise UserError(f"output={cfg.output!r}: the checkpoint folder {str(ckpt)!r} exists and is not a folder; "
                        "move it away or choose another output=")
    base = _nearest_existing(out.parent)
    if not base.is_dir():
        raise UserError(f"output={cfg.output!r}: {str(base)!r} is a file, not a folder; choose another output=")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"output={cfg.output!r}: cannot write in {str(base)!r} (read-only or no permission); "
                        "choose an output= in a folder you can write")


def model_cutoff(cfg) -> float:
    """The model's cutoff (Å) as the ranks will see it; Lennard-Jones without loading Warp."""
    from shardmd.engine.config.compose import to_container

    m = to_container(cfg.model)
    if m["name"] == "lj":
        return float(m["cutoff"])
    import torch

    from shardmd.models import build_model

    try:
        from shardmd.engine.config import guard as config_guard

        return float(build_model(m, torch.float64, "cpu", allow_imports=config_guard.allowed()).cutoff)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise UserError(str(exc)) from None


def local_rank_ceiling() -> tuple[int, str]:
    """Most local ranks this machine should run, and why (cores and available memory)."""
    cores = os.cpu_count() or 1
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    by_cores = RANKS_PER_CORE * cores
    if avail is None:
        return by_cores, f"{RANKS_PER_CORE} per core on {cores} cores"
    by_mem = max(1, avail // RANK_BYTES)
    return min(by_cores, by_mem), (f"{RANKS_PER_CORE} per core on {cores} cores and one per "
                                   f"{RANK_BYTES // 2**20} MiB of the {avail / 2**30:.1f} GiB available")


def check_domains(cfg, local: bool) -> None:
    """The domain count fits the system (as the ranks will decide) and, for ranks the engine
    starts itself (``local``), this machine."""
    n = int(cfg.domains)
    if n <= 1:
        return
    local_only = bool(cfg.restart.file)   # a restart's system is the checkpoint's: the ranks check it
    if local:
        most, why = local_rank_ceiling()
        if n > most:
            raise UserError(f"domains={n} would start {n} local ranks, more than this machine runs well "
                            f"(at most {most}: {why}); use fewer domains, or start the job under "
                            "mpirun/srun across nodes")
    if local_only:
        return
    import torch

    from shardmd.domain.decomposition import DecompositionError, choose_grid
    from shardmd.engine.run.system import build_atoms

    atoms = build_atoms(cfg.system)
    if n > len(atoms):
        raise UserError(f"domains={n} is more than the system's {len(atoms)} atoms; use fewer domains")
    width = model_cutoff(cfg) + float(cfg.neighbor.skin)
    try:
        choose_grid(n, torch.as_tensor(atoms.cell.array, dtype=torch.float64), list(atoms.pbc), width,
                    shape=None if cfg.grid is None else [int(g) for g in cfg.grid])
    except DecompositionError as exc:
        raise UserError(str(exc)) from None
