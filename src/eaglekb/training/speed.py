"""How fast a training step runs, and the switches that make it faster.

Owns: ``PHASES`` (the parts of a step, in order), ``StepProfile`` (per-phase time of each optimiser step, CUDA
events on a GPU and the wall clock on the CPU through ``eaglekb.engine.timing.PhaseTimer``, averaged over the
steady steps after the first of a process: the first pays allocator warm-up, and a step over ``STALL_X`` times
the median is a stall, counted apart), ``autocast`` (the TTT forward's autocast:
bfloat16 on CUDA unless ``--amp none``), ``wants_compile`` (``--compile auto`` is on with CUDA) and
``probe_compile`` (one forward and backward of the compiled unroll and loss on a real batch before training,
gradients dropped; any compiler error switches the model to the eager unroll and loss for good and says why, so a
failing compile never stops a run).

The phases: ``data`` (the batch read and padded, and the loss-position counts reduced over processes), ``target``
(the target's forward for online features, once per batch), ``unroll`` (the drafter's TTT steps, compiled or
eager), ``loss`` (the loss over the draft vocabulary and the accuracy counts, with the chunked loss's gradient),
``backward`` (autograd, and with DDP the gradient all-reduce), ``optimizer`` (clipping and AdamW) and ``sync``
(the counts reduced, the device synchronised).

``RunClock``: the wall clock of a whole run by part (``prepare``, ``first_compile``, ``validation``,
``checkpoints``) beside ``total``, so a record says where a command's time went besides its optimiser steps (whose
own time is the throughput's ``train_s``); the device is synchronised as each part ends.

Knows nothing about data formats, checkpoints or the task runner.
"""

from __future__ import annotations

import contextlib
import time

import torch

from eaglekb.engine.timing import PhaseTimer
from eaglekb.io.errors import compiler_failure

PHASES = ("data", "target", "unroll", "loss", "backward", "optimizer", "sync")


#: A profiled step slower than this many times the median step is a stall (a compile, a recompile, a first
#: kernel autotune): left out of the per-phase times and counted apart, so a short run reads its steady state.
STALL_X = 3.0


class StepProfile:
    """Seconds per phase of each profiled step; ``timer()`` gives the timer of one step (or None when off)."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.rows: list[dict[str, float]] = []
        self._seen = 0

    def timer(self) -> PhaseTimer | None:
        return PhaseTimer(self.device) if self.enabled else None

    def add(self, timer: PhaseTimer | None) -> None:
        """Add one finished step's phases (the first step of a process is warm-up and left out)."""
        if timer is None:
            return
        timer.stop()
        self._seen += 1
        if self._seen > 1:
            self.rows.append(dict(timer.totals()))

    def report(self) -> dict | None:
        """``{"steps": n, "ms_per_step": {phase: ms}, "share": {phase: fraction}, "stalls": k, "stall_ms": ms}``
        over the steady steps (stalls left out, see ``STALL_X``), or None when nothing was timed."""
        if not self.rows:
            return None
        totals = [sum(r.values()) for r in self.rows]
        median = sorted(totals)[len(totals) // 2]
        steady = [r for r, t in zip(self.rows, totals) if t <= STALL_X * median]
        stalls = [t for t in totals if t > STALL_X * median]
        ms = {p: round(1000 * sum(r.get(p, 0.0) for r in steady) / len(steady), 3) for p in PHASES}
        total = sum(ms.values()) or 1.0
        return {"steps": len(steady), "ms_per_step": ms, "share": {p: round(v / total, 4) for p, v in ms.items()},
                "stalls": len(stalls), "stall_ms": round(1000 * sum(stalls), 1),
                "timer": "cuda events" if self.device.type == "cuda" else "wall clock"}


class RunClock:
    """Seconds of a run's wall clock: ``part(name)`` adds a part's time (parts may repeat: every validation adds to
    ``validation``); ``report()`` gives ``total_s`` since the clock began and ``<part>_s`` for each part."""

    def __init__(self):
        self.began = time.monotonic()
        self.device: torch.device | None = None  # set once known: a CUDA device is synchronised as a part ends
        self.parts: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str):
        began = time.monotonic()
        try:
            yield
        finally:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.parts[name] = self.parts.get(name, 0.0) + time.monotonic() - began

    def report(self) -> dict[str, float]:
        return {"total_s": round(time.monotonic() - self.began, 3),
                **{f"{name}_s": round(sec, 3) for name, sec in self.parts.items()}}


def autocast(device: torch.device, amp: str):
    """bfloat16 autocast on CUDA (``amp == "bfloat16"``), else nothing (float32)."""
    if device.type == "cuda" and amp == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def wants_compile(mode: str, device: torch.device) -> bool:
    return mode in ("on", "step") or (mode == "auto" and device.type == "cuda")


def probe_compile(model, batch: dict, norms: torch.Tensor, amp_ctx) -> str | None:
    """Compile the unroll and the loss's chunk on ``batch`` (forward and backward, gradients dropped); None when it
    works, else the reason the model now runs them eager."""
    try:
        with amp_ctx:
            loss, _ = model(batch, norms)
        loss.backward()
    except Exception as exc:  # any compiler failure: the eager unroll and loss compute the same
        model.eager(compiler_failure(exc))
    finally:
        for p in model.parameters():
            p.grad = None
    return model.compile_error
