"""A run's set-up stages, one function each, in the order ``Simulation.__init__`` calls them:

1. :func:`job_ranks`     the ranks (the launcher's, else one) and ``domains`` checked against them
2. :func:`check_outputs_of`  output names, kinds and locks, before anything is built
3. :func:`device_of`     the rank's device (CUDA refused where there is none) and torch threads
4. :func:`the_model`     the configured model built, or a given one checked; its origin record
5. :func:`starting_state` a checkpoint's state, the configured system (sizes checked before it is
                         built) or a given State with velocities per ``system.velocities``
6. :func:`check_state`   finite inputs, sizes against memory, species the model knows
7. :func:`domain_grid`   the grid (a barostat's restart keeps its first grid) and reference cell
8. :func:`skin_check`    the deferred skin check where it is on

Every stage raises :class:`UserError` with one line; none keeps state of its own.
"""
from __future__ import annotations

import torch

from shardmd.domain.comm import Comm
from shardmd.domain.distributed_model import DistributedModel
from shardmd.domain.distributed_sum import DistributedSum
from shardmd.domain.spec import SPEC_MPNN_HALO
from shardmd.engine.config import guard as config_guard
from shardmd.engine.config.compose import to_container
from shardmd.engine.config.terms import with_term_defaults
from shardmd.engine.errors import CollectiveError, UserError
from shardmd.engine.io.checkpoint import api_model_origin
from shardmd.engine.io.output_lock import refuse_if_in_use
from shardmd.engine.launch.parallel import thread_choice
from shardmd.engine.run import health, model_inputs
from shardmd.engine.run import restart as restart_mod
from shardmd.engine.run.preflight import check_builder, check_outputs, check_size, local_ranks
from shardmd.engine.run.skin_check import DeferredSkinCheck
from shardmd.engine.run.state import State
from shardmd.engine.run.system import given_state_velocities, initial_state
from shardmd.models import build_model, check_model, model_origin

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def job_ranks(cfg, comm: Comm | None):
    """(cfg, comm): the launcher's ranks (mpiexec, srun, torchrun), else one; ``domains=1`` (the
    default) under a launcher follows its rank count, another count than the launcher's is refused."""
    if comm is None:
        from shardmd.engine.launch.parallel import job_comm, under_launcher

        comm = job_comm(str(cfg.device), float(cfg.health.rank_silence)) if under_launcher() else Comm()
    if cfg.domains == 1 and comm.size > 1:
        cfg = cfg.copy()
        cfg.domains = comm.size
    if cfg.domains != comm.size:
        raise UserError(f"domains={cfg.domains} but this job has {comm.size} rank(s); "
                        f"start it with domains={cfg.domains} alone or under mpiexec -n {cfg.domains}")
    return cfg, comm


def check_outputs_of(cfg, comm: Comm) -> None:
    """Names, kinds, input-is-not-output, then a running job's lock (said before "exists" or a
    restart's verdicts); collective: the same paths on every rank."""
    try:
        check_outputs(cfg)
    except UserError as exc:
        raise CollectiveError(str(exc)) from None
    refuse_if_in_use(comm, cfg.output)


#: the threads device_of chose last and why (the log's header says what was set, not a second guess)
_CHOICE: list = []


def device_of(cfg, comm: Comm) -> torch.device:
    """This rank's device (the launcher's local GPU under several ranks); sets torch's threads."""
    device = comm.device if comm.size > 1 else torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={cfg.device}: CUDA is not available on this machine; use device=cpu")
    _CHOICE[:] = [int(cfg.threads), f"threads={int(cfg.threads)}"] if int(cfg.threads) else thread_choice(comm.size)
    torch.set_num_threads(_CHOICE[0])
    if device.type == "cpu" and cfg.get("malloc", "system") == "keep":
        from shardmd.engine.run.malloc import keep_freed_memory

        keep_freed_memory()   # engine/run/malloc.py: large freed blocks kept for the next step
    return device


def threads_line(cfg, comm: Comm, device) -> str:
    """The log's words for the torch threads a rank took: ``threads N (why)``; "" on a GPU."""
    if device.type != "cpu":
        return ""
    n, why = _CHOICE or ([int(cfg.threads), f"threads={int(cfg.threads)}"] if int(cfg.threads)
                         else thread_choice(comm.size))
    kept = ""
    if cfg.get("malloc", "system") == "keep":
        from shardmd.engine.run.malloc import keep_freed_memory

        kept = ", malloc keep" if keep_freed_memory() else ", malloc keep (not glibc: its defaults kept)"
    return f", threads {n} ({why}){kept}"


