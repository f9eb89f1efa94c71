"""Run health: a blow-up stops the run with one line instead of filling files with NaN.

Checked (all ranks decide together; the error names the step, the atom id and what is wrong):

- **before step 0** (:func:`check_inputs`, :func:`close_contacts`): finite positions,
  velocities, masses > 0, a finite cell whose periodic vectors span a volume; no two atoms
  closer than ``health.min_distance`` Å (0 turns the check off, for close contacts on purpose);
- **at every skin check** (every step by default, or at the deferred check's read-backs on a
  GPU): the largest ``|v| dt`` of any atom, i.e. how far it drifts in one velocity-Verlet
  step, must stay within ``health.max_step`` Å, and positions and velocities must be finite.
  The measure rides in the read-back the skin check makes anyway, so the number of host reads
  is unchanged: per step :func:`step_measure` joins the skin flag's all-reduce. On a GPU the
  deferred check reads back only at scheduled steps; there :func:`max_speed` is measured at
  each read-back step only (no per-step cost: measured 27-46 µs of host launches per step when
  folded every step, docs/benchmarks.md), while a NaN at any step of the window still shows,
  through the displacement maximum the check folds every step anyway (a NaN velocity makes the
  next positions NaN). Too fast atoms force frequent read-backs by themselves (the schedule
  follows the displacement's growth). The error then names the read-back step ("at or before
  step N");
- **at every output step** (thermo, frame, checkpoint): the reduced energies and pressure
  must be finite (the thermo values are computed there anyway). A checkpoint or frame is
  written only after this check passes, so the newest checkpoint is always a healthy one and
  rotation never replaces a healthy checkpoint by a broken one.

Why ``|v| dt``: at 300 K a copper atom drifts ~0.003 Å per 1 fs step, a hydrogen atom at
5000 K ~0.1 Å; 1 Å per step (the default bound) is far outside MD and is what a too-large
``dt`` or an exploding force produces within a few steps. NaN/inf become +inf before they
enter a maximum, so they can never hide inside a comparison (``nan > x`` is false).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from shardmd.engine.errors import CollectiveError, UnhealthyRun

INF = float("inf")
SINGULAR = {"positions": "position", "velocities": "velocity", "forces": "force", "masses": "mass"}


def max_speed(velocities: torch.Tensor) -> torch.Tensor:
    """0-d tensor on the velocities' device: max ``|v|`` over this rank's atoms (Å/fs); NaN
    when any velocity is NaN (``amax`` propagates it, and so does the deferred check's running
    ``maximum``). Two kernels, no host read: what the GPU's deferred check carries in a read-back."""
    if velocities.shape[0] == 0:
        return torch.zeros((), dtype=velocities.dtype, device=velocities.device)
    return torch.linalg.vector_norm(velocities, dim=1).amax()


def step_measure(velocities: torch.Tensor, dt: float, displacement: torch.Tensor | None = None) -> torch.Tensor:
    """0-d float64 tensor on the velocities' device: max ``|v| dt`` over this rank's atoms (Å);
    +inf when any velocity, or the skin check's ``displacement`` (0-d), is not finite."""
    m = max_speed(velocities).to(torch.float64) * dt
    if displacement is not None:   # 0 for a finite displacement, NaN for NaN or inf
        m = torch.maximum(m, displacement.detach().reshape(()).to(m.device, torch.float64) * 0)
    return torch.nan_to_num(m, nan=INF, posinf=INF)


def finite_thermo(obs: dict) -> bool:
    """Energies finite, and the pressure where there is a volume (an open cell has none)."""
    keys = ("potential_energy", "kinetic_energy") + (
        ("pressure",) if obs.get("volume", 0) > 1e-9 and obs.get("pressure") is not None else ())
    return all(math.isfinite(float(obs[k])) for k in keys)


def _first_bad(ids: np.ndarray, arrays: dict[str, np.ndarray]) -> tuple[int, str] | None:
    """(id, text) of the lowest-id atom with a non-finite entry in any of ``arrays``."""
    found = None
    for name, a in arrays.items():
        bad = ~np.isfinite(a).all(axis=1) if a.ndim == 2 else ~np.isfinite(a)
        if bad.any():
            i = int(ids[bad].min())
            if found is None or i < found[0]:
                found = (i, f"its {SINGULAR.get(name, name)} is not finite")
    return found


