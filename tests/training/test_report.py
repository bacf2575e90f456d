"""eaglekb.training.report: per-step metrics from summed counts."""

from __future__ import annotations

import pytest
import torch

from eaglekb.training.report import summarise


def test_metrics_from_counts():
    # counts per step: loss sum, positions, correct, chain-correct, chain-correct before
    st = torch.tensor([[10.0, 10, 8, 8, 10], [10.0, 10, 6, 5, 8], [10.0, 10, 5, 4, 5]])
    m = summarise(st)
    assert m["acc"] == [0.8, 0.6, 0.5] and m["full_acc"] == [0.8, 0.5, 0.4]
    assert m["cond_acc"] == pytest.approx([0.8, 5 / 8, 0.8])
    assert m["simulated_acc_len"] == pytest.approx(0.8 + 0.48 + 0.24)
    assert m["chain_acc_len"] == pytest.approx(1.7) and m["loss"] == pytest.approx(1 + 0.8 + 0.64)
