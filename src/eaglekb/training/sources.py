"""Validation per data source: which source each held-out sequence comes from, and its numbers.

Owns ``ValSources`` (the source of each validation sequence, from the sequence ids in the
shards' headers: ``eaglekb.data.prompts.source_of``, named as datagen's record names it,
``source_key``), ``val_sources`` (None for shards written before ids were stored), ``add_rows``
(a batch's per-row counts of the validation forward summed per source, so there is no second
pass) and ``source_metrics`` (positions, step-0 accuracy and simulated accept length per source,
by ``summarise``, the definitions of the mixed numbers).

Knows nothing about the drafter, the loss, processes or the task runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglekb.data.prompts import source_key, source_of
from eaglekb.training.report import summarise


@dataclass
class ValSources:
    """The sources of a validation set: their metric keys, sorted, and each sequence's source number."""

    names: list[str]
    of: dict[int, int]  # dataset index -> index into ``names``

    def counts(self, steps: int, device) -> torch.Tensor:
        """Zeroed counts ``[sources, K, 5]`` (the loss column stays zero: the loss is summed per batch)."""
        return torch.zeros((len(self.names), steps, 5), dtype=torch.float64, device=device)


def val_sources(dataset, indices: list[int]) -> ValSources | None:
    """The source of each of ``indices``; None when a shard holds no sequence ids (an older datagen)."""
    ids = [dataset.sequence_id(i) for i in indices]
    if not ids or any(x is None for x in ids):
        return None
    keys = [source_key(source_of(x)) for x in ids]
    names = sorted(set(keys))
    number = {n: k for k, n in enumerate(names)}
    return ValSources(names, {i: number[k] for i, k in zip(indices, keys)})


def add_rows(counts: torch.Tensor, sources: ValSources, items: list[int], rows: torch.Tensor) -> None:
    """Add a batch's per-row counts ``[B, K, 4]`` (rows in the order of ``items``) to their sources' counts."""
    idx = torch.tensor([sources.of[i] for i in items], device=counts.device)
    counts[:, :, 1:].index_add_(0, idx, rows.to(counts.dtype))


def source_metrics(counts: torch.Tensor, sources: ValSources, weight: float) -> dict[str, dict]:
    """{source key: positions, step-0 accuracy, simulated accept length} from summed counts ``[sources, K, 5]``."""
    out = {}
    for name, c in zip(sources.names, counts):
        m = summarise(c, weight)
        out[name] = {"positions": m["positions"], "acc0": m["acc"][0], "simulated_acc_len": m["simulated_acc_len"]}
    return out
