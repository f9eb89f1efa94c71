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


def refuse_earlier_log(log: Path, resume: bool, overwrite: bool) -> None:
    """A protocol's or many-system run's log replaces an earlier run's only with overwrite=true
    (restart=auto appends to it)."""
    if not resume and not overwrite and log.exists():
        raise UserError(f"{str(log)!r} exists (an earlier run's log); add overwrite=true to replace it, or give "
                        "another output=")


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


#: suffixes of other formats than the trajectory's (H5MD): refused as ``output`` by name
OTHER_FORMATS = {".pdb": "PDB", ".xyz": "XYZ", ".extxyz": "extended XYZ", ".xtc": "XTC", ".dcd": "DCD",
                 ".lammpstrj": "a LAMMPS dump", ".dump": "a LAMMPS dump", ".data": "LAMMPS data", ".cif": "CIF",
                 ".traj": "an ASE trajectory", ".nc": "NetCDF", ".gro": "GROMACS .gro", ".trr": "TRR",
                 ".vasp": "POSCAR", ".json": "JSON", ".csv": "CSV"}


def check_outputs(cfg, structure: str | os.PathLike | None = None) -> None:
    """Trajectory, log and checkpoint folder (and ``structure``, the relaxed structure of
    ``minimize``): distinct, of the right kind, writable, and none of them an input (the
    structure file or the checkpoint restarted from), by resolved path and by inode (symbolic
    and hard links)."""
    from shardmd.engine.io.output_lock import lock_path
    from shardmd.engine.io.safe_io import name_problem

    for key, value in (("output", cfg.output), ("minimize.structure", structure)):
        bad = None if value is None else name_problem(lock_path(value) if key == "output" else value)
        if bad:
            raise UserError(f"{key}={str(value)[:40]!r}...: {bad}")
    kind = Path(str(cfg.output)).suffix.lower()
    if kind in OTHER_FORMATS:   # the trajectory is always HDF5: a .pdb or .xyz would be HDF5 by that name
        stem = Path(str(cfg.output)).with_suffix(".h5").name
        raise UserError(f"output={cfg.output!r}: the trajectory is H5MD (HDF5), not {OTHER_FORMATS[kind]}; give "
                        f"output={stem} and convert it (`python -m engine convert {stem} <file>`, or ase.io.read)")
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
            if key == "restart.file" and what == "output" and not how:   # the trajectory given as checkpoint
                raise UserError(f"restart.file={given!r} is this run's output, an H5MD trajectory, not a "
                                f"checkpoint; give one of {str(checkpoint_dir_of(cfg))!r}/step-*.h5, or restart=auto")
            fix = ("give minimize.structure= another name (e.g. relaxed.extxyz)" if "structure" in what
                   else "give another output= (or copy the file)")
            raise UserError(f"{key}={given!r} is also this run's {what} ({str(p)!r}{how}): the run would "
                            f"overwrite the {kind} it starts from; {fix}")


def checkpoint_dir_of(cfg) -> Path:
    return output_paths(cfg.output)["checkpoint folder"]


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
        from shardmd.engine.config.terms import with_term_defaults

        return float(build_model(with_term_defaults(m), torch.float64, "cpu",
                                 allow_imports=config_guard.allowed()).cutoff)
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
    if int(cfg.get("subdomains", 1)) != 1:   # before any rank starts (engine/run/stages.py says it too)
        raise UserError(f"subdomains={int(cfg.subdomains)} with domains={n}: parts run on one domain per process "
                        "for now; use domains=1 with subdomains, or domains without subdomains")
    local_only = bool(cfg.restart.file)   # a restart's system is the checkpoint's: the ranks check it
    if local:
        most, why = local_rank_ceiling()
        if n > most:
            raise UserError(f"domains={n} would start {n} local ranks, more than this machine runs well "
                            f"(at most {most}: {why}); use fewer domains, or start the job under "
                            "mpirun/srun across nodes")
    if local_only:
        return
    from shardmd.domain.grid_shape import DecompositionError, grid_shape, perpendicular_widths_of
    from shardmd.engine.run.builders import build_atoms

    check_builder(cfg, local_ranks=n)   # every rank builds the system: before this process does
    atoms = build_atoms(cfg.system, int(cfg.seed))
    if n > len(atoms):
        raise UserError(f"domains={n} is more than the system's {len(atoms)} atoms; use fewer domains")
    cutoff = model_cutoff(cfg)
    width = cutoff + float(cfg.neighbor.skin)
    try:
        # torch-free (domain/grid_shape.py): this process only launches the ranks
        grid_shape(n, perpendicular_widths_of(atoms.cell.array), list(atoms.pbc), width,
                   shape=None if cfg.grid is None else [int(g) for g in cfg.grid])
    except DecompositionError as exc:   # the ghost width is the model's cutoff plus the skin: name the keys
        raise UserError(f"{exc}; or a shorter model.cutoff (the ghost width is model.cutoff {cutoff:g} Å + "
                        f"neighbor.skin {float(cfg.neighbor.skin):g} Å)") from None


