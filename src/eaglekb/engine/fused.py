"""Greedy cycles with no host round trip between their steps (SGLang/gpt-fast style).

Owns ``FusedChain`` (topk 1) and ``FusedTree`` (topk > 1): at temperature 0 one cycle
is two device programs, each a single CUDA-graph replay when the engine is graphed:

* ``draft``: the drafter over the newly verified positions (accepted tokens + bonus,
  padded to a fixed row count), then the chain or tree steps; the host's one copy in
  holds those positions and ids, the root's row among them and the verify base slot;
  the steps' positions, slots and masks are computed on the device from that base
  (comparisons against cached ``arange`` tensors), so nothing is copied from the host
  per step. It returns the verify input (``[root] + nodes (+ padding)``, and for a
  tree each row's depth and parent row) and the verify base slot.
* ``verify``: the target over those rows with the tree mask, the target's argmax per
  row and the greedy walk from the root (at each node the child holding the target's
  argmax), packed with the accepted tokens into one tensor that the host reads once
  per cycle.

A chain's accepted path is always its first ``k`` nodes, so their K/V are already in
place and the next cycle's drafter input is the verify's first ``k + 1`` aux rows. A
tree's accepted rows are moved next to the prefix inside the verify program (the
``commit`` of the named steps) and their aux rows gathered there.

The tree program is the named steps' ``Drafting.tree`` with fixed shapes: the root's
``topk`` best children, then ``steps - 1`` drafter passes over the ``topk`` frontier
nodes (each row sees the prefix and its ancestors' scratch slots), each node's
``topk`` best children scored by cumulative log-probability, the frontier kept to
the ``topk`` best (a stable sort: ties go to the earlier candidate, as Python's
``sorted`` does), and the ``draft_tokens - 1`` best candidates kept in score order.
A child's score never exceeds its parent's and ties put the parent first, so the
best candidates always include their ancestors and come in topological order, the
ancestor check of ``draft._select`` holds by construction. The bookkeeping is tables
fixed per shape: a frontier row's mask is its parent's plus its own slot, and each
verify row is an entry (the root, a kept candidate, a padding row) whose token, depth
and parent row are gathered from per-entry tables.

The host work per cycle is one small pinned copy in, two replays, one read out.
Tokens are exactly those of ``Engine._cycle`` (the unfused path: sampling, the first
cycle after the prompt) and of plain greedy decoding. Knows nothing about prompts,
timing consumers or the task runner.
"""

from __future__ import annotations

import torch

from eaglekb.engine.cuda_graphs import Graphed


class _Fused:
    """What both fused cycles share: the pinned metadata, the padded drafter extend, the host side of a cycle."""

    def __init__(self, engine, steps: int, vrows: int, width: int = 0):
        dev = engine.device
        self.eng, self.steps = engine, steps
        self.rows = engine.pad_rows(max(steps + 1, 2))  # drafter extend rows (accepted + bonus, padded)
        self.vrows = vrows  # verify rows (root + nodes, padded)
        self.dcols = torch.arange(engine.dkv.max_len, device=dev)
        self.tcols = torch.arange(engine.max_len, device=dev)
        self.ar = torch.arange(max(self.rows, vrows, width) + 1, device=dev)
        pinned = dev.type == "cuda"
        self.host = torch.zeros(2 + 2 * self.rows, dtype=torch.long, pin_memory=pinned)
        self.meta = torch.zeros(2 + 2 * self.rows, dtype=torch.long, device=dev)
        self.draft = Graphed(self._draft, enabled=engine.graphs)
        self.verify = Graphed(self._verify, enabled=engine.graphs)

    @property
    def capture_s(self) -> float:
        return self.draft.capture_s + self.verify.capture_s

    def _extend(self, meta: torch.Tensor, aux: torch.Tensor):
        """The drafter over ``meta = [n - 1, start + n, positions..., ids...]`` with ``aux [rows, 3H]``: the root
        row's logits ``[1, Vd]`` and hidden ``[1, H]``, the root token ``[1]`` and the verify base slot ``[1]``."""
        eng, rows = self.eng, self.rows
        last, base, pos, ids = meta[0:1], meta[1:2], meta[2:2 + rows], meta[2 + rows:]
        logits, hidden = eng.drafter(ids[None], aux[None], pos, pos, self.dcols[None] <= pos[:, None], eng.dkv,
                                     compiled=eng.compiled)
        return logits[0].index_select(0, last), hidden[0].index_select(0, last), ids.index_select(0, last), base

    def _draft(self, meta, aux):  # pragma: no cover - overridden
        raise NotImplementedError

    def _verify(self, *args):  # pragma: no cover - overridden
        raise NotImplementedError

    def cycle(self, seq: list[int], result, pending: torch.Tensor, start: int, timer) -> tuple[torch.Tensor, int]:
        """``Engine._cycle`` after the first cycle (the pending positions, accepted tokens + bonus, number at
        most ``steps + 1 <= rows``): extends ``seq`` and ``result``; returns the next pending aux and start."""
        m, rows = len(seq), self.rows
        toks = seq[start + 1:m]
        n = len(toks)
        timer.mark("draft")
        # safe to overwrite: the last cycle's read synchronised
        self.host.numpy()[:] = [n - 1, start + n, *range(start, start + rows), *toks, *toks[-1:] * (rows - n)]
        self.meta.copy_(self.host, non_blocking=True)
        if pending.shape[0] < rows:  # after the unfused first cycle (k + 1 <= rows aux rows): pad to the fixed rows
            pending = torch.cat([pending, pending[-1:].expand(rows - pending.shape[0], -1)])
        vin = self.draft(self.meta, pending)
        timer.mark("verify")
        packed, aux = self.verify(*vin)
        timer.mark("overhead")
        vals = packed.tolist()  # [k, bonus, accepted tokens (steps)]
        k = vals[0]
        new = vals[2:2 + k] + [vals[1]]
        for d in range(k):
            result.accepted_per_depth[d] += 1
        result.accept_lens.append(len(new))
        seq += new
        result.tokens += new
        return aux[:rows], m - 1


