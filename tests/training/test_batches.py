"""Batch order: deterministic per (seed, epoch); length grouping covers each sequence once and pads less."""

from __future__ import annotations

import random

import pytest

from eaglekb.io.errors import BadInput
from eaglekb.training.batches import Batches
from eaglekb.training.config import TrainConfig


def _padded(batches: Batches, lengths: list[int], steps: range) -> int:
    return sum(max(lengths[i] for i in batches.items(s)) * len(batches.items(s)) for s in steps)


def test_length_grouping_covers_the_epoch_once_and_pads_less():
    rng = random.Random(0)
    lengths = [rng.randint(20, 1000) for _ in range(4000)]
    indices = [i for i in range(len(lengths)) if i % 17]  # some sequences held out
    plain = Batches(None, indices, 32, 1024, seed=3)
    grouped = Batches(None, indices, 32, 1024, seed=3, lengths=lengths)
    epoch = range(grouped.per_epoch)
    seen = [i for s in epoch for i in grouped.items(s)]
    assert len(seen) == len(set(seen)) == grouped.per_epoch * 32
    assert set(seen) <= set(indices)
    assert _padded(grouped, lengths, epoch) < 0.6 * _padded(plain, lengths, epoch)
    again = Batches(None, indices, 32, 1024, seed=3, lengths=lengths)
    assert [again.items(s) for s in reversed(epoch)] == [grouped.items(s) for s in reversed(epoch)]
    assert grouped.items(grouped.per_epoch) != grouped.items(0)  # a new epoch, a new order


def test_random_batches_are_unchanged_by_the_epoch_plan():
    import torch

    indices = list(range(100, 300))
    b = Batches(None, indices, 16, 512, seed=5)
    for step in (0, 5, 12, 13, 30):
        epoch, j = divmod(step, b.per_epoch)
        g = torch.Generator().manual_seed(5 * 1_000_003 + epoch)
        order = torch.randperm(len(indices), generator=g).tolist()
        assert b.items(step) == [indices[i] for i in order[j * 16:(j + 1) * 16]]


def test_unknown_batching_is_refused():
    with pytest.raises(BadInput, match="unknown batching"):
        TrainConfig(data="d", out="o", batching="sorted").check()
