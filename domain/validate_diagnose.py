"""trace_and_validate's diagnoses: from the differences between K ranks and one process, the
root cause and the one fix (a code, a message, an action). The codes are listed in
domain/validate.py's docstring; tests/test_validate_diagnoses.py and tests/test_shard_mpi.py hold
one case per code."""
from __future__ import annotations

import numpy as np

from .spec import HaloStorage, MLIPSpec


def helper_diagnostics(ref: dict, ranks: list, spec: MLIPSpec, diffs: dict, atol: float, rtol: float) -> list:
    out = []
    for key, d in diffs.items():
        if d["ok"] or d["kind"] == "per_node":
            continue
        if not all(key in x.get("raw", {}) for x in ranks):
            continue
        r = ref[key]
        tol = atol + rtol * float(np.abs(r).max(initial=0))
        total = sum(np.asarray(x["raw"][key], dtype=np.float64) for x in ranks)
        bound = max(tol, 1e-12 * abs(r).max(initial=1))
        if np.shape(total) == np.shape(r) and float(np.abs(total - r).max(initial=0)) <= bound:
            if key not in spec.all_reduce_outputs:
                out.append({"output": key, "pattern": "per-rank values sum to the reference",
                            "per_rank": [float(np.asarray(x["raw"][key]).sum()) for x in ranks],
                            "diagnosis": "undeclared_helper"})
    return out


def duplicate_keys(ref: dict, diffs: dict, spec: MLIPSpec, k: int) -> list[str]:
    keys = []
    for key in sorted(spec.all_reduce_outputs):
        d = diffs.get(key)
        if d is None or d["ok"] or d.get("value") is None:
            continue
        r = ref[key]
        scale = float(np.abs(r).max(initial=0))
        if scale == 0:
            continue
        if float(np.abs(np.asarray(d["value"]) - k * r).max()) <= max(d["tol"] * k, 1e-12 * k * scale):
            keys.append(key)
    return keys


def _unreduced_system_outputs(ref, ranks, spec, diffs, helpers, fired, atol, rtol) -> list[dict]:
    """Per-system outputs that no reduction handled: summed by the model over every local row
    (``energies.sum()``), ghost copies included.  Evidence, strongest first: each rank's value
    equals a per-point reference output summed over that rank's owned AND ghost rows; else the
    per-system handler never fired and nothing else (all_reduce_outputs, a custom op's adapter,
    a declared helper) reduces the output."""
    out = []
    helped = {h["output"] for h in helpers}
    n = next((r.shape[0] for r in ref.values() if getattr(r, "ndim", 0) >= 1), 0)
    for key, d in diffs.items():
        if d["ok"] or d["kind"] == "per_node" or key in helped or key in spec.all_reduce_outputs:
            continue
        r = np.asarray(ref[key], dtype=np.float64)
        if r.size != 1 or not all(key in x.get("raw", {}) for x in ranks):
            continue
        tol = atol + rtol * max(abs(float(r.reshape(-1)[0])), 1.0)
        per_rank = [float(np.asarray(x["raw"][key]).reshape(-1)[0]) for x in ranks]
        source = None
        for name, v in ref.items():     # a per-point output whose total is this one (energies -> energy)
            v = np.asarray(v, dtype=np.float64)
            if name == key or v.ndim != 1 or v.shape[0] != n or abs(float(v.sum()) - float(r.reshape(-1)[0])) > tol:
                continue
            padded = [float(v[x["ids"]].sum() + v[x["ghost_ids"]].sum()) for x in ranks]
            if all(abs(a - b) <= tol for a, b in zip(per_rank, padded)):
                source = (name, [float(v[x["ghost_ids"]].sum()) for x in ranks])
                break
        action = (f"reduce {key!r} over owned rows only: scatter the per-point values into positions.new_zeros("
                  "n_systems) (the per-system handler drops ghost rows and sums over ranks) or call "
                  "shardmd.domain.api.system_sum(values, batch, n_systems); a plain .sum() over all rows counts the "
                  "ghost copies")
        if source is not None:
            name, ghost = source
            out.append({"code": "ghost_rows_in_sum", "message": f"each rank's {key!r} ({per_rank}) is {name!r} summed "
                        f"over its owned AND ghost rows: the ghost copies are counted (off by their sums {ghost}); "
                        "the wrong forces follow from it", "action": action})
        elif not fired.get("system_reduce") and not spec.distribution.custom_ops:
            out.append({"code": "unreduced_system_output", "message": f"{key!r} differs ({per_rank} per rank) and no "
                        "per-system reduction handled it (the system_reduce handler never fired): it is summed over "
                        "every local row, ghost copies included, and never over ranks", "action": action})
    return out


