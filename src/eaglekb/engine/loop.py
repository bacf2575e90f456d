"""Greedy plain decoding on the device: one CUDA-graph replay per token, no host sync inside.

Owns ``DecodeLoop``: static buffers for the current token, its position, a step
counter and the output tokens; one captured step (the target's forward over one
token at the next slot, argmax, append, advance) that reads and writes only those
buffers and the target's static KV cache. The host replays it ``max_new_tokens - 1``
times and reads the tokens once at the end (or every ``check_every`` steps when
stop tokens must end the generation early; the few steps past a stop are discarded).
This is gpt-fast's decode loop with the per-token host round trip removed: the
timing of plain decoding is then the GPU's, which is what EAGLE-3 is measured against.

Knows nothing about drafters, sampling (temperature > 0 takes the engine's per-step
path) or timing.
"""

from __future__ import annotations

import time

import torch

CHECK_EVERY = 32


class DecodeLoop:
    """Captured greedy decode step for one ``Engine`` (its target, cache and compile choice)."""

    def __init__(self, engine, check_every: int = CHECK_EVERY):
        dev, size = engine.device, engine.max_len
        self.engine = engine
        self.check_every = check_every
        self.tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.i = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(size, dtype=torch.long, device=dev)
        self.cols = torch.arange(size, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_s = 0.0

    def _step(self) -> None:
        eng = self.engine
        mask = (self.cols <= self.pos)[None]  # [1, S]: slots up to this token's
        logits, _ = eng.target(self.tok, self.pos, self.pos, mask, eng.tkv, last_only=True, compiled=eng.compiled)
        nxt = logits[0, -1].argmax(-1, keepdim=True)
        self.out.index_copy_(0, self.i, nxt)
        self.tok.copy_(nxt.view(1, 1))
        self.pos.add_(1)
        self.i.add_(1)

    def _reset(self, first: int, pos: int) -> None:
        self.tok.fill_(first)
        self.pos.fill_(pos)
        self.i.zero_()

    def _capture(self, first: int, pos: int) -> None:
        """Warm up (compiles, if compiled) and capture. Warm-up writes K/V only at slots past the
        prefix (``pos``, ``pos+1``), which decoding overwrites before it ever reads them."""
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._reset(first, pos)
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self._reset(first, pos)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        torch.cuda.synchronize()
        self.graph = graph
        self.capture_s += time.perf_counter() - t0

    def run(self, first: int, pos: int, max_new_tokens: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Tokens after prefill: ``first`` (already picked) at ``pos``, then up to ``max_new_tokens - 1`` more."""
        if self.graph is None:
            self._capture(first, pos)
        self._reset(first, pos)
        steps, done = max_new_tokens - 1, 0
        tokens = [first]
        if first in stop_ids:
            return tokens
        while done < steps:
            chunk = min(self.check_every if stop_ids else steps, steps - done)
            for _ in range(chunk):
                self.graph.replay()
            done += chunk
            if stop_ids and any(t in stop_ids for t in self.out[done - chunk:done].tolist()):
                break
        for t in self.out[:done].tolist():
            tokens.append(t)
            if t in stop_ids:
                break
        return tokens
