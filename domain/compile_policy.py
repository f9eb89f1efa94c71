"""Compiling a model's forward under decomposition: :class:`CompilePolicy`,
:class:`GraphPadder` and the machinery DistributedModel uses to honour them.

A :class:`CompilePolicy` lives on the spec (``DistributionSpec.compile_policy``) and is
saved with it.  When ``enabled``, :class:`~shardmd.domain.distributed_model.DistributedModel`

1. pads the rank's graph to buckets (``padder``): filler points are appended after the
   ghosts (far from every point, species of the first point, zero extra inputs) and filler
   edges from the last query point to the first filler point (longer than the list radius),
   so the point and edge counts the compiled code sees repeat from step to step and a
   graph compiled for one count is reused;
2. runs ``model.compute`` through ``torch.compile(mode=, dynamic=, fullgraph=, backend=)``;
3. obtains forces by ``force_strategy``: ``"autograd"`` (``ModelConfig.autograd_outputs``
   are differentiated as usual) or ``"kernel"`` (the model returns them itself: autograd
   outputs are skipped and positions are not differentiated, unless strain outputs or
   ``autograd_inputs`` need it).

Filler rows are part of the halo metadata (``HaloPlan.n_filler``): the forward exchange
gives them zeros, the reverse exchange and the per-system reductions drop them, exactly like
the rows of points that are not owned.  A model is padding-safe when it ignores edges longer
than its cutoff (already required: lists carry a skin) and reduces per-point values through
the distribution-aware ops (which drop non-owned rows).  Filler rows are removed from every
output before consolidation.  Padding applies to halo storage only (sharded storage warns
once and runs unpadded).

Distribution handlers are graph breaks by design: each runs eagerly (its collectives are
never traced), the code between them is compiled.  The compiled segments receive plain
tensors (a wrapper around the backend strips the ShardTensor subclass from the graph inputs,
which AOTAutograd cannot trace); the ShardTensor semantics are already resolved in the
traced graph.  ``fullgraph=True`` therefore fails whenever a handler runs.

When compilation cannot run (unknown backend, no compiler, an error raised by the backend),
the policy becomes a no-op for that DistributedModel: one warning, then the eager forward.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from .neighbors import NeighborList

FORCE_STRATEGIES = ("autograd", "kernel")


def bucket(n: int, multiple: int, growth: float = 1.0) -> int:
    """Smallest bucket >= n: multiples of ``multiple`` (``growth == 1``), or the geometric
    ladder ``multiple * ceil(growth**k)`` (``growth > 1``); ``multiple <= 0``: n itself."""
    n = int(n)
    if multiple <= 0 or n <= 0:
        return max(n, 0)
    if growth <= 1.0:
        return -(-n // multiple) * multiple
    k = 0
    while True:
        b = multiple * math.ceil(growth ** k)
        if b >= n:
            return b
        k += 1


@dataclass(frozen=True)
class GraphPadder:
    """Pad the point count (owned + ghosts + fillers) and the edge count of a rank's graph
    to buckets (see :func:`bucket`); 0 leaves that count alone."""

    point_multiple: int = 0
    edge_multiple: int = 0
    growth: float = 1.0

    def __post_init__(self):
        if self.point_multiple < 0 or self.edge_multiple < 0:
            raise ValueError("GraphPadder multiples must be >= 0")
        if self.growth < 1.0:
            raise ValueError(f"GraphPadder growth {self.growth} < 1")

    def sizes(self, n_points: int, n_edges: int, n_query: int) -> tuple[int, int]:
        """(filler points, filler edges) for a graph of these counts."""
        e_pad = bucket(n_edges, self.edge_multiple, self.growth) - n_edges if n_query > 0 else 0
        p_pad = bucket(n_points, self.point_multiple, self.growth) - n_points
        if e_pad and not p_pad:   # filler edges need a filler point to point at
            p_pad = bucket(n_points + 1, self.point_multiple, self.growth) - n_points
        return p_pad, e_pad

    def to_dict(self) -> dict:
        return {"point_multiple": self.point_multiple, "edge_multiple": self.edge_multiple, "growth": self.growth}


@dataclass(frozen=True)
class CompilePolicy:
    """torch.compile settings for the distributed forward (see the module docstring).

    enabled: compile and pad; mode/dynamic/fullgraph/backend: passed to ``torch.compile``;
    padder: a :class:`GraphPadder` or None; force_strategy: ``"autograd"`` or ``"kernel"``."""

    enabled: bool = False
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    backend: str = "inductor"
    padder: GraphPadder | None = None
    force_strategy: str = "autograd"

    def __post_init__(self):
        if self.force_strategy not in FORCE_STRATEGIES:
            raise ValueError(f"force_strategy {self.force_strategy!r}: use one of {FORCE_STRATEGIES}")
        if isinstance(self.padder, dict):
            object.__setattr__(self, "padder", GraphPadder(**self.padder))

    def to_dict(self) -> dict:
        return {"enabled": self.enabled, "mode": self.mode, "dynamic": self.dynamic, "fullgraph": self.fullgraph,
                "backend": self.backend, "padder": None if self.padder is None else self.padder.to_dict(),
                "force_strategy": self.force_strategy}

    @classmethod
    def from_dict(cls, d: dict) -> "CompilePolicy":
        d = dict(d)
        pad = d.pop("padder", None)
        return cls(padder=None if pad is None else GraphPadder(**pad), **d)


# -- padding ------------------------------------------------------------------------------------
@dataclass
class Padded:
    """A padded graph: fillers appended; ``n_points``/``n_edges`` are the real counts."""

    positions: torch.Tensor
    numbers: torch.Tensor
    nl: NeighborList
    inputs: dict
    n_points: int
    n_edges: int
    n_filler: int = 0
    n_filler_edges: int = 0


def pad_graph(padder: GraphPadder, positions: torch.Tensor, numbers: torch.Tensor, nl: NeighborList,
              inputs: dict | None = None) -> Padded:
    """Append filler points and edges (see the module docstring).  ``positions`` may carry
    autograd history: fillers are constants joined by ``torch.cat``."""
    inputs = dict(inputs or {})
    n, e, q = int(positions.shape[0]), nl.n_edges, nl.n_query
    p_pad, e_pad = padder.sizes(n, e, q)
    if not p_pad and not e_pad:
        return Padded(positions, numbers, nl, inputs, n, e)
    with torch.no_grad():
        far = positions.detach().amax(0) if n else positions.new_zeros(3)
        filler = (far + 2.0 * float(nl.cutoff) + 1.0).expand(p_pad, 3)
    pos = torch.cat([positions, filler.to(positions.dtype)])
    z = numbers[:1].expand(p_pad) if numbers.numel() else numbers.new_zeros(p_pad)
    num = torch.cat([numbers, z])
    padded_inputs = {k: torch.cat([v, v.new_zeros((p_pad, *v.shape[1:]))]) if isinstance(v, torch.Tensor)
                     and v.dim() and v.shape[0] == n else v for k, v in inputs.items()}
    if e_pad:
        offsets = nl.offsets.clone()
        offsets[-1] += e_pad
        neighbors = torch.cat([nl.neighbors, nl.neighbors.new_full((e_pad,), n)])
        shifts = torch.cat([nl.shifts, nl.shifts.new_zeros((e_pad, 3))])
        nl = nl.replace(offsets=offsets, neighbors=neighbors, shifts=shifts, n_points=nl.n_points + p_pad)
    return Padded(pos, num, nl, padded_inputs, n, e, p_pad, e_pad)


# -- compiling ---------------------------------------------------------------------------------
def _strip(x):
    from .shard_tensor import plain

    return plain(x) if isinstance(x, torch.Tensor) else x


def inner_backend(policy: CompilePolicy):
    """The backend callable ``torch.compile`` would use for this policy (``mode`` goes to
    inductor; other backends take no mode).  Raises for an unknown backend."""
    if policy.backend == "inductor":
        return torch._TorchCompileInductorWrapper(policy.mode, None, policy.dynamic)
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend(policy.backend)


def plain_input_backend(inner, counter: list):
    """A dynamo backend that hands ``inner`` plain-tensor example inputs and calls the
    compiled graph with plain tensors (ShardTensor inputs are stripped); appends each
    graph's node count to ``counter``."""

    def backend(gm, example_inputs, **kwargs):
        counter.append(len(gm.graph.nodes))
        compiled = inner(gm, [_strip(x) for x in example_inputs], **kwargs)

        def run(*args):
            return compiled(*[_strip(a) for a in args])

        return run

    return backend


