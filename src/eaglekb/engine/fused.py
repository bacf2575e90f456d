"""Greedy cycles with no host round trip between their steps (SGLang/gpt-fast style).

Owns ``FusedChain`` (topk 1) and ``FusedTree`` (topk > 1): at temperature 0 one cycle
is two device programs, each a single CUDA-graph replay when the engine is graphed:

* ``draft``: the drafter over the newly verified positions (accepted tokens + bonus,
  padded to a fixed row count), then the chain or tree steps. It reads two buffers in
  place (no copy into a graph's inputs): ``meta`` (those positions and ids, the root's
  row among them, the verify base slot, the root token) and the aux rows of those
  positions. The steps' positions, slots and masks are computed on the device from
  that base (comparisons against cached ``arange`` tensors). It returns the verify
  input (``[root] + nodes (+ padding)``, and for a tree each row's depth and parent
  row) and the verify rows' slots.
* ``verify``: the target over those rows with the tree mask, the target's argmax per
  row and the greedy walk from the root (at each node the child holding the target's
  argmax), the accepted rows' K/V moved next to the prefix (a tree's; a chain's are in
  place). It writes the next draft's ``meta`` and aux rows into those two buffers: the
  accepted tokens + bonus are the target's argmax along the accepted path (the root's,
  then each accepted row's), so the next draft needs nothing from the host.

The host per cycle: the verify's replay, the next cycle's draft replay queued behind it
*before* the host reads this cycle's ``meta`` (k and the new tokens), so the GPU never
waits for the host's bookkeeping or launches between the two programs. Only a
generation's first fused cycle copies ``meta`` in from the host (its drafter input comes
from the unfused first cycle, ``Engine._cycle``); the draft queued after the last cycle
is for none: ``end`` books its time as ``spare_draft``, apart from the cycles' phases.

The tree program is the named steps' ``Drafting.tree`` with fixed shapes: the root's
``topk`` best children, then ``steps - 1`` drafter passes over the ``topk`` frontier
nodes (each row sees the prefix and its ancestors' scratch slots), each node's
``topk`` best children scored by cumulative log-probability (``draft.top_children``,
the named steps' rule, by its rounds of max), the frontier kept to the ``topk`` best (a stable sort: ties go
to the earlier candidate, as Python's ``sorted`` does), and the ``draft_tokens - 1``
best candidates kept in score order. A child's score never exceeds its parent's and
ties put the parent first, so the best candidates always include their ancestors and
come in topological order, the ancestor check of ``draft._select`` holds by
construction. The bookkeeping is tables fixed per shape: a frontier row's mask is its
parent's plus its own slot, and each verify row is an entry (the root, a kept
candidate, a padding row) whose token, depth and parent row are gathered from per-entry
tables; the candidates' scores, tokens and the frontiers' sort orders are written into
those tables where they are computed, and the root's and the padding rows' token is
``meta``'s root token (``meta`` is a row of the token table).

Tokens are exactly those of ``Engine._cycle`` (the unfused path: sampling, the first
cycle after the prompt) and of plain greedy decoding. Knows nothing about prompts,
timing consumers or the task runner.
"""

from __future__ import annotations

import torch

from eaglekb.engine.cuda_graphs import Graphed
from eaglekb.engine.draft import top_children


