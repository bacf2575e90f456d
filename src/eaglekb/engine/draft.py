"""The drafter at inference: its forward over a static KV cache, and chain/tree drafting.

Owns: ``DraftModel`` (an EAGLE-3 drafter's weights, read from an
``eaglekb.models.drafter.Eagle3Drafter``, run with explicit positions, cache slots and a
mask, so that chain steps, tree frontiers and teacher-forced probing all use one
forward), the compatibility check between a drafter and a target, and
``draft_tree`` (topk 1: a chain; topk > 1: EAGLE-2/SGLang-style tree, top-k per
frontier node, frontier kept to the k best cumulative log-probabilities, and the
``draft_tokens - 1`` best nodes kept for verification), and ``top_children``, the k best
children of each row that the named tree and the fused tree both take (one rule for ties).

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

from eaglekb.engine.kv import StaticKV, mask_width, write_slots
from eaglekb.engine.model import TargetModel, compile_fixed
from eaglekb.formats.mapping import check_mapping
from eaglekb.io.errors import Incompatible
from eaglekb.models.layers import apply_rope, attend, inv_freq, linear, rms_norm, rope_cos_sin, swiglu_fused


def check_shapes(drafter, hidden: int, vocab: int, embed_dim: int | None = None) -> None:
    """Refuse a drafter built for another target: hidden size, vocab, mapping range."""
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


def draft_layer(ids, hidden, positions, slots, mask, k_cache, v_cache, fc, embed, inv, ln_in, ln_hidden, wqkv, wo,
                ln_post, wgu, wdown, norm, lm_head, n_heads: int, n_kv: int, head_dim: int,
                eps: float, logits_at: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's one layer at inference (see the module docstring for the contract).

    ``ids [B,T]``, ``hidden [B,T,3H_target]`` (fc applied) or ``[B,T,H]`` (the drafter's
    own output); returns draft-vocab logits ``[B,T,Vd]`` and the output hidden ``[B,T,H]``.
    ``logits_at``: the logits of that row only, ``[B,1,Vd]`` (a cycle's extend needs its last real row's alone).
    """
    if hidden.shape[-1] != wo.shape[0]:
        hidden = linear(hidden, fc)
    b, t, _ = hidden.shape
    x = torch.cat((rms_norm(F.embedding(ids, embed), ln_in, eps), rms_norm(hidden, ln_hidden, eps)), dim=-1)
    cos, sin = rope_cos_sin(positions, inv)
    q, k, v = linear(x, wqkv).split((n_heads * head_dim, n_kv * head_dim, n_kv * head_dim), dim=-1)
    q = apply_rope(q.view(b, t, n_heads, head_dim).transpose(1, 2), cos, sin, float32=True)
    k = apply_rope(k.view(b, t, n_kv, head_dim).transpose(1, 2), cos, sin, float32=True)
    write_slots(k_cache, slots, k)
    write_slots(v_cache, slots, v.view(b, t, n_kv, head_dim).transpose(1, 2))
    width = mask.shape[-1]
    att = attend(q, k_cache[:, :, :width], v_cache[:, :, :width], mask)
    h = hidden + linear(att.transpose(1, 2).reshape(b, t, -1), wo)
    out = h + swiglu_fused(rms_norm(h, ln_post, eps), wgu, wdown)
    rows = out if logits_at is None else out[:, logits_at:logits_at + 1 or None]
    return linear(rms_norm(rows, norm, eps), lm_head), out


