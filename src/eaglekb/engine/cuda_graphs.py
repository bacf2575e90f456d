"""Switchable CUDA-graph capture for fixed-shape engine steps (decode, verify, draft).

Owns: ``Graphed``, a wrapper that, when enabled on CUDA, captures one graph per
input-shape signature (after warm-up on a side stream), then serves calls by
copying inputs into the static buffers and replaying; with ``static_inputs`` the
caller's own tensors are those buffers (it passes the same tensors every call, their
values written in place, and nothing is copied). Disabled (or on CPU) it
calls the function directly, so eager versus graphed cycle times can be measured
with the same code. Outputs are the graph's static tensors: read them before the
next call of the same wrapper. Capture time is kept apart (``capture_s``).

The wrapped function must only touch preallocated state (static KV caches) and
take tensors whose shapes depend on the signature alone. Knows nothing about models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: list[torch.Tensor]
    outputs: object


class Graphed:
    """``Graphed(fn, enabled)(*tensors)``: eager call, or replay of a captured graph.

    ``static_inputs``: the tensors of the capturing call are the graph's inputs; a later call passing those very
    tensors copies nothing (another tensor is still copied in, into them)."""

    def __init__(self, fn, *, enabled: bool = False, warmup: int = 2, static_inputs: bool = False):
        self.fn = fn
        self.enabled = bool(enabled) and torch.cuda.is_available()
        self.warmup = warmup
        self.static_inputs = static_inputs
        self.graphs: dict[tuple, _Captured] = {}
        self.capture_s = 0.0

    def __call__(self, *args: torch.Tensor):
        if not self.enabled:
            return self.fn(*args)
        key = tuple((tuple(a.shape), a.dtype, a.device) for a in args)
        cap = self.graphs.get(key)
        if cap is None:
            cap = self.graphs[key] = self._capture(args)
        for buf, a in zip(cap.inputs, args):
            if a is not buf:
                buf.copy_(a, non_blocking=True)
        cap.graph.replay()
        return cap.outputs

    def _capture(self, args) -> _Captured:
        t0 = time.perf_counter()
        static = list(args) if self.static_inputs else [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*static)
        torch.cuda.synchronize()
        self.capture_s += time.perf_counter() - t0
        return _Captured(graph, static, out)
