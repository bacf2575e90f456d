"""The EAGLE-3 drafter: module, config, and the two on-disk formats.

Owns: ``DrafterConfig`` (the fields of SGLang/SpecForge's ``LlamaForCausalLMEagle3``
config.json), ``Eagle3Drafter`` (plain torch, weight names exactly as SGLang and
SpecForge store them), and save/load in both formats:

* ``sglang`` (SpecForge / SGLang "legacy EAGLE-3"): config.json with
  ``architectures: ["LlamaForCausalLMEagle3"]`` and weights ``fc``, ``midlayer.*``,
  ``norm``, ``lm_head``, ``d2t``, ``t2d`` (``embed_tokens`` optional).
* ``speculators`` (vLLM speculators): config.json with ``speculators_model_type:
  "eagle3"``, ``transformer_layer_config`` and ``speculators_config``; the decoder
  layer is stored as ``layers.0.*``.

Layer ids: eaglekb keeps ``aux_layer_ids`` in SGLang's config convention (SGLang
captures ``id + 1``). Speculators configs are read by vLLM as capture points
(no shift), so export writes ``id + 1`` and import subtracts 1: the drafter sees
the same hidden states in both runtimes.

Sources checked (see docs/reference/drafter-format.md): SpecForge
``specforge/modeling/draft/llama3_eagle.py``, SGLang
``python/sglang/srt/models/llama_eagle3.py``, speculators
``src/speculators/models/eagle3/{config,model_definitions}.py``.

Knows nothing about targets, training, vocab statistics or the task runner.
Safetensors only; no pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
WEIGHTS_FILE = "model.safetensors"

MIDLAYER_KEYS = (
    "input_layernorm.weight",
    "hidden_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
REQUIRED_KEYS = ("fc.weight", *(f"midlayer.{k}" for k in MIDLAYER_KEYS), "norm.weight",
                 "lm_head.weight", "d2t", "t2d")
OPTIONAL_KEYS = ("embed_tokens.weight",)

# Standard HF / SpecForge config.json fields a drafter config may carry without effect here.
_PASSIVE_FIELDS = {
    "architectures", "model_type", "num_hidden_layers", "torch_dtype", "dtype", "eagle_config",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "pretraining_tp",
    "use_cache", "attention_bias", "attention_dropout", "mlp_bias", "rope_scaling",
    "rope_parameters", "transformers_version", "tie_word_embeddings", "_name_or_path",
    "bias", "hidden_act", "head_dim", "target_hidden_size", "rope_theta", "draft_vocab_size",
}


@dataclass
class DrafterConfig:
    """Shape and numerics of one EAGLE-3 drafter (one decoder layer)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int | None = None  # None: same as hidden_size
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    torch_dtype: str = "bfloat16"
    aux_layer_ids: list[int] | None = None  # SGLang config convention (capture point = id + 1)
    extra: dict[str, Any] = field(default_factory=dict)  # passive fields kept for round trips

    @property
    def fc_in(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    # -- SGLang / SpecForge config.json

    def _layer_json(self) -> dict:
        """The one Llama decoder layer's fields, the same in both formats."""
        return {
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.dim_head,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
            "tie_word_embeddings": False,  # SGLang ties lm_head to embed_tokens when true
        }

    def to_sglang_json(self) -> dict:
        doc = dict(self.extra)
        doc.update(self._layer_json())
        doc.update({
            "architectures": [SGLANG_ARCH],
            "draft_vocab_size": self.draft_vocab_size,
            "rope_scaling": None,
            "torch_dtype": self.torch_dtype,
            "target_hidden_size": self.target_hidden_size or self.hidden_size,
        })
        if self.aux_layer_ids is not None:
            doc["eagle_config"] = {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            }
        return doc

    @classmethod
    def from_sglang_json(cls, doc: dict, where: str = "config.json") -> "DrafterConfig":
        arch = doc.get("architectures") or []
        if SGLANG_ARCH not in arch:
            raise SchemaError("unknown drafter architecture", where=f"{where}:architectures",
                              expected=f"[{SGLANG_ARCH!r}] or a speculators config",
                              found=repr(arch))
        own = {f.name for f in fields(cls)} - {"extra", "aux_layer_ids"}
        unknown = sorted(set(doc) - own - _PASSIVE_FIELDS)
        if unknown:
            raise SchemaError("unknown config field", where=f"{where}:{unknown[0]}",
                              expected="a LlamaForCausalLMEagle3 field", found=repr(unknown[0]),
                              fix="remove or rename it (SGLang would ignore it silently)")
        kwargs = {k: doc[k] for k in own if k in doc and k != "torch_dtype"}
        kwargs["torch_dtype"] = str(doc.get("torch_dtype") or doc.get("dtype") or "bfloat16")
        rope = doc.get("rope_parameters") or {}
        if "rope_theta" not in doc and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        _check_rope(doc, where)
        eagle = doc.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        extra = {k: v for k, v in doc.items() if k in _PASSIVE_FIELDS and k not in _WRITTEN}
        return _build(cls, kwargs, ids, extra, where)

    # -- speculators config.json

    def to_speculators_json(self, *, verifier: str | None = None, speculative_tokens: int = 3) -> dict:
        layer = {**self._layer_json(), "architectures": ["LlamaForCausalLM"]}
        return {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "eagle3",
            "draft_vocab_size": self.draft_vocab_size,
            "norm_before_residual": False,
            "target_hidden_size": self.target_hidden_size or self.hidden_size,
            # vLLM reads these as capture points: SGLang ids + 1 keep the same hidden states.
            "eagle_aux_hidden_state_layer_ids": (
                [i + 1 for i in self.aux_layer_ids] if self.aux_layer_ids is not None else None
            ),
            "embed_requires_grad": False,
            "torch_dtype": self.torch_dtype,
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }],
                "verifier": {"name_or_path": verifier, "architectures": []},
            },
        }

    @classmethod
    def from_speculators_json(cls, doc: dict, where: str = "config.json") -> "DrafterConfig":
        if doc.get("speculators_model_type") != "eagle3":
            raise SchemaError("not an EAGLE-3 speculators config", where=f"{where}:speculators_model_type",
                              expected="'eagle3'", found=repr(doc.get("speculators_model_type")))
        if doc.get("norm_before_residual"):
            raise Incompatible("norm_before_residual=true is not the SGLang layout",
                               where=f"{where}:norm_before_residual", expected="false", found="true")
        layer = doc.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SchemaError("missing transformer_layer_config", where=where,
                              expected="an object", found=repr(type(layer).__name__))
        _check_rope(layer, f"{where}:transformer_layer_config")
        own = {f.name for f in fields(cls)} - {"extra", "aux_layer_ids", "draft_vocab_size",
                                              "target_hidden_size", "torch_dtype"}
        kwargs = {k: layer[k] for k in own if k in layer}
        rope = layer.get("rope_parameters") or {}
        if "rope_theta" not in layer and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        kwargs["draft_vocab_size"] = doc.get("draft_vocab_size")
        kwargs["target_hidden_size"] = doc.get("target_hidden_size")
        kwargs["torch_dtype"] = str(doc.get("torch_dtype") or doc.get("dtype") or "bfloat16")
        points = doc.get("eagle_aux_hidden_state_layer_ids")
        ids = [int(p) - 1 for p in points] if points is not None else None
        return _build(cls, kwargs, ids, {}, where)


