"""The builder's systems beyond a perfect crystal of one element: random packings (atoms, or rigid
molecules from a template file), substitutional alloys, vacancies and surface slabs.

Keys (engine/config/schema.py, ``System``): ``system.lattice=random`` packs ``system.count``
atoms (or molecules of ``system.molecule``) at ``system.density`` (g/cm^3) or in ``system.box``
(Å) with no two atoms of different units closer than ``system.min_distance`` (engine/run/packing.py);
``system.miller`` cuts a slab of the crystal (ASE's ``ase.build.surface``) with ``system.vacuum``
on each side and its ``system.fixed_layers`` lowest atomic planes held fixed (ASE ``FixAtoms``,
which the engine honours: engine/run/constraints.py); ``system.composition`` gives the species of
the sites; ``system.vacancies`` removes sites.

Exact counts: a composition {element: fraction} over N sites gives each element floor(f N) sites
and the sites left over, one each, to the elements with the largest remainders f N - floor(f N)
(ties: by chemical symbol), so the counts sum to N (Hamilton's largest-remainder rounding);
which sites is a seeded permutation.  A vacancy fraction f removes round(f N) sites (half up).

Every random choice (positions, orientations, which sites get which element, which are removed)
comes from one ``numpy.random.Generator`` seeded with ``system.seed`` (null: the run's ``seed``),
in that order: a seed builds the same system everywhere, and every rank builds it alike.

Nothing here imports scipy or ase.build until a builder that needs it runs: a default run
(a crystal) stays as light as before (tests/test_lattice_builder.py).
"""
from __future__ import annotations

import math

import numpy as np

from shardmd.engine.errors import UserError
from shardmd.engine.run.structure import CUBIC_CELLS, read_structure, unit_cell

#: the densest packing of equal spheres (pi / sqrt(18)): no packing of any kind goes beyond
CLOSE_PACKED = math.pi / math.sqrt(18.0)


# -- the builder ---------------------------------------------------------------------------------------
def build_atoms(system_cfg, seed: int = 0):
    """``ase.Atoms`` from ``system.file`` (if set) or from the builder: a crystal (a slab with
    ``system.miller``) or a random packing, then its composition and vacancies
    (engine/run/py).  seed: the run's, for the builder's random choices when
    ``system.seed`` is null."""
    check_system(system_cfg)
    if system_cfg.get("file"):
        return read_structure(system_cfg["file"], system_cfg.get("index", -1))
    lattice = system_cfg["lattice"]
    if lattice == "random":
        return random_atoms(system_cfg, rng_of(system_cfg, seed))
    if system_cfg.get("miller") is not None:
        atoms = slab(system_cfg)
    else:
        element, a = system_cfg["element"], float(system_cfg["a"])
        rep = tuple(int(r) for r in system_cfg["repeat"])
        try:
            unit = unit_cell(lattice, element, a)
        except Exception as exc:  # noqa: BLE001 - ASE refuses e.g. impossible combinations
            raise UserError(f"system.lattice={lattice} with system.element={element}: {exc}") from None
        atoms = unit.repeat(rep)
        atoms.pbc = [bool(p) for p in system_cfg["pbc"]]
    if system_cfg.get("composition") is None and not system_cfg.get("vacancies"):
        return atoms
    rng = rng_of(system_cfg, seed)
    if system_cfg.get("composition") is not None:
        substitute(atoms, system_cfg["composition"], rng)
    return remove_vacancies(atoms, system_cfg.get("vacancies"), rng)


# -- counts -------------------------------------------------------------------------------------------
def species_counts(composition: dict, n: int) -> dict[str, int]:
    """{element: sites} for ``n`` sites: largest-remainder rounding of fraction x n (ties by
    symbol), the counts summing to ``n`` exactly; elements in symbol order."""
    items = sorted((str(k), float(v)) for k, v in composition.items())
    exact = [(el, f * n) for el, f in items]
    counts = {el: int(math.floor(x + 1e-9)) for el, x in exact}
    left = n - sum(counts.values())
    by_remainder = sorted(exact, key=lambda e: (-(e[1] - math.floor(e[1] + 1e-9)), e[0]))
    for el, _ in by_remainder[:max(left, 0)]:
        counts[el] += 1
    return counts


