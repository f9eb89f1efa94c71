"""Replay a fixed-shape computation as one CUDA graph.

Between two neighbour rebuilds a model call has fixed shapes: the same points, the same edge
arrays, a fixed-capacity edge selection. At small sizes its cost on a GPU is the host's: the
Python and launch work of hundreds of kernels, about the same whatever the size. Replayed as
one CUDA graph, that host work is gone (docs/benchmarks.md, "Small MACE systems are bound by
the host; CUDA graphs").

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
        self._stream: torch.cuda.Stream | None = None   # the capture stream, made at the first capture

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
        """Capture ``fn`` on a stream of its own, so that a failure leaves no trace.

        ``torch.cuda.graph`` leaves the process broken when the body raises: its exit ends
        the capture and raises again (the capture was invalidated) before it restores the
        current stream, so later work runs on the dead capture stream, and the next capture
        fails with "operation failed due to a previous error during capture" (seen on the GPU:
        a MACE capture after a function that read back; docs/benchmarks.md, "The engine's MACE
        call as a CUDA graph"). Here a read-back raises in PyTorch's sync check before it
        reaches CUDA, so the capture is still valid and ends cleanly, and the stream is
        restored whatever happens."""
        self.static_in = tuple(t.detach().clone() for t in inputs)
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream, graph = self._stream, torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = fn(*self.static_in)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph, self.static_out = graph, dict(out)
        self.captures += 1

    def drop(self) -> None:
        """Forget the graph (its memory pool is freed with it)."""
        self.graph, self.static_in, self.static_out = None, (), {}
        self.owner, self.signature, self.calls = None, (), 0