# -- sizes: refused before anything large is allocated --------------------------------------------
#: bytes per atom besides its edges: state arrays, their gathered and checkpoint copies, the
#: structure as ASE holds it (measured: ~1.3 kB/atom for a 32,000-atom LJ run, edges included)
ATOM_BYTES = 1024
#: bytes per neighbour-list edge (the list radius, cutoff + skin): the list itself (indices and
#: shifts 16 B, packed words 8 B), and for learned models their per-edge activations
#: (docs/benchmarks.md, "Capacity": the shipped MACE model ~117-134 kB/atom at ~78 list edges
#: per atom); a model may say its own with an attribute ``bytes_per_edge``
EDGE_BYTES = {"lj": 24, "mace": 1600}
LEARNED_EDGE_BYTES = 1600
GIB = 2**30
#: atoms per Å^3 far above any real material (solids ~0.02-0.2): only above it does the density
#: alone refuse a start (the close-contact search would need ~density x list volume pairs per atom)
MAX_DENSITY = 1.0


def builder_count(system_cfg) -> int | None:
    """Atoms the builder would make (None for ``system.file``): no allocation."""
    from shardmd.engine.run import builders

    if system_cfg.get("file"):
        return None
    if system_cfg["lattice"] == "random":
        return builders.check_packing(system_cfg)
    n = builders.crystal_sites(system_cfg)
    return n - builders.vacancy_count(system_cfg.get("vacancies"), n)


def _builder_keys(system_cfg) -> str:
    """The keys that set the builder's size, as the user gives them."""
    if system_cfg["lattice"] == "random":
        return ", ".join(f"system.{k}={system_cfg[k]}" for k in ("count", "density", "box")
                         if system_cfg.get(k) is not None).replace(" ", "").replace(",system", ", system")
    return "system.repeat=[" + ",".join(str(int(r)) for r in system_cfg["repeat"]) + "]"


def _process_headroom() -> int | None:
    """Bytes this process may still map under RLIMIT_AS (a cap: ulimit -v, prlimit), None: no cap."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        vm = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/self/status").read_text().splitlines()
                  if ln.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        vm = 0
    return max(0, soft - vm)


def memory_budget(cfg, device=None, local_ranks: int = 1) -> tuple[int, str] | None:
    """Bytes one rank may use and where the figure comes from; None when unknown."""
    if float(cfg.limits.memory_gb) > 0:
        return int(float(cfg.limits.memory_gb) * GIB), f"limits.memory_gb={cfg.limits.memory_gb:g}"
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
        return int(free), f"{free / GIB:.1f} GiB free on {device}"
    _, avail = _available()
    if avail is None:
        return None
    share, why = avail // max(1, local_ranks), f"{avail / GIB:.1f} GiB available"
    if local_ranks > 1:
        why += f" / {local_ranks} local ranks"
    room = _process_headroom()
    if room is not None and room < share:
        share, why = room, f"{room / GIB:.1f} GiB left under this process's address-space limit"
    return int(share), why


def _available() -> tuple[int, int | None]:
    cores = os.cpu_count() or 1
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return cores, int(line.split()[1]) * 1024
    except OSError:
        pass
    return cores, None


def _fix() -> str:
    return ("use a smaller system or more domains (on more nodes), or set limits.memory_gb=<GiB> if the "
            "estimate is wrong for your model")


def check_builder(cfg, local_ranks: int = 1) -> None:
    """The builder's atom count against ``limits.max_atoms`` and memory, before it builds."""
    n = builder_count(cfg.system)
    if n is None:
        return
    what = _builder_keys(cfg.system)
    fix = "a smaller system.count or system.box" if cfg.system["lattice"] == "random" else "a smaller system.repeat"
    if n > int(cfg.limits.max_atoms):
        raise UserError(f"{what} builds {n:,} atoms, more than limits.max_atoms={int(cfg.limits.max_atoms):,}; use "
                        f"{fix}, or raise limits.max_atoms if you mean it")
    budget = memory_budget(cfg, local_ranks=local_ranks)
    if budget is not None and n * ATOM_BYTES > budget[0]:
        raise UserError(f"{what} builds {n:,} atoms, which need about {n * ATOM_BYTES / GIB:.1f} GiB per rank "
                        f"before any neighbour list ({budget[1]}); " + _fix())