def vacancy_count(vacancies, n: int) -> int:
    """Sites removed of ``n``: a whole number is a count, a float a fraction (half rounds up)."""
    if isinstance(vacancies, float):
        return int(math.floor(vacancies * n + 0.5))
    return int(vacancies or 0)


def _mean_mass(system_cfg) -> float:
    """amu per packed unit: the template molecule's mass, else the composition's mean atom mass
    (or the element's)."""
    from ase.data import atomic_masses, atomic_numbers

    if system_cfg.get("molecule"):
        return float(template(system_cfg["molecule"]).get_masses().sum())
    comp = system_cfg.get("composition") or {system_cfg["element"]: 1.0}
    return sum(float(f) * float(atomic_masses[atomic_numbers[str(el)]]) for el, f in comp.items())


def packing_box(system_cfg) -> tuple[int, np.ndarray]:
    """(units to place, box lengths (3,) Å) of ``system.lattice=random``, from two of
    ``system.count``, ``system.density`` (g/cm^3; cubic box) and ``system.box``."""
    from shardmd.engine.run.packing import AMU_PER_A3

    count, density, box = system_cfg.get("count"), system_cfg.get("density"), system_cfg.get("box")
    given = [k for k, v in (("count", count), ("density", density), ("box", box)) if v is not None]
    if len(given) != 2:
        raise UserError(f"system.lattice=random needs two of system.count, system.density and system.box; "
                        f"{'only ' + ', '.join('system.' + g for g in given) + ' is' if given else 'none is'} given"
                        if len(given) < 2 else "system.lattice=random takes two of system.count, system.density "
                        "and system.box, not all three; drop one (~system.box)")
    mass = _mean_mass(system_cfg)
    if box is None:
        side = (int(count) * mass / (float(density) * AMU_PER_A3)) ** (1.0 / 3.0)
        return int(count), np.full(3, side)
    box = np.asarray([float(b) for b in box])
    if count is None:
        count = int(round(float(density) * AMU_PER_A3 * float(np.prod(box)) / mass))
        if count < 1:
            raise UserError(f"system.density={density} g/cm^3 in system.box={list(box)} Å holds no whole "
                            "unit; give a larger box or density, or system.count")
    return int(count), box


# -- checks before anything is built ----------------------------------------------------------------
def check_system(system_cfg) -> None:
    """The keys of ``system`` that are wrong only together, as one-line UserErrors, without
    building: builder keys beside ``system.file``, a packing no random insertion (or no packing
    at all) reaches, more vacancies than sites, a slab of the random builder."""
    lattice = system_cfg["lattice"]
    if system_cfg.get("miller") is None:   # a slab's keys would be ignored without a slab
        for k, unset in (("fixed_layers", 0), ("vacuum", 10.0)):
            if system_cfg.get(k) is not None and float(system_cfg[k]) != unset:
                raise UserError(f"system.{k} applies to a slab (system.miller); give system.miller=[h,k,l] or "
                                f"drop system.{k}")
    if system_cfg.get("file"):
        used = [k for k in ("composition", "molecule", "miller") if system_cfg.get(k) is not None]
        used += ["vacancies"] if system_cfg.get("vacancies") else []
        if used:
            raise UserError(f"system.{used[0]} is a builder key, but system.file={system_cfg['file']!r} is given "
                            f"(a file overrides the builder); drop system.{used[0]} or system.file")
        return
    if lattice != "random":
        if system_cfg.get("molecule"):
            raise UserError("system.molecule is packed by system.lattice=random; set it, or drop system.molecule")
        n = crystal_sites(system_cfg)
    else:
        for k in ("miller", "vacancies"):
            if system_cfg.get(k):
                raise UserError(f"system.{k} applies to a crystal, not to system.lattice=random; drop it or "
                                "give a crystal lattice (fcc, bcc, sc, hcp, diamond)")
        if system_cfg.get("molecule") and system_cfg.get("composition") is not None:
            raise UserError("system.composition does not apply to molecules (the template gives their species); "
                            "drop system.composition or system.molecule")
        n = check_packing(system_cfg)
    gone = vacancy_count(system_cfg.get("vacancies"), n)
    if gone >= n:
        raise UserError(f"system.vacancies={system_cfg['vacancies']} removes {gone} of the {n} sites the builder "
                        "makes, leaving none; give fewer vacancies (a count below the sites, or a fraction < 1)")


