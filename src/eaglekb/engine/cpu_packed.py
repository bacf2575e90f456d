"""Which of the engine's CPU target steps run on packed weight copies: chosen per row count by timing the step.

Owns ``PACK_ROWS`` (the row counts a CPU target step runs up to 16: 1-7 unpadded, then 8, 12 and 16, see
``Engine.pad_rows``), ``PackedChoice`` (what was chosen and why, with the step times behind it), ``choose``
(the engine's own target step timed plain and packed at each row count, alternating, the best of ``repeats``
after a warm-up pass, on an injected clock; packed kept where it is faster by more than ``MARGIN``, so timing
noise does not flip a choice) and ``setup`` (the rules of ``off``, ``on`` and ``auto``, the last with its memory
guard, ``eaglekb.models.packed.PACK_MEMORY_SHARE``).

The copies belong to the target (``TargetModel.packs``): engines built over one target share them, and the last
engine built sets them. Times are kept per target and thread count, so a second engine does not time again.

Also the drafter's half-width copies (``draft_setup``, ``DraftHalves``): each drafter matrix that float16 holds
exactly after a power-of-two scale (a bfloat16 checkpoint's, read into float32) runs through FBGEMM's
float16-weight product (``eaglekb.models.packed.HalfSet``): float32 arithmetic over half the bytes, so a draft step,
which streams the drafter's weights for a row or two, reads half as much. ``auto`` and ``on`` make them; ``off``
none. The copies belong to the drafter (``DraftModel.halves``), set by the last engine built over it.

Knows nothing about prompts, baselines or the task runner.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from eaglekb.engine.kv import causal_rows
from eaglekb.io.errors import BadInput
from eaglekb.models import packed
from eaglekb.models.layers import CALIBRATE_MIN_NUMEL

MODES = ("auto", "on", "off")
DRAFT_MATRICES = ("fc", "wqkv", "wo", "wgu", "down", "lm_head")
#: Row counts a CPU target step runs, up to a 16-token tree: the ones timed and, with ``on``, packed.
PACK_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
#: Packed is kept for a row count only when its step is faster than the plain one by more than this share.
MARGIN = 0.1
# target -> {threads: {rows: {"plain": s, "packed": s}}}: each target's step times, kept while it lives
_TIMED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class PackedChoice:
    """The packed product's state on one engine (recorded by the bench)."""

    mode: str  # auto, on or off, as asked
    rows: list[int] = field(default_factory=list)  # row counts whose target steps run on the packed copies
    mib: float = 0.0  # memory the copies take (0 when none are kept)
    why: str = ""  # one line: why these row counts, or why none
    step_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # per row count: plain and packed step, ms


def target_weights(target) -> list[torch.Tensor]:
    """The target's matrices a step multiplies: fused q/k/v, o, fused gate/up and down of every layer, lm_head."""
    return [w for layer in target.layers for w in (layer.wqkv, layer.wo, layer.wgu, layer.down)] + [target.lm_head]


def choose(step: Callable[[int], None], packs, rows: tuple[int, ...] = PACK_ROWS, *,
           clock: Callable[[], float] = time.perf_counter, repeats: int = 3, margin: float = MARGIN,
           bar=None) -> dict[int, dict[str, float]]:
    """Time ``step(r)`` (one target step of ``r`` rows) with ``packs`` off and on for each of ``rows``: a warm-up
    pass of each, then ``repeats`` passes alternating which goes first, the best of each kept. Sets ``packs.rows``
    to the row counts where packed was faster by more than ``margin``; returns the times in seconds."""
    times = {}
    for r in rows:
        best = {"plain": float("inf"), "packed": float("inf")}
        for i in range(repeats + 1):
            for name in ("plain", "packed") if i % 2 == 0 else ("packed", "plain"):
                if name == "packed":
                    packs.rows.add(r)
                else:
                    packs.rows.discard(r)
                t0 = clock()
                step(r)
                if i:  # pass 0 warms the kernels and the caches
                    best[name] = min(best[name], clock() - t0)
        packs.rows.discard(r)
        times[r] = best
        if bar is not None:
            bar.update(1)
    packs.rows = faster(times, margin)
    return times


def faster(times: dict[int, dict[str, float]], margin: float = MARGIN) -> set[int]:
    """Row counts whose packed step beat the plain one by more than ``margin``."""
    return {r for r, t in times.items() if t["packed"] < (1 - margin) * t["plain"]}


def target_step(engine) -> Callable[[int], None]:
    """One target step of ``rows`` tokens at the start of ``engine``'s cache (slots a prefill overwrites)."""
    dev = engine.device

    def step(rows: int) -> None:
        ar = torch.arange(rows, device=dev)
        ids = torch.zeros(1, rows, dtype=torch.long, device=dev)
        engine._target_step(ids, ar, ar, causal_rows(0, rows, engine._width(rows), dev))
    return step


def _refusal(target, compiled: bool) -> str | None:
    """Why this target cannot run packed (None: it can)."""
    if not packed.supported():
        return "this torch build has no oneDNN (mkldnn) packed linear"
    if target.dtype not in packed.PACK_DTYPES:
        return f"packed copies are float32 only, the target is {str(target.dtype).replace('torch.', '')}"
    if compiled:
        return "the compiled layers keep F.linear (packed copies run in eager steps)"
    return None