def size_problem(cfg, n: int, cell, pbc, positions, cutoff: float, ranks: int, device=None,
                 model=None, local_ranks: int = 1, parts: dict | None = None) -> str | None:
    """Why a system cannot run (too many atoms, denser than ``health.min_distance`` allows, more
    memory than one rank has), or None.  cell: (3, 3) Å rows; pbc: 3 bools; positions: (n, 3) Å;
    cutoff: the list radius, Å (model cutoff + skin); parts: {"count": subdomains (0: as few as
    the memory needs, written back), "reach": Å, "alive": share of a part's activations alive at
    once, "atom_bytes": per atom kept besides} for a call made in parts."""
    import numpy as np

    cell, pbc = np.asarray(cell, dtype=np.float64), np.asarray(pbc, dtype=bool)
    if n > int(cfg.limits.max_atoms):
        return (f"the system has {n:,} atoms, more than limits.max_atoms={int(cfg.limits.max_atoms):,}; raise "
                "limits.max_atoms if you mean it")
    per = cell[pbc]
    if len(per) >= 2:
        # the periodic vectors' volume (area) against the product of their lengths: ~1e-3 and
        # below is a typing or unit error, and the list would need ~cutoff/width images
        gram = abs(float(np.linalg.det(per @ per.T))) ** 0.5
        ratio = gram / max(float(np.prod(np.linalg.norm(per, axis=1))), 1e-300)
        if ratio < 1e-3:
            return (f"the cell is nearly flat: its periodic vectors span {ratio:.1e} of the product of their "
                    f"lengths (vectors {np.round(per, 4).tolist()} Å); give a cell with independent vectors "
                    "(check the structure file's Lattice)")
    if pbc.all():
        volume = abs(float(np.linalg.det(cell)))
        flat = volume / max(float(np.prod(np.linalg.norm(cell, axis=1))), 1e-300)
    else:
        pos = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        extent = np.where(pbc, np.linalg.norm(cell, axis=1), np.ptp(pos, axis=0) + 1.0) if len(pos) else np.ones(3)
        volume, flat = float(np.prod(np.maximum(extent, 1.0))), 1.0
    density = n / max(volume, 1e-300)
    d = float(cfg.health.min_distance)
    if pbc.all() and d > 0 and density > max(2**0.5 / d**3, MAX_DENSITY):
        # atoms at least d apart are spheres of radius d/2 that do not overlap: at most the
        # densest packing (pi/sqrt(18) of the volume), i.e. sqrt(2)/d^3 atoms per Å^3.  Below
        # MAX_DENSITY the close-contact search (cheap there) names the closest pair instead
        shape = (f"; the cell is nearly flat (its volume is {flat:.1e} of the product of its vector lengths)"
                 if flat < 1e-2 else "")
        return (f"the system has {n:,} atoms in {volume:.4g} Å^3 ({density:.3g} atoms/Å^3{shape}): atoms "
                f"health.min_distance={d:g} Å apart fit at most {2**0.5 / d**3:.3g}/Å^3 (solids: about "
                "0.02-0.2), so some are closer than that; check the cell (its units, Å) and the positions")
    neighbours = density * 4.0 / 3.0 * np.pi * cutoff**3
    if not pbc.any():
        neighbours = min(neighbours, n - 1)
    per_edge = getattr(model, "bytes_per_edge", None) or EDGE_BYTES.get(str(cfg.model.name), LEARNED_EDGE_BYTES)
    atoms = n / max(1, ranks)
    need = atoms * (ATOM_BYTES + neighbours * float(per_edge))
    budget = memory_budget(cfg, device, local_ranks)
    if parts is not None:   # a call made in parts (subdomains): one part's activations at a time
        return _parts_problem(parts, n, cell, pbc, neighbours, float(per_edge), budget)
    if budget is not None and need > budget[0]:
        return (f"the run needs about {need / GIB:.3g} GiB per rank ({atoms:,.0f} atoms each, ~{neighbours:,.0f} "
                f"neighbours within {cutoff:g} Å at {density:.3g} atoms/Å^3, ~{per_edge} B per edge) and one rank "
                f"has {budget[0] / GIB:.3g} GiB ({budget[1]}); " + _fix()
                + ("; or subdomains=0 (the model evaluated in parts that fit)" if getattr(model, "counts_rows", False)
                   else ""))
    return None


