"""Random packing: atoms, or rigid copies of a small molecule, put at random in an orthorhombic
box with no two atoms of different units closer than a minimum distance (through the periodic
boundaries on every axis, also those that are not periodic: the packing never depends on pbc).

How: random sequential addition in batches.  Each round draws candidate centres (uniform in the
box) and, for a molecule, orientations (uniform on SO(3), scipy's ``Rotation.random``); a
candidate is dropped when one of its atoms is within the minimum distance of an atom already
placed (periodic scipy ``cKDTree``s: one over most placed atoms, rebuilt as they grow by a
quarter, one over those added since) or of an earlier candidate of the same round that was kept
(the round's close pairs, taken greedily in draw order).  A round draws as many candidates as the
last round's acceptance rate says the rest needs.  Every random number comes from one
``numpy.random.Generator`` seeded with the builder's seed, so a seed gives the same packing on
every rank (and machine, with the same numpy).

Random sequential addition of spheres of diameter d jams at a packing fraction
phi = (pi/6) n d^3 ~ 0.38 (n atoms per Å^3; for molecules, n times the volume of the union of
their atoms' spheres: :func:`unit_volume`): :data:`MAX_FRACTION` is the most this builder
accepts before it starts; a request between that and the jamming limit that still does not fit
stops after :data:`MAX_TRIALS` candidates per unit, with one line either way.
"""
from __future__ import annotations

import math

import numpy as np

from shardmd.engine.errors import UserError

#: packing fraction the builder accepts (random sequential addition jams at ~0.38 and slows down
#: long before: scripts/bench_packing.py)
MAX_FRACTION = 0.33
#: candidates drawn per unit to place before the packing gives up
MAX_TRIALS = 2000
#: amu per Å^3 in one g/cm^3 (1e-24 cm^3 per Å^3 / 1.66053907e-24 g per amu)
AMU_PER_A3 = 1.0 / 1.66053906660


def unit_volume(template: np.ndarray, min_distance: float, points: int = 40) -> float:
    """Å^3 of the union of spheres of diameter ``min_distance`` around the (k, 3) Å template's
    atoms (one atom: pi d^3 / 6 exactly), counted on a regular grid of ``points`` per diameter:
    the volume a unit excludes, for the packing fraction of molecules whose atoms overlap."""
    template = np.asarray(template, dtype=np.float64).reshape(-1, 3)
    r = 0.5 * min_distance
    if len(template) == 1 or r == 0:
        return len(template) * math.pi / 6.0 * min_distance ** 3
    h = min_distance / points
    lo, hi = template.min(axis=0) - r, template.max(axis=0) + r
    axes = [np.arange(a + 0.5 * h, b, h) for a, b in zip(lo, hi)]
    inside = np.zeros([len(x) for x in axes], dtype=bool)
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    for atom in template:
        inside |= ((grid - atom) ** 2).sum(axis=-1) <= r * r
    return float(inside.sum()) * h ** 3


def _wrap(x: np.ndarray, box: np.ndarray) -> np.ndarray:
    """``x`` (..., 3) Å folded into [0, box) (a value that rounds up to ``box`` becomes 0)."""
    w = np.mod(x, box)
    return np.where(w >= box, w - box, w)