class DraftModel:
    """An EAGLE-3 drafter's weights as plain tensors (q/k/v and gate/up fused), run over a one-layer ``StaticKV``."""

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
        self.wqkv = take(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        self.wo = take(a.o_proj.weight)
        self.ln_post = take(mid.post_attention_layernorm.weight)
        self.wgu = take(torch.cat([mid.mlp.gate_proj.weight, mid.mlp.up_proj.weight]))
        self.down = take(mid.mlp.down_proj.weight)
        self.norm = take(drafter.norm.weight)
        self.lm_head = take(drafter.lm_head.weight)
        self.embed_weight = take(drafter.embed_tokens.weight) if drafter.embed_tokens is not None \
            else target.embed_weight.to(dtype)
        self.d2t = drafter.d2t.detach().to(dev)
        # P-EAGLE (eaglekb.engine.parallel): tokens per pass (0: EAGLE-3); the mask row is appended to the embeddings
        self.parallel_tokens = int(getattr(drafter, "parallel_tokens", 0))
        if self.parallel_tokens:
            self.mask_id = int(self.embed_weight.shape[0])
            self.embed_weight = torch.cat((self.embed_weight, take(drafter.mask_embed)[None]))
            self.mask_hidden = take(drafter.mask_hidden)
        self.dtype, self.device = dtype, dev
        self.inv_freq = inv_freq(cfg.rope_theta, self.head_dim, dev)
        self._compiled = None
        self.halves = None  # CPU: half-width copies of the matrices (eaglekb.models.packed.HalfSet), set by an Engine
        self.int8 = None  # CPU: int8 copies of the matrices (eaglekb.models.packed.Int8Set), set by an Engine

    def compile(self) -> None:
        """Compile the drafter layer with inductor for the fixed-shape steps (idempotent)."""
        if self._compiled is None:
            self._compiled = compile_fixed(draft_layer)

    def new_cache(self, max_len: int) -> StaticKV:
        return StaticKV(1, self.n_kv, self.head_dim, max_len, dtype=self.dtype, device=self.device)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def mask_rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A P-EAGLE drafter's ``n`` mask positions: ids ``[1,n]`` (the mask row) and hidden ``[1,n,3H_target]``."""
        return (torch.full((1, n), self.mask_id, dtype=torch.long, device=self.device),
                self.mask_hidden.expand(1, n, -1))

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, kv: StaticKV, *, compiled: bool = False,
                logits_at: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter pass: ``ids [B,T]`` (target ids), ``hidden [B,T,3H_target or H]``.

        Returns draft-vocab logits ``[B,T,Vd]`` (``[B,1,Vd]``: row ``logits_at``'s alone) and the output hidden
        ``[B,T,H]`` that feeds the next step.
        """
        fn = self._compiled if compiled and self._compiled is not None else draft_layer
        args = (ids, hidden.to(self.dtype), positions, slots, mask, kv.k[0], kv.v[0], self.fc, self.embed_weight,
                self.inv_freq, self.ln_in, self.ln_hidden, self.wqkv, self.wo, self.ln_post, self.wgu, self.down,
                self.norm, self.lm_head, self.n_heads, self.n_kv, self.head_dim, self.eps)
        return fn(*args) if logits_at is None else fn(*args, logits_at)

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


def _draft_prob(logits: torch.Tensor, did: torch.Tensor, probs: torch.Tensor | None) -> float:
    """The drafted token's probability under the draft distribution (greedy: the softmax's top)."""
    if probs is None:
        return float(torch.softmax(logits.float(), dim=-1).max())
    return float(probs[did])


def top_children(logits: torch.Tensor, k: int, *, rounds: bool | None = None, values: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` best children: their log-probabilities (float32; into ``values`` when given) and draft ids,
    ``[..., k]`` each, best first, ties to the lower id: exactly ``torch.sort(logp, descending=True, stable=True)``
    cut to ``k``. ``torch.topk`` has the same values, but its choice and order among equal values is its own (and
    differs between CPU and CUDA).

    ``rounds`` (the default off the CPU, and the fused tree's device program everywhere): ``k`` rounds of max
    (``torch.max`` returns the first maximal index) over this call's own log-softmax, the picked id masked to -inf
    after each: ``2k - 1`` small kernels, no host read, where ``torch.topk`` ran a radix select with one thread block
    per row over the whole vocab (46 us for 4 rows of 12,288 on the H200); its ids hold for rows with at least ``k``
    entries above -inf (the logits of a finite drafter). Otherwise (the CPU, where max with an index is the slow
    reduction): ``torch.topk`` of ``k + 1``; if any two of those are equal (a host read), the entries up to the k-th
    value in id order, stably sorted."""
    if k > logits.shape[-1]:
        raise ValueError(f"top {k} of {logits.shape[-1]} entries")
    logp = torch.log_softmax(logits.float(), -1)
    if not (logp.device.type != "cpu" if rounds is None else rounds):
        vals, ids = logp.topk(min(k + 1, logp.shape[-1]))
        # topk's first k ids are the stable ones unless two of its first k + 1 values are equal (a tie within, or the
        # k-th value held outside too)
        if bool((vals[..., 1:] == vals[..., :-1]).any()):  # then every entry >= the k-th value, in id order, sorted
            ids = logp.topk(int((logp >= vals[..., k - 1:k]).sum(-1).max())).indices.sort(dim=-1).values
            vals, order = logp.gather(-1, ids).sort(dim=-1, descending=True, stable=True)
            ids = ids.gather(-1, order)
        vals, ids = vals[..., :k], ids[..., :k]
        return (vals if values is None else values.copy_(vals)), ids
    vals = logp.new_empty((*logp.shape[:-1], k)) if values is None else values
    ids = torch.empty(vals.shape, dtype=torch.long, device=logp.device)
    for j in range(k):
        torch.max(logp, -1, keepdim=True, out=(vals[..., j:j + 1], ids[..., j:j + 1]))
        if j + 1 < k:
            logp.scatter_(-1, ids[..., j:j + 1], float("-inf"))
    return vals, ids


class Drafting:
    """Runs chain or tree drafting for one cycle over a drafter and its cache.

    ``step(ids, hidden, positions, slots, mask)`` is the drafter call (eager or
    CUDA-graphed); ``static_width`` > 0 makes every mask that wide (graphs need
    fixed shapes), else masks are as wide as the slots in use.
    """

    def __init__(self, dm: DraftModel, step, *, static_width: int = 0, cache_len: int | None = None):
        self.dm, self.step, self.static_width = dm, step, static_width
        self.cache_len = cache_len

    def _width(self, needed: int) -> int:
        if self.static_width or self.cache_len is None:
            return self.static_width or needed
        return mask_width(needed, self.cache_len, static=False, device=self.dm.device)

    def chain(self, root_logits, root_hidden, *, root_pos: int, scratch: int, steps: int,
              temperature: float = 0.0, gen=None, min_prob: float = 0.0) -> DraftTree:
        """topk 1: ``steps`` tokens, each drafted from the previous one; with ``min_prob``, fewer: the chain ends
        after a token whose draft probability (greedy: the top probability; sampled: the drawn token's) is below it.
        Deep where the drafter is sure, short where it guesses (docs/findings/F26 measures what that buys)."""
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
            if s == steps or (min_prob > 0 and _draft_prob(logits, did, probs) < min_prob):
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
        top_lp, top_ids = top_children(root_logits, topk)
        # candidate table: score, parent (-1 root), draft id, depth, drafter slot once processed
        scores = top_lp.tolist()
        dids = top_ids.tolist()
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
            ch_lp, ch_ids = top_children(out_logits[0], topk)
            base = torch.tensor([scores[i] for i in frontier], device=ch_lp.device)[:, None]
            child_scores = (base + ch_lp).flatten().tolist()
            child_ids = ch_ids.flatten().tolist()
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
