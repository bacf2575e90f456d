"""The greedy chain cycle with no host round trip between its steps (SGLang/gpt-fast style).

Owns ``FusedChain``: for topk 1 at temperature 0, one cycle is two device programs,
each a single CUDA-graph replay when the engine is graphed:

* ``draft``: the drafter over the newly verified positions (accepted tokens + bonus,
  padded to a fixed row count), then ``steps - 1`` chained drafter steps; positions,
  slots and masks are computed on the device from ``start`` and ``n`` (comparisons
  against cached ``arange`` tensors), so nothing is copied from the host per step.
  It returns the verify input ``[root] + chain (+ padding)`` and the verify base slot.
* ``verify``: the target over those rows (a chain's tree mask is causal), the target's
  argmax per row, and the greedy accept length ``k`` (leading drafts equal to the
  target's argmax) packed into one tensor that the host reads once per cycle.

The accepted path of a chain is always its first ``k`` nodes, so their K/V are
already in place (no move) and the next cycle's drafter input is the verify's
first ``k + 1`` aux rows (the rows after them are padding the drafter ignores).
The host work per cycle is one small pinned copy in, two replays, one read out.
Tokens are exactly those of ``Engine._cycle`` (the unfused path: trees, sampling,
the first cycle after the prompt) and of plain greedy decoding.

Knows nothing about prompts, timing consumers or the task runner.
"""

from __future__ import annotations

import torch

from eaglekb.engine.cuda_graphs import Graphed


class FusedChain:
    """A greedy chain of ``steps`` drafts per cycle for one ``Engine`` (its caches, graphs and compile choice)."""

    def __init__(self, engine, steps: int):
        dev = engine.device
        self.eng, self.steps = engine, steps
        self.rows = engine.pad_rows(max(steps + 1, 2))  # drafter extend rows = verify rows
        self.dcols = torch.arange(engine.dkv.max_len, device=dev)
        self.tcols = torch.arange(engine.max_len, device=dev)
        self.ar = torch.arange(self.rows, device=dev)
        pinned = dev.type == "cuda"
        self.host = torch.zeros(2 + self.rows, dtype=torch.long, pin_memory=pinned)
        self.meta = torch.zeros(2 + self.rows, dtype=torch.long, device=dev)
        self.draft = Graphed(self._draft, enabled=engine.graphs)
        self.verify = Graphed(self._verify, enabled=engine.graphs)

    @property
    def capture_s(self) -> float:
        return self.draft.capture_s + self.verify.capture_s

    # ------------------------------------------------------------------ device programs

    def _draft(self, meta: torch.Tensor, aux: torch.Tensor):
        """``meta = [start, n, ids...]`` (ids padded to ``rows``), ``aux [rows, 3H]`` -> (verify ids, base slot)."""
        eng = self.eng
        dm, kv, c = eng.drafter, eng.dkv, eng.compiled
        start, n, ids = meta[0:1], meta[1:2], meta[2:]
        pos = start + self.ar
        logits, hidden = dm(ids[None], aux[None], pos, pos, self.dcols[None] <= pos[:, None], kv, compiled=c)
        last = n - 1
        lg, h = logits[0].index_select(0, last), hidden[0].index_select(0, last)  # [1, Vd], [1, H]
        base = start + n  # the verify's root slot; drafts of step s sit at base + s - 1 in the drafter
        toks = []
        for s in range(1, self.steps + 1):
            tok = dm.to_target(lg.argmax(-1))
            toks.append(tok)
            if s == self.steps:
                break
            slot = base + (s - 1)
            lg, h = dm(tok[None], h[None], slot, slot, (self.dcols <= slot)[None], kv, compiled=c)
            lg, h = lg[0], h[0]
        root = ids.index_select(0, last)
        return torch.cat([root, *toks] + [root] * (self.rows - self.steps - 1)), base

    def _verify(self, vids: torch.Tensor, base: torch.Tensor):
        """Target over ``vids [rows]`` at ``base..``; returns ``[k, argmax per row, vids]`` and aux ``[rows, 3H]``."""
        eng = self.eng
        pos = base + self.ar
        logits, aux = eng.target(vids[None], pos, pos, self.tcols[None] <= pos[:, None], eng.tkv,
                                 compiled=eng.compiled)
        pred = logits[0].argmax(-1)
        k = (pred[:self.steps] == vids[1:self.steps + 1]).long().cumprod(0).sum().view(1)
        return torch.cat([k, pred, vids]), aux[0]

    # ------------------------------------------------------------------ the cycle

    def cycle(self, seq: list[int], result, pending: torch.Tensor, start: int, timer) -> tuple[torch.Tensor, int]:
        """``Engine._cycle`` for a greedy chain after the first cycle (the pending positions, accepted tokens +
        bonus, then number at most ``steps + 1 <= rows``): extends ``seq`` and ``result``; returns the next pending aux."""
        m, rows = len(seq), self.rows
        toks = seq[start + 1:m]
        n = len(toks)
        timer.mark("draft")
        self.host.numpy()[:] = [start, n, *toks, *toks[-1:] * (rows - n)]  # the last cycle's read synchronised
        self.meta.copy_(self.host, non_blocking=True)
        if pending.shape[0] < rows:  # after the unfused first cycle (k + 1 <= rows aux rows): pad to the fixed rows
            pending = torch.cat([pending, pending[-1:].expand(rows - pending.shape[0], -1)])
        vids, base = self.draft(self.meta, pending)
        timer.mark("verify")
        packed, aux = self.verify(vids, base)
        timer.mark("overhead")
        vals = packed.tolist()
        k = vals[0]
        chain = vals[2 + rows:2 + rows + self.steps]
        new = chain[:k] + [vals[1 + k]]
        for d in range(k):
            result.accepted_per_depth[d] += 1
        result.accept_lens.append(len(new))
        seq += new
        result.tokens += new
        return aux[:rows], m - 1
