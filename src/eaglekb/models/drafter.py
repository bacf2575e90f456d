"""The EAGLE-3 drafter as a torch module, and saving / loading it.

Owns: ``Eagle3Drafter`` (plain torch; parameter names exactly as SGLang and SpecForge
store them: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``), its
pieces (``RMSNorm``, ``Attention``, ``MLP``, ``MidLayer``), the drafter's own growing
``KVCache``, ``build_drafter_for_target`` (a fresh drafter sized for a target config by
``drafter_config_for_target``) and ``save_drafter`` / ``load_drafter`` (module <-> the
files of ``eaglekb.formats.drafter``, in either on-disk format).

The per-step pieces are methods the TTT trainer (``eaglekb.training.ttt``) calls too,
so inference and training run the same code: ``Eagle3Drafter.project_hidden`` (fc on
aux hidden states), ``rope``, ``logits``; ``MidLayer.fuse`` (``norm(embed) ++
norm(hidden)``) and ``feed_forward``; ``Attention.project`` (q/k/v + RoPE) and
``output``. The numerics are ``eaglekb.models.layers`` (RoPE in float32, as SpecForge
trains it).

Knows nothing about config.json fields or tensor files beyond calling
``eaglekb.formats.drafter``, vocab statistics, training or the task runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from eaglekb.formats.drafter import (
    DrafterConfig,
    layout_problems,
    read_drafter_files,
    write_drafter_files,
)
from eaglekb.formats.mapping import check_mapping, mapping_from_selected
from eaglekb.io.errors import BadInput, Incompatible, SchemaError
from eaglekb.models.layers import apply_rope, attend, inv_freq, rms_norm, rope_cos_sin, swiglu
from eaglekb.models.parallel_drafter import add_mask_inputs, parallel_tokens_of
from eaglekb.models.target import default_config_ids


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


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

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q ``[B,Hq,T,D]``, k and v ``[B,Hkv,T,D]`` of ``x [B,T,2H]``; RoPE (float32) on q and k."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin, float32=True), apply_rope(k, cos, sin, float32=True), v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the attention output ``[B,Hq,T,D]`` -> ``[B,T,H]``."""
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def forward(self, x, cos, sin, cache: "KVCache | None") -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        t = q.shape[2]
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        s = k.shape[2]
        # query i sits at cache slot past+i and sees slots <= past+i
        mask = torch.arange(s, device=x.device)[None, :] <= (past + torch.arange(t, device=x.device))[:, None]
        return self.output(attend(q, k, v, mask))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


class MidLayer(nn.Module):
    """The one decoder layer: norm(embed) ++ norm(hidden) -> attention; residual is the raw hidden."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def fuse(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The attention input ``norm(embeds) ++ norm(hidden)`` ``[B,T,2H]``."""
        return torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)

    def feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLP block with its residual: ``hidden + mlp(norm(hidden))``."""
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward(self, embeds, hidden, cos, sin, cache) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.fuse(embeds, hidden), cos, sin, cache)
        return self.feed_forward(hidden)


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
        _check_supported(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embeddings else None
        if self.embed_tokens is not None:
            self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", inv_freq(cfg.rope_theta, cfg.dim_head), persistent=False)
        # P-EAGLE (eaglekb.models.parallel_drafter): k tokens per pass and the mask inputs; 0 for EAGLE-3
        self.parallel_tokens = parallel_tokens_of(cfg)
        if self.parallel_tokens:
            add_mask_inputs(self, cfg)

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

    # -- the per-step pieces (the TTT trainer calls these too)

    def token_embeds(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """The token input: ``inputs_embeds`` as given, else ``embed_tokens(input_ids)``."""
        if inputs_embeds is not None:
            return inputs_embeds
        if input_ids is None:
            raise BadInput("no token input", where="Eagle3Drafter.forward",
                           expected="input_ids or inputs_embeds", found="neither")
        if self.embed_tokens is None:
            raise BadInput("drafter holds no embed_tokens", where="Eagle3Drafter.forward",
                           expected="inputs_embeds from the target", found="input_ids only",
                           fix="pass inputs_embeds=target.embed_weight[ids] or attach embeddings")
        return self.embed_tokens(input_ids)

    def project_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """``fc`` on the target's aux hidden states ``[..,3*target_H]``; a drafter hidden ``[..,H]`` as is."""
        width = hidden.shape[-1]
        if width == self.config.fc_in:
            return self.fc(hidden)
        if width != self.config.hidden_size:
            raise Incompatible("hidden state width does not fit the drafter", where="hidden",
                               expected=f"{self.config.fc_in} (aux) or {self.config.hidden_size}",
                               found=str(width))
        return hidden

    def rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin ``[B,1,T,D]`` (one head axis to broadcast) for ``position_ids [B,T]``."""
        cos, sin = rope_cos_sin(position_ids, self.inv_freq.to(position_ids.device).float())
        return cos[:, None], sin[:, None]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits of a (pre-norm) drafter hidden state."""
        return self.lm_head(self.norm(hidden))

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
        inputs_embeds = self.token_embeds(input_ids, inputs_embeds)
        hidden = self.project_hidden(hidden)
        b, t, _ = hidden.shape
        if position_ids is None:
            start = cache.length if cache is not None else 0
            position_ids = torch.arange(start, start + t, device=hidden.device)[None].expand(b, t)
        cos, sin = self.rope(position_ids)
        out = self.midlayer(inputs_embeds.to(hidden.dtype), hidden, cos, sin, cache)
        return DrafterOutput(logits=self.logits(out), hidden=out)

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