class _Fused:
    """What both fused cycles share: the ``meta`` and aux buffers, the padded drafter extend, the host side of a cycle.

    ``meta = [n - 1, base, positions (rows), ids (rows), root token x roots]``: the drafter extend's rows (``n``
    accepted tokens + bonus at positions ``base - n ..``, then padding rows whose ids are any token), the verify base
    slot and the root token (the bonus), once per verify row that holds it. It is row 0 of ``table`` from ``lead`` on
    (a tree's token table; its candidates fill the first ``lead`` entries)."""

    def __init__(self, engine, steps: int, vrows: int, width: int = 0, roots: int = 1, lead: int = 0):
        dev = engine.device
        self.eng, self.steps = engine, steps
        self.nodes = steps  # draft tokens verified a cycle (a chain's steps; a tree sets its own)
        self.rows = engine.pad_rows(max(steps + 1, 2))  # drafter extend rows (accepted + bonus, padded)
        self.vrows = vrows  # verify rows (root + nodes, padded)
        self.roots = roots
        self.dcols = torch.arange(engine.dkv.max_len, device=dev)
        self.tcols = torch.arange(engine.max_len, device=dev)
        self.ar = torch.arange(max(self.rows, vrows, width) + 1, device=dev)
        size = 2 + 2 * self.rows + roots
        pinned = dev.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pinned)  # a generation's one copy in
        self.out = torch.zeros(size, dtype=torch.long, pin_memory=pinned)  # each cycle's read of meta
        self.read = torch.cuda.Event() if pinned else None  # that read's copy done (one event, every cycle)
        self.table = torch.zeros(2, lead + size, dtype=torch.long, device=dev)
        self.meta = self.table[0, lead:]
        self.aux: torch.Tensor | None = None  # [rows, 3H], allocated at the first cycle (the target's aux dtype)
        self.queued = None  # the draft program's outputs for the next cycle, queued before the host's read
        self.start = -1  # the drafter start position the queued draft was for
        self.draft = Graphed(self._draft, enabled=engine.graphs, static_inputs=True)
        self.verify = Graphed(self._verify, enabled=engine.graphs, static_inputs=True)

    @property
    def capture_s(self) -> float:
        return self.draft.capture_s + self.verify.capture_s

    def _extend(self, meta: torch.Tensor, aux: torch.Tensor):
        """The drafter over ``meta`` with ``aux [rows, 3H]``: the root row's logits ``[1, Vd]`` and hidden ``[1, H]``,
        the verify base slot ``[1]`` (a view of ``meta``: the verify takes slots computed from it, never ``meta``,
        which it overwrites) and the root token ``[1]`` (a view)."""
        eng, rows = self.eng, self.rows
        last, base, pos, ids = meta[0:1], meta[1:2], meta[2:2 + rows], meta[2 + rows:2 + 2 * rows]
        logits, hidden = eng.drafter(ids[None], aux[None], pos, pos, self.dcols[None] <= pos[:, None], eng.dkv,
                                     compiled=eng.compiled)
        return logits[0].index_select(0, last), hidden[0].index_select(0, last), base, meta[2 + 2 * rows:3 + 2 * rows]

    def _next(self, k: torch.Tensor, slots: torch.Tensor, ids: list[torch.Tensor]) -> None:
        """The verify's last write: the next draft's ``meta`` from ``k`` accepted, the verify slots (``base + i``) and
        ``ids`` (``rows + roots`` ids: the accepted tokens, the bonus, any ids, the bonus ``roots`` times)."""
        torch.cat([k, slots[1:2] + k, slots[:self.rows], *ids], out=self.meta)

    def _draft(self, meta, aux):  # pragma: no cover - overridden
        raise NotImplementedError

    def _verify(self, *args):  # pragma: no cover - overridden
        raise NotImplementedError

    def cycle(self, seq: list[int], result, pending: torch.Tensor, start: int, timer) -> tuple[torch.Tensor, int]:
        """``Engine._cycle`` after the first cycle (the pending positions, accepted tokens + bonus, number at
        most ``steps + 1 <= rows``): extends ``seq`` and ``result``; returns the next pending aux (``self.aux``) and
        start. The draft was queued by the previous call when ``pending`` is its aux and ``start`` its start; else
        (a generation's first fused cycle) the host copies ``meta`` and ``pending`` in and queues it. This call
        queues the next cycle's draft behind its verify, before it reads the verify's ``meta``."""
        m, rows = len(seq), self.rows
        if self.queued is None or pending is not self.aux or start != self.start:
            timer.mark("draft")
            toks = seq[start + 1:m]
            n = len(toks)
            # safe to overwrite: the copy in of an earlier generation was read long ago (every cycle synchronises)
            self.host.numpy()[:] = [n - 1, start + n, *range(start, start + rows), *toks,
                                    *toks[-1:] * (rows - n + self.roots)]
            self.meta.copy_(self.host, non_blocking=True)
            if pending is not self.aux:
                if self.aux is None:
                    self.aux = pending.new_empty((rows, pending.shape[-1]))
                torch.cat([pending, pending[-1:].expand(rows - pending.shape[0], -1)], out=self.aux)
            self.queued = self.draft(self.meta, self.aux)
        timer.mark("verify")
        self.verify(*self.queued)  # writes the next draft's meta and aux rows
        timer.mark("overhead")
        self.out.copy_(self.meta, non_blocking=True)
        if self.read is not None:
            self.read.record()
        timer.mark("draft")
        self.queued = self.draft(self.meta, self.aux)  # the next cycle's draft, queued before this cycle is read
        self.start = m - 1
        if self.read is not None:
            self.read.synchronize()
        vals = self.out.tolist()  # meta: [k, ..., ids: accepted tokens (k), bonus, ...]
        k = vals[0]
        new = vals[2 + rows:3 + rows + k]
        for d in range(k):
            result.accepted_per_depth[d] += 1
        result.accept_lens.append(len(new))
        result.drafted += self.nodes
        seq += new
        result.tokens += new
        return self.aux, m - 1

    def end(self, timer) -> None:
        """The generation is over: the draft queued for a next cycle ran for none (its time: ``spare_draft``)."""
        if self.queued is not None:
            timer.relabel("spare_draft")
            self.queued = None