def _evidence(ranks: list, key: str) -> list:
    return [x.get("probe", {}).get(key) for x in ranks if x.get("probe") is not None]


def adapter_diagnoses(ranks: list, fired: dict) -> list[dict]:
    """``adapter_never_fired``: an adapted op was called with no ShardTensor argument."""
    out = []
    calls: dict = {}
    for ev in _evidence(ranks, "plain_op_calls"):
        for op, n in (ev or {}).items():
            calls[op] = calls.get(op, 0) + n
    for op, n in sorted(calls.items()):
        fires = sum(c for h, c in fired.items() if h.startswith(f"op_adapter:{op}"))
        out.append({"code": "adapter_never_fired" if not fires else "adapter_not_reached", "severity": "error",
                    "message": f"the OpAdapter of {op} did not fire on {n} call(s) (it fired {fires} time(s)): no "
                    "argument of those calls was a ShardTensor (plain tensors made by .detach(), .as_subclass, "
                    "torch.tensor(...) or arithmetic reached the op), so its transforms were never applied",
                    "action": f"pass {op} an argument that carries the decomposition (the positions, or a per-point "
                              "tensor re-wrapped with shard_like(x, positions)); the spec alone cannot reach it"})
    return out


def helper_sum_diagnoses(ranks: list, diffs: dict, helpers: list) -> list[dict]:
    """``helper_sum_reused``: model code summed per-point rows into a small plain target (no
    handler saw it) and outputs differ: a per-rank partial used as if it were global."""
    if helpers or all(d["ok"] for d in diffs.values()):
        return []
    found: dict = {}
    for ev in _evidence(ranks, "plain_reductions"):
        for r in ev or ():
            found.setdefault(r["function"], r)
    out = []
    for fn, r in found.items():
        ghosts = " (ghost copies included)" if r["ghost_rows_included"] else ""
        bad = sorted(k for k, d in diffs.items() if not d["ok"])
        out.append({"code": "helper_sum_reused", "message": f"{fn}() sums per-point rows into a plain tensor of "
                    f"{r['rows']} row(s) on each rank{ghosts}: a per-rank partial that no handler sees and nothing "
                    f"sums over ranks, reused inside the model, so {bad} differ",
                    "action": f"make the sum in {fn}() global: call shardmd.domain.api.system_sum(values, index, "
                              "n) or scatter into positions.new_zeros(n), or declare a PythonAdapter swapping the "
                              "helper for a distribution-aware one"})
    return out


def scatter_output_diagnoses(ranks: list, diffs: dict) -> list[dict]:
    """``missing_scatter_outputs`` from direct evidence: an adapted op's per-point output left
    the op with halo rows that are not copies of their owners' rows."""
    if all(d["ok"] for d in diffs.values()):
        return []
    seen = []
    for ev in _evidence(ranks, "halo_inconsistent"):
        for item in ev or ():
            if tuple(item) not in seen:
                seen.append(tuple(item))
    return [{"code": "missing_scatter_outputs", "message": f"output {k} of {op} has halo rows that are not copies of "
             "their owners' rows (partial sums or values from truncated neighbourhoods) and no transform completes "
             "them; everything computed from it afterwards differs, far from the boundaries too when a global value "
             "depends on it", "action": f"declare ScatterOutputs() on output {k} of {op} (ReverseOutputs() if it is a "
             "final per-point output)"} for op, k in seen]