def _check_supported(cfg: DrafterConfig) -> None:
    """Refuse configs this module would run wrong (uneven GQA, an fc bias, another activation): the checks
    ``invoke inspect`` reports too (``eaglekb.formats.drafter.layout_problems``)."""
    problems = layout_problems(cfg)
    if problems:
        raise problems[0][1]


# ----------------------------------------------------------------------------- build, save, load


def drafter_config_for_target(target_config, draft_vocab_size: int, *, intermediate_size: int | None = None,
                              aux_layer_ids: Sequence[int] | None = None,
                              torch_dtype: str = "bfloat16") -> DrafterConfig:
    """The drafter shape for a transformers target config (a config object or its dict)."""
    tc = target_config
    get = (lambda k, d=None: tc.get(k, d)) if isinstance(tc, dict) else (lambda k, d=None: getattr(tc, k, d))
    rope = get("rope_parameters") or {}
    theta = get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    hidden = int(get("hidden_size"))
    vocab = int(get("vocab_size"))
    if not 0 < draft_vocab_size <= vocab:
        raise BadInput("draft vocab size out of range", where="draft_vocab_size",
                       expected=f"1..{vocab}", found=str(draft_vocab_size))
    return DrafterConfig(
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
    cfg = drafter_config_for_target(target_config, draft_vocab_size, intermediate_size=intermediate_size,
                                    aux_layer_ids=aux_layer_ids, torch_dtype=torch_dtype)
    model = Eagle3Drafter(cfg, with_embeddings=with_embeddings)
    model.init_weights(seed)
    if mapping is None:
        selected = list(range(draft_vocab_size))
    else:
        selected = [int(i) for i in torch.as_tensor(mapping).tolist()]
    if len(set(selected)) != draft_vocab_size:
        raise BadInput("mapping size does not match draft_vocab_size", where="mapping",
                       expected=f"{draft_vocab_size} distinct token ids", found=str(len(set(selected))))
    d2t, _ = mapping_from_selected(selected, cfg.vocab_size)
    model.set_mapping(d2t)
    return model


def save_drafter(model: Eagle3Drafter, path: str | Path, *, format: str = "sglang",
                 include_embeddings: bool = False, verifier: str | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in ``format`` (sglang or speculators), atomically.

    Floating tensors are stored in the config's ``torch_dtype``; ``embed_tokens`` only
    with ``include_embeddings``.
    """
    if format != "sglang" and model.parallel_tokens:
        raise BadInput("a P-EAGLE drafter is saved in the sglang layout only", where="format", expected="sglang",
                       found=repr(format))
    dtype = getattr(torch, model.config.torch_dtype, None)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("embed_tokens") and not include_embeddings:
            continue
        if tensor.is_floating_point() and isinstance(dtype, torch.dtype):
            tensor = tensor.to(dtype)
        state[name] = tensor.detach().contiguous().cpu()
    return write_drafter_files(path, model.config, state, format=format, verifier=verifier)


def load_drafter(path: str | Path, *, dtype: str | None = None, device: str = "cpu",
                 strict: bool = True) -> Eagle3Drafter:
    """Load a drafter saved in SGLang/SpecForge or speculators format."""
    cfg, tensors = read_drafter_files(path)
    model = Eagle3Drafter(cfg, with_embeddings="embed_tokens.weight" in tensors)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    _check_tensors(path, tensors, expected, strict)
    check_mapping(tensors["d2t"], cfg.vocab_size, cfg.draft_vocab_size, tensors.get("t2d"), str(path))
    model.load_state_dict({k: tensors[k] for k in expected}, strict=True, assign=True)
    if dtype is not None:
        model.to(getattr(torch, dtype))
        model.inv_freq = model.inv_freq.float()  # rope frequencies stay float32
    if model.embed_tokens is not None:
        model.embed_tokens.weight.requires_grad_(False)
    return model.to(device)


def _check_tensors(path, tensors: dict, expected: dict, strict: bool) -> None:
    """Names and shapes of a checkpoint's tensors against the module built from its config."""
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
