"""Replay a fixed-shape computation as one CUDA graph.

Between two neighbour rebuilds a model call has fixed shapes: the same points, the same edge
arrays, a fixed-capacity edge selection. At small sizes its cost on a GPU is the host's: the
Python and launch work of hundreds of kernels. Measured on one H200 (bare mace-torch forward +
backward, float32, captured by hand: docs/benchmarks.md): 22-25 ms per call with
cuEquivariance for 864 to 16,384 atoms, whatever the size; captured as a CUDA graph and
replayed, 1.5 ms at 864 atoms, 3.5 ms at 4,000, 11 ms at 16,384.

:class:`GraphedCall` runs ``fn(*inputs) -> dict of tensors`` for a given *owner* (the object
whose lifetime bounds the shapes, e.g. a neighbour list) and signature:

- the first call for an owner runs eagerly: it may read sizes back to the host (a new list);
- the second captures ``fn`` on static copies of the inputs, then replays the graph;
- later calls copy the inputs into the static copies and replay.

Outputs are cloned (each replay overwrites the graph's own). A new owner or signature drops
the graph. ``fn`` must not synchronise with the host, and Python state it changes is changed
once, at capture: a graph records device work only. If capturing fails, the call runs
eagerly from then on and :attr:`GraphedCall.disabled` says why.
"""
from __future__ import annotations

from collections.abc import Callable

import torch


class GraphedCall:
    """Counters: ``eager`` calls, ``captures``, ``replays``."""

    def __init__(self) -> None:
        self.owner: object | None = None
        self.signature: tuple = ()
        self.calls = 0                  # calls with the current owner
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: tuple[torch.Tensor, ...] = ()
        self.static_out: dict[str, torch.Tensor] = {}
        self.eager = self.captures = self.replays = 0
        self.disabled: str | None = None

    def __call__(self, fn: Callable[..., dict], owner: object, signature: tuple,
                 inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        if owner is not self.owner or signature != self.signature:
            self.drop()
            self.owner, self.signature = owner, signature
        self.calls += 1
        if self.disabled is not None or self.calls == 1:
            self.eager += 1
            return fn(*inputs)
        if self.graph is None:
            try:
                self._capture(fn, inputs)
            except RuntimeError as exc:   # e.g. an operation that synchronises: stay eager
                self.drop()
                self.disabled = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self.eager += 1
                return fn(*inputs)
        else:
            with torch.no_grad():
                for s, t in zip(self.static_in, inputs):
                    s.copy_(t)
        self.graph.replay()
        self.replays += 1
        return {k: v.clone() for k, v in self.static_out.items()}

    def _capture(self, fn: Callable[..., dict], inputs: tuple[torch.Tensor, ...]) -> None:
        self.static_in = tuple(t.detach().clone() for t in inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*self.static_in)
        self.graph, self.static_out = graph, dict(out)
        self.captures += 1

    def drop(self) -> None:
        """Forget the graph (its memory pool is freed with it)."""
        self.graph, self.static_in, self.static_out = None, (), {}
        self.owner, self.signature, self.calls = None, (), 0