class CompiledForward:
    """The compiled form of one callable under one policy, with a one-time fallback."""

    def __init__(self, policy: CompilePolicy):
        self.policy = policy
        self.graphs: list[int] = []     # node counts of the graphs handed to the backend
        self.failed: str | None = None
        self._fn = None
        self._compiled = None

    def _fail(self, exc: BaseException):
        self.failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        warnings.warn(f"CompilePolicy: torch.compile cannot run here ({self.failed}); running the forward "
                      "eagerly (graph padding still applies)", RuntimeWarning, stacklevel=4)

    def __call__(self, fn, *args, **kwargs):
        if self.failed is not None:
            return fn(*args, **kwargs)
        if self._fn is None or self._fn != fn:   # bound methods are new objects on every access
            p = self.policy
            try:
                from .shard_tensor import guard_for_compile

                guard_for_compile()
                backend = plain_input_backend(inner_backend(p), self.graphs)
                self._compiled = torch.compile(fn, backend=backend, dynamic=p.dynamic, fullgraph=p.fullgraph)
                self._fn = fn
            except Exception as exc:  # noqa: BLE001 - any set-up failure makes the policy a no-op
                self._fail(exc)
                return fn(*args, **kwargs)
        try:
            return self._compiled(*args, **kwargs)
        except (torch._dynamo.exc.BackendCompilerFailed, torch._dynamo.exc.Unsupported,
                torch._dynamo.exc.InternalTorchDynamoError) as exc:
            self._fail(exc)
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            if type(exc).__module__.startswith("torch._inductor") or "inductor" in type(exc).__name__.lower():
                self._fail(exc)
                return fn(*args, **kwargs)
            raise


__all__ = ["CompilePolicy", "CompiledForward", "FORCE_STRATEGIES", "GraphPadder", "Padded", "bucket", "inner_backend",
           "pad_graph", "plain_input_backend"]
