"""Training helpers shared by the training tests: a small, fast TrainConfig over the tiny datasets."""

from __future__ import annotations

from pathlib import Path

from eaglekb.training.config import TrainConfig


def cfg_for(root: Path, out: Path, **over) -> TrainConfig:
    """A few-step CPU run on ``root/soft`` (see the ``data`` fixture of tests/training/conftest.py)."""
    kw = dict(data=str(root / "soft"), out=str(out), draft_vocab_size=40, intermediate_size=48, batch_size=4,
              steps=6, lr=3e-3, log_every=1, val_fraction=0.25, ttt_steps=3, warmup_frac=0.0)
    kw.update(over)
    return TrainConfig(**kw)
