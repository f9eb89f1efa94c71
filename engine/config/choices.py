"""The choices of the configuration's groups, one dataclass each: ``model`` (:data:`MODELS`) and
``integrator`` (:data:`INTEGRATORS`). A new model or integrator is one more dataclass here and
one more entry in its table; engine/config/schema.py registers them with Hydra.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from shardmd.engine.config.checks import (
    AUTO,
    FLAG,
    Check,
    _is_num,
    _pairs,
    _per_species,
    _text,
    key,
    number,
    one_of,
    whole,
)


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


def _element_charges(v) -> bool | str:
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
                                    check=Check(_element_charges,
                                                "give finite charges per element, e.g. {Na: 1.0, Cl: -1.0}"),
                                    factory=lambda: {"Na": 1.0, "Cl": -1.0})
    cutoff: float = key(10.0, "real-space cutoff, Å (the Ewald splitting follows from it and model.accuracy)",
                        number("give a real-space cutoff > 0 in Å", gt=0))
    accuracy: float = key(1e-6, "target relative force accuracy: sets the Ewald splitting alpha = "
                          "sqrt(-ln acc)/cutoff, the k-space cutoff and the PME mesh (docs/coulomb.md)",
                          Check(lambda v: _is_num(v) and 0 < v < 1, "give an accuracy between 0 and 1, e.g. 1e-6"))


@dataclass
class D3:
    """DFT-D3 dispersion (tad-dftd3's tables, our sums over the neighbour list: models/d3.py); copper by default"""

    name: str = "d3"
    functional: str = key("pbe", "the functional whose D3 parameters are used (s-dftd3's names and aliases: pbe, "
                          "b3lyp, r2scan, ...)", _text("give a functional name such as pbe"))
    damping: str = key("bj", "bj (rational, D3(BJ)) or zero (D3(0))", one_of("bj", "zero"))
    cutoff: float = key(31.75, "two-body cutoff, Å (60 Bohr, s-dftd3's disp2)",
                        number("give a two-body cutoff > 0 in Å", gt=0))
    cn_cutoff: float = key(21.17, "coordination-number cutoff, Å (40 Bohr, s-dftd3's cn)",
                           number("give a coordination-number cutoff > 0 in Å", gt=0))
    three_body: bool = key(False, "add the Axilrod-Teller-Muto three-body term (s-dftd3's atm)", FLAG)
    three_body_cutoff: float = key(21.17, "three-body cutoff, Å (40 Bohr, s-dftd3's disp3): all three sides "
                                   "within it", number("give a three-body cutoff > 0 in Å", gt=0))
    cutoff_width: float = key(0.0, "two-body switching width, Å (s-dftd3's width2): the pair energy goes smoothly "
                              "to 0 over the last width before model.cutoff; 0: a hard cutoff",
                              number("give a width >= 0 in Å", ge=0))


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
    compile: Any = key("auto", "run the model compiled by torch.compile (inductor); its first call and its first "
                       "new shape compile for ~10-60 s; auto: on a GPU, one domain, over 50,000 atoms, when the run "
                       "is long enough to earn it back (docs/models.md)",
                       one_of("auto", True, False, fix="use auto, true or false"))


def _terms(v) -> bool | str:
    if not isinstance(v, (list, tuple)):   # an empty list is the factory's to refuse: it names the key
        return False
    for k, t in enumerate(v):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            return f"model.terms[{k}] is not a model: give each term as {{name: <model>, <key>: <value>}}"
    return True


@dataclass
class Sum:
    """a sum of models, each term with its own keys, cutoff and spec: model.terms=[{name: mace}, {name: d3}] (docs/byo.md)"""  # noqa: E501 - one line: --help and README's table

    name: str = "sum"
    terms: List[Any] = key(help="the terms, each {name: <model>, <key>: <value>, ...} as model=<name> "
                                "model.<key>=<value> would give it, e.g. [{name: lj}, {name: coulomb, method: pme}]",
                           check=Check(_terms, "give a list of models, e.g. [{name: mace}, {name: d3, functional: "
                                               "pbe}]"), factory=list)


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
    couple: str = key("iso", "iso (one strain rate), aniso (three: x y z), tri (six: a triclinic cell), or one "
                      "axis x, y, z, or xy (x and y together; area) with the other axes fixed (LAMMPS's fix npt z ...)",
                      one_of("iso", "aniso", "tri", "x", "y", "z", "xy"))
    tdamp: float = key(100.0, "damping time of the chain, fs (LAMMPS's Tdamp; about 100 steps is typical)",
                       number("give a tdamp > 0 in fs", gt=0))
    chain: int = key(3, "number of thermostats in the chain (LAMMPS's tchain)",
                     whole(1, "give a chain length >= 1"))
    pchain: int = key(3, "number of thermostats in the barostat's chain (LAMMPS's pchain; 0: none)",
                      whole(0, "give a chain length >= 0"))


#: group -> {choice: dataclass}; a new model or integrator is one more entry here
MODELS: dict[str, type] = {"lj": LJ, "morse": Morse, "coulomb": Coulomb, "d3": D3, "mace": Mace,
                           "sum": Sum, "custom": Custom}
#: the choice whose node takes free keys (the factory's arguments): model=py:... and registered names
OPEN_CHOICES: dict[str, str] = {"model": "custom"}
INTEGRATORS: dict[str, type] = {"verlet": Verlet, "langevin": Langevin, "nose-hoover": NoseHoover,
                                 "csvr": CSVR, "npt": NPT}