class FusedChain(_Fused):
    """A greedy chain of ``steps`` drafts per cycle for one ``Engine`` (its caches, graphs and compile choice)."""

    def __init__(self, engine, steps: int):
        super().__init__(engine, steps, engine.pad_rows(max(steps + 1, 2)))

    def _draft(self, meta: torch.Tensor, aux: torch.Tensor):
        """``meta`` (see ``_extend``; ids padded to ``rows``), ``aux [rows, 3H]`` -> (verify ids, base slot)."""
        eng = self.eng
        dm, kv, c = eng.drafter, eng.dkv, eng.compiled
        lg, h, root, base = self._extend(meta, aux)  # drafts of step s sit at base + s - 1 in the drafter
        toks = []
        for s in range(1, self.steps + 1):
            tok = dm.to_target(lg.argmax(-1))
            toks.append(tok)
            if s == self.steps:
                break
            slot = base + (s - 1)
            lg, h = dm(tok[None], h[None], slot, slot, (self.dcols <= slot)[None], kv, compiled=c)
            lg, h = lg[0], h[0]
        return torch.cat([root, *toks] + [root] * (self.vrows - self.steps - 1)), base

    def _verify(self, vids: torch.Tensor, base: torch.Tensor):
        """Target over ``vids [rows]`` at ``base..``; returns ``[k, bonus, chain]`` and aux ``[rows, 3H]``."""
        eng = self.eng
        pos = base + self.ar[:self.vrows]
        logits, aux = eng.target(vids[None], pos, pos, self.tcols[None] <= pos[:, None], eng.tkv,
                                 compiled=eng.compiled)
        pred = logits[0].argmax(-1)
        k = (pred[:self.steps] == vids[1:self.steps + 1]).long().cumprod(0).sum().view(1)
        return torch.cat([k, pred.index_select(0, k), vids[1:self.steps + 1]]), aux[0]