#: bytes per list edge a call in parts keeps for the whole system (indices and shifts, packed)
LIST_EDGE_BYTES = 24
#: the measured peaks of calls in parts over this sum (one H200, the shipped model layer by layer in
#: 27 parts: 62.0 GiB against 57.7 at 10.1 M atoms, 100.8 against 92.6 at 16.4 M; docs/benchmarks.md)
PARTS_MARGIN = 1.10


def _parts_problem(parts: dict, n: int, cell, pbc, neighbours: float, per_edge: float, budget) -> str | None:
    """The memory of a call in ``parts["count"]`` parts: the whole system's atoms and list plus
    one part's activations (its atoms grown by the reach on each side of a split or periodic
    axis). Count 0: the fewest parts that fit, written back; None: fits (or no budget known)."""
    from shardmd.domain.grid_shape import DecompositionError, grid_shape, max_domains_of, perpendicular_widths_of

    widths, reach = perpendicular_widths_of(cell), float(parts["reach"])
    whole = n * (ATOM_BYTES + float(parts.get("atom_bytes", 0)) + neighbours * LIST_EDGE_BYTES)
    alive = float(parts.get("alive", 1.0))   # the share of a part's activations alive at once

    def need(count: int) -> float | None:
        if count == 1:   # one piece: the call as it is without parts
            return n * (ATOM_BYTES + neighbours * per_edge)
        try:
            g = grid_shape(count, widths, list(pbc), reach)
        except DecompositionError:
            return None
        grow = 1.0
        for k in range(3):
            if g[k] > 1 or pbc[k]:
                grow *= (widths[k] / g[k] + 2 * reach) / (widths[k] / g[k])
        return PARTS_MARGIN * (whole + min(n, n / count * grow) * neighbours * per_edge * alive)

    most = max_domains_of(widths, reach, 4096)
    fits = [c for c in range(1, most + 1) if need(c) is not None and (budget is None or need(c) <= budget[0])]
    asked = int(parts["count"])
    if asked == 0:
        if fits:
            parts["count"] = fits[0]
            return None
        least = min(need(c) for c in range(1, most + 1) if need(c) is not None)
        return (f"subdomains=0 (auto): no part count fits {budget[0] / GIB:.3g} GiB ({budget[1]}): the fewest "
                f"bytes are ~{least / GIB:.3g} GiB (the system's atoms and list ~{whole / GIB:.3g} GiB, at most "
                f"subdomains={most} parts as wide as the reach {reach:g} Å); give limits.memory_gb >= "
                f"{least / GIB:.3g} if the device has it, or use more domains")
    got = need(asked)
    if budget is None or got is None or got <= budget[0]:
        return None   # a count too many for the reach is refused by name (domain/subdomains.py's part_grid)
    fix = (f"use subdomains={fits[0]} (or subdomains=0 to choose)" if fits else
           f"no count fits: the least is ~{min(need(c) for c in range(1, most + 1) if need(c)) / GIB:.3g} GiB; "
           "use more domains")
    return (f"subdomains={asked} needs about {got / GIB:.3g} GiB (one part's activations and the whole system's "
            f"atoms and list) and one rank has {budget[0] / GIB:.3g} GiB ({budget[1]}); {fix}")


def local_ranks(size: int) -> int:
    """Ranks of this job on this host: all of them when the engine started them itself, else what
    the launcher says (MPICH/Hydra, Open MPI, SLURM), else 1."""
    if size <= 1 or os.environ.get("SHARDMD_SELF_LAUNCHED"):
        return max(1, size)
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) >= 1:
            return int(v)
    return 1


def check_size(cfg, comm, state, cutoff: float, device=None, model=None, parts: dict | None = None) -> None:
    """:func:`size_problem` of the run's state, decided on rank 0 and raised on every rank
    (CollectiveError).  Collective."""
    from shardmd.engine.errors import CollectiveError

    problem = None
    if comm.is_root:
        problem = size_problem(cfg, int(state.n_atoms), state.cell.detach().cpu().numpy(),
                               state.pbc.cpu().numpy(), state.positions.detach().cpu().numpy(), cutoff,
                               comm.size, device, model, local_ranks(comm.size), parts)
    if comm.any(problem is not None):
        raise CollectiveError(problem or "the system is too large for this job (rank 0 says why)")