class FusedChain(_Fused):
    """A greedy chain of ``steps`` drafts per cycle for one ``Engine`` (its caches, graphs and compile choice)."""

    def __init__(self, engine, steps: int):
        super().__init__(engine, steps, engine.pad_rows(max(steps + 1, 2)))

    def _draft(self, meta: torch.Tensor, aux: torch.Tensor):
        """``meta`` (see ``_Fused``), ``aux [rows, 3H]`` -> (verify ids, verify slots), ``[vrows]`` each."""
        eng = self.eng
        dm, kv, c = eng.drafter, eng.dkv, eng.compiled
        lg, h, base, root = self._extend(meta, aux)  # drafts of step s sit at base + s - 1 in the drafter
        toks = []
        for s in range(1, self.steps + 1):
            tok = dm.to_target(lg.argmax(-1))
            toks.append(tok)
            if s == self.steps:
                break
            slot = base + (s - 1)
            lg, h = dm(tok[None], h[None], slot, slot, (self.dcols <= slot)[None], kv, compiled=c)
            lg, h = lg[0], h[0]
        return torch.cat([root, *toks] + [root] * (self.vrows - self.steps - 1)), base + self.ar[:self.vrows]

    def _verify(self, vids: torch.Tensor, pos: torch.Tensor):
        """Target over ``vids [rows]`` at slots ``pos``; writes the next ``meta`` (``k`` accepted, then the accepted
        tokens and the bonus: the target's argmax at rows 0..k) and the aux rows (``[rows, 3H]``, root first)."""
        eng = self.eng
        logits, aux = eng.target(vids[None], pos, pos, self.tcols[None] <= pos[:, None], eng.tkv,
                                 compiled=eng.compiled)
        pred = logits[0].argmax(-1)
        k = (pred[:self.steps] == vids[1:self.steps + 1]).long().cumprod(0).sum().view(1)
        self.aux.copy_(aux[0])
        self._next(k, pos, [pred, pred.index_select(0, k)])
        return self.meta, self.aux