def check_packing(system_cfg) -> int:
    """Atoms of the random packing, once its units fill no more of the box than random insertion
    reaches (spheres of diameter ``system.min_distance`` around their atoms:
    :func:`~shardmd.engine.run.packing.unit_volume`); else a one-line UserError naming the densest
    that does."""
    from shardmd.engine.run.packing import AMU_PER_A3, MAX_FRACTION, unit_volume

    count, box = packing_box(system_cfg)
    offsets = unit_offsets(system_cfg)
    d = float(system_cfg["min_distance"])
    volume = float(np.prod(box))
    excluded = unit_volume(offsets, d)
    phi = count * excluded / volume
    if phi > MAX_FRACTION:
        best = MAX_FRACTION / excluded * _mean_mass(system_cfg) / AMU_PER_A3
        what = ("no packing can reach it (the densest fills 74%)" if phi > CLOSE_PACKED
                else f"random insertion fills at most {MAX_FRACTION:.0%}")
        units = f"{count} molecules" if len(offsets) > 1 else f"{count} atoms"
        raise UserError(f"system.lattice=random: {units} in {volume:.4g} Å^3 with system.min_distance={d:g} Å fill "
                        f"{phi:.0%} of the volume (spheres of that diameter around each atom); {what}; give "
                        f"system.density <= {best:.4g} g/cm^3 (or a larger system.box) or a smaller "
                        "system.min_distance")
    return count * len(offsets)


def unit_offsets(system_cfg) -> np.ndarray:
    """(k, 3) Å: the packed unit's atoms about its centre of mass (one atom: the origin)."""
    if not system_cfg.get("molecule"):
        return np.zeros((1, 3))
    mol = template(system_cfg["molecule"])
    return mol.positions - mol.get_center_of_mass()


def crystal_sites(system_cfg) -> int:
    """Sites of the crystal builder (bulk, or the slab of ``system.miller``) before vacancies."""
    rep = [int(r) for r in system_cfg["repeat"]]
    if system_cfg.get("miller") is not None:
        return len(slab_cell(system_cfg)) * rep[0] * rep[1] * rep[2]
    per_cell = len(CUBIC_CELLS.get(system_cfg["lattice"], ())) or 4   # hcp: 4 in ASE's orthorhombic cell
    return per_cell * rep[0] * rep[1] * rep[2]


# -- building ------------------------------------------------------------------------------------------
def rng_of(system_cfg, run_seed: int) -> np.random.Generator:
    seed = system_cfg.get("seed")
    return np.random.default_rng(int(run_seed if seed is None else seed))


def template(path: str):
    """The molecule template (``ase.Atoms``) of ``system.molecule``: any file ASE reads."""
    try:
        return read_structure(path, -1)
    except UserError as exc:
        raise UserError(exc.one_line().replace("system.file=", "system.molecule=", 1)) from None


