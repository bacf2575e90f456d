"""Verification: which drafted tokens the target accepts, and the token it adds.

Owns three rules, all over the target's logits for ``[root] + tree nodes``:

* ``greedy``: walk from the root; at each node take the target's argmax and move
  to the child holding that token; stop when none does. The emitted tokens are
  exactly the target's own greedy tokens.
* ``sampled_chain`` (topk 1, temperature > 0): speculative sampling (Leviathan et
  al. 2023; Chen et al. 2023): accept draft ``d`` with probability
  ``min(1, p(d)/q(d))``; on the first rejection sample from ``norm(max(p - q, 0))``;
  if all are accepted sample the bonus from ``p``. Preserves the target's
  distribution when drafts were sampled from ``q``.
* ``sampled_tree`` (topk > 1, temperature > 0): at each node sample ``t ~ p``; move
  to the child holding ``t`` or stop and emit ``t``. Every emitted token is a
  sample of the target's conditional, so the distribution is preserved for any
  tree (fewer acceptances than multi-draft rejection schemes, but exact).

Knows nothing about caches, drafting or timing.
"""

from __future__ import annotations

import torch

from eaglekb.engine.draft import DraftTree


def _children(tree: DraftTree) -> dict[int, dict[int, int]]:
    kids: dict[int, dict[int, int]] = {}
    for i, (p, tok) in enumerate(zip(tree.parents, tree.tokens)):
        kids.setdefault(p, {}).setdefault(tok, i)
    return kids


def greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """``logits [N+1, V]`` (row 0: root) -> (accepted node indices root to leaf, bonus token)."""
    best = logits.argmax(-1).tolist()
    kids = _children(tree)
    path: list[int] = []
    node = -1
    while True:
        tok = best[node + 1]
        nxt = kids.get(node, {}).get(tok)
        if nxt is None:
            return path, tok
        path.append(nxt)
        node = nxt


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def sampled_tree(tree: DraftTree, logits: torch.Tensor, temperature: float,
                 gen: torch.Generator | None) -> tuple[list[int], int]:
    """Sample-and-match over a tree: exact for any tree shape."""
    probs = target_probs(logits, temperature)
    kids = _children(tree)
    path: list[int] = []
    node = -1
    while True:
        tok = int(torch.multinomial(probs[node + 1], 1, generator=gen))
        nxt = kids.get(node, {}).get(tok)
        if nxt is None:
            return path, tok
        path.append(nxt)
        node = nxt


def sampled_chain(tree: DraftTree, logits: torch.Tensor, temperature: float, d2t: torch.Tensor,
                  gen: torch.Generator | None) -> tuple[list[int], int]:
    """Speculative sampling over a chain whose drafts were sampled from ``tree.q``."""
    p = target_probs(logits, temperature)  # [N+1, V]
    n = len(tree)
    vocab = p.shape[-1]
    draft_vocab = tree.q.shape[-1]
    target_ids = torch.arange(draft_vocab, device=d2t.device) + d2t
    u = torch.rand(n, generator=gen, device=p.device) if n else None
    for i in range(n):
        tok, did = tree.tokens[i], tree.draft_ids[i]
        qd = float(tree.q[i, did])
        pd = float(p[i, tok])
        if qd > 0 and float(u[i]) < min(1.0, pd / qd):
            continue
        q_full = torch.zeros(vocab, device=p.device, dtype=p.dtype)
        q_full[target_ids] = tree.q[i].to(p.dtype)
        residual = (p[i] - q_full).clamp_min(0)
        total = float(residual.sum())
        if total <= 0:  # p == q: any rejection is impossible in exact arithmetic; fall back to p
            residual = p[i]
        bonus = int(torch.multinomial(residual, 1, generator=gen))
        return list(range(i)), bonus
    bonus = int(torch.multinomial(p[n], 1, generator=gen))
    return list(range(n)), bonus
