"""The drafter at inference: its forward over a static KV cache, and chain/tree drafting.

Owns: ``DraftModel`` (an EAGLE-3 drafter's weights, read from an
``eaglekb.models.drafter.Eagle3Drafter``, run with explicit positions, cache slots and a
mask, so that chain steps, tree frontiers and teacher-forced probing all use one
forward), the compatibility check between a drafter and a target, and
``draft_tree`` (topk 1: a chain; topk > 1: EAGLE-2/SGLang-style tree, top-k per
frontier node, frontier kept to the k best cumulative log-probabilities, and the
``draft_tokens - 1`` best nodes kept for verification).

One drafter step (the contract training must match, SpecForge's): at drafter
position ``j`` the input is ``embed(x[j+1])`` with ``fc(aux[j])`` (the target's
capture-point states at ``j``) for positions the target has verified, or with the
drafter's own previous output hidden for drafted positions; rotary position
``j``; the output predicts ``x[j+2]`` through ``lm_head(norm(out))`` and ``d2t``.

Knows nothing about verification, acceptance or the task runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from eaglekb.engine.kv import StaticKV
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import Incompatible
from eaglekb.models.layers import apply_rope, rms_norm


def check_shapes(drafter, hidden: int, vocab: int, embed_dim: int | None = None) -> None:
    """Refuse a drafter built for another target: hidden size, vocab, mapping range."""
    from eaglekb.models.drafter import check_mapping

    cfg = drafter.config
    th = cfg.target_hidden_size or cfg.hidden_size
    if th != hidden:
        raise Incompatible("drafter was built for another target (hidden size)", where="drafter config:target_hidden_size",
                           expected=str(hidden), found=str(th))
    embed_dim = embed_dim or hidden
    if cfg.hidden_size != embed_dim and drafter.embed_tokens is None:
        raise Incompatible("drafter hidden size does not match the target embeddings", where="drafter config:hidden_size",
                           expected=str(embed_dim), found=str(cfg.hidden_size))
    if cfg.vocab_size != vocab:
        raise Incompatible("drafter was built for another target (vocab size)", where="drafter config:vocab_size",
                           expected=str(vocab), found=str(cfg.vocab_size))
    check_mapping(drafter.d2t.cpu(), vocab, cfg.draft_vocab_size)


def check_compatible(drafter, target: TargetModel) -> None:
    check_shapes(drafter, target.hidden, target.vocab, int(target.embed_weight.shape[1]))


class DraftModel:
    """An EAGLE-3 drafter's weights as plain tensors, run over a one-layer ``StaticKV``."""

    def __init__(self, drafter, target: TargetModel, *, dtype: torch.dtype | None = None):
        check_compatible(drafter, target)
        cfg = drafter.config
        dtype = dtype or target.dtype
        dev = target.device
        take = lambda t: t.detach().to(device=dev, dtype=dtype)  # noqa: E731
        mid = drafter.midlayer
        self.config = cfg
        self.hidden = cfg.hidden_size
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.dim_head
        self.eps = cfg.rms_norm_eps
        self.fc = take(drafter.fc.weight)
        self.ln_in, self.ln_hidden = take(mid.input_layernorm.weight), take(mid.hidden_norm.weight)
        a = mid.self_attn
        self.wq, self.wk, self.wv, self.wo = (take(a.q_proj.weight), take(a.k_proj.weight),
                                              take(a.v_proj.weight), take(a.o_proj.weight))
        self.ln_post = take(mid.post_attention_layernorm.weight)
        self.gate, self.up, self.down = take(mid.mlp.gate_proj.weight), take(mid.mlp.up_proj.weight), take(mid.mlp.down_proj.weight)
        self.norm = take(drafter.norm.weight)
        self.lm_head = take(drafter.lm_head.weight)
        self.embed_weight = take(drafter.embed_tokens.weight) if drafter.embed_tokens is not None \
            else target.embed_weight.to(dtype)
        self.d2t = drafter.d2t.detach().to(dev)
        self.dtype, self.device = dtype, dev
        hd = self.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=dev) / hd))
        self.inv_freq = inv

    def new_cache(self, max_len: int) -> StaticKV:
        return StaticKV(1, self.n_kv, self.head_dim, max_len, dtype=self.dtype, device=self.device)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, kv: StaticKV) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter pass: ``ids [B,T]`` (target ids), ``hidden [B,T,3H_target or H]``.

        Returns draft-vocab logits ``[B,T,Vd]`` and the output hidden ``[B,T,H]`` that
        feeds the next step.
        """
        hidden = hidden.to(self.dtype)
        if hidden.shape[-1] != self.hidden:
            hidden = F.linear(hidden, self.fc)
        emb = F.embedding(ids, self.embed_weight)
        b, t, _ = hidden.shape
        x = torch.cat((rms_norm(emb, self.ln_in, self.eps), rms_norm(hidden, self.ln_hidden, self.eps)), dim=-1)
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None]
        e = torch.cat((freqs, freqs), dim=-1)
        cos, sin = e.cos(), e.sin()
        q = F.linear(x, self.wq).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = F.linear(x, self.wk).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = F.linear(x, self.wv).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin, float32=True), apply_rope(k, cos, sin, float32=True)
        keys, values = kv.write(0, slots, k, v)
        width = mask.shape[-1]
        att = F.scaled_dot_product_attention(q, keys[:, :, :width], values[:, :, :width], attn_mask=mask,
                                             enable_gqa=self.n_heads != self.n_kv)
        h = hidden + F.linear(att.transpose(1, 2).reshape(b, t, -1), self.wo)
        g = rms_norm(h, self.ln_post, self.eps)
        out = h + F.linear(F.silu(F.linear(g, self.gate)) * F.linear(g, self.up), self.down)
        return F.linear(rms_norm(out, self.norm, self.eps), self.lm_head), out

    __call__ = forward


@dataclass
class DraftTree:
    """Draft nodes in topological order; ``parents[i] == -1`` hangs off the root (the last committed token)."""

    tokens: list[int] = field(default_factory=list)  # target vocab ids
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)  # 1 = child of the root
    draft_ids: list[int] = field(default_factory=list)  # draft vocab ids (for q lookups)
    q: torch.Tensor | None = None  # [N, Vd] draft probabilities each node was sampled from (sampled chain)

    def __len__(self) -> int:
        return len(self.tokens)


def _choose(logits: torch.Tensor, temperature: float, gen: torch.Generator | None):
    """Greedy argmax, or a sample from softmax(logits / T); returns (id tensor, probs or None)."""
    if temperature <= 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1), probs


class Drafting:
    """Runs chain or tree drafting for one cycle over a drafter and its cache.

    ``step(ids, hidden, positions, slots, mask)`` is the drafter call (eager or
    CUDA-graphed); ``static_width`` > 0 makes every mask that wide (graphs need
    fixed shapes), else masks are as wide as the slots in use.
    """

    def __init__(self, dm: DraftModel, step, *, static_width: int = 0):
        self.dm, self.step, self.static_width = dm, step, static_width

    def _width(self, needed: int) -> int:
        return self.static_width or needed

    def chain(self, root_logits, root_hidden, *, root_pos: int, scratch: int, steps: int,
              temperature: float = 0.0, gen=None) -> DraftTree:
        """topk 1: ``steps`` tokens, each drafted from the previous one."""
        dm, dev = self.dm, self.dm.device
        tree = DraftTree()
        qs = []
        logits, hidden = root_logits, root_hidden
        tok_tensors = []
        for s in range(1, steps + 1):
            did, probs = _choose(logits, temperature, gen)
            tok = dm.to_target(did)
            tok_tensors.append(torch.stack((did, tok)))
            if probs is not None:
                qs.append(probs)
            if s == steps:
                break
            slot = scratch + s - 1
            width = self._width(slot + 1)
            mask = torch.zeros(1, width, dtype=torch.bool, device=dev)
            mask[0, :slot + 1] = True
            out_logits, out_hidden = self.step(tok.view(1, 1), hidden.view(1, 1, -1),
                                               torch.tensor([root_pos + s], device=dev),
                                               torch.tensor([slot], device=dev), mask)
            logits, hidden = out_logits[0, -1], out_hidden[0, -1]
        pairs = torch.stack(tok_tensors).tolist()  # one sync for the whole chain
        for i, (did, tok) in enumerate(pairs):
            tree.tokens.append(tok)
            tree.draft_ids.append(did)
            tree.parents.append(i - 1)
            tree.depths.append(i + 1)
        if qs:
            tree.q = torch.stack(qs)
        return tree

    def tree(self, root_logits, root_hidden, *, root_pos: int, scratch: int, steps: int, topk: int,
             budget: int) -> DraftTree:
        """topk > 1: expand the k best frontier nodes by their k best children per step."""
        dm, dev = self.dm, self.dm.device
        logp = torch.log_softmax(root_logits.float(), -1)
        top = logp.topk(topk)
        # candidate table: score, parent (-1 root), draft id, depth, drafter slot once processed
        scores = top.values.tolist()
        dids = top.indices.tolist()
        parents = [-1] * topk
        depths = [1] * topk
        slot_of: dict[int, int] = {}
        frontier = list(range(topk))
        hid_of_parent = {i: root_hidden for i in frontier}
        next_slot = scratch
        for s in range(2, steps + 1):
            n = len(frontier)
            ids = dm.to_target(torch.tensor([dids[i] for i in frontier], device=dev))
            slots = list(range(next_slot, next_slot + n))
            for i, sl in zip(frontier, slots):
                slot_of[i] = sl
            width = self._width(next_slot + n)
            mask = torch.zeros(n, width, dtype=torch.bool)
            mask[:, :scratch] = True
            for row, i in enumerate(frontier):
                j = i
                while j >= 0:
                    mask[row, slot_of[j]] = True
                    j = parents[j]
            hidden = torch.stack([hid_of_parent[i] for i in frontier])[None]
            pos = torch.tensor([root_pos + depths[i] for i in frontier], device=dev)
            out_logits, out_hidden = self.step(ids[None], hidden, pos, torch.tensor(slots, device=dev),
                                               mask.to(dev))
            next_slot += n
            lp = torch.log_softmax(out_logits[0].float(), -1)
            ch = lp.topk(topk, dim=-1)
            base = torch.tensor([scores[i] for i in frontier], device=lp.device)[:, None]
            child_scores = (base + ch.values).flatten().tolist()
            child_ids = ch.indices.flatten().tolist()
            first = len(scores)
            for c, (sc, did) in enumerate(zip(child_scores, child_ids)):
                parent = frontier[c // topk]
                scores.append(sc)
                dids.append(did)
                parents.append(parent)
                depths.append(s)
                hid_of_parent[first + c] = out_hidden[0, c // topk]
            order = sorted(range(first, len(scores)), key=lambda i: -scores[i])
            frontier = order[:topk]
        return _select(scores, parents, depths, dids, budget - 1, dm)


def _select(scores, parents, depths, dids, n_keep: int, dm: DraftModel) -> DraftTree:
    """The ``n_keep`` best nodes whose ancestors are all kept, in topological order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], depths[i], i))
    kept: dict[int, int] = {}
    for i in order:
        if len(kept) >= n_keep:
            break
        if parents[i] == -1 or parents[i] in kept:
            kept[i] = len(kept)
    tree = DraftTree()
    toks = dm.to_target(torch.tensor([dids[i] for i in kept], device=dm.device)).tolist() if kept else []
    for (i, _), tok in zip(kept.items(), toks):
        tree.tokens.append(tok)
        tree.draft_ids.append(dids[i])
        tree.parents.append(-1 if parents[i] == -1 else kept[parents[i]])
        tree.depths.append(depths[i])
    return tree
