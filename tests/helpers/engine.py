"""An oracle drafting policy for exactness tests: right drafts up to a random depth, then wrong ones."""

from __future__ import annotations

import random

from eaglekb.engine.draft import Drafting, DraftTree
from helpers.models import VOCAB


class OracleDrafting(Drafting):
    """Proposes the target's own greedy continuation, corrupted at random depths, so that
    every accept length (0..steps) and, in trees, off-first-child paths occur."""

    def __init__(self, base: Drafting, reference: list[int], prompt_len: int, seed: int = 0):
        super().__init__(base.dm, base.step, static_width=base.static_width, cache_len=base.cache_len)
        self.reference, self.prompt_len = reference, prompt_len
        self.rng = random.Random(seed)

    def _truth(self, root_pos: int, depth: int) -> int:
        i = root_pos + 2 + depth - 1 - self.prompt_len  # token index within the continuation
        return self.reference[i] if i < len(self.reference) else 0

    def _wrong(self, truth: int) -> int:
        return (truth + self.rng.randrange(1, VOCAB)) % VOCAB

    def chain(self, root_logits, root_hidden, *, root_pos, scratch, steps, temperature=0.0, gen=None, min_prob=0.0):
        super().chain(root_logits, root_hidden, root_pos=root_pos, scratch=scratch, steps=steps)  # real work
        cut = self.rng.randint(0, steps)
        toks = [self._truth(root_pos, d) if d <= cut else self._wrong(self._truth(root_pos, d))
                for d in range(1, steps + 1)]
        return DraftTree(tokens=toks, parents=list(range(-1, steps - 1)), depths=list(range(1, steps + 1)),
                         draft_ids=[0] * steps)

    def tree(self, root_logits, root_hidden, *, root_pos, scratch, steps, topk, budget):
        super().tree(root_logits, root_hidden, root_pos=root_pos, scratch=scratch, steps=steps, topk=topk,
                     budget=budget)
        tree = DraftTree()
        parent, cut = -1, self.rng.randint(0, steps)
        for d in range(1, steps + 1):
            truth = self._truth(root_pos, d)
            right = self.rng.randrange(topk) if d <= cut else -1
            nxt = None
            wrong = set()
            for c in range(topk):
                if c == right:
                    tok = truth
                else:
                    tok = self._wrong(truth)
                    while tok in wrong:
                        tok = self._wrong(truth)
                    wrong.add(tok)
                tree.tokens.append(tok)
                tree.parents.append(parent)
                tree.depths.append(d)
                tree.draft_ids.append(0)
                if c == right:
                    nxt = len(tree.tokens) - 1
            if nxt is None:
                break
            parent = nxt
        return tree


def record_trees(engine) -> list[tuple]:
    """Make ``engine``'s named tree drafting also append each drafted tree's (tokens, parents, depths) to the list
    it returns."""
    trees, real = [], engine.drafting.tree

    def record(*args, **kw):
        t = real(*args, **kw)
        trees.append((t.tokens, t.parents, t.depths))
        return t

    engine.drafting.tree = record
    return trees


def record_fused_trees(fc) -> list[tuple]:
    """Make a ``FusedTree``'s draft program also append each tree it hands the verify, as (tokens, parents,
    depths) in the named drafting's form, to the list it returns."""
    seen, real = [], fc.draft

    def record(meta, aux):
        vids, depth, prow, base = real(meta, aux)
        n = fc.nodes
        seen.append((vids[1:n + 1].tolist(), (prow[1:n + 1] - 1).tolist(), depth[1:n + 1].tolist()))
        return vids, depth, prow, base

    fc.draft = record
    return seen
