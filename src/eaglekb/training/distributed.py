"""The process group as the training loop sees it: rank, world size, reductions, device.

Owns: ``dist_info`` (rank and world size; ``(0, 1)`` outside torchrun), ``all_reduce``
and ``barrier`` (no-ops in one process), and ``pick_device`` (``auto`` / ``cpu`` /
``cuda``, one GPU per local rank under torchrun).

Knows nothing about training, data or checkpoints; starting processes is
``eaglekb.training.launch``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from eaglekb.io.errors import Unavailable


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def dist_info() -> tuple[int, int]:
    """(rank, world size) of this process."""
    if _active():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over all processes, in place; returns it."""
    if _active() and dist.get_world_size() > 1:
        dist.all_reduce(x)
    return x


def barrier() -> None:
    """Wait for every process (nothing to wait for in one process)."""
    if _active() and dist.get_world_size() > 1:
        dist.barrier()


def pick_device(name: str) -> torch.device:
    """The device for ``name``; under torchrun ``cuda`` means this process's ``cuda:LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise Unavailable("CUDA is not available", where=f"device={name}", fix="use --device cpu")
        if name == "cuda" and "LOCAL_RANK" in os.environ:
            name = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return torch.device(name)