def the_model(cfg, model, dtype: torch.dtype, device) -> tuple[DistributedModel, dict]:
    """(wrapped model, origin record): ``cfg.model`` built when ``model`` is None, else ``model``
    checked against models/contract.py; made in parts where ``subdomains`` > 1."""
    if model is None:
        try:
            model = build_model(with_term_defaults(to_container(cfg.model)), dtype, device,
                                allow_imports=config_guard.allowed())
        except (ValueError, KeyError, NotImplementedError) as exc:
            # a KeyError's str() is its repr: its message is args[0]
            raise UserError(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)) from None
        origin = model_origin(to_container(cfg.model))
    else:
        try:
            check_model(model, f"the model given to Simulation ({type(model).__name__})")
        except ValueError as exc:
            raise UserError(str(exc)) from None
        origin = api_model_origin(model)
    dmodel = model if isinstance(model, DistributedModel) else wrap_model(model)
    return in_parts(cfg, dmodel), origin


def in_parts(cfg, dmodel):
    """``dmodel`` called in ``subdomains`` parts (domain/subdomains.py) when that is > 1: for a
    model whose energy counts a list's ``n_counted`` rows (``counts_rows``: models/mace.py)."""
    count = int(cfg.get("subdomains", 1))   # 0: as few parts as the memory needs (engine/run/preflight.py)
    if count == 1:
        return dmodel
    inner = getattr(dmodel, "model", None)
    if not getattr(inner, "counts_rows", False) or not getattr(inner, "layers", None):
        raise UserError(f"subdomains={count}: the model {type(inner).__name__} cannot be evaluated in parts (it must "
                        "count the energies of a part's own atoms: mace, nequip, sevennet, allegro and mattersim do); "
                        "use subdomains=1")
    if int(cfg.domains) > 1:
        raise UserError(f"subdomains={count} with domains={int(cfg.domains)}: parts run on one domain per process "
                        "for now; use domains=1 with subdomains, or domains without subdomains")
    if cfg.system.get("frames") or cfg.system.get("files"):
        raise UserError(f"subdomains={count} with many systems (system.frames/files): each system is one piece; "
                        "use subdomains=1")
    from shardmd.domain.subdomains import PartedModel

    # one CUDA graph per part would keep each part's activations: parts run eagerly
    inner.graph_max_points = None
    return PartedModel(dmodel, count, inner.layers, float(cfg.neighbor.skin), _by_layer(cfg, inner))


def _by_layer(cfg, model) -> bool:
    """``parts_by_layer``: whether the call in parts goes layer by layer (the model's
    ``call_layer``, domain/layered_parts.py); true asks for it and refuses a model that cannot."""
    asked = cfg.get("parts_by_layer", "auto")
    if asked is False or asked == "false":
        return False
    problem = model.layer_problem() if hasattr(model, "layer_problem") else f"a {type(model).__name__}"
    if problem and asked is True:
        raise UserError(f"parts_by_layer=true: the model is {problem}, which is not called layer by layer "
                        "(mace's MACE and ScaleShiftMACE and sevenn's SevenNet are); use parts_by_layer=auto or false")
    return problem is None


def parts_line(dmodel, state) -> str:
    """The header's words for a call made in parts: ``, subdomains 8 (grid 2x2x2)``."""
    if not hasattr(dmodel, "reach") or dmodel.count == 1:
        return ""
    from shardmd.domain.subdomains import part_grid

    grid = part_grid(dmodel.count, state.cell, [bool(p) for p in state.pbc], dmodel.reach)
    how = "layer by layer, " if dmodel.by_layer else ""
    return f", subdomains {dmodel.count} (grid {'x'.join(map(str, grid))}, {how}reach {dmodel.reach:g} Å)"


def wrap_model(model) -> DistributedModel:
    """``DistributedModel`` of a bare model: its own spec or output kinds, else the
    message-passing halo preset (models/contract.py)."""
    if isinstance(model, DistributedSum):   # model=sum: every term wrapped by its own spec already
        return model
    if getattr(model, "distribution_spec", None) is None and not getattr(model, "output_kinds", None):
        return DistributedModel(model, spec=SPEC_MPNN_HALO)
    return DistributedModel(model)