def diagnose(state, dt: float) -> tuple[float, str]:
    """This rank's worst atom: (badness, text); badness inf for a non-finite value, else the
    largest ``|v| dt`` (Å). Host-side: runs on the error path only."""
    ids = state.ids.cpu().numpy()
    if len(ids) == 0:
        return -1.0, ""
    arrays = {k: getattr(state, k).detach().double().cpu().numpy() for k in ("positions", "velocities", "forces")}
    bad = _first_bad(ids, arrays)
    if bad is not None:
        return INF, f"atom id {bad[0]}: {bad[1]}"
    speed = np.linalg.norm(arrays["velocities"], axis=1)
    k = int(np.argmax(speed))
    return float(speed[k] * dt), (f"atom id {int(ids[k])} moved {speed[k] * dt:.3g} Å in one step "
                                  f"(|v| = {speed[k]:.3g} Å/fs)")


def raise_unhealthy(comm, state, dt: float, where: str, what: str = "", bound: float | None = None):
    """Collective: every rank calls this after the same reduced check failed; rank-local
    diagnoses are gathered and the worst is named in one UnhealthyRun raised on every rank."""
    parts = comm.all_gather_object(diagnose(state, dt))
    score, text = max(parts, key=lambda p: p[0])
    if not text:
        text = what or "a non-finite value"
    elif score != INF and bound is not None:
        text += f", more than health.max_step={bound:g} Å"
    err = UnhealthyRun(f"the run blew up {where}: {text}{'; ' + what if what and text != what else ''}. "
                       "Nothing after the last healthy output was written; use a smaller dt, check the "
                       "model and the structure, and continue from the newest checkpoint with restart=auto")
    err.collective = True
    raise err


def check_inputs(state) -> None:
    """Refuse a starting state that cannot be integrated (identical on every rank: collective)."""
    cell = state.cell.detach().double().cpu().numpy()
    if not np.isfinite(cell).all():
        raise CollectiveError("the cell is not finite; give a structure with a finite cell")
    ids = state.ids.cpu().numpy()
    arrays = {k: getattr(state, k).detach().double().cpu().numpy() for k in ("positions", "masses", "velocities")}
    # in this order: a bad mass makes every thermal velocity bad (momentum removal sums them)
    for name, a in arrays.items():
        bad = _first_bad(ids, {name: a})
        if bad is not None:
            raise CollectiveError(f"the structure's atom id {bad[0]}: {bad[1]} (NaN or inf); fix the structure")
        if name == "masses" and (a <= 0).any():
            i = int(ids[a <= 0].min())
            raise CollectiveError(f"atom id {i} has mass {a[ids == i][0]:g} amu; masses must be > 0")
    pbc = state.pbc.cpu().numpy()
    if pbc.any():
        per = cell[pbc]
        # the periodic vectors must be independent (a volume, an area or a length)
        if np.linalg.matrix_rank(per, tol=1e-9 * max(1.0, np.abs(per).max())) < int(pbc.sum()):
            raise CollectiveError("the cell is singular on its periodic axes (vectors of zero length or "
                                  "in one plane); give a proper cell or make those axes non-periodic")
    if pbc.any() and (~pbc).any():   # all-open cells need no frame (molecules, clusters: the list makes one)
        zero = ~pbc & (np.linalg.norm(cell, axis=1) < 1e-9)
        if zero.any() or abs(np.linalg.det(cell)) < 1e-9:
            axis = int(np.flatnonzero(zero if zero.any() else ~pbc)[0])   # a zero vector first, else the first open one
            raise CollectiveError(f"cell vector {axis} (a non-periodic axis) has zero length or is not "
                                  "independent; give the box a vector there, e.g. ase's "
                                  f"atoms.center(vacuum=10.0, axis={axis}) before writing the file")


def close_contacts(comm, pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], min_distance: float) -> None:
    """Collective: refuse atoms closer than ``min_distance`` Å. pairs: this rank's (id_i, id_j,
    distance) of pairs under the bound (owned i); the closest pair overall is named."""
    i, j, d = (p.detach().cpu() for p in pairs)
    local = (float(d.min()), int(i[d.argmin()]), int(j[d.argmin()])) if d.numel() else (INF, -1, -1)
    count = comm.all_reduce(torch.tensor([d.numel()], dtype=torch.int64), "sum")
    dist, a, b = min(comm.all_gather_object(local))
    if dist < min_distance:
        n = int(count[0]) // 2   # full lists hold each pair twice
        raise CollectiveError(f"atoms {min(a, b)} and {max(a, b)} are {dist:.3g} Å apart, closer than "
                              f"health.min_distance={min_distance:g} Å ({n} such pair(s)); fix the "
                              "structure, or set health.min_distance=0 if the contact is intended")
