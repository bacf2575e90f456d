"""P-EAGLE training: every anchor at every depth of one parallel pass, with the TTT trainer's loss and counts.

Owns: ``ParallelTTTModel`` (``TTTModel`` with the P-EAGLE unroll: depth 0 is the EAGLE-3 step, depths ``1..k-1``
are the mask positions of ``eaglekb.models.parallel_drafter``, whose contract it trains) and ``as_parallel`` (the
training's drafter for ``--method``).

The unroll reuses ``eaglekb.training.ttt.ttt_attention``: the keys a depth-``d`` mask position sees (the depth-0
keys at positions ``<= t``, then its own rollout's depths ``1..d``) are exactly the keys a TTT step ``d`` sees, so
only the inputs differ: a TTT step feeds the previous step's output hidden and the next token's embedding, a mask
position feeds ``fc(mask_hidden)`` and ``mask_embed``, whatever came before. The loss, its weights
(``step_weight**d``), the targets (token ``t+d+2``), the per-depth counts, compiling and the chunked loss are the
TTT trainer's (``TTTModel.forward``), so the reports of the two methods read alike: "step d" is depth d.

SpecForge samples the anchors of each depth (COD: fewer at larger depths) to bound flex-attention memory; this
unroll is dense, every anchor at every depth, ``k`` passes over the sequence like a TTT unroll of ``k`` steps.

Knows nothing about datasets, optimisers, checkpoints, processes or the task runner.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from eaglekb.models.parallel_drafter import EAGLE3, mask_inputs, to_parallel
from eaglekb.io.errors import Incompatible
from eaglekb.training.ttt import TTTModel, shift, ttt_attention


class ParallelTTTModel(TTTModel):
    """A P-EAGLE drafter's (``parallel_tokens`` k) ``k`` depths over every anchor; loss and counts as ``TTTModel`` (``steps = k``)."""

    def __init__(self, drafter, embed: torch.Tensor, target_head: torch.Tensor | None, *,
                 step_weight: float = 0.8, loss_chunk: int = 0):
        super().__init__(drafter, embed, target_head, steps=drafter.parallel_tokens, step_weight=step_weight,
                         positions="runtime", loss_chunk=loss_chunk)

    def _unroll(self, input_ids, aux_hidden) -> list[torch.Tensor]:
        """The output hidden of each depth ``[k][B,T,H]`` (see the module docstring)."""
        d = self.drafter
        mid, attn = d.midlayer, d.midlayer.self_attn
        hidden = d.project_hidden(aux_hidden.to(d.fc.weight.dtype))
        b, t, _ = hidden.shape
        base = torch.arange(t, device=input_ids.device)
        emb = F.embedding(shift(input_ids, 1), self.embed).to(hidden.dtype)
        cos, sin = d.rope(base[None])
        q, key, value = attn.project(mid.fuse(emb, hidden), cos, sin)
        keys, values = [key], [value]
        out = [mid.feed_forward(hidden + attn.output(ttt_attention(q, keys, values)))]
        mask_embed, mask_aux = mask_inputs(d, b, t, hidden.dtype)
        mask_hidden = d.project_hidden(mask_aux)
        fused = mid.fuse(mask_embed, mask_hidden)
        for k in range(1, self.steps):
            cos, sin = d.rope((base + k)[None])
            q, key, value = attn.project(fused, cos, sin)
            keys.append(key)
            values.append(value)
            out.append(mid.feed_forward(mask_hidden + attn.output(ttt_attention(q, keys, values))))
        return out


def as_parallel(drafter, method: str, tokens: int, seed: int = 0):
    """The drafter a run of ``method`` trains: eagle3 keeps an EAGLE-3 drafter (a P-EAGLE init is refused),
    p-eagle turns it into a P-EAGLE drafter of ``tokens`` (``to_parallel``)."""
    if method == EAGLE3:
        if drafter.parallel_tokens:
            raise Incompatible("init drafter is a P-EAGLE drafter", where="--init", expected="an EAGLE-3 drafter "
                               "(or --method p-eagle)", found=f"p-eagle, {drafter.parallel_tokens} tokens per pass")
        return drafter
    return to_parallel(drafter, tokens, seed=seed)
