"""The configuration schema: every key's type, default, help text and check, in one place.

Each key is one dataclass field made with :func:`key`.  Hydra composes from these dataclasses
(registered with its ConfigStore below), OmegaConf enforces their types, and
``engine/config/compose.py`` derives from them the key table (``KEYS``), ``--help``, the README's
table (tests/test_readme.py checks it) and the value checks.  Adding a key is adding a field.

Groups: ``model`` and ``integrator``, one dataclass per choice (engine/config/choices.py; the
checks and :func:`key` are in engine/config/checks.py); a choice may also change defaults
outside its own node (:data:`GROUP_DEFAULTS`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from shardmd.engine.config.checks import (
    AUTO,
    FLAG,
    SUM_TOLERANCE,
    TRAJECTORY_FIELDS,
    Check,
    _charges,
    _element,
    _existing_file,
    _fields,
    _is_int,
    _is_num,
    _text,
    _triple,
    key,
    number,
    one_of,
    parse_frames,
    whole,
)
from shardmd.engine.config.choices import INTEGRATORS, MODELS, OPEN_CHOICES  # noqa: F401


# -- the keys ---------------------------------------------------------------------------------
@dataclass
class Restart:
    file: Optional[str] = key(None, "checkpoint to continue from (restart=PATH is the same); auto: the newest "
                              "checkpoint beside output if any, else a fresh start",
                              _text("give a checkpoint path or auto", null=True))
    allow_changes: bool = key(False, "allow model, dt, integrator, temperature, seed or precision to differ "
                              "from the checkpoint", FLAG)


@dataclass
class Checkpoint:
    every: int = key(1000, "steps between restart checkpoints (0: only at the end and on signals)", whole(0))
    keep: int = key(3, "newest checkpoints kept in <output>.ckpt/", whole(1))


def _frames(v) -> bool:
    if v is None:
        return True
    try:
        parse_frames(v)
    except ValueError:
        return False
    return True


def _composition(v) -> bool | str:
    """null, or {element: fraction >= 0} with fractions summing to 1."""
    if v is None:
        return True
    if not hasattr(v, "items") or len(v) == 0:
        return False
    for el, f in v.items():
        if not _element(el):
            return f"unknown element {el!r}; give chemical symbols such as Cu, Au"
        if not _is_num(f) or f < 0:
            return f"the fraction of {el} is {f!r}; give fractions >= 0"
    total = sum(float(f) for f in v.values())
    return abs(total - 1.0) <= SUM_TOLERANCE or f"the fractions sum to {total:g}; give fractions that sum to 1"


def _vacancies(v) -> bool:
    return (_is_int(v) and v >= 0) or (isinstance(v, float) and 0 <= v < 1)


def _miller(v) -> bool | str:
    if v is None:
        return True
    if len(v) != 3 or not all(_is_int(i) for i in v):
        return False
    return any(v) or "[0,0,0] names no plane; give a Miller index such as [1,1,1]"


@dataclass
class System:
    file: Optional[str] = key(None, "any ASE-readable structure (extxyz, cif, POSCAR, ...); overrides the "
                              "builder", Check(_existing_file, "give a path"))
    index: int = key(-1, "frame of a multi-frame file", Check(_is_int, "give a frame number (-1: last)"))
    lattice: str = key("fcc", "builder lattice: fcc, bcc, sc, hcp or diamond; random: atoms (or system.molecule) "
                       "packed at random (docs/builders.md)", one_of("fcc", "bcc", "sc", "hcp", "diamond", "random"))
    element: str = key("Ar", "builder element", Check(_element, "give an element symbol such as Ar"))
    a: float = key(5.26, "builder lattice constant, Å", number("give a lattice constant > 0 in Å", gt=0))
    repeat: List[int] = key(help="builder repeats of the cubic cell (orthorhombic for hcp); a slab: "
                            "[a, b, layers] of its surface cell",
                            check=_triple(lambda r: _is_int(r) and r >= 1,
                                          "give three whole numbers >= 1, e.g. [10,10,10]"),
                            factory=lambda: [10, 10, 10])
    pbc: List[bool] = key(help="builder periodic axes (files keep their own)",
                          check=_triple(lambda p: isinstance(p, bool), "give three booleans, e.g. [true,true,false]"),
                          factory=lambda: [True, True, True])
    count: Optional[int] = key(None, "system.lattice=random: atoms (molecules with system.molecule) to pack; give "
                               "two of count, density and box", Check(lambda v: v is None or (_is_int(v) and v >= 1),
                                                                      "give a whole number >= 1"))
    density: Optional[float] = key(None, "system.lattice=random: mass density, g/cm^3 (a cubic box with count)",
                                   Check(lambda v: v is None or (_is_num(v) and v > 0), "give g/cm^3 > 0"))
    box: Optional[List[float]] = key(None, "system.lattice=random: box lengths [x,y,z], Å (orthorhombic)",
                                     _triple(lambda b: _is_num(b) and b > 0, "give three lengths > 0 in Å, e.g. "
                                             "[30,30,30]"))
    min_distance: float = key(2.0, "system.lattice=random: Å, the least distance between atoms of different "
                              "packed units", number("give a distance >= 0 in Å", ge=0))
    molecule: Optional[str] = key(None, "system.lattice=random: an ASE-readable molecule placed rigidly with "
                                  "random orientations (system.count copies)",
                                  Check(_existing_file, "give the path of a molecule file"))
    composition: Any = key(None, "builder species by fraction, e.g. {Cu: 0.75, Au: 0.25}: exact counts (largest "
                           "remainder) on seeded sites; null: system.element", Check(_composition, "give a map "
                                                                                      "element: fraction, e.g. "
                                                                                      "{Cu: 0.75, Au: 0.25}"))
    vacancies: Any = key(0, "builder sites removed at random (seeded): a count, or a fraction < 1 (e.g. 0.01)",
                         Check(_vacancies, "give a count of atoms (a whole number >= 0) or a fraction in [0, 1)"))
    miller: Optional[List[int]] = key(None, "a slab of the crystal with this surface (e.g. [1,1,1]; hcp: of the "
                                      "hexagonal cell); system.repeat is then [a, b, layers]",
                                      Check(_miller, "give three whole numbers, e.g. [1,1,1]"))
    # at 1e20 Å the atoms' float64 positions cannot tell neighbours apart (a silent nonsense
    # energy), at 1e300 the bins divide by zero: a vacuum beyond any use is refused
    vacuum: float = key(10.0, "Å of vacuum on each side of a slab (system.miller; 0: none)",
                        Check(lambda v: _is_num(v) and 0 <= v <= 1e4,
                              "give a distance in [0, 10000] Å (far out, positions lose their precision)"))
    fixed_layers: int = key(0, "lowest atomic planes of a slab (system.miller) held fixed (FixAtoms)", whole(0))
    seed: Optional[int] = key(None, "seeds the builder's random choices (packing, sites, vacancies); null: seed",
                              Check(lambda v: v is None or (_is_int(v) and 0 <= v < 2**63),
                                    "give a whole number from 0 to 2**63 - 1"))
    velocities: str = key("auto", "auto (the file's if it has them, else thermal), thermal, file, zero, or rescale "
                          "(the file's scaled to temperature)", one_of("auto", "thermal", "file", "zero", "rescale"))
    charges: Any = key(
        None, "per-atom charges (e) by element, e.g. {Na: 1.0, Cl: -1.0}, for a model that takes charges; "
        "or one per atom; null: the file's initial_charges (or charges) array",
        Check(_charges, "give finite numbers per element, e.g. {Na: 1.0, Cl: -1.0}, or one per atom"))
    charge: Optional[float] = key(None, "total charge (e) for a model that takes one; null: the file's charge "
                                  "(info), else 0", Check(lambda v: v is None or _is_num(v),
                                                          "give a finite number of elementary charges"))
    spin: Optional[float] = key(None, "spin multiplicity 2S+1 for a model that takes one; null: the file's spin "
                                "(info), else 1", Check(lambda v: v is None or (_is_num(v) and v >= 1),
                                                        "give a spin multiplicity >= 1 (1: singlet)"))
    frames: Optional[str] = key(None, "many systems in one run: every selected frame of system.file is its own "
                                "system (all, or START:STOP:STEP; docs/batch.md); null: one system, system.index",
                                Check(_frames, "give all or START:STOP:STEP, e.g. 0:100"))
    files: List[str] = key(help="many systems from several files: paths or glob patterns (e.g. 'cands/*.cif'), every "
                           "frame of each, in order (system.frames then selects among them all; docs/batch.md)",
                           check=Check(lambda v: all(isinstance(x, str) and x for x in v),
                                       "give a list of paths or patterns, e.g. ['cands/*.cif']"), factory=list)
    skip_bad: bool = key(False, "with system.frames or system.files: leave out a frame that cannot run (unknown "
                         "element, atoms closer than health.min_distance, NaN), listed in the summary, instead of "
                         "refusing the run", FLAG)


@dataclass
class Batch:
    size: Any = key("auto", "with system.frames or files and a model that evaluates many systems in one call "
                    "(mace): the most systems stepped together, the next frame taking a finished one's place; "
                    "auto: on CUDA as many as fill the free memory, 1 on the CPU, where one call per system is faster "
                    "(docs/batch.md)",
                    Check(lambda v: v == "auto" or (_is_int(v) and v >= 1), "give auto or a whole number >= 1"))


@dataclass
class Neighbor:
    skin: float = key(1.0, "Å added to the model cutoff for the Verlet list", number("give a skin >= 0 in Å", ge=0))
    every: int = key(1, "check the skin criterion every N steps", whole(1))
    check: bool = key(True, "false: rebuild every neighbor.every steps without checking", FLAG)
    sort: str = key("spatial", "atoms' memory order, set at every rebuild: spatial (by neighbour-grid bin, then "
                    "id: fast kernels), id, or none", one_of("spatial", "id", "none"))
    deferred: Any = key("auto", "read the skin check back only at scheduled steps, results as with a per-step "
                        "check (docs/design.md); auto: on CUDA", AUTO)
    deferred_max: int = key(50, "most steps between those read-backs", whole(1))
    pipelined: Any = key("auto", "post the deferred check's reads and settle them a step later (docs/design.md); "
                         "auto: on CUDA", AUTO)


@dataclass
class Health:
    max_step: float = key(1.0, "Å: an atom moving farther in one step (speed times dt), or any non-finite "
                          "value, stops the run with exit status 3", number("give a distance > 0 in Å", gt=0))
    min_distance: float = key(0.5, "Å: a start with two atoms closer than this is refused, naming them; 0 allows "
                              "close contacts", number("give a distance >= 0 in Å (0: no check)", ge=0))
    rank_silence: float = key(30.0, "s: a rank of a multi-rank run whose heartbeat is silent this long (stopped, "
                              "or its node down) ends every rank with exit status 5, naming it; 0: off",
                              number("give seconds >= 0 (0: off)", ge=0))


@dataclass
class Trajectory:
    every: int = key(100, "steps between frames (0: no trajectory file)", whole(0))
    fields: List[str] = key(help="per-atom fields in each frame",
                            check=Check(_fields, "give a list of position, image, velocity, force"),
                            factory=lambda: list(TRAJECTORY_FIELDS))
    precision: Optional[str] = key(None, "stored precision of positions, velocities, forces and the box: float32 "
                                   "or float64; null: the run's precision", one_of(None, "float32", "float64"))
    compression: str = key("none", "the file's datasets compressed: gzip (smallest), lzf (fastest) or none",
                           one_of("none", "gzip", "lzf"))
    keep_bits: Optional[int] = key(None, "lossy: mantissa bits kept of positions, velocities and forces (14: relative "
                                   "precision 3e-5, ~1e-3 Å at 50 Å; with gzip ~1.4x smaller again); null keeps all",
                                   Check(lambda v: v is None or (_is_int(v) and 1 <= v <= 52),
                                         "give a number of bits from 1 to 52, or null"))


def _modules(v) -> bool | str:
    from shardmd.engine.observables.modules import check_entry

    bad = next((b for b in map(check_entry, v or []) if b), None)
    return bad or (len(set(v)) == len(v) or "a module is named twice; give each once")


@dataclass
class Observables:
    modules: List[str] = key(help="modules of yours that register observables (module or module:function; "
                             "needs allow_code=true; docs/observables.md)",
                             check=Check(_modules, "give a list of module or module:function names"), factory=list)
    every: Optional[int] = key(None, "steps between rows of the trajectory's observables, besides every frame's "
                               "(null or 0: trajectory.every)", Check(lambda v: v is None or (_is_int(v) and v >= 0),
                                                                      "give a whole number of steps >= 0"))


def _columns(v) -> bool | str:
    from shardmd.engine.observables.columns import SPELLING

    bad = next((c for c in v if not (isinstance(c, str) and SPELLING.fullmatch(c.strip()))), None)
    return bad is None or f"{bad!r} is not a column name (e.g. temp, pe, density, temp@top, vcm[2])"


@dataclass
class Thermo:
    every: int = key(100, "steps between thermo lines (0: first and last only)", whole(0))
    progress: bool = key(True, "progress line with steps/s, ns/day and ETA", FLAG)
    columns: Optional[List[str]] = key(None, "thermo table columns, LAMMPS's names (step time temp pe ke etotal "
                                       "conserved press pxx..pyz vol density lx ly lz), any observable by name, "
                                       "per group as temp@<group>; null: Step Time Temp PotEng KinEng TotEng Press "
                                       "Volume", Check(_columns, "give a list of column names, e.g. [step,temp,pe]"))


def _groups(v) -> bool | str:
    from shardmd.engine.observables.groups import config_problem

    return config_problem(v)


def _id_list(v) -> bool | str:
    if v is None or not all(_is_int(x) and x >= 0 for x in v):
        return "give a list of atom ids >= 0 (0-based, the input's order), e.g. [0,1,2]"
    dup = sorted({x for x in v if list(v).count(x) > 1})
    return not dup or f"id {dup[0]} is given more than once; give each id once"


@dataclass
class Fix:
    ids: List[int] = key(help="ids (0-based, the input's order) of atoms held fixed, besides the input's ASE "
                         "FixAtoms (docs/minimize.md)",
                         check=Check(_id_list, "give a list of atom ids"), factory=list)
    group: Optional[str] = key(None, "a group (groups.<name>) whose atoms are held fixed too",
                               _text("give a group's name", null=True))


@dataclass
class Minimize:
    method: str = key("fire", "minimiser: fire (ASE's FIRE, step for step), lbfgs or bfgs (ASE's LBFGS / BFGS "
                      "driven by the engine's forces)", one_of("fire", "lbfgs", "bfgs",
                                                             fix="use fire, lbfgs or bfgs"))
    fmax: float = key(0.05, "eV/Å: `python -m engine minimize` stops when every atom's force is below this "
                      "(ASE's criterion)", number("give a force > 0 in eV/Å", gt=0))
    steps: int = key(1000, "most steps of `python -m engine minimize`", whole(0))
    maxstep: float = key(0.2, "Å: longest step (ASE's maxstep: FIRE of all atoms' displacement together, "
                         "L-BFGS / BFGS of the largest atom's)", number("give a distance > 0 in Å", gt=0))
    dt: float = key(0.1, "FIRE's initial time step (ASE's dt, ASE's time units)", number("give a dt > 0", gt=0))
    dtmax: float = key(1.0, "FIRE's largest time step (ASE's dtmax)", number("give a dtmax > 0", gt=0))
    memory: int = key(100, "L-BFGS: steps of history kept (ASE's memory; 2 x memory x 3N floats on rank 0)",
                      whole(1))
    alpha: float = key(70.0, "eV/Å^2: L-BFGS and BFGS initial Hessian (ASE's alpha)",
                       number("give a curvature > 0 in eV/Å^2", gt=0))
    structure: Optional[str] = key(None, "the relaxed structure (extxyz, or any ASE format by its suffix); null: "
                                   "output with the suffix .extxyz", _text("give a file name", null=True))
    cell: bool = key(False, "relax the cell too, as ASE's FrechetCellFilter (periodic cells; fmax applies to "
                     "the cell's rows too)", FLAG)
    pressure: float = key(0.0, "bar: target pressure of the cell relaxation (minimize.cell=true; ASE's "
                          "scalar_pressure; negative: tension)", number("give a pressure in bar"))
    symmetry: bool = key(False, "keep the space group: ASE's FixSymmetry (spglib; refines the structure to its "
                         "group first); lbfgs or bfgs, periodic cells, no fixed atoms", FLAG)
    symprec: float = key(0.01, "Å: spglib's tolerance finding the space group minimize.symmetry keeps",
                         number("give a tolerance > 0 in Å", gt=0))


@dataclass
class Limits:
    max_atoms: int = key(100_000_000, "most atoms a run accepts, checked before the system is built (raise it for "
                         "a larger system)", whole(1))
    memory_gb: float = key(0.0, "GiB one rank may use: a run whose estimate (atoms, neighbours within the list "
                           "radius, the model's bytes per edge) is larger is refused before it allocates; 0: the "
                           "memory available (the host's share per local rank, a GPU's free memory)",
                           number("give GiB >= 0 (0: what is available)", ge=0))


@dataclass
class ShardMD:
    """The run: top-level keys, sections, and the group choices (``model``, ``integrator``)."""

    # `_self_` first: a group choice may change the defaults below (GROUP_DEFAULTS)
    defaults: List[Any] = field(default_factory=lambda: [
        "_self_", {"integrator": "verlet"}, {"model": MISSING}, "shardmd_hydra"])
    model: Any = MISSING
    integrator: Any = MISSING
    domains: int = key(1, "spatial domains = MPI ranks; under mpirun the launcher's rank count", whole(1))
    grid: Optional[List[int]] = key(None, "domain grid [Px,Py,Pz] with product = domains; null: the least ghost "
                                    "volume", _triple(lambda g: _is_int(g) and g >= 1,
                                                      "give three whole numbers, e.g. [2,2,1]"))
    subdomains: int = key(1, "parts each domain's model call is made in, one after another (peak memory: one "
                          "part's activations plus the per-atom arrays; docs/design.md); 1: in one piece; 0: as "
                          "few as the memory (limits.memory_gb, else what is free) needs", whole(0))
    parts_by_layer: Any = key("auto", "with subdomains: the call made one message-passing layer at a time over the "
                              "parts, each with one cutoff + skin of halo (docs/design.md); auto: where the model "
                              "can (mace, sevennet); false: each part whole, with a halo of layers x (cutoff + "
                              "skin)", AUTO)
    steps: int = key(1000, "total step number to reach", whole(0))
    dt: float = key(1.0, "time step, fs", number("give a time step > 0 in fs", gt=0))
    temperature: float = key(100.0, "K: initial Maxwell-Boltzmann velocities and the Langevin target",
                             number("give kelvin >= 0", ge=0))
    seed: int = key(12345, "keys initial velocities, Langevin noise and the builder (system.seed: null)",
                    Check(lambda v: _is_int(v) and 0 <= v < 2**63, "give a whole number from 0 to 2**63 - 1"))
    precision: str = key("float64", "float64 or float32 (positions, velocities, forces)",
                         one_of("float32", "float64", fix="use float32 or float64"))
    device: str = key("cpu", "cpu, cuda or cuda:N",
                      Check(lambda v: re.fullmatch(r"cpu|cuda(:\d+)?", v) is not None, "use cpu, cuda or cuda:N"))
    malloc: str = key("system", "CPU runs: keep (glibc keeps the memory a step frees for the next: MACE 2.3x faster "
                      "at 4,000 atoms, ~1.8x the peak memory; docs/design.md) or system (its defaults)",
                      one_of("system", "keep"))
    threads: int = key(0, "torch CPU threads per rank; 0: 1 per rank under MPI, else OMP_NUM_THREADS, "
                          "SLURM_CPUS_PER_TASK or the cores this process may use less the busy ones (the log's "
                          "header says which)",
                       whole(0))
    output: str = key("run.h5", "H5MD trajectory; the log (.log) and checkpoints (.ckpt/) go beside it; a "
                      "relative path is inside the job's folder (hydra.run.dir, or the sweep's)",
                      _text("give a file name"))
    quiet: bool = key(False, "nothing on the terminal; the log keeps everything", FLAG)
    overwrite: bool = key(False, "a fresh run may replace an existing output file (else refused)", FLAG)
    restart: Restart = field(default_factory=Restart)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    system: System = field(default_factory=System)
    batch: Batch = field(default_factory=Batch)
    neighbor: Neighbor = field(default_factory=Neighbor)
    health: Health = field(default_factory=Health)
    groups: Dict[str, Any] = key(help="atom groups by species, ids or index file, e.g. groups.top={species: [Cu]}, "
                                 "{ids: '0-99,200'}, {file: idx.ndx} (thermo's temp@top, fix.group)",
                                 check=Check(_groups, "give {species: [...]}, {ids: ...} or {file: ...}"), factory=dict)
    trajectory: Trajectory = field(default_factory=Trajectory)
    thermo: Thermo = field(default_factory=Thermo)
    observables: Observables = field(default_factory=Observables)
    fix: Fix = field(default_factory=Fix)
    minimize: Minimize = field(default_factory=Minimize)
    limits: Limits = field(default_factory=Limits)
    stages: Optional[List[Any]] = key(None, "a protocol: stages run one after another, each a mapping of the keys it "
                                      "changes with name and kind (run or minimize), e.g. [{kind: minimize}, "
                                      "{integrator: nose-hoover, temperature: [300, 600], steps: 2000}] "
                                      "(docs/protocols.md)",
                                      Check(lambda v: v is None or (len(v) > 0 and all(hasattr(x, "items") for x in v)),
                                            "give a list of mappings, e.g. [{kind: minimize}, {steps: 1000}]"))


# -- group choices ----------------------------------------------------------------------------
GROUPS: dict[str, dict[str, type]] = {"model": MODELS, "integrator": INTEGRATORS}
#: what the group is for; each choice is described by its dataclass's docstring
GROUP_HELP = {"model": "the interatomic model", "integrator": "the equations of motion"}
#: defaults a choice changes outside its own node: model=mace runs fcc Cu (864 atoms, 300 K,
#: 20 steps), the system the shipped model was trained on
GROUP_DEFAULTS: dict[tuple[str, str], dict] = {
    ("model", "morse"): {"system": {"element": "Cu", "lattice": "fcc", "a": 3.66, "repeat": [5, 5, 5]},
                         "temperature": 300.0},
    ("model", "d3"): {"system": {"element": "Cu", "lattice": "fcc", "a": 3.61, "repeat": [4, 4, 4]},
                      "temperature": 300.0, "steps": 20, "thermo": {"every": 5}, "trajectory": {"every": 10}},
    ("model", "mace"): {"system": {"element": "Cu", "lattice": "fcc", "a": 3.59, "repeat": [6, 6, 6]},
                        "temperature": 300.0, "steps": 20, "thermo": {"every": 5}, "trajectory": {"every": 10}},
}
#: how Hydra runs a job: outputs where the user runs (hydra.run.dir=.), a sweep's jobs in
#: multirun/<date>/<time>/<job number>/ (multirun/<SLURM array job id>/<task id>/ in a SLURM
#: array), no .hydra/ folder (the log echoes the config; the trajectory stores it), no logging set-up
HYDRA_SETTINGS = {
    "defaults": [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}],
    "hydra": {"run": {"dir": "."},
              "sweep": {"dir": "multirun/${oc.env:SLURM_ARRAY_JOB_ID,${now:%Y-%m-%d}/${now:%H-%M-%S}}",
                        "subdir": "${hydra.job.num}"},
              "output_subdir": None, "job": {"chdir": False}},
}


def register() -> None:
    """Put the schema in Hydra's ConfigStore: ``shardmd`` (the base every config starts from),
    one node per group choice, and the Hydra settings."""
    cs = ConfigStore.instance()
    cs.store(name="shardmd", node=ShardMD)
    cs.store(name="shardmd_hydra", node=HYDRA_SETTINGS, package="_global_")
    for group, options in GROUPS.items():
        for name, cls in options.items():
            extra = GROUP_DEFAULTS.get((group, name))
            if extra:
                cs.store(group=group, name=name, node={group: cls, **extra}, package="_global_")
            else:
                cs.store(group=group, name=name, node=cls)


register()
