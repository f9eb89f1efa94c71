"""trace_and_validate: does a model give the single-process answer on K real ranks?

    report = trace_and_validate(make_model, sample, world_size=3, atol=0.0, rtol=1e-10)
    report.ok, report.spec, report.fix_applied, report.next_action, report.attempts

1. Reference: the model alone on one process (no ShardTensor, no adapters), autograd
   outputs by ``torch.autograd.grad``; plus the same call through a one-domain
   DistributedModel under a dispatch trace (which handlers the spec engages).
2. ``world_size`` real ranks: ``mpiexec -n world_size python -m
   shardmd.domain.validate_worker`` (gloo; CUDA data would be staged through the host),
   each rank owning the points of its domain, with halo and neighbour list as the engine
   builds them, through DistributedModel.
3. Comparison: per output, the largest elementwise error after matching per-point rows by
   global id, against ``atol + rtol * max|reference|``.  (A min-over-measures metric would
   let wrong forces pass because forces sum to zero either way.)
4. Auto-fixes, tried in this order, the first that passes wins:
   ``drop_duplicate_all_reduce`` (a per-system output listed in ``all_reduce_outputs`` came
   back ``world_size`` times the reference: drop it from the set) and
   ``halo_correction_to_local`` (the halo-correction handler fired, the halo is complete
   and the results differ, diagnosed ``halo_correction_mismatch``: switch the halo mode to
   ``local``) and ``halo_mode_to_scatter`` (halo mode ``local`` on a model without custom
   ops, diagnosed ``no_per_layer_exchange``: switch it to ``scatter``).  Candidate variants run in
   the same launch as the first attempt; a variant is reported only when its rule applies.
5. Diagnostics per attempt: ``halo_completeness`` (each rank's edges shorter than the
   model cutoff vs the single-process list), ``helper_diagnostics`` (a per-system output
   whose per-rank values sum to the reference but is not reduced: an undeclared helper),
   ``diagnosis`` (codes: ``extra_gather_inputs``, ``transform_error``, ``worker_error``,
   ``halo_too_thin``, ``duplicate_all_reduce``, ``undeclared_helper``,
   ``missing_scatter_outputs``, ``halo_correction_mismatch``, ``no_per_layer_exchange``,
   ``plain_scatter_target``, ``ghost_rows_in_sum``, ``unreduced_system_output``, ``adapter_never_fired``,
   ``adapter_not_reached``, ``helper_sum_reused``, ``collective_backward``,
   ``replicated_objective_seeded_per_rank``, ``mismatch``), from the outputs and what each rank's
   :class:`~shardmd.domain.validate_probe.Probe` saw; ``warnings`` (``halo_covers_system``).
   A diagnosis with ``severity: error`` fails the attempt even when the outputs match.
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .cell import wrap
from .comm import Comm
from .context import DomainContext
from .decomposition import DomainGrid
from .derivatives import apply_strain, fill_derivative_outputs, strain_leaf
from .distributed_model import DistributedModel
from .halo import HaloPlan
from .neighbors import build_neighbor_list
from .shard_tensor import dispatch_trace, plain
from .spec import SPEC_MPNN_HALO, HaloStorage, MLIPSpec, OutputKind
from .validate_diagnose import coverage_warnings, diagnose, duplicate_keys, helper_diagnostics


@dataclass
class Attempt:
    spec: MLIPSpec
    rule: str | None
    ok: bool
    diffs: dict
    halo_completeness: dict
    helper_diagnostics: list
    diagnosis: list
    handlers_fired: dict
    error: str | None = None
    warnings: list = field(default_factory=list)


@dataclass
class TraceReport:
    ok: bool
    spec: MLIPSpec
    attempts: list
    next_action: str
    fix_applied: str | None
    world_size: int
    reference_trace: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def summary(self) -> str:
        a = self.attempts[-1]
        errs = ", ".join(f"{k}: {v['max_abs_err']:.3g}/{v['scale']:.3g}" for k, v in a.diffs.items())
        return (f"{'OK' if self.ok else 'FAIL'} on {self.world_size} ranks, {len(self.attempts)} attempt(s), "
                f"fix {self.fix_applied}; {errs or a.error}")


# -- sample ----------------------------------------------------------------------------------------
def _point_array(sample, name: str):
    if isinstance(sample, dict):
        return sample.get(name, (sample.get("extras") or {}).get(name))
    arrays = getattr(sample, "arrays", {}) or {}
    if name in arrays:
        return arrays[name]
    if name == "charges" and "initial_charges" in arrays:     # ase.Atoms(charges=...)
        return arrays["initial_charges"]
    return getattr(sample, name, None)


def sample_arrays(sample, point_inputs=()) -> dict:
    """positions, cell, pbc, numbers (numpy) of an ase.Atoms or any object with those
    attributes/keys, and ``extras``: the per-point inputs named in ``point_inputs`` that the
    sample has (a dict key, an ase array; ``charges`` also from ase's initial charges)."""
    get = (lambda k: sample[k]) if isinstance(sample, dict) else (lambda k: getattr(sample, k))
    cell = np.asarray(get("cell"), dtype=np.float64).reshape(3, 3)
    pbc = np.asarray(get("pbc"), dtype=bool).reshape(-1)
    if pbc.size == 1:
        pbc = np.repeat(pbc, 3)
    extras = {}
    for name in point_inputs:
        v = _point_array(sample, name)
        if v is not None:
            extras[name] = np.asarray(v, dtype=np.float64)
    return {"positions": np.asarray(get("positions"), dtype=np.float64), "cell": cell, "pbc": pbc,
            "numbers": np.asarray(get("numbers"), dtype=np.int64), "extras": extras}


def _factory_path(factory) -> tuple[str, str | None]:
    if isinstance(factory, str):
        return factory, None
    mod, qual = factory.__module__, factory.__qualname__
    if "<" in qual:
        raise ValueError(f"model_factory {qual} must be defined at module scope (workers import it by name)")
    m = sys.modules.get(mod)
    return f"{mod}:{qual}", getattr(m, "__file__", None)


def _model_cutoff(model) -> float:
    cfg = getattr(model, "model_config", None)
    if cfg is not None and cfg.neighbors.cutoff:
        return float(cfg.neighbors.cutoff)
    return float(model.cutoff)


# -- reference -------------------------------------------------------------------------------------
def reference_run(model, s: dict, radius: float, spec: MLIPSpec) -> tuple[dict, dict, dict]:
    """(outputs, trace counts, edges by centre) of the model on one process."""
    dtype = torch.float64
    cell = torch.tensor(s["cell"], dtype=dtype)
    pbc = tuple(bool(p) for p in s["pbc"])
    pos = torch.tensor(s["positions"], dtype=dtype)
    pos, _ = wrap(pos, cell, torch.tensor(pbc), torch.zeros(pos.shape[0], 3, dtype=torch.int32))
    numbers = torch.tensor(s["numbers"], dtype=torch.int64)
    n = pos.shape[0]
    ids = torch.arange(n)
    nl = build_neighbor_list(pos, cell, pbc, radius, ids=ids)
    cfg = getattr(model, "model_config", None)
    auto = dict(cfg.autograd_outputs) if cfg is not None else {}
    strain = dict(cfg.strain_outputs) if cfg is not None else {}
    own = set(cfg.autograd_inputs) if cfg is not None else set()
    names = set(cfg.point_inputs) if cfg is not None else set()
    extras = {k: torch.tensor(v, dtype=dtype).requires_grad_(k in own) for k, v in (s.get("extras") or {}).items()
              if k in names}
    leaf = pos.detach().clone().requires_grad_(bool(auto or strain or "positions" in own))
    with torch.enable_grad():
        x, c, eps = leaf, cell, None
        if strain:
            eps = strain_leaf(dtype, leaf.device)
            x, c = apply_strain(leaf, cell, eps)
        raw = dict(model.compute(x, c, pbc, numbers, nl, **extras))
        if auto or strain:
            fill_derivative_outputs(raw, leaf, auto, eps, strain, cell)
    ref = {k: plain(v).detach().numpy() for k, v in raw.items() if isinstance(v, torch.Tensor)}
    # the same call through a one-domain DistributedModel, traced
    plan = HaloPlan(n_owned=n, ghost_shift=torch.zeros(0, 3, dtype=torch.int32))
    ctx = DomainContext(Comm(), DomainGrid((1, 1, 1)), plan, cell, pbc, pbc)
    counts: dict = {}
    try:
        with dispatch_trace() as tr:
            one = DistributedModel(model, spec).compute(ctx, pos, numbers, nl,
                                                        extras={k: v.detach() for k, v in extras.items()} or None)
        for e in tr:
            counts[e["handler"]] = counts.get(e["handler"], 0) + 1
        dev = max((float(np.abs(one[k].numpy() - ref[k]).max()) for k in ref if k in one and ref[k].size), default=0.0)
        counts["_max_dev_from_plain"] = dev
    except Exception as exc:  # noqa: BLE001
        counts["_error"] = f"{type(exc).__name__}: {exc}"
    from .validate_worker import edges_within

    edges = edges_within(nl, pos, ids, cell, _model_cutoff(model))
    return ref, counts, _edge_map(*edges)


def _edge_map(i, j, r) -> dict:
    m: dict = {}
    for a, b, d in zip(i.tolist(), j.tolist(), r.tolist()):
        m.setdefault((a, b), []).append(d)
    for v in m.values():
        v.sort()
    return m


# -- launching ---------------------------------------------------------------------------------------
def find_mpiexec() -> str:
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        if (here / name).exists():
            return str(here / name)
        w = shutil.which(name)
        if w:
            return w
    raise RuntimeError("trace_and_validate needs an MPI launcher (mpiexec); install one (pip install mpich)")


def launch_workers(cases: list[dict], world_size: int, timeout: float = 600.0) -> list:
    """Run ``cases`` on ``world_size`` ranks in one launch; per case, the list of rank results."""
    exe = find_mpiexec()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    cmd = [exe, "-n", str(world_size)]
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="shardmd-validate-") as tmp:
        job, out = Path(tmp) / "job.pkl", Path(tmp) / "out.pkl"
        job.write_bytes(pickle.dumps(cases))
        r = subprocess.run(cmd + [sys.executable, "-m", "shardmd.domain.validate_worker", str(job), str(out)],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0 or not out.exists():
            tail = (r.stderr or r.stdout)[-2000:]
            raise RuntimeError(f"validation workers failed (exit {r.returncode}): {tail}")
        return pickle.loads(out.read_bytes())


# -- comparison and diagnosis ---------------------------------------------------------------------------
def _assemble(ranks: list, key: str, n: int):
    rows = [(r["ids"], r["outputs"][key]) for r in ranks]
    if not all(v.ndim and v.shape[0] == ids.shape[0] for ids, v in rows):
        return None
    ids = np.concatenate([a for a, _ in rows])
    if ids.shape[0] != n or not np.array_equal(np.sort(ids), np.arange(n)):
        return None
    vals = np.concatenate([v for _, v in rows])
    out = np.empty_like(vals)
    out[ids] = vals
    return out


def compare(ref: dict, ranks: list, spec: MLIPSpec, n: int, atol: float, rtol: float) -> dict:
    diffs = {}
    for key, r in ref.items():
        kind = spec.kind_of(key)
        have = all(key in x["outputs"] for x in ranks)
        if not have:
            diffs[key] = {"kind": kind.value, "max_abs_err": float("inf"), "scale": float(np.abs(r).max(initial=0)),
                          "ok": False, "note": "missing from the distributed outputs"}
            continue
        per_point = r.ndim >= 1 and r.shape[0] == n and kind != OutputKind.PER_GRAPH and n > 1
        if per_point:
            d = _assemble(ranks, key, n)
            note = None if d is not None else "per-point rows do not cover every id once"
        else:
            vals = [x["outputs"][key] for x in ranks]
            d = vals[0]
            spread = max(float(np.abs(v - d).max(initial=0)) for v in vals)
            note = f"differs between ranks by {spread:.3g}" if spread > 0 else None
        scale = float(np.abs(r).max(initial=0.0))
        if d is None or np.shape(d) != np.shape(r):
            err = float("inf")
            bad_ids = None
            note = note or f"shape {np.shape(d)} vs reference {np.shape(r)}"
        else:
            delta = np.abs(np.asarray(d, dtype=np.float64) - r)
            err = float(delta.max(initial=0.0))
            bad_ids = None
            if per_point:
                row_err = delta.reshape(n, -1).max(1)
                bad_ids = np.nonzero(row_err > atol + rtol * scale)[0]
        tol = atol + rtol * scale
        diffs[key] = {"kind": "per_node" if per_point else kind.value, "max_abs_err": err, "scale": scale,
                      "rel": err / scale if scale else err, "tol": tol, "ok": bool(err <= tol) and note is None,
                      "note": note, "bad_ids": bad_ids, "value": None if per_point else d}
    return diffs


def halo_completeness(ranks: list, ref_edges: dict) -> dict:
    per_rank = []
    for x in ranks:
        if "edges" not in x:
            continue
        got = _edge_map(*x["edges"])
        owned = set(x["ids"].tolist())
        want = {k: v for k, v in ref_edges.items() if k[0] in owned}
        missing = extra = 0
        for k, v in want.items():
            g = got.get(k, [])
            if len(g) < len(v):
                missing += len(v) - len(g)
            elif any(abs(a - b) > 1e-8 for a, b in zip(g, v)):
                missing += 1
        for k, g in got.items():
            extra += max(0, len(g) - len(want.get(k, [])))
        per_rank.append({"rank": x["rank"], "missing_edges": missing, "extra_edges": extra})
    matches = bool(per_rank) and all(p["missing_edges"] == 0 and p["extra_edges"] == 0 for p in per_rank)
    return {"matches": matches, "per_rank": per_rank}


# -- the validator ---------------------------------------------------------------------------------------
def _fix_candidates(spec: MLIPSpec) -> list[tuple[str, MLIPSpec]]:
    c = []
    if spec.all_reduce_outputs:
        c.append(("drop_duplicate_all_reduce", None))  # resolved after the first attempt (needs the keys)
    st = spec.distribution.storage
    if isinstance(st, HaloStorage) and st.mode != "local":
        c.append(("halo_correction_to_local", spec.with_storage(HaloStorage("local"))))
    if isinstance(st, HaloStorage) and st.mode == "local" and not spec.distribution.custom_ops:
        c.append(("halo_mode_to_scatter", spec.with_storage(HaloStorage("scatter"))))
    return c


def _drop_variants(spec: MLIPSpec) -> list[MLIPSpec]:
    """Every single-key drop from all_reduce_outputs, and dropping them all (run
    speculatively in the first launch; used only when the dropped keys are exactly the
    ones found duplicated)."""
    keys = sorted(spec.all_reduce_outputs)
    out = [spec.replace(all_reduce_outputs=spec.all_reduce_outputs - {k}) for k in keys]
    if len(keys) > 1:
        out.append(spec.replace(all_reduce_outputs=frozenset()))
    return out


def validate_many(jobs: list[dict], world_size: int, timeout: float = 600.0) -> list[TraceReport]:
    """Validate several (model_factory, sample, ...) jobs on ``world_size`` ranks in ONE launch.

    Each job is a dict of :func:`trace_and_validate` keyword arguments (without world_size)."""
    prepared, cases = [], []
    for job in jobs:
        p = _prepare(**job)
        p["first_case"] = len(cases)
        cases.extend(p["cases"])
        prepared.append(p)
    results = launch_workers(cases, world_size, timeout=timeout)
    return [_finish(p, results[p["first_case"]:p["first_case"] + len(p["cases"])], world_size) for p in prepared]


def trace_and_validate(model_factory, sample_system, world_size: int, atol: float = 0.0, rtol: float = 1e-10,
                       spec: MLIPSpec | None = None, ghost_width: float | None = None, skin: float = 0.5,
                       grid=None, auto_fix: bool = True, timeout: float = 600.0) -> TraceReport:
    """Validate ``model_factory()`` (a module-scope callable, or ``'module:qualname'``) on
    ``world_size`` real ranks against one process; see the module docstring.

    sample_system: ase.Atoms or an object/dict with positions, cell, pbc, numbers;
    spec: the spec to start from (default: the model's ``distribution_spec``, else the MPNN
    halo preset); ghost_width: halo width in Å (default cutoff + skin); grid: domain grid
    shape (default: the engine's choice); atol/rtol: pass when every output's largest
    elementwise error is <= atol + rtol * max|reference|.
    """
    return validate_many([dict(model_factory=model_factory, sample_system=sample_system, atol=atol, rtol=rtol,
                               spec=spec, ghost_width=ghost_width, skin=skin, grid=grid, auto_fix=auto_fix)],
                         world_size, timeout=timeout)[0]


def _prepare(model_factory, sample_system, atol=0.0, rtol=1e-10, spec=None, ghost_width=None, skin=0.5, grid=None,
             auto_fix=True) -> dict:
    path, file = _factory_path(model_factory)
    factory = model_factory if callable(model_factory) else None
    if factory is None:
        from .validate_worker import load_factory

        factory = load_factory(path, None)
    model = factory()
    spec = spec or getattr(model, "distribution_spec", None) or SPEC_MPNN_HALO
    cfg = getattr(model, "model_config", None)
    s = sample_arrays(sample_system, cfg.point_inputs if cfg is not None else ())
    cutoff = _model_cutoff(model)
    gw = float(ghost_width) if ghost_width is not None else cutoff + skin
    radius = cutoff + skin
    ref, ref_trace, ref_edges = reference_run(model, s, radius, spec)
    variants = [("initial", spec)]
    if auto_fix:
        variants += [("drop_duplicate_all_reduce", v) for v in _drop_variants(spec)]
        variants += [(name, v) for name, v in _fix_candidates(spec) if v is not None]
    base = {"factory": path, "factory_file": file, "sample": s, "ghost_width": gw, "radius": radius,
            "model_cutoff": cutoff, "grid": tuple(grid) if grid is not None else None}
    cases = [dict(base, spec_json=v.to_json()) for _, v in variants]
    derivs = set(cfg.autograd_outputs) | set(cfg.strain_outputs) if cfg is not None else set()
    if cfg is not None and cfg.autograd_inputs:    # the model differentiates itself: its reversed outputs
        derivs |= set(spec.reverse_outputs)
    return {"variants": variants, "cases": cases, "ref": ref, "ref_trace": ref_trace, "ref_edges": ref_edges,
            "n": s["positions"].shape[0], "atol": atol, "rtol": rtol, "ghost_width": gw, "cutoff": cutoff,
            "derivatives": derivs}


def _attempt(p: dict, rule, spec, ranks, k) -> Attempt:
    errors = [x["error"] for x in ranks if x.get("error")]
    fired: dict = {}
    for e in ranks[0].get("trace", []):
        fired[e["handler"]] = fired.get(e["handler"], 0) + 1
    boundary = set(np.concatenate([x.get("ghost_ids", np.zeros(0, np.int64)) for x in ranks]).tolist())
    complete = halo_completeness(ranks, p["ref_edges"])
    if errors:
        diffs, helpers = {}, []
    else:
        diffs = compare(p["ref"], ranks, spec, p["n"], p["atol"], p["rtol"])
        helpers = helper_diagnostics(p["ref"], ranks, spec, diffs, p["atol"], p["rtol"])
    diag = diagnose(p["ref"], ranks, spec, diffs, complete, helpers, fired, boundary, k, p["ghost_width"], p["cutoff"],
                    p["atol"], p["rtol"], p.get("derivatives", ()))
    ok = not errors and all(d["ok"] for d in diffs.values()) and not any(d.get("severity") == "error" for d in diag)
    for d in diffs.values():
        d.pop("value", None)
    return Attempt(spec=spec, rule=rule, ok=ok, diffs=diffs, halo_completeness=complete, helper_diagnostics=helpers,
                   diagnosis=diag, handlers_fired=fired, error=errors[0] if errors else None,
                   warnings=coverage_warnings(ranks, p["n"]))


def _finish(p: dict, results: list, k: int) -> TraceReport:
    variants = p["variants"]
    # keep the raw values for the rules before _attempt drops them
    first_ranks = results[0]
    first = _attempt(p, None, variants[0][1], first_ranks, k)
    attempts = [first]
    fix = None
    if not first.ok and not first.error:
        ref_diffs = compare(p["ref"], first_ranks, variants[0][1], p["n"], p["atol"], p["rtol"])
        dup = set(duplicate_keys(p["ref"], ref_diffs, variants[0][1], k))
        halo_ok = first.halo_completeness["matches"]
        first_code = first.diagnosis[0]["code"] if first.diagnosis else None
        for (rule, spec), ranks in zip(variants[1:], results[1:]):
            if rule == "drop_duplicate_all_reduce":
                dropped = variants[0][1].all_reduce_outputs - spec.all_reduce_outputs
                applies = bool(dup) and dropped == dup
            elif rule == "halo_correction_to_local":
                applies = (bool(first.handlers_fired.get("halo_correction")) and halo_ok
                           and first_code == "halo_correction_mismatch")
            elif rule == "halo_mode_to_scatter":
                applies = first_code == "no_per_layer_exchange"
            else:
                applies = False
            if not applies:
                continue
            a = _attempt(p, rule, spec, ranks, k)
            attempts.append(a)
            if a.ok:
                fix = rule
                break
    ok = attempts[-1].ok
    if ok:
        spec = attempts[-1].spec
        nxt = ("none: the spec validates" + (f" after the auto-fix {fix}" if fix else "")
               + "; save it with report.spec.save(path)")
    else:
        spec = min(attempts, key=_badness).spec
        d = first.diagnosis
        nxt = d[0]["action"] if d else "inspect attempts[-1].diffs"
    for w in first.warnings:
        warnings.warn(f"trace_and_validate: {w['message']}", RuntimeWarning, stacklevel=3)
    return TraceReport(ok=ok, spec=spec, attempts=attempts, next_action=nxt, fix_applied=fix, world_size=k,
                       reference_trace=p["ref_trace"], reference={k2: v for k2, v in p["ref"].items()},
                       warnings=first.warnings)


def _badness(a: Attempt) -> float:
    if a.error:
        return float("inf")
    if not a.diffs:
        return 0.0
    return max((d["max_abs_err"] / d["tol"] if d["tol"] else d["max_abs_err"]) for d in a.diffs.values())


__all__ = ["Attempt", "TraceReport", "launch_workers", "reference_run", "trace_and_validate", "validate_many"]