_WRITTEN = {"architectures", "model_type", "num_hidden_layers", "torch_dtype", "dtype", "eagle_config",
            "rope_scaling", "rope_parameters", "tie_word_embeddings", "head_dim", "hidden_act",
            "target_hidden_size", "rope_theta", "draft_vocab_size", "_name_or_path",
            "transformers_version"}


def _check_rope(doc: dict, where: str) -> None:
    """eaglekb's drafter implements default RoPE only; refuse scaled RoPE rather than run it wrong."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = doc.get(key)
        kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
        if kind not in (None, "default"):
            raise Incompatible("unsupported RoPE scaling", where=f"{where}:{key}",
                               expected="null or default RoPE", found=repr(kind))


def _build(cls, kwargs: dict, ids, extra: dict, where: str) -> DrafterConfig:
    required = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "draft_vocab_size")
    for key in required:
        value = kwargs.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SchemaError("missing or invalid config field", where=f"{where}:{key}",
                              expected="a positive integer", found=repr(value))
    if ids is not None and (not isinstance(ids, list) or len(ids) != 3):
        raise SchemaError("invalid aux layer ids", where=f"{where}:eagle_aux_hidden_state_layer_ids",
                          expected="a list of 3 integers", found=repr(ids))
    return cls(**kwargs, aux_layer_ids=[int(i) for i in ids] if ids is not None else None, extra=extra)


# ----------------------------------------------------------------------------- module


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Llama attention whose q/k/v read ``2*hidden`` inputs (embedding ++ hidden)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.dim_head
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * h, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, h, bias=False)

    def forward(self, x, cos, sin, cache: "KVCache | None") -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        s = k.shape[2]
        # query i sits at cache slot past+i and sees slots <= past+i
        mask = torch.arange(s, device=x.device)[None, :] <= (past + torch.arange(t, device=x.device))[:, None]
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The one decoder layer: norm(embed) ++ norm(hidden) -> attention; residual is the raw hidden."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds, hidden, cos, sin, cache) -> torch.Tensor:
        residual = hidden
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        hidden = residual + self.self_attn(x, cos, sin, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class KVCache:
    """The drafter's own growing KV cache (one layer); ``crop(n)`` keeps the first n slots."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def crop(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


