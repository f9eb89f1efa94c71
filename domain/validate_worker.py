"""Worker of :func:`shardmd.domain.validate.trace_and_validate` (run under ``mpiexec -n K``).

    mpiexec -n K python -m shardmd.domain.validate_worker JOB.pkl RESULT.pkl

JOB.pkl holds a list of cases: the model factory (``'module:qualname'`` and the file to
load it from when the module is not importable), the sample points, the spec as JSON (or
None: the model's own), the ghost width, the neighbour skin and optional grid.  Every rank
builds its domain (owned points by fractional position, halo, neighbour list), runs the
model through :class:`~shardmd.domain.distributed_model.DistributedModel` under a dispatch
trace and sends rank 0 its owned rows, per-system values, raw per-rank values, halo edges
and errors; rank 0 writes the list of results.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pickle
import sys
import traceback

import torch


def load_factory(path: str, file: str | None):
    mod_name, _, qual = path.partition(":")
    try:
        if mod_name == "__main__":   # the launcher's script: never this process's own __main__
            raise ImportError(mod_name)
        mod = importlib.import_module(mod_name)
    except ImportError:
        if not file:
            raise
        name = mod_name if mod_name != "__main__" else "_shardmd_validate_main"
        mod = sys.modules.get(name)
        if mod is None:
            spec = importlib.util.spec_from_file_location(name, file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
    obj = mod
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def edges_within(nl, padded: torch.Tensor, ids: torch.Tensor, cell: torch.Tensor, cutoff: float):
    """(i id, j id, r) of the list's edges shorter than ``cutoff`` (numpy arrays)."""
    ei = nl.edge_index()
    d = padded[ei[1]] + nl.shift_vectors(cell) - padded[ei[0]]
    r = d.norm(dim=1)
    m = r < cutoff
    return ids[ei[0][m]].numpy(), ids[ei[1][m]].numpy(), r[m].numpy()


def rank_domain(comm, s: dict, ghost_width: float, radius: float, grid=None) -> dict:
    """This rank's part of the sample ``s`` (numpy positions, cell, pbc, numbers) laid out as
    the engine does: wrapped, owned points by fractional position, halo, neighbour list
    with the owned points as queries.  Returns a dict with ctx, padded positions, ids,
    numbers, nl, owned ids, ghost ids, grid."""
    from .cell import to_fractional, wrap
    from .context import DomainContext
    from .decomposition import choose_grid
    from .halo import build_halo, local_pbc
    from .neighbors import build_neighbor_list

    dtype = torch.float64
    cell = torch.tensor(s["cell"], dtype=dtype)
    pbc = tuple(bool(p) for p in s["pbc"])
    pos = torch.tensor(s["positions"], dtype=dtype)
    numbers = torch.tensor(s["numbers"], dtype=torch.int64)
    ids = torch.arange(pos.shape[0], dtype=torch.int64)
    pos, _ = wrap(pos, cell, torch.tensor(pbc), torch.zeros(pos.shape[0], 3, dtype=torch.int32))
    g = choose_grid(comm.size, cell, list(pbc), float(ghost_width), shape=grid)
    mine = torch.nonzero(g.owner(to_fractional(pos, cell)) == comm.rank).flatten()
    pos_o, num_o, ids_o = pos[mine], numbers[mine], ids[mine]
    plan, gpos, glab = build_halo(comm, g, cell, list(pbc), pos_o, torch.stack([ids_o, num_o], 1), float(ghost_width))
    padded = torch.cat([pos_o, gpos])
    pids = torch.cat([ids_o, glab[:, 0]])
    pnum = torch.cat([num_o, glab[:, 1]])
    lp = local_pbc(g, list(pbc))
    ctx = DomainContext(comm, g, plan, cell, pbc, lp)
    nl = build_neighbor_list(padded, cell, lp, float(radius), ids=pids, n_query=int(mine.numel()))
    return {"ctx": ctx, "padded": padded, "ids": pids, "numbers": pnum, "nl": nl, "owned_ids": ids_o,
            "ghost_ids": glab[:, 0], "grid": g, "wrapped": pos, "cell": cell, "pbc": pbc}


def run_case(comm, case: dict) -> dict:
    from .collectives import collective_counts
    from .distributed_model import DistributedModel
    from .shard_tensor import dispatch_trace
    from .spec import MLIPSpec
    from .validate_probe import Probe

    factory = load_factory(case["factory"], case.get("factory_file"))
    model = factory()
    # the caller's own spec objects, passed to its ranks (not a file of someone else's)
    spec = MLIPSpec.from_json(case["spec_json"], allow_imports=True) if case.get("spec_json") else None
    d = rank_domain(comm, case["sample"], case["ghost_width"], case["radius"], case.get("grid"))
    ctx, padded, pids, pnum, nl, cell = d["ctx"], d["padded"], d["ids"], d["numbers"], d["nl"], d["cell"]
    ids_o, grid = d["owned_ids"], d["grid"]
    glab = d["ghost_ids"][:, None]
    res = {"rank": comm.rank, "ids": ids_o.numpy(), "ghost_ids": glab[:, 0].numpy(), "grid": grid.shape,
           "error": None, "outputs": {}, "raw": {}, "trace": []}
    res["edges"] = edges_within(nl, padded, pids, cell, float(case["model_cutoff"]))
    dm = DistributedModel(model, spec)
    extras = {k: torch.tensor(v, dtype=padded.dtype)[ids_o] for k, v in (case["sample"].get("extras") or {}).items()}
    try:
        # a compiled forward runs without the probe (a torch-function mode would be traced into its graphs)
        probe = Probe(ctx, dm.spec)
        watch = probe if dm.compiled is None else contextlib.nullcontext()
        with dispatch_trace() as tr, collective_counts() as counts, watch:
            out = dm.compute(ctx, padded, pnum, nl, extras=extras or None)
        res["trace"] = [{"handler": e["handler"], "op": e["op"]} for e in tr]
        res["probe"] = probe.evidence()
        res["collectives"] = dict(counts)
        res["outputs"] = {k: v.detach().cpu().numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}
        res["raw"] = {k: v.detach().cpu().numpy() for k, v in (dm.last_raw or {}).items()
                      if isinstance(v, torch.Tensor) and (v.dim() == 0 or v.shape[0] != padded.shape[0])}
    except Exception as exc:  # noqa: BLE001 - reported to the validator
        msg = str(exc).splitlines()[0] if str(exc) else ""
        res["error"] = f"{type(exc).__name__}: {msg}"
        res["traceback"] = traceback.format_exc(limit=6)
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from .comm import init_comm, shutdown

    comm = init_comm("cpu")
    torch.set_num_threads(1)
    with open(argv[0], "rb") as f:
        cases = pickle.load(f)
    results = []
    for case in cases:
        try:
            r = run_case(comm, case)
        except Exception as exc:  # noqa: BLE001 - set-up failures (grid, import) are reported too
            r = {"rank": comm.rank, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                 "setup_error": True, "traceback": traceback.format_exc(limit=6)}
        results.append(comm.gather_object(r))
    if comm.is_root:
        with open(argv[1], "wb") as f:
            pickle.dump(results, f)
    shutdown(comm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
