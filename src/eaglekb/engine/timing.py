"""Timers: per-phase cycle split and repeated measurements with median and spread.

Owns: ``PhaseTimer`` (CUDA events on a GPU, ``time.perf_counter`` on CPU; events
are read once at the end, so timing adds no synchronisation inside the loop), and
``stats`` (median, min, max, range of repeated measurements). Warm-up is the
caller's job: time only steady-state runs. Knows nothing about models.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch


class PhaseTimer:
    """Accumulates time per named phase: ``mark('draft') ... mark('verify') ... stop()``."""

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self._open: tuple[str, object] | None = None
        self._spans: list[tuple[str, object, object]] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def mark(self, phase: str | None) -> None:
        """End the open phase (if any) and start ``phase`` (None: just stop)."""
        if not self.enabled:
            return
        now = self._now()
        if self._open is not None:
            self._spans.append((self._open[0], self._open[1], now))
        self._open = (phase, now) if phase else None

    def relabel(self, phase: str) -> None:
        """Book the open phase (its time so far and up to the next mark) as ``phase`` instead."""
        if self.enabled and self._open is not None:
            self._open = (phase, self._open[1])

    def stop(self) -> None:
        self.mark(None)

    def totals(self) -> dict[str, float]:
        """Seconds per phase (synchronises once on CUDA)."""
        if self.cuda and self._spans:
            torch.cuda.synchronize()
        out: dict[str, float] = defaultdict(float)
        for phase, a, b in self._spans:
            out[phase] += (a.elapsed_time(b) / 1000.0) if self.cuda else (b - a)
        return dict(out)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def wall(device) -> float:
    """A wall-clock reading after the device is idle (use around whole generations)."""
    sync(device)
    return time.perf_counter()


def stats(values: list[float]) -> dict[str, float]:
    """median, min, max and range (max - min) of repeated measurements."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "range": float("nan")}
    return {"median": float(statistics.median(values)), "min": float(min(values)),
            "max": float(max(values)), "range": float(max(values) - min(values))}