class FusedTree(_Fused):
    """A greedy ``(steps, topk, draft_tokens)`` tree per cycle for one ``Engine`` (see the module docstring)."""

    def __init__(self, engine, steps: int, topk: int, draft_tokens: int):
        k, nodes, vrows = topk, draft_tokens - 1, engine.pad_rows(draft_tokens)
        c, pad = k + (steps - 1) * k * k, vrows - nodes - 1  # candidates: the root's children, then each step's k * k
        super().__init__(engine, steps, vrows, width=topk, roots=1 + pad, lead=c)
        dev, dm = engine.device, engine.drafter
        self.topk, self.nodes = topk, nodes
        self.walk = min(steps, self.nodes)  # the deepest acceptable path
        self.t_of = dm.to_target(torch.arange(dm.d2t.shape[0], device=dev))  # draft id -> target id
        f = torch.arange(steps - 1)[:, None]  # frontier of step f + 2, row r: position base + f, slot base + f k + r
        self.ps = torch.stack([f.expand(-1, k), f * k + torch.arange(k)], 1).to(dev)
        # entries: the candidates (their tokens written by the draft), then meta, whose root tokens are the entries of
        # the root and the padding rows (depth 0); ``table`` row 1 holds each entry's depth
        self.tail = torch.arange(c + 2 + 2 * self.rows, c + 2 + 2 * self.rows + 1 + pad, device=dev)
        self.table[1, :c] = torch.tensor([1] * k + [d for d in range(2, steps + 1) for _ in range(k * k)], device=dev)
        self.score = torch.empty(c, dtype=torch.float32, device=dev)  # each candidate's cumulative log-probability
        self.sorted = torch.empty(k * k, dtype=torch.float32, device=dev)  # a frontier sort's scores
        # parent entries: ptab = [step 2's frontier (the root children), each later step's sort order of its k * k
        # children (the first k: the next frontier; + poff: entries), root, padding]; pidx, each entry's parent's
        # place in ptab (the root's for root children, themselves for root and padding; meta's other entries: none)
        nb0, sorts = k * (steps > 1), max(steps - 2, 0)
        self.nb0 = nb0
        self.ptab = torch.cat([torch.arange(nb0), torch.zeros(sorts * k * k, dtype=torch.long),
                               self.tail.cpu()]).to(dev)
        self.poff = torch.tensor([0] * nb0 + [k + s * k * k for s in range(sorts) for _ in range(k * k)]
                                 + [0] * (1 + pad), device=dev)
        root_at = nb0 + sorts * k * k
        self.pidx = torch.tensor([root_at] * k + [i // k if s == 0 else nb0 + (s - 1) * k * k + i // k
                                                  for s in range(steps - 1) for i in range(k * k)] +
                                 [0] * (2 + 2 * self.rows) + [root_at + j for j in range(1 + pad)], device=dev)
        self.eye = torch.eye(self.vrows, dtype=torch.bool, device=dev)
        self.real = (self.ar[:self.vrows] >= 1) & (self.ar[:self.vrows] <= self.nodes)
        self.yes = torch.ones(1, dtype=torch.bool, device=dev)

    def _expand(self, s: int, f_score, f_tid, f_hid, f_mask, ps, own, last: bool):
        """Drafter pass ``s`` over a frontier (scores, target ids, hidden, masks without ``own`` slots): writes its
        children's scores and target ids into the entry tables; returns the next frontier (None after the ``last``)."""
        dm, k = self.eng.drafter, self.topk
        mask = f_mask | own  # the prefix, each row's ancestors and the row itself
        lg, hid = dm(f_tid[None], f_hid[None], ps[0], ps[1], mask, self.eng.dkv, compiled=self.eng.compiled)
        lp, ids = top_children(lg[0], k, rounds=True)
        a = k + s * k * k
        scores, tids = self.score[a:a + k * k], self.table[0, a:a + k * k]
        torch.add(f_score[:, None], lp, out=scores.view(k, k))
        torch.index_select(self.t_of, 0, ids.view(-1), out=tids)
        if last:
            return None
        b = self.nb0 + s * k * k
        best = torch.sort(scores, descending=True, stable=True, out=(self.sorted, self.ptab[b:b + k * k]))
        sel = best.indices[:k]
        row = sel // k
        return best.values[:k], tids.index_select(0, sel), hid[0].index_select(0, row), mask.index_select(0, row)

    def _draft(self, meta: torch.Tensor, aux: torch.Tensor):
        """-> (verify ids, depths, parent rows, slots), each ``[vrows]``; ``meta`` must be ``self.meta`` (the root's
        token is read from the token table)."""
        assert meta is self.meta, "the tree's draft reads meta in place"
        k = self.topk
        lg, h, base, _ = self._extend(meta, aux)
        _, ids = top_children(lg[0], k, rounds=True, values=self.score[:k])
        torch.index_select(self.t_of, 0, ids, out=self.table[0, :k])
        ps = base + self.ps  # [steps - 1, 2, k]: the frontier rows' positions and slots
        own = self.dcols == ps[:, 1, :, None]
        front = (self.score[:k], self.table[0, :k], h.expand(k, -1), (self.dcols < base)[None])
        for s in range(self.steps - 1):
            front = self._expand(s, *front, ps[s], own[s], s == self.steps - 2)
        keep = torch.sort(self.score, descending=True, stable=True).indices[:self.nodes]
        ent = torch.cat([self.tail[:1], keep, self.tail[1:]])  # verify row -> entry
        vd = self.table.index_select(1, ent)
        row = torch.empty(self.table.shape[1], dtype=torch.long, device=ent.device).index_copy_(0, ent,
                                                                                              self.ar[:self.vrows])
        # entry -> verify row, read at verify rows' parents only: a kept candidate's parent is kept
        prow = row.index_select(0, (self.ptab + self.poff).index_select(0, self.pidx.index_select(0, ent)))
        return vd[0], vd[1], prow, base + self.ar[:max(self.vrows, self.rows)]

    def _verify(self, vids, depth, prow, slots):
        """Target over the tree at ``slots`` (``base + i``); the greedy walk, the accepted rows moved next to the
        prefix; writes the next ``meta`` (``k``, the target's argmax along the accepted path: the accepted tokens, the
        bonus) and the aux rows ``[rows, 3H]`` of root + path."""
        eng = self.eng
        base = slots[0:1]
        anc = self.eye
        for _ in range(self.walk):  # each row's ancestors (depth <= walk), itself included
            anc = self.eye | anc.index_select(0, prow)
        rel = self.tcols - base
        inside = (rel >= 0) & (rel < self.vrows)
        mask = (rel < 0)[None] | (inside[None] & anc.index_select(1, rel.clamp(0, self.vrows - 1)))
        logits, aux = eng.target(vids[None], base + depth, slots[:self.vrows], mask, eng.tkv, compiled=eng.compiled)
        pred = logits[0].argmax(-1)
        good = (vids == pred.index_select(0, prow)) & self.real  # a node holding its parent's target argmax
        node, alive = self.ar[:1], self.yes
        path = [node]
        for _ in range(self.walk):
            match = (prow == node) & good
            alive = alive & match.any()
            node = torch.where(alive, match.int().argmax().view(1), node)
            path.append(node)
        # root, accepted rows, then the last accepted row repeated: the aux rows (rows) and the next ids (+ roots)
        keep = torch.cat(path + [node] * (self.rows - self.walk - 1 + self.roots))
        walked = keep[:self.walk + 1]
        k = (walked[1:] != walked[:-1]).sum().view(1)
        eng.tkv.move(base + walked, slots[:self.walk + 1])  # the commit: accepted K/V next to the prefix
        torch.index_select(aux[0], 0, keep[:self.rows], out=self.aux)
        self._next(k, slots, [pred.index_select(0, keep)])
        return self.meta, self.aux
