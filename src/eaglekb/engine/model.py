"""The target's forward, run by the engine itself over a transformers model's weights.

Owns: a Llama / Qwen2 decoder forward (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU MLP; Qwen2's q/k/v biases) that writes K/V into a ``StaticKV``
by slot and reads the cache through a boolean mask, returning logits and the
auxiliary hidden states EAGLE-3 reads (the residual stream entering each capture
layer, the convention of ``eaglekb.models.target``). Shapes depend only on the number of
query tokens and the mask width, so a step can be captured in a CUDA graph.

Why not call the HF module: its cache API changes between transformers releases
(5.17 on the GPU machine, 5.24 here) and its StaticCache failed on the GPU. The
weights are the HF module's own tensors (no copy); ``tests/test_engine.py`` checks
the logits against HF's forward.

Knows nothing about drafters, decoding policy or timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from eaglekb.engine.kv import StaticKV
from eaglekb.io.errors import Incompatible
from eaglekb.models.layers import apply_rope, rms_norm, rope_tables, rope_theta

SUPPORTED = ("llama", "qwen2")


def attention(x, wq, wk, wv, wo, bq, bk, bv, *, n_heads, n_kv, head_dim, cos, sin,
              kv: StaticKV, layer: int, slots, mask) -> torch.Tensor:
    """GQA attention: project, rotate, write K/V at ``slots``, attend through ``mask [T,S]``."""
    b, t, _ = x.shape
    q = F.linear(x, wq, bq).view(b, t, n_heads, head_dim).transpose(1, 2)
    k = F.linear(x, wk, bk).view(b, t, n_kv, head_dim).transpose(1, 2)
    v = F.linear(x, wv, bv).view(b, t, n_kv, head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    keys, values = kv.write(layer, slots, k, v)
    width = mask.shape[-1]
    out = F.scaled_dot_product_attention(q, keys[:, :, :width], values[:, :, :width],
                                         attn_mask=mask, enable_gqa=n_heads != n_kv)
    return F.linear(out.transpose(1, 2).reshape(b, t, n_heads * head_dim), wo)


@dataclass
class LayerWeights:
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    ln1: torch.Tensor
    ln2: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


class TargetModel:
    """A Llama/Qwen2 causal LM as plain tensors plus the capture points EAGLE-3 reads."""

    def __init__(self, hf_model, capture_points: list[int], max_len: int):
        cfg = hf_model.config
        kind = getattr(cfg, "model_type", None)
        if kind not in SUPPORTED:
            raise Incompatible("target architecture not supported by the engine", where="config:model_type",
                               expected=" or ".join(SUPPORTED), found=repr(kind))
        body = hf_model.model
        self.config = cfg
        self.n_layers = int(cfg.num_hidden_layers)
        self.hidden = int(cfg.hidden_size)
        self.vocab = int(cfg.vocab_size)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or self.hidden // self.n_heads)
        self.eps = float(cfg.rms_norm_eps)
        self.capture_points = [int(c) for c in capture_points]
        self.embed_weight = body.embed_tokens.weight.detach()
        self.norm_weight = body.norm.weight.detach()
        self.lm_head = hf_model.lm_head.weight.detach()
        self.dtype = self.embed_weight.dtype
        self.device = self.embed_weight.device
        self.layers = []
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            bias = lambda lin: None if lin.bias is None else lin.bias.detach()  # noqa: E731
            self.layers.append(LayerWeights(
                a.q_proj.weight.detach(), a.k_proj.weight.detach(), a.v_proj.weight.detach(),
                a.o_proj.weight.detach(), bias(a.q_proj), bias(a.k_proj), bias(a.v_proj),
                layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                m.gate_proj.weight.detach(), m.up_proj.weight.detach(), m.down_proj.weight.detach()))
        self.max_len = max_len
        self.cos, self.sin = rope_tables(rope_theta(cfg), self.head_dim, max_len, self.device)

    def new_cache(self, max_len: int | None = None) -> StaticKV:
        return StaticKV(self.n_layers, self.n_kv, self.head_dim, max_len or self.max_len,
                        dtype=self.dtype, device=self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                kv: StaticKV, *, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids [B,T]`` at ``positions [T]``, caching K/V at ``slots [T]``.

        Returns logits ``[B,T,V]`` (``[B,1,V]`` with ``last_only``) and the aux
        hidden states ``[B,T,3H]`` (capture points concatenated in order).
        """
        x = self.embed(ids)
        cos, sin = self.cos[positions], self.sin[positions]
        captured = {}
        for i, w in enumerate(self.layers):
            if i in self.capture_points:
                captured[i] = x
            h = rms_norm(x, w.ln1, self.eps)
            x = x + attention(h, w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, n_heads=self.n_heads,
                              n_kv=self.n_kv, head_dim=self.head_dim, cos=cos, sin=sin, kv=kv, layer=i,
                              slots=slots, mask=mask)
            h = rms_norm(x, w.ln2, self.eps)
            x = x + F.linear(F.silu(F.linear(h, w.gate)) * F.linear(h, w.up), w.down)
        aux = torch.cat([captured[c] for c in self.capture_points], dim=-1)
        if last_only:
            x = x[:, -1:]
        logits = F.linear(rms_norm(x, self.norm_weight, self.eps), self.lm_head)
        return logits, aux

    __call__ = forward
