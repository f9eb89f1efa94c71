"""MACE (mace-torch) behind the model interface, on the message-passing halo scheme.

The real mace-torch model runs unchanged (no fork, no edits).  We drive its own per-layer
ghost-exchange hook (the one LAMMPS ML-IAP uses: ``lammps_class.forward_exchange`` /
``reverse_exchange``) from our halo machinery:

- inputs are the rank's ``[owned | ghost]`` points and edges whose receivers are owned
  (the neighbour list's query rows): each owned atom sees all its neighbours, so ghost
  width stays cutoff + skin whatever the number of layers;
- before every layer after the first, mace pads the owned node features with ghost slots
  and calls ``forward_exchange``: ghost rows are refreshed from their owners; autograd's
  backward of that exchange is our reverse exchange, so gradients reach the owners;
- the leaves of autograd are the edge vectors ``v_e = x_receiver - (x_sender + S @ cell)``
  (with the ghosts' image shifts applied): forces are ``-dE/dv`` scattered onto both ends of
  each edge (ghost rows then reverse-exchanged to their owners by the decomposition), and
  the virial is ``-sum_e v_e (x) dE/dv_e``, exactly the strain derivative of the
  decomposed system (a strain acts on every edge vector, ghosts' images included).

Energies are owned atoms' site energies (summed over ranks by the caller).  Units: eV, Å.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, GraphedCall, OutputKind, current_scope

from .contract import refuse_unknown_species
from .edge_filter import RadiusFilter
from .files import file_sha256
from .mace_files import (  # noqa: F401 - the model files' API, here for its users
    DEFAULT_MODEL,
    _import_mace,
    foundation_cache_path,
    foundation_models,
    load_mace,
    resolve_checkpoint,
)

#: the message-passing halo preset, with this wrapper's outputs: forces come from edge
#: gradients scattered onto padded rows (ghost rows reverse-exchanged to owners); energy
#: and virial are this rank's partial sums
SPEC_MACE = SPEC_MPNN_HALO.replace(
    name="mace-mpnn-halo",
    output_kinds={"energy": OutputKind.PER_GRAPH, "virial": OutputKind.PER_GRAPH,
                  "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "capacity_fill": OutputKind.PER_GRAPH},
    owned_only_outputs=frozenset({"energies"}), reverse_outputs=frozenset({"forces"}),
    all_reduce_outputs=frozenset({"energy", "virial"}))



@contextmanager
def _fixed_jit_executor():
    """Run mace-torch's TorchScript parts on TorchScript's simple executor, not the profiling one.

    The profiling executor specialises a scripted function to the shapes it has seen and, on
    the second call with new shapes, re-optimises it (fuses and compiles kernels) on the
    host. Every neighbour rebuild changes the edge count, so the step after each rebuild (and
    the second step of a run) stalled on the host for several times a normal step. The simple
    executor gives the same steady-state step with no stall (docs/benchmarks.md, "Sync-free
    MACE steps", its TorchScript part). An executor is chosen when a scripted function first
    runs, so the switch is scoped to this model's calls and the process-wide setting is
    restored.

    Both flags go off together, TorchScript's own pairing for its legacy executor. Some
    scripted functions are shared by the whole process (e3nn's spherical harmonics): when one
    had already run on the profiling executor (mace-torch's ``MACECalculator`` in the same
    process, say), calling it with the executor flag alone switched off mixed the two
    executors' graphs in its backward pass: an INTERNAL ASSERT in TorchScript's alias analysis
    or a segmentation fault (tests/test_mace.py, ``test_mace_calculator_then_ours_in_one_process``).
    With profiling mode off as well, such a function runs its unprofiled plan."""
    previous = torch._C._jit_set_profiling_executor(False)
    previous_mode = torch._C._jit_set_profiling_mode(False)
    try:
        yield
    finally:
        torch._C._jit_set_profiling_mode(previous_mode)
        torch._C._jit_set_profiling_executor(previous)


class _Recompute:
    """``forward`` of one of mace-torch's radial MLPs (``conv_tp_weights``: edge features (E, b)
    -> tensor-product weights (E, w)) that keeps only its input for the backward pass and
    recomputes the hidden activations there (``torch.utils.checkpoint``, non-reentrant).

    The radial MLP's hidden activations (3 hidden layers of 64: ~390 floats per edge per
    interaction, pre- and post-activation) were most of a MACE call's memory: with
    cuEquivariance's fused convolution nothing else per edge comes close (docs/benchmarks.md,
    "Peers, capacity, foundation size"). Recomputing them gives the same numbers (the same
    kernels run again on the same input) for one more MLP forward per call. Installed as an
    instance attribute, so the module's class, parameters and state_dict keys are unchanged.
    ``flag.on`` (shared by the model's MLPs) switches it at call time.

    It costs speed (one H200, float32, cuEquivariance, shipped model: -20 % at 55k and 864k
    atoms) for 12 % less memory (133.7 -> 117.1 kB per atom), so by default it is off and
    :class:`MaceModel` switches it on only when a one-domain call runs out of device memory
    (``recompute_radial='auto'``): systems that fit keep their speed, and 1,000,188 atoms of the
    shipped model fit on one H200 (docs/benchmarks.md, "Peers, capacity, foundation size")."""

    def __init__(self, module: torch.nn.Module, flag):
        self._plain = type(module).forward.__get__(module)
        self._flag = flag

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._flag.on and torch.is_grad_enabled() and x.requires_grad:
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._plain, x, use_reentrant=False, preserve_rng_state=False)
        return self._plain(x)


class _Flag:
    """on: recompute now; auto: switch on after a call ran out of device memory (one domain)."""

    on = False
    auto = True


def _install_recompute(model: torch.nn.Module) -> "_Flag":
    """Recompute the radial MLPs' activations in the backward pass (:class:`_Recompute`) of every
    interaction block that has one; returns the switch (``.on``)."""
    flag = _Flag()
    for block in getattr(model, "interactions", []):
        mlp = getattr(block, "conv_tp_weights", None)
        if isinstance(mlp, torch.nn.Module) and "forward" not in vars(mlp):
            mlp.forward = _Recompute(mlp, flag)
    return flag


class _Exchange:
    """The object mace's interaction blocks call between layers (its ``lammps_class``)."""

    def __init__(self, ctx, n_owned: int):
        self.ctx = ctx
        self.n_owned = n_owned

    def forward_exchange(self, feats: torch.Tensor, out: torch.Tensor, vec_len: int) -> None:
        if self.ctx is None:
            out.copy_(feats)
            return
        out.copy_(self.ctx.forward(feats[: self.n_owned]))

    def reverse_exchange(self, grad: torch.Tensor, gout: torch.Tensor, vec_len: int) -> None:
        if self.ctx is None:
            gout.copy_(grad)
            return
        gout.zero_()
        gout[: self.n_owned] = self.ctx.reverse(grad)


@functools.cache
def _opaque_exchange() -> type:
    """:class:`_Exchange` whose two calls are graph breaks, for a compiled module: mace-torch's
    ``LAMMPS_MP`` (an autograd.Function whose output these calls fill in place) traced by dynamo
    gave wrong gradients on CUDA (torch 2.11; docs/design.md, "Compiling the MACE module"), so under a
    compiled module the whole Function runs eagerly, as uncompiled. Made on first use: the
    wrapper imports torch._dynamo, which a run that never compiles does not need."""
    return type("_OpaqueExchange", (_Exchange,), {
        "forward_exchange": torch.compiler.disable(_Exchange.forward_exchange),
        "reverse_exchange": torch.compiler.disable(_Exchange.reverse_exchange)})


def select_head(model: torch.nn.Module, head: str | None, label: str) -> int:
    """Index of readout head ``head`` in mace-torch's ``model.heads`` (the calculator's
    ``head=``).  None: the only head, else the one named ``default`` (any case), as
    MACECalculator chooses; otherwise a one-line error listing the heads."""
    heads = [str(h) for h in (getattr(model, "heads", None) or ["Default"])]
    if head is None:
        if len(heads) == 1:
            return 0
        default = [i for i, h in enumerate(heads) if h.lower() == "default"]
        if default:
            return default[0]
        raise ValueError(f"{label} has {len(heads)} heads ({', '.join(heads)}) and none is named default; "
                         "choose one with model.head=NAME")
    if str(head) not in heads:
        raise ValueError(f"model.head={head!r}: {label} has no such head; its heads are {', '.join(heads)}")
    return heads.index(str(head))


def cueq_available(kernels: bool = False) -> bool:
    """Whether cuEquivariance's torch front end (and mace-torch's converter for it) import;
    with ``kernels``, also its compiled CUDA kernels (without them it runs naive torch code)."""
    try:
        import cuequivariance_torch  # noqa: F401
        from mace.cli.convert_e3nn_cueq import run  # noqa: F401

        if kernels:
            import cuequivariance_ops_torch  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a broken CUDA extension
        return False
    return True


def to_cueq(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """mace-torch's own e3nn -> cuEquivariance converter (same weights, other kernels).

    The converter sets torch's default dtype to the model's; it is restored here."""
    import contextlib
    import io

    from mace.cli.convert_e3nn_cueq import run

    old = torch.get_default_dtype()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            out = run(model, device=device.type, return_model=True)
    finally:
        torch.set_default_dtype(old)
    return out.to(device).eval()


def resolve_cueq(cueq, device: torch.device) -> bool:
    """model.cueq: 'auto' = on for CUDA when installed; True = required; False = off."""
    if cueq in (None, "auto"):
        return device.type == "cuda" and cueq_available(kernels=True)
    if cueq and not cueq_available():
        raise ValueError("model.cueq=true but cuequivariance-torch is not installed; "
                         "pip install cuequivariance-torch cuequivariance-ops-torch-cu13, or set model.cueq=false")
    return bool(cueq)


#: 'auto' replays calls of at most this many points as CUDA graphs. A graph removes the host's
#: launch work, which bounds small calls; larger calls are bound by the GPU, and replaying them
#: gains nothing (docs/benchmarks.md, "The engine's MACE call as a CUDA graph"). A graph keeps
#: its own memory pool besides the eager call's blocks, which a system near the GPU's capacity
#: cannot afford.
GRAPH_MAX_POINTS = 50_000


def _building(on: bool):
    """The context a module to be compiled is loaded in (models/mace_compile.py), else none."""
    if not on:
        return nullcontext()
    from .mace_compile import building

    return building()


class MaceModel:
    """mace-torch model on the halo scheme.

    checkpoint: mace-torch model file, or a foundation model's name (``medium-mpa-0``, ``small``,
    ``off-medium``...: see :func:`resolve_checkpoint`; default: the shipped Cu model); head:
    the readout head of a multi-head model (None: its only or ``default`` head); dtype, device: where
    and how it runs; cueq: cuEquivariance kernels ('auto': on CUDA when installed);
    cuda_graph: replay the call as a CUDA graph between neighbour rebuilds when it can be: on
    CUDA, on one domain, with sync-free edge selection (True: then always; 'auto', the default:
    up to ``GRAPH_MAX_POINTS``; False: never; see domain/graphed_call.py); trust_pickle: load
    the file by unpickling it freely instead of through the safe loader (see ``load_mace``);
    compile: run the module compiled by torch.compile (models/mace_compile.py); 'auto': built
    eager, compiled by :meth:`compile_now` when the engine finds the run long enough
    (engine/run/compile_choice.py). Under
    DistributedModel the decomposition context of the call (for the per-layer exchange) comes
    from ``current_scope()``; called directly, it runs alone.
    """

    name = "mace"
    distribution_spec = SPEC_MACE

    def __init__(self, checkpoint: str | Path | None = None, dtype=torch.float64, device="cpu", cueq="auto",
                 cuda_graph="auto", trust_pickle: bool = False, head: str | None = None, compile=False):
        self.path = resolve_checkpoint(checkpoint)
        if not checkpoint and not self.path.is_file():
            raise ValueError(f"the shipped MACE model {self.path} is missing; give model.checkpoint=PATH")
        self.dtype, self.device = dtype, torch.device(device)
        #: the module runs compiled by torch.compile (models/mace_compile.py)
        self.compiled = compile is True
        self.compile_asked = "auto" if compile == "auto" else self.compiled   # auto: eager until compile_now
        self._built_with = (trust_pickle, cueq, checkpoint, head, cuda_graph)
        if self.compiled:
            from .mace_compile import compiler_problem

            if problem := compiler_problem(self.device):
                raise ValueError(problem)
        self._build()

    def _build(self) -> None:
        """Load (compiled: e3nn's codegen off), freeze, recompute switch, heads; compile if ``compiled``."""
        trust_pickle, cueq, checkpoint, head, cuda_graph = self._built_with
        with _building(self.compiled):
            self._load(trust_pickle, cueq)
        self.model.requires_grad_(False)   # every parameter
        #: the radial MLPs' activations: kept for the backward pass, or recomputed there
        #: (:class:`_Recompute`); ``recompute_radial``: True, False, or 'auto' (the default:
        #: kept until a one-domain CUDA call runs out of memory, recomputed from then on)
        self._recompute = _install_recompute(self.model)
        self._finish(checkpoint, head, cuda_graph)
        if self.compiled:
            from .mace_compile import compiled

            self.model = compiled(self.model)

    def compile_now(self) -> str | None:
        """models/mace_compile.py :func:`compile_built` (``compile='auto'`` chosen on): why not, or None."""
        from .mace_compile import compile_built

        return compile_built(self)

    def _load(self, trust_pickle: bool, cueq) -> None:
        self.model = load_mace(self.path, self.device, self.dtype, trust_pickle=trust_pickle)
        #: whether the model runs on cuEquivariance kernels (converted by mace-torch's own tool)
        self.cueq = resolve_cueq(cueq, self.device)
        if self.cueq:
            self.model = to_cueq(self.model, self.device)

    def _finish(self, checkpoint, head, cuda_graph) -> None:
        label = f"the MACE model {checkpoint or self.path.name}"
        #: the readout head used (an index into ``self.heads``)
        self.heads = [str(h) for h in (getattr(self.model, "heads", None) or ["Default"])]
        self.head = self.heads[select_head(self.model, head, label)]
        self._head = torch.tensor([self.heads.index(self.head)], dtype=torch.int64, device=self.device)
        self.cutoff = float(self.model.r_max)
        #: message-passing steps (the reach of a site energy is layers x cutoff), and the energy
        #: counts ``nl.n_counted`` rows where a list has them: a call can be made in parts
        self.layers = len(self.model.interactions)
        self.counts_rows = True
        #: select edges without a host read; then the caller must read ``capacity_fill`` (the
        #: engine does in its deferred skin check) and discard results where it is nonzero
        self.static_edges = False
        self._filter = RadiusFilter(self.cutoff)
        #: None: never; else the most points a call may have to be replayed as a CUDA graph
        self.graph_max_points = (None if cuda_graph not in (True, "auto") or self.device.type != "cuda"
                                 else GRAPH_MAX_POINTS if cuda_graph == "auto" else 2**62)
        self._graphed = GraphedCall()
        #: the per-layer exchange of calls with ghost rows (graph breaks when compiled)
        self._exchange = _opaque_exchange() if self.compiled else _Exchange
        self._graphed_joined = GraphedCall()   # many systems' joined call (models/mace_batch.py)
        self.atomic_numbers = [int(z) for z in self.model.atomic_numbers]
        lut = torch.full((max(self.atomic_numbers) + 1,), -1, dtype=torch.int64)
        lut[torch.tensor(self.atomic_numbers)] = torch.arange(len(self.atomic_numbers))
        self._lut = lut.to(self.device)

    @property
    def recompute_radial(self) -> bool:
        """Whether the radial MLPs' activations are recomputed now (see :class:`_Recompute`)."""
        return self._recompute.on

    @recompute_radial.setter
    def recompute_radial(self, mode) -> None:
        """True: always; False: never; 'auto': from the first call that runs out of memory."""
        self._recompute.auto = mode == "auto"
        self._recompute.on = mode is True

    def identity(self) -> str:
        return file_sha256(self.path)

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.atomic_numbers, f"the MACE model {self.path.name}")

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl,
                ctx=None) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å; nl: query rows = owned atoms (the first n_owned rows).
        Returns energy () eV of the owned atoms, forces (n_padded, 3) eV/Å (ghost rows partial),
        virial (3, 3) eV (this rank's edges), energies (n_owned,) eV."""
        if ctx is None:
            scope = current_scope()
            ctx = scope.ctx if scope is not None and scope.halo is not None else None
        positions = positions.as_subclass(torch.Tensor)  # a plain view of the ShardTensor
        h = cell.as_subclass(torch.Tensor) if isinstance(cell, torch.Tensor) else torch.as_tensor(cell)
        numbers = numbers.as_subclass(torch.Tensor)
        alone = ctx is None or ctx.comm.size == 1
        if (self.graph_max_points is not None and self.static_edges and alone and positions.is_cuda
                and positions.shape[0] <= self.graph_max_points):
            # fixed shapes until the next list: one CUDA graph per list (domain/graphed_call.py)
            sig = (int(positions.shape[0]), positions.dtype, int(numbers.shape[0]))
            out = self._graphed(lambda x, c, z: self._evaluate(x, c, z, nl, ctx), nl, sig, (positions, h, numbers))
        elif alone and positions.is_cuda and self._recompute.auto and not self._recompute.on:
            out = self._evaluate_fitting(positions, h, numbers, nl, ctx)
        else:
            out = self._evaluate(positions, h, numbers, nl, ctx)
        if "capacity_fill" in out:
            self._filter.observe(out["capacity_fill"])
        return out

    def compute_batch(self, items) -> list[dict[str, torch.Tensor]]:
        """One call over independent whole systems: items (positions, cell, pbc, numbers, nl),
        per item what :meth:`compute` gives alone (models/mace_batch.py)."""
        from shardmd.models.mace_batch import compute_batch

        return compute_batch(self, items, _fixed_jit_executor)

    def join(self, items):
        """The joined graph of whole systems ``items`` (as :meth:`compute_batch` takes them),
        kept by a caller between rebuilds: models/mace_batch.py ``JoinedGraph``."""
        from shardmd.models.mace_batch import join

        return join(self, items)

    def compute_joined(self, graph, positions: torch.Tensor, capacity: int | None = None,
                       owner=None) -> dict[str, torch.Tensor]:
        """One call over a joined graph at positions (N, 3) Å: per-system energy (S,) float64 and
        virial (S, 3, 3), forces (N, 3) and site energies (N,) (models/mace_batch.py). With an
        edge ``capacity`` (sync-free selection) and an ``owner`` (what bounds the shapes), on
        CUDA up to ``graph_max_points``: replayed as a CUDA graph."""
        from shardmd.models.mace_batch import compute_joined

        graphed = None
        if (capacity is not None and owner is not None and self.graph_max_points is not None and positions.is_cuda
                and positions.shape[0] <= self.graph_max_points):
            graphed = self._graphed_joined
        return compute_joined(self, graph, positions, _fixed_jit_executor, capacity, graphed, owner)

    def call_layer(self, index: int, positions: torch.Tensor, numbers: torch.Tensor, nl, features):
        """Layer ``index`` on a part (domain/layered_parts.py; models/mace_layers.py): (the query
        rows' features, their site-energy terms (q,) eV). positions: (m, 3) Å of the part's points."""
        from .mace_layers import call_layer

        node_attrs = torch.nn.functional.one_hot(self._lut[numbers.long()], len(self.atomic_numbers)).to(self.dtype)
        with _fixed_jit_executor():
            return call_layer(self.model, index, positions.to(self.dtype), node_attrs, self.heads.index(self.head), nl,
                              features, self.cutoff)

    @property
    def layer_feature_bytes(self) -> int:
        """Bytes per atom a call layer by layer keeps besides the list: a layer's output, its
        gradient and the next one's (three arrays of the widest hidden features)."""
        from e3nn import o3

        # a block keeps its hidden irreps as Irreps or as their text, depending on the class
        widths = [o3.Irreps(str(b.hidden_irreps)).dim for b in self.model.interactions if hasattr(b, "hidden_irreps")]
        return 3 * max(widths, default=512) * torch.finfo(self.dtype).bits // 8

    def layer_problem(self) -> str | None:
        """Why this model cannot be called layer by layer (None: it can)."""
        from .mace_layers import layer_problem

        return "a compiled module (model.compile=true)" if self.compiled else layer_problem(self.model)

    def _evaluate_fitting(self, positions, cell, numbers, nl, ctx) -> dict[str, torch.Tensor]:
        """:meth:`_evaluate`; if it runs out of device memory with the radial MLPs' activations
        kept, once more with them recomputed, which stays on for later calls. One domain only:
        a rank repeating a call alone would meet its neighbours' halo exchanges out of step."""
        try:
            return self._evaluate(positions, cell, numbers, nl, ctx)
        except torch.cuda.OutOfMemoryError:
            pass
        # outside the handler: the failed call's frames, and the tensors they held, are gone
        self._recompute.on = True
        torch.cuda.empty_cache()
        return self._evaluate(positions, cell, numbers, nl, ctx)

    def _evaluate(self, positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor, nl,
                  ctx) -> dict[str, torch.Tensor]:
        """The call itself, on plain tensors (no host read when ``static_edges``)."""
        n_pad = int(positions.shape[0])
        n_own = nl.n_query
        x = positions.to(self.dtype)
        h = cell.to(self.dtype)
        receivers = nl.centers()
        senders = nl.neighbors.long()
        node_attrs = torch.nn.functional.one_hot(self._lut[numbers.long()], len(self.atomic_numbers)).to(self.dtype)
        vectors = x[receivers] - x[senders] - nl.shifts.to(self.dtype) @ h
        # the list reaches cutoff + skin; MACE's envelope is exactly zero beyond r_max, so the
        # edges past it only cost time (~1.7x more edges with a 1 Å skin at 5 Å): drop them,
        # sync-free when the caller reads 'capacity_fill' (models/edge_filter.py)
        sel = self._filter.select(torch.linalg.vector_norm(vectors, dim=1), nl, self.static_edges)
        receivers, senders, vectors = self._filter.pad(receivers[sel.index], senders[sel.index],
                                                       vectors[sel.index], sel, n_own)
        with torch.enable_grad(), _fixed_jit_executor():
            vectors = vectors.detach().requires_grad_(True)
            data = {
                "node_attrs": node_attrs,
                "edge_index": torch.stack([senders, receivers]),
                "vectors": vectors,
                "batch": torch.zeros(n_own, dtype=torch.int64, device=x.device),
                "natoms": torch.tensor([n_own, n_pad - n_own]),
                # no ghost rows: the per-layer exchange is the identity, and mace-torch skips it
                # (and its in-place autograd.Function) when given none
                "lammps_class": (self._exchange(ctx, n_own) if n_pad > n_own else None),
                "ptr": torch.arange(2, device=x.device) * n_own,  # [0, n_own], made on the device
                "head": self._head,   # the readout head of a multi-head model (its index, per graph)
            }
            out = self.model(data, compute_force=False, lammps_mliap=True)
            # the owned atoms' energies, summed by a reduction tree rather than mace-torch's
            # scatter-add: on a GPU that accumulates ~1e6 float32 terms of E0 = 3.51 eV one by one
            # into a total of ~3e6 eV whose spacing is 0.25 eV (the error it caused:
            # docs/benchmarks.md, "Scaling on 1–2 GPUs"). The reported total is summed in float64.
            # the energies counted: the query rows, or a part's own points (domain/subdomains.py)
            nodes = out["node_energy"][: getattr(nl, "n_counted", n_own)]
            (grad,) = torch.autograd.grad(nodes.sum(), vectors, allow_unused=True)
            energy = nodes.detach().to(torch.float64).sum().to(self.dtype)
        if grad is None:
            grad = torch.zeros_like(vectors)
        if sel.valid is not None:   # padding edges: exactly zero already; never let them carry a NaN
            grad = torch.where(sel.valid[:, None], grad, 0.0)
        forces = torch.zeros(n_pad, 3, dtype=self.dtype, device=x.device)
        forces.index_add_(0, receivers, -grad)
        forces.index_add_(0, senders, grad)
        virial = -(vectors.detach().T @ grad)
        virial = 0.5 * (virial + virial.T)
        result = {"energy": energy.detach(), "forces": forces, "virial": virial,
                  "energies": nodes.detach().to(self.dtype)}
        if sel.fill is not None:   # > 1: incomplete, discard; near 1: rebuild soon
            result["capacity_fill"] = sel.fill
        return result
