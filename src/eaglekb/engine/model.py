"""The target's forward, run by the engine itself over a transformers model's weights.

Owns: ``check_architecture`` (what the forward supports, judged from a config before weights load),
a Llama / Qwen2 decoder forward (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU MLP; Qwen2's q/k/v biases) that writes K/V into a ``StaticKV``
by slot and reads the cache through a boolean mask, returning logits and the
auxiliary hidden states EAGLE-3 reads (the residual stream entering each capture
layer, the convention of ``eaglekb.models.target``). Shapes depend only on the number of
query tokens and the mask width, so a step can be captured in a CUDA graph.

Speed (docs/reference/engine.md has the measurements): q/k/v and gate/up are fused
into one matmul each at load time; one decoder layer is a plain function
(``decoder_layer``) that ``compile()`` hands to ``torch.compile`` (inductor fuses the
norms, RoPE, residual adds and SiLU-mul); the compiled layer is used only for
fixed-shape steps (``compiled=True``, inside CUDA graphs), the prompt prefill stays
eager so prompts of any length never trigger a recompile.

Why not call the HF module: its cache API changes between transformers releases
(5.17 and 5.24 differ) and its StaticCache failed on a GPU. The
unfused weights are the HF module's own tensors (no copy); ``tests/engine`` checks
the logits against HF's forward.

Knows nothing about drafters, decoding policy or timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from eaglekb.engine.kv import StaticKV, write_slots
from eaglekb.io.errors import Incompatible
from eaglekb.models.layers import (apply_rope, attend, group_mask, linear, rms_norm, rope_tables, rope_theta,
                                   swiglu_fused)

SUPPORTED = ("llama", "qwen2")


def check_architecture(cfg, where: str = "config") -> None:
    """Refuse a target config the engine's forward would run wrong, from its config alone (before any weights load).

    ``cfg``: a transformers config or its config.json as a dict; ``where``: how the user named it. Supported:
    Llama and Qwen2 decoders with SiLU MLPs, full attention, default RoPE, biases on q/k/v only (Qwen2's).
    """
    get = cfg.get if isinstance(cfg, dict) else (lambda key, default=None: getattr(cfg, key, default))
    kind, arch = get("model_type"), get("architectures") or []
    found = f"{kind!r}" + (f" ({', '.join(map(str, arch))})" if arch else "")
    if kind not in SUPPORTED:
        raise Incompatible("target architecture not supported by the engine", where=f"{where}: model_type",
                           expected=" or ".join(SUPPORTED) + " (Llama or Qwen2 decoder)", found=found)
    if get("use_sliding_window"):
        raise Incompatible("sliding-window attention not supported by the engine", where=f"{where}: use_sliding_window",
                           expected="false (full attention in every layer)",
                           found=f"true (sliding_window {get('sliding_window')})")
    for key in ("attention_bias", "mlp_bias"):  # Llama's options: o_proj / MLP biases the engine does not add
        if get(key):
            raise Incompatible("target has biases the engine does not add", where=f"{where}: {key}",
                               expected="false (Qwen2's q/k/v biases are the only ones supported)", found="true")
    act = get("hidden_act") or "silu"
    if act != "silu":
        raise Incompatible("target activation not supported by the engine", where=f"{where}: hidden_act",
                           expected="'silu' (SwiGLU)", found=repr(act))
    params = get("rope_parameters") or {}
    scaling = get("rope_scaling") or {}
    rope = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope != "default":
        raise Incompatible("unsupported rope scaling", where=f"{where}: rope_parameters.rope_type",
                           expected="'default'", found=repr(rope))


def decoder_layer(x, cos, sin, wqkv, bqkv, wo, ln1, ln2, wgu, wdown, k_cache, v_cache, slots, mask,
                  n_heads: int, n_kv: int, head_dim: int, eps: float) -> torch.Tensor:
    """One pre-norm decoder layer over ``x [B,T,H]``; writes K/V at ``slots`` and attends through ``mask``.

    ``cos/sin`` ``[T,D]`` (or ``[B,1,T,D]`` per row), ``k_cache/v_cache`` the layer's
    ``[B,Hkv,S,D]`` buffers, ``slots [T]`` (or ``[B,T]``), ``mask`` the ``[T,W]`` (or ``[B,T,W]``)
    visibility, W <= S, already repeated for the query heads of each K/V head (``group_mask``).
    """
    b, t, _ = x.shape
    h = rms_norm(x, ln1, eps)
    q, k, v = linear(h, wqkv, bqkv).split((n_heads * head_dim, n_kv * head_dim, n_kv * head_dim), dim=-1)
    q = apply_rope(q.view(b, t, n_heads, head_dim).transpose(1, 2), cos, sin)
    k = apply_rope(k.view(b, t, n_kv, head_dim).transpose(1, 2), cos, sin)
    v = v.view(b, t, n_kv, head_dim).transpose(1, 2)
    write_slots(k_cache, slots, k)
    write_slots(v_cache, slots, v)
    width = mask.shape[-1]
    out = attend(q, k_cache[:, :, :width], v_cache[:, :, :width], mask, grouped=True)
    x = x + linear(out.transpose(1, 2).reshape(b, t, n_heads * head_dim), wo)
    return x + swiglu_fused(rms_norm(x, ln2, eps), wgu, wdown)


@dataclass
class LayerWeights:
    """One layer's weights, q/k/v and gate/up fused (``[(Hq+2Hkv)D, H]`` and ``[2I, H]``)."""

    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    ln1: torch.Tensor
    ln2: torch.Tensor
    wgu: torch.Tensor
    down: torch.Tensor

    @classmethod
    def from_hf(cls, layer) -> "LayerWeights":
        a, m = layer.self_attn, layer.mlp
        biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
        bqkv = None if any(b is None for b in biases) else torch.cat([b.detach() for b in biases])
        return cls(torch.cat([a.q_proj.weight.detach(), a.k_proj.weight.detach(), a.v_proj.weight.detach()]),
                   bqkv, a.o_proj.weight.detach(), layer.input_layernorm.weight.detach(),
                   layer.post_attention_layernorm.weight.detach(),
                   torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]), m.down_proj.weight.detach())