def gradient_diagnoses(ref, diffs: dict, derivatives, k: int, fired: dict, ranks: list) -> list[dict]:
    """The forward outputs match on K ranks but derivative outputs do not: the backward of a
    collective, not the spec's halo handling, is wrong (or a replicated objective was seeded on
    every rank: derivatives exactly K times the reference)."""
    deriv = [key for key in derivatives if key in diffs]
    forward = [key for key in diffs if key not in derivatives]
    if not deriv or not forward or any(not diffs[key]["ok"] for key in forward):
        return []
    bad = [key for key in deriv if not diffs[key]["ok"]]
    if not bad:
        return []
    counts = [x.get("collectives", {}).get("all_reduce_sum", 0) for x in ranks]
    n_sum = (max(counts) if counts else 0) + fired.get("system_reduce", 0)
    dev = [float(diffs[key]["rel"]) for key in bad]
    if all(abs(d - (k - 1)) < 1e-6 * k for d in dev):
        return [{"code": "replicated_objective_seeded_per_rank", "message": f"{bad} are {k}x the reference while every "
                 "forward output matches: a value identical on every rank (a per-system sum) was differentiated with "
                 "cotangent 1 on every rank, and a backward pass differentiates the sum over ranks of the seeds",
                 "action": "differentiate shardmd.domain.api.seed_once(energy) (it counts a replicated value once), "
                           "or let DistributedModel compute the derivative (ModelConfig.autograd_outputs)"}]
    return [{"code": "collective_backward", "message": f"every forward output matches on {k} ranks but {bad} do not "
             f"(largest relative error {max(dev):.3g}): a value summed over ranks ({n_sum} global sum(s) in the "
             "forward) is reused inside each rank's share of the energy, and the backward of the collective that "
             "formed it is not its adjoint (an all-reduce whose backward is the identity, or a sum over ranks of "
             "detached values), so the other ranks' contributions to its cotangent are lost",
             "action": "form global values with shardmd.domain.api.system_sum, all_reduce_sum or a scatter into "
                       "positions.new_zeros(n_systems) (their backward sums the cotangents over ranks); a custom "
                       "all-reduce must all-reduce in its backward too (docs/distributed.md, 'Gradients through "
                       "collectives')"}]


def coverage_warnings(ranks: list, n: int) -> list[dict]:
    """``halo_covers_system``: every rank holds every point (owned or ghost), so the sample
    cannot show what only a split neighbourhood shows (the comparison is then weak)."""
    full = [x for x in ranks if "ids" in x and len(set(x["ids"].tolist()) | set(x["ghost_ids"].tolist())) >= n]
    if not ranks or len(full) < len(ranks):
        return []
    return [{"code": "halo_covers_system", "message": f"the halo covers the whole sample: every rank holds all {n} "
             "points (owned or as ghosts), so missing exchanges, ghost rows counted twice or wrong gradients through "
             "collectives may go unnoticed; the check is not meaningful",
             "action": "validate on a larger sample (each domain wider than the ghost width, more than two ghost "
                       "widths across the box along split axes) or on more ranks"}]


