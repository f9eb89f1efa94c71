"""The configuration schema: every key's type, default, help text and check, in one place.

Each key is one dataclass field made with :func:`key`.  Hydra composes from these dataclasses
(registered with its ConfigStore below), OmegaConf enforces their types, and
``engine/config/compose.py`` derives from them the key table (``KEYS``), ``--help``, the README's
table (tests/test_readme.py checks it) and the value checks.  Adding a key is adding a field.

Groups: ``model`` (:data:`MODELS`) and ``integrator`` (:data:`INTEGRATORS`), one dataclass
per choice; a choice may also change defaults outside its own node (:data:`GROUP_DEFAULTS`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


# -- checks: each returns None when the value is fine, else the fix (what to give instead) --------
@dataclass(frozen=True)
class Check:
    """``test(value)`` is True (fine), False (say ``fix``) or a string (say that instead)."""

    test: Callable[[Any], bool | str]
    fix: str

    def __call__(self, value) -> str | None:
        try:
            ok = self.test(value)
        except (TypeError, AttributeError, KeyError, ValueError):   # the wrong shape (a string where a
            ok = False                                             # map goes, as an interpolation gives)
        return None if ok is True else (ok if isinstance(ok, str) else self.fix)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    """A finite number (inf and NaN are refused for every float key)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _same(v, option) -> bool:
    """``v == option`` without Python's 1 == True."""
    return type(v) is type(option) and v == option


def whole(lo: int, fix: str | None = None) -> Check:
    return Check(lambda v: _is_int(v) and v >= lo, fix or f"give a whole number >= {lo}")


def number(fix: str, *, gt: float | None = None, ge: float | None = None) -> Check:
    return Check(lambda v: _is_num(v) and (gt is None or v > gt) and (ge is None or v >= ge), fix)


