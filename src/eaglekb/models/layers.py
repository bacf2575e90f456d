"""The transformer layers every forward in eaglekb shares: RoPE, RMSNorm, SwiGLU, attention.

Owns the numerics, once: rotary tables and their application (HF's convention,
frequencies repeated twice; computed in float32 for the drafter, in the
activation dtype for the target, as transformers does), RMSNorm in float32 with
the weight applied in the input dtype, the SwiGLU MLP, scaled-dot-product
attention over a boolean mask with grouped-query heads, and the linear map the engine
runs (``linear``: on the CPU, a few rows through the faster of two equal products).

Used by the drafter module (``eaglekb.models.drafter``), the TTT trainer
(``eaglekb.training``) and the engine (``eaglekb.engine``). Plain functions over
tensors: no modules, no caches, no knowledge of checkpoints or configs beyond
``rope_theta``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from eaglekb.io.errors import Incompatible


def rope_theta(config) -> float:
    """rope theta from a config (transformers 5 keeps it in ``rope_parameters``); default rope only."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise Incompatible("unsupported rope scaling", where="config:rope_parameters.rope_type",
                           expected="'default'", found=repr(kind))
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    return float(theta)


def inv_freq(theta: float, head_dim: int, device=None) -> torch.Tensor:
    """float32 inverse frequencies ``[head_dim // 2]``."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rope_cos_sin(positions: torch.Tensor, inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``[..., head_dim]`` for integer ``positions [...]`` (frequencies repeated twice)."""
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope_tables(theta: float, head_dim: int, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``[max_len, head_dim]``, indexed by position."""
    return rope_cos_sin(torch.arange(max_len, device=device), inv_freq(theta, head_dim, device))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, float32: bool = False) -> torch.Tensor:
    """Rotate ``x [..., T, D]`` by float32 ``cos/sin [T, D]``.

    ``float32=False``: cos/sin cast to x's dtype, product in x's dtype (transformers'
    Llama/Qwen2, so the target matches HF bit for bit in float32). ``float32=True``:
    the product in float32, cast back (the drafter, as SpecForge trains it).
    """
    if float32:
        return (x.float() * cos + rotate_half(x).float() * sin).to(x.dtype)
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, weight applied in the input dtype (transformers' LlamaRMSNorm)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


#: Rows (tokens in a step) for which the CPU runs ``w @ x.T`` instead of ``x @ w.T``: 1 to 7 rows. On the 2-core
#: CPU the BLAS behind ``F.linear`` takes a slow path for a handful of rows (a decoder's weights at 2 to 5 rows
#: stream at about half the rate of one row), while the transposed product streams them faster for 2 to 5 rows
#: than one row does, so one row runs as two identical columns (docs/reference/engine.md, "Few rows on the
#: CPU"). Many rows and every GPU: ``F.linear``.
CPU_FEW_ROWS = (1, 7)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``; for 1-7 rows on the CPU the same product as ``(w @ x.T).T`` (the faster kernel; one
    row as two identical columns, the first kept)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not CPU_FEW_ROWS[0] <= rows <= CPU_FEW_ROWS[1]:
        return F.linear(x, w, b)
    cols = x.reshape(rows, x.shape[-1])
    if rows == 1:
        cols = cols.expand(2, -1).contiguous()  # a stride-0 copy takes the slow path too
    y = (w @ cols.t())[:, :rows].t().contiguous()
    y = y + b if b is not None else y
    return y.view(*x.shape[:-1], w.shape[0])


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate x) * up x)``, the Llama MLP."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def swiglu_fused(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The same MLP with gate and up stacked in one weight ``[2I, H]`` (one matmul instead of two)."""
    gu = linear(x, gate_up)
    g, u = gu.chunk(2, dim=-1)
    return linear(F.silu(g) * u, down)


def group_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """A ``[T,S]`` (or ``[B,T,S]``) mask repeated for ``groups`` query heads per K/V head (see ``attend``)."""
    if groups == 1:
        return mask
    return mask.repeat(groups, 1) if mask.dim() == 2 else mask.repeat(1, groups, 1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
           causal: bool = False, grouped: bool = False) -> torch.Tensor:
    """Attention of ``q [B,Hq,T,D]`` over ``k, v [B,Hkv,S,D]`` (grouped-query when Hq > Hkv).

    ``mask`` (bool, True = visible) is ``[T,S]`` or per row ``[B,T,S]``; or ``causal``.
    With a mask, the query heads that share a K/V head are folded into the query rows
    (``[B,Hkv,G*T,D]``), so K/V are read in place, never copied, and any SDPA backend
    applies; ``grouped=True`` says the mask is already ``group_mask``-ed (done once per
    step instead of once per layer). Causal attention repeats K/V heads instead and keeps
    the fused causal kernels (training over long sequences).
    """
    b, hq, t, d = q.shape
    g = hq // k.shape[1]
    if mask is None:
        if g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if g > 1:
        q = q.reshape(b, hq // g, g * t, d)
        if not grouped:
            mask = group_mask(mask, g)
    if mask.dim() == 3:
        mask = mask[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).reshape(b, hq, t, d)