def diagnose(ref, ranks, spec, diffs, complete, helpers, fired, boundary, k, ghost_width, cutoff,
             atol: float = 0.0, rtol: float = 1e-10, derivatives=()) -> list[dict]:
    out = []
    errors = sorted({x["error"] for x in ranks if x.get("error")})
    for e in errors:
        if e.startswith("TransformError") and "GatherInputs" in e and "already" in e:
            out.append({"code": "extra_gather_inputs",
                        "message": e,
                        "action": "drop the GatherInputs transform named in the message: "
                                  "the input is already halo-padded"})
        elif e.startswith("TransformError"):
            out.append({"code": "transform_error", "message": e,
                        "action": "fix the transform named in the message"})
        else:
            out.append({"code": "worker_error", "message": e,
                        "action": "fix the error raised on the ranks (see message)"})
    if errors:
        return out
    adapters = adapter_diagnoses(ranks, fired)
    out.extend(adapters)
    if not complete["matches"]:
        miss = sum(p["missing_edges"] for p in complete["per_rank"])
        out.append({"code": "halo_too_thin", "message": f"{miss} edges shorter than the model cutoff {cutoff} Å are "
                    f"missing from the ranks' lists (ghost width {ghost_width} Å)",
                    "action": f"widen the halo: the ghost width must be at least the neighbour-list radius (the "
                              f"model cutoff {cutoff} Å plus the skin), whatever the number of layers (the "
                              "per-layer exchange refreshes ghost features); no spec change can recover missing "
                              "edges"})
    for key in duplicate_keys(ref, diffs, spec, k):
        out.append({"code": "duplicate_all_reduce", "message": f"{key!r} is {k}x the reference: reduced twice",
                    "action": f"drop {key!r} from all_reduce_outputs (the per-system handler or an AllReduceSum "
                              "already sums it)"})
    for h in helpers:
        out.append({"code": "undeclared_helper", "message": f"{h['output']!r}: per-rank values {h['per_rank']} sum to "
                    "the reference but are not reduced over ranks",
                    "action": f"declare a PythonAdapter/MethodAdapter (JitAdapter for TorchScript or compiled "
                              f"code) for the helper computing {h['output']!r} (replace it by a distribution-aware "
                              "one such as shardmd.domain.api.system_sum)"})
    reused = helper_sum_diagnoses(ranks, diffs, helpers)
    out.extend(reused)
    system_root = _unreduced_system_outputs(ref, ranks, spec, diffs, helpers, fired, atol, rtol)
    out.extend(system_root)
    direct = scatter_output_diagnoses(ranks, diffs)
    if complete["matches"] and not out:
        direct += gradient_diagnoses(ref, diffs, derivatives, k, fired, ranks)
    out.extend(direct)
    system_root = system_root or direct or reused or adapters
    node_bad = [d for d in diffs.values() if not d["ok"] and d["kind"] == "per_node" and d.get("bad_ids") is not None]
    st = spec.distribution.storage
    mode = st.mode if isinstance(st, HaloStorage) else None
    custom = bool(spec.distribution.custom_ops)
    if complete["matches"] and node_bad and not system_root:
        bad = set(np.concatenate([d["bad_ids"] for d in node_bad]).tolist())
        near = len(bad & boundary)
        pattern = (f"{len(bad)} per-point rows differ, {near} of them points that are halo copies on another rank "
                   "(within the ghost width of a domain boundary) and the rest further inside their domains")
        shown = {h: c for h, c in fired.items() if not h.startswith("_")}
        if mode == "local" and not custom:
            out.append({"code": "no_per_layer_exchange", "message": f"{pattern}: the spec's halo mode is 'local', "
                        "which turns the halo correction off, so scatters into per-point targets are never completed "
                        "across ranks and ghost rows keep features computed from truncated neighbourhoods after the "
                        "first layer (the model has no custom ops: no adapter is missing)",
                        "action": "use HaloStorage('scatter') (the message-passing preset SPEC_MPNN_HALO): its "
                                  "per-layer exchange completes and refreshes ghost rows; 'local' is only for models "
                                  "that complete ghost rows themselves"})
        elif mode in ("scatter", "gather") and not custom and not fired.get("halo_correction"):
            out.append({"code": "plain_scatter_target", "message": f"{pattern}; the halo-correction handler never "
                        f"fired (handlers fired: {shown or 'none'}) although halo mode {mode!r} relies on it: the "
                        "model scatters per-point sums into plain tensors (made with torch.zeros, torch.empty, "
                        "torch.full...), which carry no decomposition, so their ghost rows are sums over truncated "
                        "neighbourhoods and are never refreshed",
                        "action": "allocate per-point scatter targets from the positions, positions.new_zeros(n, F) "
                                  "(or torch.zeros_like of a ShardTensor), not torch.zeros(...): then the halo "
                                  "correction completes them at every layer; no spec change fixes this"})
        elif fired.get("halo_correction"):
            out.append({"code": "halo_correction_mismatch", "message": "the halo-correction handler fired and "
                        "per-point results differ",
                        "action": "check how the model fills halo rows; if it completes them itself, "
                                  "use HaloStorage('local')"})
        elif bad and bad <= boundary:
            out.append({"code": "missing_scatter_outputs", "message": f"{len(bad)} per-point rows differ, all of them "
                        "points that are halo copies on another rank: halo partial sums never reach their owners",
                        "action": "declare ScatterOutputs() (or ReverseOutputs() for final per-point outputs) on the "
                                  "op output that accumulates per-point sums"})
    if not out and any(not d["ok"] for d in diffs.values()):
        bad = [k2 for k2, d in diffs.items() if not d["ok"]]
        out.append({"code": "mismatch", "message": f"outputs {bad} differ from the reference",
                    "action": "inspect attempts[-1].diffs; run with the dispatch trace to see which handlers fired"})
    return out
