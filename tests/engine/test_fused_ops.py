"""The fused tree's bookkeeping (index tables, masks built from slot one-hots, parent rows from entry tables) against
the named ``Drafting.tree`` over a stub drafter whose logits are full of exact ties: the same drafter inputs (ids,
hidden, positions, slots, masks) call by call, the same tree, the padding rows as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from eaglekb.engine.draft import Drafting
from eaglekb.engine.fused import FusedTree

VD, H, W, M = 48, 6, 64, 97  # draft vocab, hidden size, drafter cache width, table rows


class StubDrafter:
    """Logits and hidden looked up from fixed tables by each row's (token, position, incoming hidden): a pure function
    of the inputs, so the fused and the named calls get the same rows; ``levels`` distinct logit values make ties."""

    def __init__(self, levels: int | None, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(M, VD, generator=g) if levels is None else \
            torch.randint(0, levels, (M, VD), generator=g).float()
        self.hid = torch.randint(-3, 4, (M, H), generator=g).float()
        self.d2t = torch.randint(0, 5, (VD,), generator=g) * 2
        self.device = torch.device("cpu")
        self.calls = []

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def step(self, ids, hidden, positions, slots, mask):
        """``Drafting``'s drafter call: ``ids [1,T]``, ``hidden [1,T,*]``."""
        self.calls.append((ids[0].clone(), hidden[0].sum(-1), positions.clone(), slots.clone(), mask.clone()))
        key = (ids[0] * 31 + positions * 7 + hidden[0].sum(-1).long()) % M
        return self.logits[key][None], self.hid[key][None]

    def __call__(self, ids, hidden, positions, slots, mask, kv, *, compiled=False):
        return self.step(ids, hidden[..., :H], positions, slots, mask)


def _engine(dm, pad: int):
    return SimpleNamespace(device=torch.device("cpu"), drafter=dm, dkv=SimpleNamespace(max_len=W), max_len=W,
                           graphs=False, compiled=False, pad_rows=lambda n: max(n, 2) + pad)


@pytest.mark.parametrize("levels", [2, 5, None], ids=["ties2", "ties5", "noties"])
@pytest.mark.parametrize("key", [(4, 4, 16), (3, 2, 7), (5, 4, 3), (4, 3, 8), (1, 3, 4), (2, 3, 13), (6, 2, 9)],
                         ids=lambda k: "s{}k{}n{}".format(*k))
def test_fused_tree_is_the_named_tree_with_ties(levels, key):
    steps, topk, budget = key
    for seed in range(3):
        dm = StubDrafter(levels, seed)
        fc = FusedTree(_engine(dm, pad=seed), steps, topk, budget)
        start, toks = 11 + seed, [5 + seed, 9, 17][:1 + seed % 3]
        n, rows = len(toks), fc.rows
        meta = torch.tensor([n - 1, start + n, *range(start, start + rows), *toks, *toks[-1:] * (rows - n)])
        aux = torch.randint(-2, 3, (rows, 3 * H), generator=torch.Generator().manual_seed(seed)).float()
        vids, depth, prow, base = fc._draft(meta, aux)
        extend, *fused = dm.calls
        dm.calls = []
        logits, hidden = dm.step(extend[0][None], aux[None, :, :H], extend[2], extend[3], extend[4])
        tree = Drafting(dm, dm.step, static_width=W).tree(logits[0, n - 1], hidden[0, n - 1], root_pos=start + n - 1,
                                                          scratch=start + n, steps=steps, topk=topk, budget=budget)
        named = dm.calls[1:]
        assert int(base) == start + n and len(fused) == len(named) == steps - 1
        for got, want in zip(fused, named):  # the frontier passes: ids, hidden, positions, slots, masks
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        k = fc.nodes
        assert vids[1:k + 1].tolist() == tree.tokens and (prow[1:k + 1] - 1).tolist() == tree.parents
        assert depth[1:k + 1].tolist() == tree.depths
        assert vids[0] == toks[-1] and depth[0] == 0 and prow[0] == 0
        pads = fc.vrows - k - 1  # padding rows: the root token at depth 0, each its own parent
        assert vids[k + 1:].tolist() == [toks[-1]] * pads and depth[k + 1:].tolist() == [0] * pads
        assert prow[k + 1:].tolist() == list(range(k + 1, fc.vrows))
