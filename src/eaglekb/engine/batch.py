"""Batched generation for data: continuous batching over a static cache, CUDA-graphed decode steps.

Owns ``BatchDecoder``: ``B`` rows of one static KV cache ``[layers, B, kv_heads, S, D]``;
each row holds one request (a prompt, a temperature, a token budget) and writes its
own slots from 0 (``positions == slots == cur``), so rows start and finish
independently. A decode step runs every row at once (one token each) through the
target, picks the next token per row on the device (argmax at temperature 0, Gumbel-max
sampling otherwise), appends it, advances, and retires a row at a stop token, at its
budget or at the end of the cache; the host reads the state only every
``check_every`` steps, retires finished rows and refills free ones (a batched prefill
of new prompts into those rows). On CUDA each step is one graph replay, one graph
over the whole cache width (a width that followed the longest row would read less
early on, but its kernels would change with the batch's composition, and so would
greedy tokens).

Reproducibility: requests are served in order of prompt length; a prompt's prefill
runs in a fixed shape (``prefill_rows`` rows x its own length rounded up to
``PREFILL_STEP``, grouped only with prompts of the same rounded length) and every
decode step runs all ``B`` rows over all ``S`` slots, so a greedy row's tokens depend
on its own prompt only, not on which other requests share the batch (nor on how
prompts are sharded across GPUs). Sampled rows depend on the RNG stream.

Knows nothing about tokenizers, chat templates, corpora or storage: ``eaglekb.data``
turns prompts into token ids and results into datasets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from eaglekb.engine.kv import StaticKV, causal_rows
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput

PREFILL_ROWS = {"cuda": 64, "cpu": 16}  # rows per prefill: CUDA prefills are launch-bound, so wide ones are free
PREFILL_STEP = 64
CHECK_EVERY = 16


@dataclass(frozen=True)
class Request:
    """One generation: prompt token ids, sampling temperature (0 = greedy), token budget."""

    prompt: Sequence[int]
    temperature: float = 0.0
    max_new_tokens: int = 256


@dataclass
class BatchStats:
    """What a run did: tokens generated, decode steps, prefills, rows busy, seconds."""

    tokens: int = 0
    steps: int = 0
    prefills: int = 0
    row_steps_busy: int = 0
    row_steps_total: int = 0
    seconds: float = 0.0
    capture_s: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def utilisation(self) -> float:
        return self.row_steps_busy / self.row_steps_total if self.row_steps_total else float("nan")


class BatchDecoder:
    """Continuous-batching generation with one target over ``rows`` cache rows of ``max_len`` slots."""

    def __init__(self, target: TargetModel, rows: int, max_len: int, *, stop_ids: Sequence[int] = (),
                 graphs: bool = True, compile: bool | None = None, seed: int = 0, check_every: int = CHECK_EVERY):
        if rows < 1 or max_len < 2:
            raise BadInput("batch decoder needs rows >= 1 and a cache of >= 2 slots", where="batch decoder",
                           found=f"rows {rows}, max_len {max_len}")
        if max_len > target.max_len:
            raise BadInput("cache longer than the rope table", where="--max-len", expected=f"<= {target.max_len}",
                           found=str(max_len))
        self.target, self.rows, self.max_len = target, rows, max_len
        self.device = target.device
        self.graphs = graphs and self.device.type == "cuda"
        self.compiled = self.graphs if compile is None else bool(compile)  # inductor layers inside the graph
        if self.compiled:
            target.compile()
        self.check_every = check_every
        self.prefill_rows = PREFILL_ROWS.get(self.device.type, PREFILL_ROWS["cpu"])
        self.kv = target.new_cache(max_len, batch=rows)
        dev, long = self.device, torch.long
        self.tok = torch.zeros(rows, 1, dtype=long, device=dev)
        self.cur = torch.zeros(rows, dtype=long, device=dev)
        self.n_out = torch.zeros(rows, dtype=long, device=dev)
        self.budget = torch.ones(rows, dtype=long, device=dev)
        self.temp = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.active = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.out = torch.zeros(rows, max_len, dtype=long, device=dev)
        self.cols = torch.arange(max_len, device=dev)
        self.row_ids = torch.arange(rows, device=dev)
        self.stops = torch.tensor(sorted(set(int(s) for s in stop_ids)) or [-1], dtype=long, device=dev)
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        if self.graphs:  # graph replays draw from the default CUDA generator
            torch.cuda.manual_seed(seed)
        self._graph: torch.cuda.CUDAGraph | None = None
        self.compile_error: str | None = None
        self.stats = BatchStats()

    # ------------------------------------------------------------------ device-side pieces

    def _pick(self, logits: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
        """Per row: argmax where temp == 0, else Gumbel-max sampling from softmax(logits / temp)."""
        logits = logits.float()
        greedy = logits.argmax(-1)
        u = torch.rand(logits.shape, device=logits.device, generator=None if self.graphs else self.gen)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
        sampled = (logits / temp.clamp_min(1e-6)[:, None] + gumbel).argmax(-1)
        return torch.where(temp > 0, sampled, greedy)

    def _step(self) -> None:
        """One token for every row; finished rows keep computing but change nothing."""
        pos = self.cur[:, None]
        mask = (self.cols[None, :] <= pos)[:, None, :]  # [B, 1, S]
        logits, _ = self.target(self.tok, pos, pos, mask, self.kv, last_only=True, compiled=self.compiled)
        nxt = self._pick(logits[:, -1], self.temp)
        act = self.active
        idx = self.n_out.clamp(max=self.max_len - 1)
        self.out[self.row_ids, idx] = torch.where(act, nxt, self.out[self.row_ids, idx])
        self.n_out.add_(act.long())
        self.tok.copy_(torch.where(act, nxt, self.tok[:, 0])[:, None])
        self.cur.copy_(torch.where(act, self.cur + 1, self.cur).clamp(max=self.max_len - 1))
        done = self._is_stop(nxt) | (self.n_out >= self.budget) | (self.cur >= self.max_len - 1)
        self.active.copy_(act & ~done)

    def _is_stop(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens[:, None] == self.stops[None, :]).any(-1)

    def _capture(self) -> None:
        t0 = time.perf_counter()
        saved = [t.clone() for t in (self.tok, self.cur, self.n_out, self.active, self.out)]
        try:
            self._warm_up()
        except Exception as exc:  # an inductor failure must not cost the run: fall back to the eager layers
            if not self.compiled:
                raise
            self.compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.compiled = False
            self._warm_up()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        for buf, old in zip((self.tok, self.cur, self.n_out, self.active, self.out), saved):
            buf.copy_(old)
        torch.cuda.synchronize()
        self._graph = graph
        self.stats.capture_s += time.perf_counter() - t0

    def _warm_up(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)

    def _decode(self) -> None:
        if not self.graphs:
            self._step()
            return
        if self._graph is None:
            self._capture()
        self._graph.replay()

    # ------------------------------------------------------------------ host-side pieces

    def _bucket(self, length: int) -> int:
        return min(self.max_len, -(-length // PREFILL_STEP) * PREFILL_STEP)

    def _prefill(self, rows: list[int], reqs: list[Request]) -> None:
        """Prompts (of one length bucket) into cache rows ``rows`` in a fixed shape; first tokens picked."""
        bucket = self._bucket(max(len(r.prompt) for r in reqs))
        dev = self.device
        ids = torch.zeros(self.prefill_rows, bucket, dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, :len(r.prompt)] = torch.as_tensor(list(r.prompt), dtype=torch.long)
        tmp = StaticKV(self.target.n_layers, self.target.n_kv, self.target.head_dim, bucket,
                       dtype=self.target.dtype, device=dev, batch=self.prefill_rows)
        ar = torch.arange(bucket, device=dev)
        logits, _ = self.target(ids.to(dev), ar, ar, causal_rows(0, bucket, bucket, dev), tmp)
        n = len(reqs)
        lengths = torch.tensor([len(r.prompt) for r in reqs], device=dev)
        idx = torch.tensor(rows, device=dev)
        self.kv.k[:, idx, :, :bucket] = tmp.k[:, :n]
        self.kv.v[:, idx, :, :bucket] = tmp.v[:, :n]
        temp = torch.tensor([r.temperature for r in reqs], dtype=torch.float32, device=dev)
        first = self._pick(logits[torch.arange(n, device=dev), lengths - 1], temp)
        budget = torch.tensor([r.max_new_tokens for r in reqs], device=dev)
        self.temp[idx] = temp
        self.budget[idx] = budget
        self.out[idx, 0] = first
        self.tok[idx, 0] = first
        self.cur[idx] = lengths
        self.n_out[idx] = 1
        self.active[idx] = ~self._is_stop(first) & (budget > 1) & (lengths < self.max_len - 1)
        self.stats.prefills += 1

    def _check(self, reqs: list[Request]) -> None:
        for i, r in enumerate(reqs):
            if not 1 <= len(r.prompt) <= self.max_len - 2:
                raise BadInput("prompt does not fit the batch cache", where=f"request {i}",
                               expected=f"1 to {self.max_len - 2} tokens", found=str(len(r.prompt)))
            if r.max_new_tokens < 1:
                raise BadInput("token budget must be >= 1", where=f"request {i}", found=str(r.max_new_tokens))
            if not 0 <= r.temperature <= 2:
                raise BadInput("temperature out of range", where=f"request {i}", expected="0 to 2",
                               found=str(r.temperature))

    def generate(self, requests: Sequence[Request],
                 on_done: Callable[[int, list[int]], None] | None = None) -> list[list[int]]:
        """Run every request; returns their new tokens in request order (``on_done(i, tokens)`` as each ends)."""
        self._check(requests)
        order = sorted(range(len(requests)), key=lambda i: (len(requests[i].prompt), i))
        queue = list(reversed(order))  # pop() takes the shortest first
        owner: list[int | None] = [None] * self.rows
        results: list[list[int] | None] = [None] * len(requests)
        t0 = time.perf_counter()
        self.active.zero_()
        with torch.no_grad():
            while queue or any(o is not None for o in owner):
                self._refill(requests, queue, owner)
                for _ in range(self.check_every):
                    self._decode()
                self.stats.steps += self.check_every
                self._retire(owner, results, on_done)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.stats.seconds += time.perf_counter() - t0
        return [r or [] for r in results]

    def _refill(self, requests, queue: list[int], owner: list) -> None:
        free = [r for r in range(self.rows) if owner[r] is None]
        busy = self.rows - len(free)
        if not queue or not free or (busy and len(free) < max(1, self.rows // 8) and len(queue) >= len(free)):
            return
        while queue and free:
            bucket = self._bucket(len(requests[queue[-1]].prompt))
            take = []
            while queue and len(take) < min(self.prefill_rows, len(free)) and \
                    self._bucket(len(requests[queue[-1]].prompt)) == bucket:
                take.append(queue.pop())
            rows = [free.pop(0) for _ in take]
            self._prefill(rows, [requests[i] for i in take])
            for r, i in zip(rows, take):
                owner[r] = i

    def _retire(self, owner: list, results: list, on_done) -> None:
        active = self.active.tolist()
        n_out = self.n_out.tolist()
        finished = [r for r in range(self.rows) if owner[r] is not None and not active[r]]
        outs = self.out[finished].tolist() if finished else []
        for r, row in zip(finished, outs):
            i = owner[r]
            toks = row[:n_out[r]]
            results[i] = toks
            self.stats.tokens += len(toks)
            owner[r] = None
            if on_done is not None:
                on_done(i, toks)
        busy = sum(o is not None for o in owner)
        self.stats.row_steps_busy += busy * self.check_every + sum(
            min(self.check_every, n_out[r]) for r in finished)
        self.stats.row_steps_total += self.rows * self.check_every