def one_of(*options, fix: str | None = None) -> Check:
    words = ["null" if o is None else str(o).lower() for o in options]
    return Check(lambda v: any(_same(v, o) for o in options),
                 fix or "use " + (", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]))


FLAG = Check(lambda v: isinstance(v, bool), "use true or false")
AUTO = one_of("auto", True, False)


def _triple(ok: Callable[[Any], bool], fix: str) -> Check:
    return Check(lambda v: v is not None and len(v) == 3 and all(ok(x) for x in v), fix)


def _per_species(v) -> bool:
    return len(v) > 0 and all(_is_num(x) and x > 0 for x in v.values())


def _pairs(v) -> bool:
    return all(re.fullmatch(r"[A-Z][a-z]?-[A-Z][a-z]?", str(k)) and _is_num(p["epsilon"]) and p["epsilon"] > 0
               and _is_num(p["sigma"]) and p["sigma"] > 0 for k, p in v.items())


def _existing_file(v) -> bool | str:
    from shardmd.engine.io.safe_io import input_file_problem

    if v is None:
        return True
    bad = input_file_problem(v)
    return bad is None or f"{bad}; give the path of a structure file ASE can read"


def _element(v) -> bool:
    from ase.data import atomic_numbers

    return isinstance(v, str) and v in atomic_numbers


def _fields(v) -> bool | str:
    bad = [f for f in v if f not in TRAJECTORY_FIELDS and f not in MODEL_FIELDS]
    if bad:
        return f"unknown field(s) {bad}; use any of {[*TRAJECTORY_FIELDS, 'energies']}"
    names = [MODEL_FIELDS.get(f, f) for f in v]   # energies and energy are one field
    return len(set(names)) == len(names) or "a field is named twice; give each once"


def _text(fix: str, *, null: bool = False) -> Check:
    return Check(lambda v: (null and v is None) or (isinstance(v, str) and v.strip() != ""), fix)


TRAJECTORY_FIELDS = ("position", "image", "velocity", "force")   # the default; optional besides:
MODEL_FIELDS = {"energies": "energy", "energy": "energy"}   # per-atom energies the model returns, eV


def key(default: Any = MISSING, help: str = "", check: Check | None = None, *,
        factory: Callable[[], Any] | None = None):
    """One configuration key: its default, its help text (one sentence: --help and the README's
    table), and the check its value must pass (see ``shardmd.engine.config.compose.validate``)."""
    meta = {"help": help, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


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


@dataclass
class System:
    file: Optional[str] = key(None, "any ASE-readable structure (extxyz, cif, POSCAR, ...); overrides the "
                              "builder", Check(_existing_file, "give a path"))
    index: int = key(-1, "frame of a multi-frame file", Check(_is_int, "give a frame number (-1: last)"))
    lattice: str = key("fcc", "builder lattice: fcc, bcc, sc, hcp or diamond",
                       one_of("fcc", "bcc", "sc", "hcp", "diamond"))
    element: str = key("Ar", "builder element", Check(_element, "give an element symbol such as Ar"))
    a: float = key(5.26, "builder lattice constant, Å", number("give a lattice constant > 0 in Å", gt=0))
    repeat: List[int] = key(help="builder repeats of the cubic cell (orthorhombic for hcp)",
                            check=_triple(lambda r: _is_int(r) and r >= 1,
                                          "give three whole numbers >= 1, e.g. [10,10,10]"),
                            factory=lambda: [10, 10, 10])
    pbc: List[bool] = key(help="builder periodic axes (files keep their own)",
                          check=_triple(lambda p: isinstance(p, bool), "give three booleans, e.g. [true,true,false]"),
                          factory=lambda: [True, True, True])
    velocities: str = key("auto", "auto (the file's if it has them, else thermal), thermal, file or zero",
                          one_of("auto", "thermal", "file", "zero"))


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


def _modules(v) -> bool | str:
    from shardmd.engine.observables.modules import check_entry

    bad = next((b for b in map(check_entry, v or []) if b), None)
    return bad or (len(set(v)) == len(v) or "a module is named twice; give each once")


@dataclass
class Observables:
    modules: List[str] = key(help="modules of yours that register observables (module or module:function; "
                             "needs allow_code=true; docs/observables.md)",
                             check=Check(_modules, "give a list of module or module:function names"), factory=list)


@dataclass
class Thermo:
    every: int = key(100, "steps between thermo lines (0: first and last only)", whole(0))
    progress: bool = key(True, "progress line with steps/s, ns/day and ETA", FLAG)


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


@dataclass
class Minimize:
    fmax: float = key(0.05, "eV/Å: `python -m engine minimize` stops when every atom's force is below this "
                      "(ASE's FIRE criterion)", number("give a force > 0 in eV/Å", gt=0))
    steps: int = key(1000, "most FIRE steps of `python -m engine minimize`", whole(0))
    maxstep: float = key(0.2, "Å: longest FIRE step (ASE's maxstep, of all atoms' displacement together)",
                         number("give a distance > 0 in Å", gt=0))
    dt: float = key(0.1, "FIRE's initial time step (ASE's dt, ASE's time units)", number("give a dt > 0", gt=0))
    dtmax: float = key(1.0, "FIRE's largest time step (ASE's dtmax)", number("give a dtmax > 0", gt=0))
    structure: Optional[str] = key(None, "the relaxed structure (extxyz, or any ASE format by its suffix); null: "
                                   "output with the suffix .extxyz", _text("give a file name", null=True))
    cell: bool = key(False, "relax the cell too: FIRE on the atoms and the cell as ASE's FIRE on its "
                     "FrechetCellFilter (periodic cells; fmax applies to the cell's rows too)", FLAG)
    pressure: float = key(0.0, "bar: target pressure of the cell relaxation (minimize.cell=true; ASE's "
                          "scalar_pressure; negative: tension)", number("give a pressure in bar"))


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
    steps: int = key(1000, "total step number to reach", whole(0))
    dt: float = key(1.0, "time step, fs", number("give a time step > 0 in fs", gt=0))
    temperature: float = key(100.0, "K: initial Maxwell-Boltzmann velocities and the Langevin target",
                             number("give kelvin >= 0", ge=0))
    seed: int = key(12345, "keys initial velocities and Langevin noise",
                    Check(lambda v: _is_int(v) and 0 <= v < 2**63, "give a whole number >= 0"))
    precision: str = key("float64", "float64 or float32 (positions, velocities, forces)",
                         one_of("float32", "float64", fix="use float32 or float64"))
    device: str = key("cpu", "cpu, cuda or cuda:N",
                      Check(lambda v: re.fullmatch(r"cpu|cuda(:\d+)?", v) is not None, "use cpu, cuda or cuda:N"))
    threads: int = key(0, "torch CPU threads per rank; 0: 1 per rank under MPI, else OMP_NUM_THREADS or the "
                          "cores this process may use", whole(0))
    output: str = key("run.h5", "H5MD trajectory; the log (.log) and checkpoints (.ckpt/) go beside it; a "
                      "relative path is inside the job's folder (hydra.run.dir, or the sweep's)",
                      _text("give a file name"))
    quiet: bool = key(False, "nothing on the terminal; the log keeps everything", FLAG)
    overwrite: bool = key(False, "a fresh run may replace an existing output file (else refused)", FLAG)
    restart: Restart = field(default_factory=Restart)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    system: System = field(default_factory=System)
    neighbor: Neighbor = field(default_factory=Neighbor)
    health: Health = field(default_factory=Health)
    trajectory: Trajectory = field(default_factory=Trajectory)
    thermo: Thermo = field(default_factory=Thermo)
    observables: Observables = field(default_factory=Observables)
    fix: Fix = field(default_factory=Fix)
    minimize: Minimize = field(default_factory=Minimize)
    limits: Limits = field(default_factory=Limits)


# -- group choices ----------------------------------------------------------------------------
@dataclass
class LJPair:
    epsilon: float = MISSING
    sigma: float = MISSING


@dataclass
class LJ:
    """Lennard-Jones, Warp kernel, argon by default"""

    name: str = "lj"
    epsilon: Dict[str, float] = key(help="per-species ε, eV (model.epsilon.Kr=0.014 adds a species)",
                                    check=Check(_per_species, "give positive numbers per element, e.g. {Ar: 0.0104}"),
                                    factory=lambda: {"Ar": 0.0104})
    sigma: Dict[str, float] = key(help="per-species σ, Å",
                                  check=Check(_per_species, "give positive numbers per element, e.g. {Ar: 3.4}"),
                                  factory=lambda: {"Ar": 3.40})
    cutoff: float = key(8.5, "cutoff, Å", number("give a cutoff > 0 in Å", gt=0))
    shift: bool = key(True, "shift the pair energy to zero at the cutoff", FLAG)
    mixing: str = key("lorentz-berthelot", "lorentz-berthelot or geometric", one_of("lorentz-berthelot", "geometric"))
    pairs: Dict[str, LJPair] = key(help="explicit pairs, e.g. {Ar-Kr: {epsilon: 0.012, sigma: 3.5}}",
                                   check=Check(_pairs, "give pairs as {Ar-Kr: {epsilon: 0.012, sigma: 3.5}} "
                                                       "with positive numbers"),
                                   factory=dict)


@dataclass
class Morse:
    """Morse pair potential in plain PyTorch, the readable reference pair model; copper by default"""

    name: str = "morse"
    D: float = key(0.3429, "well depth D, eV", number("give a well depth > 0 in eV", gt=0))
    a: float = key(1.3588, "inverse width a, 1/Å", number("give an inverse width > 0 in 1/Å", gt=0))
    r0: float = key(2.866, "equilibrium distance r0, Å", number("give an equilibrium distance > 0 in Å", gt=0))
    cutoff: float = key(6.0, "cutoff, Å (Morse: U is shifted to 0 here)", number("give a Morse cutoff > 0 in Å", gt=0))
    shift: bool = key(True, "shift the pair energy to zero at the cutoff", FLAG)


def _charges(v) -> bool | str:
    bad = [k for k, x in v.items() if not _is_num(x)]
    if bad:
        return f"model.charges.{bad[0]} is not a finite number; give a charge in e, e.g. model.charges.{bad[0]}=1.0"
    return len(v) > 0


@dataclass
class Coulomb:
    """Coulomb electrostatics of fixed charges per element, Ewald or particle-mesh Ewald (docs/coulomb.md); Na+ Cl- by default"""  # noqa: E501 - one line: --help and README's table

    name: str = "coulomb"
    method: str = key("ewald", "ewald (explicit k sum) or pme (particle-mesh Ewald, torch-pme's mesh)",
                      one_of("ewald", "pme"))
    charges: Dict[str, float] = key(help="per-species charge, e (model.charges.Cl=-1.0 adds a species)",
                                    check=Check(_charges, "give finite charges per element, e.g. {Na: 1.0, Cl: -1.0}"),
                                    factory=lambda: {"Na": 1.0, "Cl": -1.0})
    cutoff: float = key(10.0, "real-space cutoff, Å (the Ewald splitting follows from it and model.accuracy)",
                        number("give a real-space cutoff > 0 in Å", gt=0))
    accuracy: float = key(1e-6, "target relative force accuracy: sets the Ewald splitting alpha = "
                          "sqrt(-ln acc)/cutoff, the k-space cutoff and the PME mesh (docs/coulomb.md)",
                          Check(lambda v: _is_num(v) and 0 < v < 1, "give an accuracy between 0 and 1, e.g. 1e-6"))


@dataclass
class Mace:
    """MACE via mace-torch, the shipped Cu model by default"""

    name: str = "mace"
    checkpoint: Optional[str] = key(None, "a mace-torch model file (null: the shipped Cu model)",
                                    _text("give a model file path", null=True))
    dtype: Optional[str] = key(None, "float32 or float64 (null: precision)", one_of(None, "float32", "float64",
                                                                                  fix="use float32 or float64"))
    cueq: Any = key("auto", "cuEquivariance kernels: auto (on CUDA when installed), true (required) or false (e3nn)",
                    AUTO)
    trust_pickle: bool = key(False, "true unpickles a model file the safe loader refuses, which runs any code it "
                             "holds: only for files you made or trust", FLAG)
    cuda_graph: Any = key("auto", "replay the model call as a CUDA graph between neighbour rebuilds (one domain, "
                          "CUDA); auto: up to 50,000 atoms (docs/benchmarks.md)",
                          one_of("auto", True, False, fix="use true, auto or false"))
    head: Optional[str] = key(None, "the readout head of a multi-head model (mace-torch's heads); null: its only "
                              "head, else the one named default", _text("give a head name", null=True))


@dataclass
class Custom:
    """py:module:factory (a model of yours) or the name an installed package registers, model.<key>=... passed to its factory (docs/byo.md)"""  # noqa: E501 - one line: --help and README's table

    name: str = "custom"
    spec: Optional[str] = key(None, "a saved spec JSON (MLIPSpec.save) for the model's distribution; null: the "
                              "model's own distribution_spec", _text("give a spec file path", null=True))


@dataclass
class Verlet:
    """velocity Verlet, NVE"""

    name: str = "verlet"


@dataclass
class Langevin:
    """Langevin dynamics, BAOAB; temperature is the target"""

    name: str = "langevin"
    friction: float = key(0.01, "friction γ, 1/fs", number("give a friction >= 0 in 1/fs", ge=0))


@dataclass
class NoseHoover:
    """Nosé-Hoover chains as LAMMPS fix nvt integrates them; temperature is the target"""

    name: str = "nose-hoover"
    tdamp: float = key(100.0, "damping time of the chain, fs (LAMMPS's Tdamp; about 100 steps is typical)",
                       number("give a tdamp > 0 in fs", gt=0))
    chain: int = key(3, "number of thermostats in the chain (LAMMPS's tchain)",
                     whole(1, "give a chain length >= 1"))


@dataclass
class CSVR:
    """stochastic velocity rescaling, Bussi-Donadio-Parrinello; temperature is the target"""

    name: str = "csvr"
    tau: float = key(100.0, "relaxation time of the kinetic energy, fs (0: rescale to it every step)",
                     number("give a tau >= 0 in fs", ge=0))


@dataclass
class NPT:
    """MTK barostat with Nosé-Hoover chains as LAMMPS fix npt integrates them; temperature is the target"""

    name: str = "npt"
    pressure: float = key(1.01325, "target pressure, bar (LAMMPS metal units; hydrostatic for every coupling)",
                          number("give a pressure in bar"))
    pdamp: float = key(1000.0, "damping time of the barostat, fs (LAMMPS's Pdamp; about 1000 steps is typical)",
                       number("give a pdamp > 0 in fs", gt=0))
    couple: str = key("iso", "iso (one strain rate), aniso (three: x y z) or tri (six: a triclinic cell)",
                      one_of("iso", "aniso", "tri"))
    tdamp: float = key(100.0, "damping time of the chain, fs (LAMMPS's Tdamp; about 100 steps is typical)",
                       number("give a tdamp > 0 in fs", gt=0))
    chain: int = key(3, "number of thermostats in the chain (LAMMPS's tchain)",
                     whole(1, "give a chain length >= 1"))
    pchain: int = key(3, "number of thermostats in the barostat's chain (LAMMPS's pchain; 0: none)",
                      whole(0, "give a chain length >= 0"))


#: group -> {choice: dataclass}; a new model or integrator is one more entry here
MODELS: dict[str, type] = {"lj": LJ, "morse": Morse, "coulomb": Coulomb, "mace": Mace, "custom": Custom}
#: the choice whose node takes free keys (the factory's arguments): model=py:... and registered names
OPEN_CHOICES: dict[str, str] = {"model": "custom"}
INTEGRATORS: dict[str, type] = {"verlet": Verlet, "langevin": Langevin, "nose-hoover": NoseHoover,
                                 "csvr": CSVR, "npt": NPT}
GROUPS: dict[str, dict[str, type]] = {"model": MODELS, "integrator": INTEGRATORS}
#: what the group is for; each choice is described by its dataclass's docstring
GROUP_HELP = {"model": "the interatomic model", "integrator": "the equations of motion"}
#: defaults a choice changes outside its own node: model=mace runs fcc Cu (864 atoms, 300 K,
#: 20 steps), the system the shipped model was trained on
GROUP_DEFAULTS: dict[tuple[str, str], dict] = {
    ("model", "morse"): {"system": {"element": "Cu", "lattice": "fcc", "a": 3.66, "repeat": [5, 5, 5]},
                         "temperature": 300.0},
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