#: Fixed-shape compiles a process may hold per layer function: row buckets (1..64) times models and
#: dtypes loaded in one process (tests load several); dynamo's default of 8 made a second model fail.
RECOMPILE_LIMIT = 64


def compile_fixed(fn):
    """``torch.compile`` for one fixed-shape layer function, with room for every shape the engine runs."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
    return torch.compile(fn, dynamic=False, fullgraph=True)


class TargetModel:
    """A Llama/Qwen2 causal LM as plain tensors plus the capture points EAGLE-3 reads."""

    def __init__(self, hf_model, capture_points: list[int], max_len: int):
        cfg = hf_model.config
        check_architecture(cfg)
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
        self.layers = [LayerWeights.from_hf(layer) for layer in body.layers]
        self.max_len = max_len
        self.cos, self.sin = rope_tables(rope_theta(cfg), self.head_dim, max_len, self.device)
        self._compiled = None
        self.packs = None  # CPU: packed copies of the matrices (eaglekb.models.packed.PackSet), set by an Engine
        self.halves = None  # CPU: half-width copies of the matrices (eaglekb.models.packed.HalfSet), set by an Engine

    def compile(self) -> None:
        """Compile one decoder layer with inductor for the fixed-shape steps (idempotent)."""
        if self._compiled is None:
            self._compiled = compile_fixed(decoder_layer)

    def new_cache(self, max_len: int | None = None, batch: int = 1) -> StaticKV:
        return StaticKV(self.n_layers, self.n_kv, self.head_dim, max_len or self.max_len,
                        dtype=self.dtype, device=self.device, batch=batch)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``positions [T]`` (``[T,D]``) or per row ``[B,T]`` (``[B,1,T,D]``)."""
        cos, sin = self.cos[positions], self.sin[positions]
        return (cos[:, None], sin[:, None]) if positions.dim() == 2 else (cos, sin)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return linear(rms_norm(x, self.norm_weight, self.eps), self.lm_head)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                kv: StaticKV, *, last_only: bool = False, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids [B,T]`` at ``positions [T]`` (or ``[B,T]``), caching K/V at ``slots``.

        Returns logits ``[B,T,V]`` (``[B,1,V]`` with ``last_only``) and the aux
        hidden states ``[B,T,3H]`` (capture points concatenated in order).
        """
        x = self.embed(ids)
        cos, sin = self.rope(positions)
        mask = group_mask(mask, self.n_heads // self.n_kv)  # once per step, not once per layer
        layer = self._compiled if compiled and self._compiled is not None else decoder_layer
        captured = {}
        for i, w in enumerate(self.layers):
            if i in self.capture_points:
                captured[i] = x
            x = layer(x, cos, sin, w.wqkv, w.bqkv, w.wo, w.ln1, w.ln2, w.wgu, w.down, kv.k[i], kv.v[i],
                      slots, mask, self.n_heads, self.n_kv, self.head_dim, self.eps)
        aux = torch.cat([captured[c] for c in self.capture_points], dim=-1)
        if last_only:
            x = x[:, -1:]
        return self.head(x), aux

    __call__ = forward