def random_atoms(system_cfg, rng: np.random.Generator):
    """``ase.Atoms`` of ``system.lattice=random``: atoms or molecules packed in their box."""
    from ase import Atoms

    from shardmd.engine.run.packing import pack

    check_packing(system_cfg)
    count, box = packing_box(system_cfg)
    d = float(system_cfg["min_distance"])
    if system_cfg.get("molecule"):
        positions = pack(count, unit_offsets(system_cfg), box, d, rng)
        symbols = list(template(system_cfg["molecule"]).get_chemical_symbols()) * count
    else:
        positions = pack(count, np.zeros((1, 3)), box, d, rng)
        symbols = [system_cfg["element"]] * count
    atoms = Atoms(symbols, positions=positions, cell=np.diag(box), pbc=[bool(p) for p in system_cfg["pbc"]])
    if system_cfg.get("composition") is not None:
        substitute(atoms, system_cfg["composition"], rng)
    return atoms


def slab_cell(system_cfg):
    """One surface cell (ASE's ``surface`` with one layer, no vacuum) of ``system.miller``."""
    return _surface(system_cfg, 1, None)


def _surface(system_cfg, layers: int, vacuum: float | None):
    from ase.build import bulk, surface

    lattice, element, a = system_cfg["lattice"], system_cfg["element"], float(system_cfg["a"])
    # Miller indices of the conventional cell: the cubic one, hcp's hexagonal one ((0,0,1): basal)
    cell = bulk(element, "hcp", a=a) if lattice == "hcp" else unit_cell(lattice, element, a)
    try:
        return surface(cell, tuple(int(i) for i in system_cfg["miller"]), layers, vacuum=vacuum)
    except Exception as exc:  # noqa: BLE001 - ASE refuses e.g. an index it cannot reduce
        raise UserError(f"system.miller={list(system_cfg['miller'])}: ASE cannot cut that surface ({exc}); "
                        "give another Miller index") from None


def slab(system_cfg):
    """``ase.Atoms`` of the slab: ``system.repeat`` = [lateral a, lateral b, layers (ASE's)],
    ``system.vacuum`` Å each side (0: none), the lowest ``system.fixed_layers`` atomic planes
    (ASE's ``get_layers`` normal to the surface) held by FixAtoms; pbc per ``system.pbc``."""
    rx, ry, layers = (int(r) for r in system_cfg["repeat"])
    vacuum = float(system_cfg["vacuum"])
    atoms = _surface(system_cfg, layers, vacuum if vacuum > 0 else None).repeat((rx, ry, 1))
    atoms.pbc = [bool(p) for p in system_cfg["pbc"]]
    k = int(system_cfg["fixed_layers"])
    if k:
        from ase.constraints import FixAtoms
        from ase.geometry import get_layers

        tags, levels = get_layers(atoms, (0, 0, 1), tolerance=1e-3)
        if k >= len(levels):
            raise UserError(f"system.fixed_layers={k} fixes every atomic plane of the slab (it has {len(levels)}); "
                            "give fewer fixed layers or more system.repeat layers")
        atoms.set_constraint(FixAtoms(mask=tags < k))
    return atoms


def substitute(atoms, composition: dict, rng: np.random.Generator) -> None:
    """Species of ``atoms`` per ``composition`` ({element: fraction}, exact counts:
    :func:`species_counts`) on a seeded permutation of the sites; in place."""
    counts = species_counts(composition, len(atoms))
    order = rng.permutation(len(atoms))
    symbols = np.empty(len(atoms), dtype=object)
    start = 0
    for el, c in counts.items():
        symbols[order[start:start + c]] = el
        start += c
    atoms.set_chemical_symbols(list(symbols))
    atoms.set_masses()   # the new species' masses


def remove_vacancies(atoms, vacancies, rng: np.random.Generator):
    """``atoms`` without a seeded choice of :func:`vacancy_count` sites (FixAtoms kept on the
    atoms left)."""
    gone = vacancy_count(vacancies, len(atoms))
    if gone == 0:
        return atoms
    drop = np.sort(rng.choice(len(atoms), size=gone, replace=False))
    del atoms[drop]   # ASE carries FixAtoms' indices over to the atoms left
    return atoms