def starting_state(cfg, state: State | None, checkpoint_in: dict | None, integrator, dtype, device,
                   dmodel: DistributedModel | None = None):
    """(state, reference): the checkpoint's (its thermostat's chain loaded into ``integrator``;
    ``reference``: the positions of its last rebuild, from which its lists are rebuilt), else the
    configured system's (its size checked before it is built), else ``state`` given through the
    API with velocities per ``system.velocities`` and ``temperature`` as for a file.  The
    inputs ``dmodel`` declares (charges, total charge, spin: engine/run/model_inputs.py) come
    with it: the checkpoint's or the given state's, else from the config and the structure."""
    kw = {"zero_momentum": integrator.conserves_momentum}

    def inputs(s: State, atoms=None) -> State:
        return s if dmodel is None else model_inputs.complete(cfg, s, dmodel, atoms)

    if checkpoint_in is not None:
        state, reference = restart_mod.state_from_checkpoint(checkpoint_in, dtype, device)
        if hasattr(integrator, "load_state_dict"):
            integrator.load_state_dict(checkpoint_in["integrator"])
        return inputs(state), reference
    if state is None:
        if "limits" in cfg:   # the builder's size before it builds
            check_builder(cfg, local_ranks(int(cfg.domains)))
        return initial_state(cfg, dtype, device, integrator.degrees_of_freedom, inputs=inputs, **kw), None
    state = state.to(device)   # a state built from ase.Atoms lives on the CPU
    return inputs(given_state_velocities(cfg, state, integrator.degrees_of_freedom, **kw)), None


def check_state(cfg, comm: Comm, state: State, dmodel: DistributedModel, device) -> None:
    """Finite inputs, sizes against limits and memory, and species the model knows."""
    health.check_inputs(state)
    parts = None
    if hasattr(dmodel, "reach"):   # one layer's activations alive, and the features kept, when by layer
        layered = dmodel.by_layer
        parts = {"count": dmodel.count, "reach": dmodel.reach, "alive": 1.0 / dmodel.layers if layered else 1.0,
                 "atom_bytes": getattr(dmodel.model, "layer_feature_bytes", 0) if layered else 0}
    check_size(cfg, comm, state, dmodel.cutoff + float(cfg.neighbor.skin), device, dmodel.model, parts)
    if parts is not None:   # made in parts: parts as wide as the model's reach, before any file opens
        from shardmd.domain.subdomains import part_grid

        dmodel.count = parts["count"]   # subdomains=0: the count the memory needs
        try:
            part_grid(dmodel.count, state.cell, [bool(p) for p in state.pbc], dmodel.reach)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if hasattr(dmodel.model, "check_species"):
        try:
            dmodel.model.check_species(state.numbers)
        except ValueError as exc:
            raise UserError(str(exc)) from None


def domain_grid(cfg, checkpoint_in: dict | None, restored: bool, barostat: bool, size: int):
    """(grid or None for the automatic one, reference cell or None): a barostat's restart (or
    a cell relaxation's: its checkpoint holds the cell too) rebuilds its lists in the cell of its
    last rebuild, on the grid chosen for the first cell (the cell's shape has changed since)."""
    grid = None if cfg.grid is None else [int(g) for g in cfg.grid]
    saved = checkpoint_in["integrator"] if restored else {}
    if not (restored and (barostat or "minimizer" in checkpoint_in) and "reference_cell" in saved):
        return grid, None
    g = saved.get("grid")
    if grid is None and g is not None and g[0] * g[1] * g[2] == size:
        grid = [int(x) for x in g]
    return grid, torch.tensor(saved["reference_cell"], dtype=torch.float64)


def skin_check(cfg, device, model) -> DeferredSkinCheck | None:
    """The skin check read back only at scheduled steps (engine/run/skin_check.py) where
    ``neighbor.deferred`` is on (auto: on CUDA) with a list checked every step; else None."""
    def on_cuda(key: str) -> bool:   # true | false | auto (= on for CUDA)
        v = cfg.neighbor[key]
        return v is True or (v == "auto" and device.type == "cuda")

    if not (on_cuda("deferred") and int(cfg.neighbor.every) == 1 and bool(cfg.neighbor.check)):
        return None
    if hasattr(model, "static_edges"):
        model.static_edges = True   # sync-free edge selection; its 'capacity_fill' joins the check
    return DeferredSkinCheck(0.5 * float(cfg.neighbor.skin), int(cfg.neighbor.deferred_max),
                             pipelined=on_cuda("pipelined"))
