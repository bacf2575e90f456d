"""Training in several processes: ``launch`` starts torchrun, ``main`` is what each process runs.

Owns: ``launch`` (``train`` in ``nproc`` processes through torchrun, one per GPU or
gloo on CPU; the first library error of a process comes back as the same one-line
error) and ``main`` (``torchrun --nproc_per_node N -m eaglekb.training --config
RUN.json``: parse, join the process group, ``train``, print ``error: ...`` on a
library error).

Knows nothing about what a training step does (``eaglekb.training.loop``) or the
task runner.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from eaglekb.io.errors import EaglekbError, Unavailable
from eaglekb.io.files import atomic_write_json, read_json
from eaglekb.training.config import METRICS, TrainConfig
from eaglekb.training.loop import train


def launch(cfg: TrainConfig, nproc: int, *, progress: bool = True) -> dict:
    """Run ``train`` in ``nproc`` processes through torchrun (one per GPU, or gloo on CPU)."""
    cfg.check()
    with tempfile.TemporaryDirectory() as tmp:
        conf = atomic_write_json(Path(tmp) / "train.json", asdict(cfg))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "eaglekb.training", "--config", str(conf)] + ([] if progress else ["--no-progress"])
        proc = subprocess.run(cmd, capture_output=True, text=True)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error: ")]
    if errors:
        raise EaglekbError(errors[0][len("error: "):])
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable("torchrun failed", where=" ".join(cmd[:6]), found=tail[:200])
    return read_json(Path(cfg.out) / METRICS, what="training report")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Train an EAGLE-3 drafter (TTT); one process per GPU under torchrun.")
    ap.add_argument("--config", required=True, help="TrainConfig as JSON (see eaglekb.training.config.TrainConfig)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in out")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _join(cfg: TrainConfig) -> None:
    """Join torchrun's process group (nccl on GPUs, gloo on CPU) when there are several processes."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "nccl" if torch.cuda.is_available() and cfg.device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc_per_node N -m eaglekb.training --config RUN.json``."""
    args = _parser().parse_args(argv)
    try:
        cfg = TrainConfig.from_dict(read_json(args.config, what="training config"), args.config)
        if args.resume:
            cfg.resume = True
        _join(cfg)
        train(cfg, progress=not args.no_progress, log=lambda s: print(s, flush=True))
    except EaglekbError as exc:
        print(f"error: {exc.line()}", flush=True)
        return exc.exit_code
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0
