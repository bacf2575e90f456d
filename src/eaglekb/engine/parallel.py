"""P-EAGLE drafting at inference: a cycle's whole chain from ONE drafter pass.

Owns ``check_spec`` (what a P-EAGLE drafter can draft: a chain of at most its k tokens) and ``parallel_chain``.

The pass (the contract of ``eaglekb.models.parallel_drafter``): the positions the target verified since the last
cycle (drafter position ``j``: ``aux[j]`` with token ``j+1``, written to the drafter's cache at slot ``j`` as in an
EAGLE-3 extend), then ``steps - 1`` mask rows (the mask embedding and ``mask_hidden``) at positions and slots
``m-1 ..`` after the last anchor ``m-2``, all under one causal mask: mask row ``d`` sees every verified slot and the
mask rows before it. The last anchor's row and the mask rows give the chain's ``steps`` tokens (greedy argmax, or a
sample per depth with its probabilities kept for the sampled acceptance rule). The mask slots lie past the verified
prefix; the next cycle's pass writes its verified positions over them before any row reads them.

Runs the drafter eagerly (the plain engine path); the fused cycles (``eaglekb.engine.fused``) draft EAGLE-3 chains
and trees only, so the engine never fuses a P-EAGLE cycle.

Knows nothing about verification, acceptance, prompts or the task runner.
"""

from __future__ import annotations

import torch

from eaglekb.engine.draft import DraftModel, DraftTree, _choose
from eaglekb.engine.kv import causal_rows, mask_width
from eaglekb.io.errors import BadInput


def check_spec(parallel_tokens: int, steps: int, topk: int) -> None:
    """Refuse what a P-EAGLE drafter of ``parallel_tokens`` a pass cannot draft: a tree, or more tokens than one pass
    proposes (callers with only the drafter's config check before any weights load)."""
    if topk != 1:
        raise BadInput("a P-EAGLE drafter drafts chains only", where="--topk", expected="1", found=str(topk))
    if steps > parallel_tokens:
        raise BadInput("more draft steps than the P-EAGLE drafter proposes per pass", where="--steps",
                       expected=f"<= {parallel_tokens} (its config's parallel_draft_tokens)", found=str(steps))


@torch.no_grad()
def parallel_chain(dm: DraftModel, kv, tokens: list[int], aux: torch.Tensor | None, start: int, *, steps: int,
                   temperature: float = 0.0, gen: torch.Generator | None = None,
                   root_logits: torch.Tensor | None = None) -> DraftTree:
    """The chain of ``steps`` tokens after the last anchor, from one pass over ``kv`` (the drafter's cache).

    ``tokens`` / ``aux [n,3H_target]``: the verified positions ``start .. start+n-1`` not yet in the cache (token
    ``j+1`` with ``aux[j]``); ``root_logits [Vd]``: the last anchor's logits when its row already ran (the prompt's
    extend), then ``tokens`` is empty and only the mask rows run."""
    dev = dm.device
    n = len(tokens)
    masks = steps - 1
    rows = []
    if root_logits is not None:
        rows.append(root_logits[None])
    if n + masks:
        mask_ids, mask_hidden = dm.mask_rows(masks)
        ids = torch.cat((torch.tensor([tokens], dtype=torch.long, device=dev), mask_ids), dim=1)
        hidden = mask_hidden if n == 0 else torch.cat((aux.view(1, n, -1).to(dm.dtype), mask_hidden), dim=1)
        ar = torch.arange(start, start + n + masks, device=dev)
        mask = causal_rows(start, n + masks, mask_width(start + n + masks, kv.max_len, static=False, device=dev), dev)
        logits, _ = dm(ids, hidden, ar, ar, mask, kv)
        rows.append(logits[0, max(n - 1, 0):])
    chosen, probs = _choose(torch.cat(rows)[:steps], temperature, gen)
    tree = DraftTree()
    dids = chosen.tolist()
    tree.tokens = dm.to_target(chosen).tolist()
    tree.draft_ids = dids
    tree.parents = list(range(-1, steps - 1))
    tree.depths = list(range(1, steps + 1))
    if probs is not None:
        tree.q = probs
    return tree