def setup(target, mode: str, step: Callable[[int], None], *, compiled: bool = False,
          clock: Callable[[], float] = time.perf_counter, available: Callable[[], float | None] = packed.available_mib,
          repeats: int = 3, progress: bool = False) -> PackedChoice:
    """Pack ``target``'s matrices (or not) for ``mode`` and say which row counts run packed.

    ``off``: no copies (any the target had are dropped). ``on``: copies, every row count of ``PACK_ROWS`` packed,
    refused in one line where the build, dtype or compiled layers cannot run them or they exceed the memory
    available. ``auto``: copies only where they take at most ``PACK_MEMORY_SHARE`` of the memory available and the
    matrices are large enough to time, then ``choose`` by timing ``step``; none kept where no row count gains."""
    if mode not in MODES:
        raise BadInput("unknown packed-product mode", where="--cpu-packed", expected="auto, on or off",
                       found=repr(mode))
    packed.release(target.packs)
    target.packs = None
    if mode == "off":
        return PackedChoice(mode, why="off: every product through F.linear or the transposed product")
    weights = target_weights(target)
    cannot = _refusal(target, compiled)
    mib, free = packed.copies_mib(weights), available()
    if mode == "on":
        if cannot:
            raise BadInput("packed products cannot run here", where="--cpu-packed on", expected="auto or off",
                           found=cannot)
        if free is not None and mib > free:
            raise BadInput("packed weight copies do not fit in memory", where="--cpu-packed on",
                           expected=f"at most {free:,.0f} MiB (available now)", found=f"{mib:,.0f} MiB",
                           fix="use --cpu-packed auto or off")
    elif cannot:
        return PackedChoice(mode, why=cannot)
    elif max(w.numel() for w in weights) < CALIBRATE_MIN_NUMEL:
        return PackedChoice(mode, why="matrices too small to time (a tiny model): none packed")
    elif not packed.fits(mib, free):
        return PackedChoice(mode, why=f"copies of {mib:,.0f} MiB exceed {packed.PACK_MEMORY_SHARE:.0%} of the "
                                      f"{free or 0:,.0f} MiB available: none packed")
    packs = target.packs = packed.PackSet(weights)
    if mode == "on":
        packs.rows = set(PACK_ROWS)
        return PackedChoice(mode, sorted(packs.rows), packs.mib, "on: every row count up to 16 packed")
    times = _timed(target, packs, step, clock=clock, repeats=repeats, progress=progress)
    step_ms = {str(r): {k: 1000 * v for k, v in t.items()} for r, t in times.items()}
    if not packs.rows:
        packs.release()
        target.packs = None
        return PackedChoice(mode, why=f"no row count faster packed by more than {MARGIN:.0%}: none kept",
                            step_ms=step_ms)
    return PackedChoice(mode, sorted(packs.rows), packs.mib,
                        f"timed: packed faster by more than {MARGIN:.0%} at these row counts", step_ms)


def _timed(target, packs, step, *, clock, repeats: int, progress: bool) -> dict[int, dict[str, float]]:
    """``choose`` once per target and thread count; later engines over the same target reuse its times."""
    from tqdm.auto import tqdm

    threads = torch.get_num_threads()
    known = _TIMED.setdefault(target, {})
    if threads in known:
        packs.rows = faster(known[threads])
    else:  # choose sets packs.rows
        with tqdm(total=len(PACK_ROWS), desc="timing packed products", disable=not progress, leave=False) as bar:
            known[threads] = choose(step, packs, clock=clock, repeats=repeats, bar=bar)
    return known[threads]


@dataclass
class DraftHalves:
    """The drafter's half-width copies on one engine (recorded by the bench)."""

    mode: str  # auto, on or off, as asked
    matrices: int = 0  # drafter matrices whose products run on half-width copies
    mib: float = 0.0  # memory the copies take
    why: str = ""  # one line: why these, or why none


def draft_setup(drafter, mode: str, *, compiled: bool = False) -> DraftHalves:
    """Make ``drafter``'s half-width copies (or not) for ``mode``: ``off`` none (any it had are dropped); ``auto``
    every matrix float16 holds exactly (none where this build or dtype cannot run them); ``on`` the same, refused in
    one line where they cannot run or a matrix would not be held exactly."""
    if mode not in MODES:
        raise BadInput("unknown drafter half-width mode", where="--cpu-draft-fp16", expected="auto, on or off",
                       found=repr(mode))
    packed.release_half(drafter.halves)
    drafter.halves = None
    if mode == "off":
        return DraftHalves(mode, why="off: the drafter's products in float32 over its float32 matrices")
    cannot = _half_refusal(drafter, compiled)
    if cannot:
        if mode == "on":
            raise BadInput("half-width drafter copies cannot run here", where="--cpu-draft-fp16 on",
                           expected="auto or off", found=cannot)
        return DraftHalves(mode, why=cannot)
    weights = [getattr(drafter, name) for name in DRAFT_MATRICES]
    halves = packed.HalfSet(weights)
    if mode == "on" and halves.refused:
        halves.release()
        raise BadInput("a drafter matrix has more precision than float16 holds", where="--cpu-draft-fp16 on",
                       expected="matrices a bfloat16 or float16 checkpoint holds",
                       found=f"{halves.refused} of {len(weights)} would round", fix="use --cpu-draft-fp16 auto or off")
    if not halves.kept:
        return DraftHalves(mode, why="no drafter matrix is held exactly by float16 (float32 weights): none made")
    drafter.halves = halves
    return DraftHalves(mode, halves.kept, halves.mib,
                       f"{halves.kept} of {len(weights)} matrices held exactly by float16 after a power-of-two scale")


def _half_refusal(drafter, compiled: bool) -> str | None:
    """Why this drafter cannot run half-width copies (None: it can)."""
    if not packed.half_supported():
        return "this torch build has no FBGEMM float16-weight linear"
    if drafter.dtype not in packed.PACK_DTYPES:
        return f"half-width copies are for a float32 drafter, this one is {str(drafter.dtype).replace('torch.', '')}"
    if compiled:
        return "the compiled drafter layer keeps F.linear (half-width copies run in eager steps)"
    return None