def pack(n_units: int, template: np.ndarray, box, min_distance: float, rng: np.random.Generator,
         ) -> np.ndarray:
    """Centre-of-unit positions of ``n_units`` copies of ``template`` placed at random.

    template: (k, 3) Å atom offsets from the unit's centre (k = 1: single atoms, offsets 0);
    box: 3 lengths, Å (an orthorhombic cell); min_distance: Å between atoms of different units.
    Returns (n_units * k, 3) Å positions, unit by unit (a molecule's atoms unwrapped around its
    centre, the centre inside the box).  UserError (one line) when the units do not fit within
    ``MAX_TRIALS`` candidates per unit."""
    from scipy.spatial import cKDTree

    box = np.asarray(box, dtype=np.float64)
    template = np.asarray(template, dtype=np.float64).reshape(-1, 3)
    k = len(template)
    if k > 1:
        from scipy.spatial.transform import Rotation
    placed = _Placed(box, min_distance)
    out: list[np.ndarray] = []         # placed units' atoms, unwrapped, (k, 3) each
    trials, rate = 0, 0.5
    while len(out) < n_units:
        need = n_units - len(out)
        # as many candidates as the last round's acceptance rate says fill the rest (fewer rounds
        # as the box fills), within bounds
        m = int(min(65536, max(256, 1.2 * need / max(rate, 1e-4))))
        trials += m
        if trials > MAX_TRIALS * n_units + 100_000:
            raise UserError(f"random packing placed {len(out)} of {n_units} units after {trials:,} trials: the "
                            "box is too full for system.min_distance; lower system.density (or give a larger "
                            "system.box) or a smaller system.min_distance")
        centres = rng.random((m, 3)) * box
        if k > 1:   # each candidate's own rotation of the template
            rot = Rotation.random(m, random_state=rng)
            offsets = np.einsum("mij,kj->mki", rot.as_matrix(), template)
        else:
            offsets = np.zeros((m, 1, 3))
        atoms = centres[:, None, :] + offsets                       # (m, k, 3) unwrapped
        flat = _wrap(atoms.reshape(-1, 3), box)
        ok = ~placed.clashes(flat).reshape(m, k).any(axis=1)
        rate = max(float(ok.mean()), 1.0 / m)
        keep = _greedy(flat, k, ok, box, min_distance, cKDTree)[:need]
        out.extend(atoms[keep])
        placed.add(flat.reshape(m, k, 3)[keep].reshape(-1, 3))
    return np.concatenate(out).reshape(-1, 3) if out else np.zeros((0, 3))


class _Placed:
    """The atoms placed so far (wrapped, Å): a periodic tree over most of them, rebuilt only when
    the atoms added since (checked with a second, small tree) reach a quarter of it."""

    def __init__(self, box: np.ndarray, d: float):
        self.box, self.d = box, d
        self.old = np.zeros((0, 3))
        self.new: list[np.ndarray] = []
        self.tree = None

    def add(self, x: np.ndarray) -> None:
        self.new.append(x)
        recent = sum(len(a) for a in self.new)
        if recent > max(1024, len(self.old) // 4):
            from scipy.spatial import cKDTree

            self.old = np.concatenate([self.old, *self.new])
            self.new = []
            self.tree = cKDTree(self.old, boxsize=self.box)

    def clashes(self, x: np.ndarray) -> np.ndarray:
        """(len(x),) bool: an atom placed within the minimum distance of each point of ``x``."""
        from scipy.spatial import cKDTree

        hit = np.zeros(len(x), dtype=bool)
        for tree in (self.tree, cKDTree(np.concatenate(self.new), boxsize=self.box) if self.new else None):
            if tree is not None:
                dist, _ = tree.query(x, k=1, distance_upper_bound=self.d)
                hit |= dist < self.d
        return hit


def _greedy(flat: np.ndarray, k: int, ok: np.ndarray, box: np.ndarray, d: float, tree_cls) -> np.ndarray:
    """Indices of the candidates kept: those ``ok`` that are not within ``d`` (Å) of an earlier
    kept candidate of the round, in draw order.  flat: (m * k, 3) wrapped atom positions."""
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return idx
    sub = flat.reshape(-1, k, 3)[idx].reshape(-1, 3)
    pairs = tree_cls(sub, boxsize=box).query_pairs(d, output_type="ndarray")
    if len(pairs):
        pairs = pairs // k                               # atom -> candidate (of ``idx``)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]        # a molecule's own atoms are no clash
    if len(pairs) == 0:
        return idx
    pairs = np.sort(pairs, axis=1)
    later: dict[int, list[int]] = {}
    for a, b in pairs.tolist():
        later.setdefault(a, []).append(b)
    dropped = np.zeros(len(idx), dtype=bool)
    for a in range(len(idx)):   # draw order: a kept candidate drops every later one it clashes with
        if not dropped[a] and a in later:
            dropped[later[a]] = True
    return idx[~dropped]