@dataclass
class DrafterOutput:
    logits: torch.Tensor  # [B, T, draft_vocab]
    hidden: torch.Tensor  # [B, T, H], pre-norm: the input of the next draft step


class Eagle3Drafter(nn.Module):
    """EAGLE-3 drafter with SGLang/SpecForge parameter names."""

    def __init__(self, cfg: DrafterConfig, *, with_embeddings: bool = False):
        super().__init__()
        self.config = cfg
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise SchemaError("heads not divisible by kv heads", where="config",
                              expected="num_attention_heads % num_key_value_heads == 0",
                              found=f"{cfg.num_attention_heads} % {cfg.num_key_value_heads}")
        if cfg.extra.get("bias"):
            raise Incompatible("fc bias is not supported", where="config:bias", expected="false", found="true")
        if cfg.hidden_act != "silu":
            raise Incompatible("unsupported activation", where="config:hidden_act",
                               expected="'silu'", found=repr(cfg.hidden_act))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embeddings else None
        if self.embed_tokens is not None:
            self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        hd = cfg.dim_head
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    # -- mapping

    def set_mapping(self, d2t: torch.Tensor) -> None:
        """Install a mapping: ``target_id = i + d2t[i]``; t2d is derived from it."""
        d2t = torch.as_tensor(d2t, dtype=torch.int64)
        selected = check_mapping(d2t, self.config.vocab_size, self.config.draft_vocab_size)
        self.d2t.copy_(d2t)
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        t2d[selected] = True
        self.t2d.copy_(t2d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # -- forward

    def forward(
        self,
        hidden: torch.Tensor,
        *,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> DrafterOutput:
        """One drafter pass over ``T`` positions.

        ``hidden`` is either the target's aux hidden states ``[B,T,3*target_H]`` (fc is
        applied) or the previous step's drafter hidden ``[B,T,H]`` (fc skipped, as in
        SGLang). Token input: ``inputs_embeds`` (the target's embeddings) or
        ``input_ids`` when the drafter holds ``embed_tokens``. Positions default to
        ``cache.length + arange(T)``.
        """
        if inputs_embeds is None:
            if input_ids is None:
                raise BadInput("no token input", where="Eagle3Drafter.forward",
                               expected="input_ids or inputs_embeds", found="neither")
            if self.embed_tokens is None:
                raise BadInput("drafter holds no embed_tokens", where="Eagle3Drafter.forward",
                               expected="inputs_embeds from the target", found="input_ids only",
                               fix="pass inputs_embeds=target.embed_weight[ids] or attach embeddings")
            inputs_embeds = self.embed_tokens(input_ids)
        width = hidden.shape[-1]
        if width == self.config.fc_in:
            hidden = self.fc(hidden)
        elif width != self.config.hidden_size:
            raise Incompatible("hidden state width does not fit the drafter", where="hidden",
                               expected=f"{self.config.fc_in} (aux) or {self.config.hidden_size}",
                               found=str(width))
        b, t, _ = hidden.shape
        if position_ids is None:
            start = cache.length if cache is not None else 0
            position_ids = torch.arange(start, start + t, device=hidden.device)[None].expand(b, t)
        freqs = position_ids.to(torch.float32)[..., None] * self.inv_freq.to(hidden.device)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B,1,T,hd]
        out = self.midlayer(inputs_embeds.to(hidden.dtype), hidden, emb.cos(), emb.sin(), cache)
        return DrafterOutput(logits=self.lm_head(self.norm(out)), hidden=out)

    def init_weights(self, seed: int = 0, std: float = 0.02) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("embed_tokens"):
                    continue
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


# ----------------------------------------------------------------------------- mapping helpers


def check_mapping(d2t: torch.Tensor, vocab_size: int, draft_vocab_size: int, t2d: torch.Tensor | None = None,
                  where: str = "drafter") -> torch.Tensor:
    """Validate d2t (and t2d, when the checkpoint has one) for this config; return ``i + d2t[i]``."""
    from eaglekb.data import vocab

    if tuple(d2t.shape) != (draft_vocab_size,):
        raise Incompatible("d2t length does not match draft_vocab_size", where=f"{where}:d2t",
                           expected=str(draft_vocab_size), found=str(tuple(d2t.shape)))
    return vocab.check_mapping(d2t, t2d, vocab_size, where)


def mapping_from_selected(selected_ids: Sequence[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t and t2d for a set of target token ids (sorted ascending, as SpecForge does)."""
    selected = torch.as_tensor(sorted(set(int(i) for i in selected_ids)), dtype=torch.int64)
    d2t = selected - torch.arange(selected.numel(), dtype=torch.int64)
    check_mapping(d2t, vocab_size, selected.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return d2t, t2d


def build_drafter_for_target(
    target_config,
    draft_vocab_size: int,
    *,
    intermediate_size: int | None = None,
    mapping: Sequence[int] | torch.Tensor | None = None,
    aux_layer_ids: Sequence[int] | None = None,
    torch_dtype: str = "bfloat16",
    with_embeddings: bool = False,
    seed: int = 0,
) -> Eagle3Drafter:
    """A freshly initialised drafter sized for a transformers target config.

    ``mapping``: the selected target token ids (any order; sorted here) or None for
    ids ``0..draft_vocab_size-1``. ``aux_layer_ids`` default to SpecForge's
    ``[1, N//2-1, N-4]`` (SGLang convention).
    """
    from eaglekb.models.target import default_config_ids

    tc = target_config
    get = (lambda k, d=None: tc.get(k, d)) if isinstance(tc, dict) else (lambda k, d=None: getattr(tc, k, d))
    rope = get("rope_parameters") or {}
    theta = get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    hidden = int(get("hidden_size"))
    vocab = int(get("vocab_size"))
    if not 0 < draft_vocab_size <= vocab:
        raise BadInput("draft vocab size out of range", where="draft_vocab_size",
                       expected=f"1..{vocab}", found=str(draft_vocab_size))
    cfg = DrafterConfig(
        hidden_size=hidden,
        intermediate_size=int(intermediate_size or get("intermediate_size")),
        num_attention_heads=int(get("num_attention_heads")),
        num_key_value_heads=int(get("num_key_value_heads") or get("num_attention_heads")),
        head_dim=int(get("head_dim") or hidden // int(get("num_attention_heads"))),
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab_size),
        target_hidden_size=hidden,
        rms_norm_eps=float(get("rms_norm_eps") or 1e-6),
        rope_theta=float(theta),
        max_position_embeddings=int(get("max_position_embeddings") or 2048),
        torch_dtype=torch_dtype,
        aux_layer_ids=list(aux_layer_ids) if aux_layer_ids is not None
        else default_config_ids(int(get("num_hidden_layers"))),
    )
    model = Eagle3Drafter(cfg, with_embeddings=with_embeddings)
    model.init_weights(seed)
    if mapping is None:
        selected = list(range(draft_vocab_size))
    else:
        selected = [int(i) for i in torch.as_tensor(mapping).tolist()]
    if len(set(selected)) != draft_vocab_size:
        raise BadInput("mapping size does not match draft_vocab_size", where="mapping",
                       expected=f"{draft_vocab_size} distinct token ids", found=str(len(set(selected))))
    d2t, _ = mapping_from_selected(selected, vocab)
    model.set_mapping(d2t)
    return model


# ----------------------------------------------------------------------------- files


def read_config_json(path: str | Path) -> dict:
    """The raw ``config.json`` object of a model or drafter folder, with one-line errors."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise MissingFile("drafter config.json not found", where=str(cfg_path))
    try:
        doc = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise SchemaError("config.json is not valid JSON", where=str(cfg_path),
                          expected="a JSON object", found=str(exc)) from None
    if not isinstance(doc, dict):
        raise SchemaError("config.json is not an object", where=str(cfg_path),
                          expected="a JSON object", found=type(doc).__name__)
    return doc


def read_config(path: str | Path) -> tuple[DrafterConfig, str]:
    """Parse ``config.json`` of a drafter folder; returns (config, format)."""
    cfg_path = Path(path) / "config.json"
    doc = read_config_json(path)
    if "speculators_model_type" in doc:
        return DrafterConfig.from_speculators_json(doc, str(cfg_path)), "speculators"
    return DrafterConfig.from_sglang_json(doc, str(cfg_path)), "sglang"


def weight_files(path: str | Path) -> list[Path]:
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingFile("no safetensors weights in drafter folder", where=str(folder),
                          expected="model.safetensors", found=", ".join(sorted(p.name for p in folder.iterdir()))
                          or "an empty folder",
                          fix="pytorch_model.bin is not read (no pickle); convert it to safetensors")
    return files


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a drafter folder (every ``*.safetensors``), with corrupt files named."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise IntegrityError("unreadable safetensors file (truncated or corrupt)", where=str(file),
                                 expected="a complete safetensors file",
                                 found=str(exc).splitlines()[0][:160]) from None
        dup = set(out) & set(tensors)
        if dup:
            raise IntegrityError("tensor stored twice", where=str(file), found=sorted(dup)[0])
        out.update(tensors)
    return out


def to_sglang_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("midlayer." + k[len("layers.0."):]) if k.startswith("layers.0.") else k: v
            for k, v in tensors.items()}


def to_speculators_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k: v
            for k, v in tensors.items()}


def save_drafter(model: Eagle3Drafter, path: str | Path, *, format: str = "sglang",
                 include_embeddings: bool = False, verifier: str | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (atomically: temp files then rename)."""
    from safetensors.torch import save_file

    if format not in ("sglang", "speculators"):
        raise BadInput("unknown drafter format", where="format",
                       expected="sglang or speculators", found=repr(format))
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, model.config.torch_dtype, None)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("embed_tokens") and not include_embeddings:
            continue
        if tensor.is_floating_point() and isinstance(dtype, torch.dtype):
            tensor = tensor.to(dtype)
        state[name] = tensor.detach().contiguous().cpu()
    if format == "sglang":
        doc = model.config.to_sglang_json()
    else:
        doc = model.config.to_speculators_json(verifier=verifier)
        state = to_speculators_names(state)
    tmp_w = folder / f".{WEIGHTS_FILE}.tmp-{os.getpid()}"
    tmp_c = folder / f".config.json.tmp-{os.getpid()}"
    save_file(state, str(tmp_w), metadata={"format": "pt"})
    tmp_c.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_w, folder / WEIGHTS_FILE)
    os.replace(tmp_c, folder / "config.json")
    return folder


def load_drafter(path: str | Path, *, dtype: str | None = None, device: str = "cpu",
                 strict: bool = True) -> Eagle3Drafter:
    """Load a drafter saved in SGLang/SpecForge or speculators format."""
    cfg, _fmt = read_config(path)
    tensors = to_sglang_names(read_tensors(path))
    model = Eagle3Drafter(cfg, with_embeddings="embed_tokens.weight" in tensors)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    unknown = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    if strict and unknown:
        raise SchemaError("unknown tensor name", where=f"{path}:{unknown[0]}",
                          expected="an EAGLE-3 drafter weight name", found=repr(unknown[0]),
                          fix="rename it (SGLang would load random weights silently); run invoke inspect")
    if missing:
        raise SchemaError("required tensor missing", where=f"{path}", expected=missing[0], found="absent")
    for k, shape in expected.items():
        if tuple(tensors[k].shape) != shape:
            raise Incompatible("tensor shape does not match config", where=f"{path}:{k}",
                               expected=str(list(shape)), found=str(list(tensors[k].shape)))
    check_mapping(tensors["d2t"], cfg.vocab_size, cfg.draft_vocab_size, tensors.get("t2d"), str(path))
    model.load_state_dict({k: tensors[k] for k in expected}, strict=True, assign=True)
    if dtype is not None:
        model.to(getattr(torch, dtype))
        model.inv_freq = model.inv_freq.float()  # rope frequencies stay float32
    if model.embed_tokens is not None:
        model.embed_tokens.weight.requires_grad_(False)
    return model.to(device)
