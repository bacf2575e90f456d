"""Training: TTT drafter training, lm_head remapping, checkpoints, DDP through torchrun.

Modules: ``config`` (TrainConfig, NOISE), ``ttt`` (the TTT unroll and loss),
``batches`` (split, order, padding), ``checkpoints``, ``distributed`` (rank, reductions,
device), ``loop`` (prepare, train, evaluate), ``sources`` (validation per data source),
``report`` (metrics, baseline fields, text), ``launch`` (torchrun), ``remap`` (lm_head rows
to another draft vocab).

The names callers use (``from eaglekb import training``): ``TrainConfig``, ``NOISE``,
``train``, ``launch``, ``baseline_fields``, ``render_text``.
"""

from eaglekb.training.config import NOISE, TrainConfig
from eaglekb.training.launch import launch
from eaglekb.training.loop import train
from eaglekb.training.report import baseline_fields, render_text

__all__ = ["NOISE", "TrainConfig", "baseline_fields", "launch", "render_text", "train"]
