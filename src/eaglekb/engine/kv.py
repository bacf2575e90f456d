"""Static, preallocated KV caches and attention masks over them (gpt-fast style).

Owns: ``StaticKV`` (one tensor per layer for K and V, sized up front, written by
slot index so shapes never change), the tree compaction move after acceptance,
and mask builders (causal rows, tree rows). A slot is a cache index; callers
decide which position each slot holds. Knows nothing about models or decoding.
"""

from __future__ import annotations

import torch


class StaticKV:
    """K/V buffers ``[layers, batch, kv_heads, max_len, head_dim]``, written by slot."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_len: int, *,
                 dtype: torch.dtype, device: torch.device | str, batch: int = 1):
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.batch = batch
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store ``k, v [B, H, T, D]`` at ``slots [T]`` (or per row ``[B, T]``); return the layer's full K, V."""
        write_slots(self.k[layer], slots, k)
        write_slots(self.v[layer], slots, v)
        return self.k[layer], self.v[layer]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` to ``dst`` in every layer (keep the accepted tree path)."""
        self.k.index_copy_(3, dst, self.k.index_select(3, src))
        self.v.index_copy_(3, dst, self.v.index_select(3, src))


#: On CUDA without graphs, mask widths are rounded up to this many slots: a new attention shape
#: every decode step would cost a fresh kernel plan per layer (the eager-step finding on the H200).
EAGER_WIDTH_STEP = 256


def mask_width(needed: int, cache_len: int, *, static: bool, device) -> int:
    """Attention width for ``needed`` visible slots: the whole cache under CUDA graphs (fixed
    shapes), a multiple of ``EAGER_WIDTH_STEP`` on CUDA eager, exactly ``needed`` on CPU."""
    if static:
        return cache_len
    if torch.device(device).type == "cuda":
        return min(cache_len, -(-needed // EAGER_WIDTH_STEP) * EAGER_WIDTH_STEP)
    return needed


def write_slots(cache: torch.Tensor, slots: torch.Tensor, new: torch.Tensor) -> None:
    """``cache [B,H,S,D]``: store ``new [B,H,T,D]`` at ``slots [T]`` (every row) or ``slots [B,T]`` (per row)."""
    if slots.dim() == 1:
        cache.index_copy_(2, slots, new)
    else:
        rows = torch.arange(cache.shape[0], device=cache.device)[:, None]
        cache[rows, :, slots] = new.transpose(1, 2)


def causal_rows(start: int, length: int, width: int, device) -> torch.Tensor:
    """Mask ``[length, width]``: row i (slot ``start+i``) sees slots ``<= start+i``."""
    cols = torch.arange(width, device=device)
    rows = start + torch.arange(length, device=device)
    return cols[None, :] <= rows[:, None]


def tree_rows(prefix: int, parents: list[int], width: int, device) -> torch.Tensor:
    """Mask for a tree laid out at slots ``prefix + i``: node i sees the prefix and its ancestors.

    ``parents[i]`` is the index of node i's parent within the same list, or -1 for a
    node attached directly to the prefix.
    """
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
    mask = torch.zeros(n, width, dtype=torch.bool)
    mask[:, :prefix] = True
    mask[:, prefix:prefix + n] = anc
    return mask.to(device)