class FusedTree(_Fused):
    """A greedy ``(steps, topk, draft_tokens)`` tree per cycle for one ``Engine`` (see the module docstring)."""

    def __init__(self, engine, steps: int, topk: int, draft_tokens: int):
        super().__init__(engine, steps, engine.pad_rows(draft_tokens), width=topk)
        dev, k, dm = engine.device, topk, engine.drafter
        self.topk, self.nodes = topk, draft_tokens - 1
        self.walk = min(steps, self.nodes)  # the deepest acceptable path
        self.t_of = dm.to_target(torch.arange(dm.d2t.shape[0], device=dev))  # draft id -> target id
        f = torch.arange(steps - 1)[:, None]  # frontier of step f + 2, row r: position base + f, slot base + f k + r
        self.ps = torch.stack([f.expand(-1, k), f * k + torch.arange(k)], 1).to(dev)
        # entries: the candidates (root children, then each step's k * k children), the root, the padding rows
        c, pad = k + (steps - 1) * k * k, self.vrows - self.nodes - 1
        self.tail = torch.arange(c, c + 1 + pad, device=dev)
        self.depth = torch.tensor([1] * k + [d for d in range(2, steps + 1) for _ in range(k * k)] + [0] * (1 + pad),
                                  device=dev)
        # parent entries: ptab = [step 2's frontier (the root children), later frontiers (sel + poff), root, padding]
        # and pidx, each entry's parent's place in ptab (the root's for root children, themselves for root, padding)
        self.poff = torch.tensor([0] * k * (steps > 1) + [k + s * k * k for s in range(steps - 2) for _ in range(k)]
                                 + [0] * (1 + pad), device=dev)
        n_f = (steps - 1) * k  # frontier rows over all steps
        self.pidx = torch.tensor([n_f] * k + [s * k + i // k for s in range(steps - 1) for i in range(k * k)] +
                                 [n_f + j for j in range(1 + pad)], device=dev)
        self.eye = torch.eye(self.vrows, dtype=torch.bool, device=dev)
        self.real = (self.ar[:self.vrows] >= 1) & (self.ar[:self.vrows] <= self.nodes)

    def _expand(self, f_score, f_tid, f_hid, f_mask, ps, own, last: bool):
        """One drafter pass over a frontier (scores, target ids, hidden, masks without ``own`` slots); returns its
        children (scores, target ids), the selected ones and the next frontier (None after the ``last`` step)."""
        dm, k = self.eng.drafter, self.topk
        mask = f_mask | own  # the prefix, each row's ancestors and the row itself
        lg, hid = dm(f_tid[None], f_hid[None], ps[0], ps[1], mask, self.eng.dkv, compiled=self.eng.compiled)
        ch = torch.log_softmax(lg[0].float(), -1).topk(k, dim=-1)
        scores = (f_score[:, None] + ch.values).flatten()
        tids = self.t_of.index_select(0, ch.indices.flatten())
        if last:
            return (scores, tids), None, None
        best = torch.sort(scores, descending=True, stable=True)
        sel = best.indices[:k]
        row = sel // k
        return (scores, tids), sel, (best.values[:k], tids.index_select(0, sel), hid[0].index_select(0, row),
                                     mask.index_select(0, row))

    def _draft(self, meta: torch.Tensor, aux: torch.Tensor):
        """-> (verify ids, depths, parent rows, base slot), each ``[vrows]`` but the base ``[1]``."""
        k = self.topk
        lg, h, root, base = self._extend(meta, aux)
        top = torch.log_softmax(lg[0].float(), -1).topk(k)
        cand, sels = [(top.values, self.t_of.index_select(0, top.indices))], []
        ps = base + self.ps  # [steps - 1, 2, k]: the frontier rows' positions and slots
        own = self.dcols == ps[:, 1, :, None]
        front = (top.values, cand[0][1], h.expand(k, -1), (self.dcols < base)[None])
        for s in range(self.steps - 1):
            new, sel, front = self._expand(*front, ps[s], own[s], s == self.steps - 2)
            cand.append(new)
            sels.append(sel)
        scores, tids = zip(*cand)
        keep = torch.sort(torch.cat(scores), descending=True, stable=True).indices[:self.nodes]
        ent = torch.cat([self.tail[:1], keep, self.tail[1:]])  # verify row -> entry
        vd = torch.cat([*tids, root.expand(self.tail.shape[0]), self.depth]).view(2, -1).index_select(1, ent)
        ptab = torch.cat([self.ar[:k * (self.steps > 1)], *sels[:-1], self.tail]) + self.poff
        row = torch.empty_like(self.depth).index_copy_(0, ent, self.ar[:self.vrows])  # entry -> verify row (read at
        # verify rows' parents only: a kept candidate's parent is kept)
        return vd[0], vd[1], row.index_select(0, ptab.index_select(0, self.pidx.index_select(0, ent))), base

    def _verify(self, vids, depth, prow, base):
        """Target over the tree; the greedy walk, the accepted rows moved next to the prefix.

        Returns ``[k, bonus, accepted tokens (walk)]`` and the aux rows ``[rows, 3H]`` of root + path."""
        eng = self.eng
        anc = self.eye
        for _ in range(self.walk):  # each row's ancestors (depth <= walk), itself included
            anc = self.eye | anc.index_select(0, prow)
        rel = self.tcols - base
        inside = (rel >= 0) & (rel < self.vrows)
        mask = (rel < 0)[None] | (inside[None] & anc.index_select(1, rel.clamp(0, self.vrows - 1)))
        slots = base + self.ar[:self.vrows]
        logits, aux = eng.target(vids[None], base + depth, slots, mask, eng.tkv, compiled=eng.compiled)
        pred = logits[0].argmax(-1)
        node = self.ar[:1] * 0
        alive = torch.ones(1, dtype=torch.bool, device=vids.device)
        path = [node]
        for _ in range(self.walk):
            match = (prow == node) & (vids == pred.index_select(0, node)) & self.real
            alive = alive & match.any()
            node = torch.where(alive, match.int().argmax().view(1), node)
            path.append(node)
        rows = torch.cat(path)  # [walk + 1]: root, accepted rows, then the last accepted row repeated
        k = (rows[1:] != rows[:-1]).long().sum().view(1)
        eng.tkv.move(base + rows, base + self.ar[:self.walk + 1])  # the commit: accepted K/V next to the prefix
        keep = torch.cat([rows, rows[-1:].repeat(self.rows - self.walk - 1)])
        return torch.cat([k, pred.index_select(0, node), vids.index_select(0, rows[1:])]), aux[0].index_select(0, keep)
