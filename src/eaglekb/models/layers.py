"""The transformer layers every forward in eaglekb shares: RoPE, RMSNorm, SwiGLU, attention.

Owns the numerics, once: rotary tables and their application (HF's convention,
frequencies repeated twice; computed in float32 for the drafter, in the
activation dtype for the target, as transformers does), RMSNorm in float32 with
the weight applied in the input dtype, the SwiGLU MLP, scaled-dot-product
attention over a boolean mask with grouped-query heads, and the linear map the engine
runs (``linear``: on the CPU, a few rows through the fastest of three equal products: ``F.linear``, the
transposed product, or oneDNN's over a packed copy of the matrix, ``eaglekb.models.packed``).

Used by the drafter module (``eaglekb.models.drafter``), the TTT trainer
(``eaglekb.training``) and the engine (``eaglekb.engine``). Plain functions over
tensors: no modules, no caches, no knowledge of checkpoints or configs beyond
``rope_theta``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from eaglekb.io.errors import Incompatible
from eaglekb.models.packed import half_for, half_linear, packed_for, packed_linear


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


#: Rows (tokens in a step) for which the CPU may run ``w @ x.T`` instead of ``x @ w.T``: 1 to 7 rows. On one 2-core
#: CPU the BLAS behind ``F.linear`` took a slow path for a handful of rows (a decoder's weights at 2 to 5 rows
#: streamed at about half the rate of one row), while the transposed product streamed them faster, one row run as
#: two identical columns; on another the opposite held (docs/reference/engine.md, "Few rows on the CPU"), so the
#: choice is timed per machine (``calibrate_cpu_products``). Many rows and every GPU: ``F.linear``.
CPU_FEW_ROWS = (1, 7)

#: Per row count in ``CPU_FEW_ROWS``: whether ``linear`` runs the transposed product. Which of the two is faster
#: depends on the CPU and its BLAS (on another 2-core host ``F.linear`` was about twice as fast at every count), so
#: ``calibrate_cpu_products`` times both on the model's own weights and sets this; until then, the transposed one.
_TRANSPOSED: dict[int, bool] = {r: True for r in range(CPU_FEW_ROWS[0], CPU_FEW_ROWS[1] + 1)}
_CALIBRATED: dict[tuple, dict[int, str]] = {}
#: Weights smaller than this are not timed (a tiny test model's products take microseconds: noise, not a choice).
CALIBRATE_MIN_NUMEL = 1 << 20


def cpu_products() -> dict[str, str]:
    """The product ``linear`` runs on the CPU per row count: {"1": "transposed" or "direct", ...}."""
    return {str(r): "transposed" if t else "direct" for r, t in sorted(_TRANSPOSED.items())}


def calibrate_cpu_products(weights: list[torch.Tensor], *, repeats: int = 3, margin: float = 0.1) -> dict[str, str]:
    """Time ``F.linear`` against the transposed product for 1-7 rows over ``weights`` (a model's matrices), on the
    threads in force, and keep for each row count the faster; the transposed one only when it is faster by more
    than ``margin`` (so timing noise does not flip the choice). Once per process for the same shapes and threads;
    CPU float32/bfloat16 matrices only, tiny ones left at the default. Returns ``cpu_products()``."""
    weights = [w for w in weights if w.device.type == "cpu" and w.dim() == 2 and w.numel() >= CALIBRATE_MIN_NUMEL]
    if not weights:
        return cpu_products()
    key = (tuple((tuple(w.shape), w.dtype) for w in weights), torch.get_num_threads())
    if key not in _CALIBRATED:
        import time

        choice = {}
        with torch.inference_mode():
            for rows in range(CPU_FEW_ROWS[0], CPU_FEW_ROWS[1] + 1):
                xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]
                best = {}
                for name, transposed in (("direct", False), ("transposed", True)):
                    _TRANSPOSED[rows] = transposed
                    times = []
                    for _ in range(repeats + 1):  # the first pass warms the kernel and the caches
                        t0 = time.perf_counter()
                        for x, w in zip(xs, weights):
                            linear(x, w)
                        times.append(time.perf_counter() - t0)
                    best[name] = min(times[1:])
                choice[rows] = "transposed" if best["transposed"] < (1 - margin) * best["direct"] else "direct"
        _CALIBRATED[key] = choice
    for rows, name in _CALIBRATED[key].items():
        _TRANSPOSED[rows] = name == "transposed"
    return cpu_products()


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``; on the CPU, over ``w``'s half-width copy where its model runs this row count on one
    (a drafter: every row count), or its packed
    copy where its model runs this row count packed (``eaglekb.models.packed``), else for 1-7 rows, where
    ``calibrate_cpu_products`` found it faster (the default before any calibration), the same product as
    ``(w @ x.T).T`` (one row as two identical columns, the first kept)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu":
        return F.linear(x, w, b)
    half = half_for(w, rows)
    if half is not None:
        return half_linear(x, half, b)
    copy = packed_for(w, rows)
    if copy is not None:
        return packed_linear(x, copy, b)
    if not _TRANSPOSED.get(rows, False):
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
