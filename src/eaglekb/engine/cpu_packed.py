"""Which product each of the engine's CPU target steps runs: chosen per row count by timing the step.

Owns ``PACK_ROWS`` (the row counts a CPU target step runs up to 16: 1-7 unpadded, then 8, 12 and 16, see
``Engine.pad_rows``), ``PRODUCTS`` (plain: ``F.linear`` or the transposed product; packed: oneDNN float32 copies;
fp16: FBGEMM half-width copies, float32 arithmetic over half the bytes), ``PackedChoice`` (what was chosen and
why, with the step times behind it), ``choose`` (the engine's own target step timed on each product at each row
count, alternating, the best of ``repeats`` after a warm-up pass, on an injected clock; a copy kept for a row
count where it is the fastest and beats plain by more than ``MARGIN``, so timing noise does not flip a choice)
and ``setup`` (the rules of ``off``, ``on`` and ``auto`` for each kind of copy, ``auto`` with its memory guard,
``eaglekb.models.packed.PACK_MEMORY_SHARE``, over the copies of both kinds together).

The copies belong to the target (``TargetModel.packs``, ``TargetModel.halves``): engines built over one target
share them, and the last engine built sets them. Times are kept per target, thread count and products timed, so a
second engine does not time again.

Also the drafter's half-width copies (``draft_setup``, ``DraftHalves``): each drafter matrix that float16 holds
exactly after a power-of-two scale (a bfloat16 checkpoint's, read into float32) runs through FBGEMM's
float16-weight product (``eaglekb.models.packed.HalfSet``): float32 arithmetic over half the bytes, so a draft step,
which streams the drafter's weights for a row or two, reads half as much. ``auto`` and ``on`` make them; ``off``
none. Before them, the drafter's int8 copies (``--cpu-draft-int8``, ``DRAFT_INT8``: every matrix but ``fc``, through
FBGEMM's dynamic int8 linear, ``eaglekb.models.packed.Int8Set``): a quarter of the float32 bytes, lossy, so they may
lower acceptance but never change the tokens the target keeps. The copies belong to the drafter
(``DraftModel.halves``, ``DraftModel.int8``), set by the last engine built over it.

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
#: The drafter's matrices ``--cpu-draft-int8`` rounds to int8: all but ``fc``, whose input (the target's hidden
#: states of three layers, side by side) has a few features far larger than the rest, so FBGEMM's per-call 8-bit
#: rounding of the activations wipes out the others (smollm2-135m's default drafter: accept 2.47 -> 1.71 on GSM8K
#: with ``fc`` in int8, 2.47 -> 2.52 without it).
DRAFT_INT8 = ("wqkv", "wo", "wgu", "down", "lm_head")
#: Row counts a CPU target step runs, up to a 16-token tree: the ones timed and, with ``on``, copied.
PACK_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
#: The products a row count can run on; the copies' kinds in the order ``auto`` makes them within the memory guard.
PRODUCTS = ("plain", "fp16", "packed")
#: The option that sets each kind of copy.
FLAGS = {"packed": "--cpu-packed", "fp16": "--cpu-target-fp16"}
#: A copy is kept for a row count only when its step is faster than the plain one by more than this share.
MARGIN = 0.1
# target -> {(threads, products): {rows: {product: s}}}: each target's step times, kept while it lives
_TIMED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class PackedChoice:
    """The target's copies on one engine (recorded by the bench)."""

    mode: str  # --cpu-packed as asked: auto, on or off
    rows: list[int] = field(default_factory=list)  # row counts whose target steps run on the packed copies
    mib: float = 0.0  # memory the packed copies take (0 when none are kept)
    why: str = ""  # one line: why these row counts, or why none
    step_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # per row count: each product's step, ms
    fp16: str = "off"  # --cpu-target-fp16 as asked: auto, on or off
    fp16_rows: list[int] = field(default_factory=list)  # row counts whose target steps run on half-width copies
    fp16_mib: float = 0.0  # memory the half-width copies take (0 when none are kept)


def target_weights(target) -> list[torch.Tensor]:
    """The target's matrices a step multiplies: fused q/k/v, o, fused gate/up and down of every layer, lm_head."""
    return [w for layer in target.layers for w in (layer.wqkv, layer.wo, layer.wgu, layer.down)] + [target.lm_head]


def choose(step: Callable[[int], None], copies: dict, rows: tuple[int, ...] = PACK_ROWS, *,
           clock: Callable[[], float] = time.perf_counter, repeats: int = 3, margin: float = MARGIN,
           bar=None) -> dict[int, dict[str, float]]:
    """Time ``step(r)`` (one target step of ``r`` rows) plain and on each of ``copies`` (product -> a ``PackSet``
    or ``HalfSet``, whose ``rows`` say which row counts run on it) for each of ``rows``: a warm-up pass of each,
    then ``repeats`` passes alternating the order, the best of each kept. Sets each set's ``rows`` to the row counts
    where it was the fastest and beat plain by more than ``margin``; returns the times in seconds."""
    names = ["plain", *copies]
    times = {}
    for r in rows:
        best = dict.fromkeys(names, float("inf"))
        for i in range(repeats + 1):
            for name in names if i % 2 == 0 else names[::-1]:
                for other, c in copies.items():
                    (c.rows.add if other == name else c.rows.discard)(r)
                t0 = clock()
                step(r)
                if i:  # pass 0 warms the kernels and the caches
                    best[name] = min(best[name], clock() - t0)
        for c in copies.values():
            c.rows.discard(r)
        times[r] = best
        if bar is not None:
            bar.update(1)
    assign(copies, times, margin)
    return times


def fastest(times: dict[int, dict[str, float]], margin: float = MARGIN) -> dict[int, str]:
    """Per row count, the copy whose step was the fastest where it beat the plain one by more than ``margin``
    (row counts absent run plain)."""
    out = {}
    for r, t in times.items():
        name = min((n for n in t if n != "plain"), key=t.__getitem__, default=None)
        if name is not None and t[name] < (1 - margin) * t["plain"]:
            out[r] = name
    return out


def assign(copies: dict, times: dict[int, dict[str, float]], margin: float = MARGIN) -> None:
    """Set each set of ``copies`` to run the row counts it won (``fastest``)."""
    won = fastest(times, margin)
    for name, c in copies.items():
        c.rows = {r for r, n in won.items() if n == name}


def target_step(engine) -> Callable[[int], None]:
    """One target step of ``rows`` tokens at the start of ``engine``'s cache (slots a prefill overwrites)."""
    dev = engine.device

    def step(rows: int) -> None:
        ar = torch.arange(rows, device=dev)
        ids = torch.zeros(1, rows, dtype=torch.long, device=dev)
        engine._target_step(ids, ar, ar, causal_rows(0, rows, engine._width(rows), dev))
    return step


#: Each kind of weight copy: its name in messages, the check (in eaglekb.models.packed) that this torch build has its
#: product, and what the build lacks otherwise.
_BUILDS = {"packed": ("packed", "supported", "oneDNN (mkldnn) packed linear"),
           "fp16": ("half-width", "half_supported", "FBGEMM float16-weight linear"),
           "int8": ("int8", "int8_supported", "FBGEMM dynamic int8 linear")}


def _copy_refusal(kind: str, model, compiled: bool, what: str) -> str | None:
    """Why this model (``what``: target or drafter) cannot run copies of ``kind`` (None: it can)."""
    label, check, lacks = _BUILDS[kind]
    if not getattr(packed, check)():
        return f"this torch build has no {lacks}"
    if model.dtype not in packed.PACK_DTYPES:
        return (f"{label} copies are float32 only: the {what} is "
                f"{str(model.dtype).replace('torch.', '')}")
    if compiled:
        return f"the compiled {what} layers keep F.linear ({label} copies run in eager steps)"
    return None


def _make(name: str, mode: str, target, weights, compiled: bool, room: float | None):
    """The copies of kind ``name`` for ``mode`` (``on`` or ``auto``) within ``room`` MiB (None: unknown), or the one
    line saying why none; ``on`` refused in one line where they cannot run, a matrix would round, or they exceed
    ``room``."""
    flag, label = f"{FLAGS[name]} on", _BUILDS[name][0]
    cannot = _copy_refusal(name, target, compiled, "target")
    mib = packed.copies_mib(weights) / (2 if name == "fp16" else 1)
    if mode == "on" and cannot:
        raise BadInput(f"{label} products cannot run here", where=flag,
                       expected="auto or off", found=cannot)
    if mode == "on" and room is not None and mib > room:
        raise BadInput(f"{label} weight copies do not fit in memory",
                       where=flag, expected=f"at most {room:,.0f} MiB (available now)", found=f"{mib:,.0f} MiB",
                       fix=f"use {FLAGS[name]} auto or off")
    if mode == "auto" and cannot:
        return cannot
    if mode == "auto" and max(w.numel() for w in weights) < CALIBRATE_MIN_NUMEL:
        return "matrices too small to time (a tiny model): none copied"
    if mode == "auto" and (room is None or mib > room):
        return f"{name} copies of {mib:,.0f} MiB exceed {packed.PACK_MEMORY_SHARE:.0%} of the memory available"
    if name == "packed":
        return packed.PackSet(weights)
    return _halves(weights, mode, "target", FLAGS[name], rows=set())


def _halves(weights, mode: str, what: str, flag: str, rows: set[int] | None = None):
    """The half-width copies of ``weights`` (``what``: target or drafter; ``rows`` as ``HalfSet``'s) for ``mode``
    (``on`` or ``auto``), or the one line saying why none: ``on`` refused in one line where a matrix would round,
    ``auto`` keeps those float16 holds exactly."""
    halves = packed.HalfSet(weights, rows=rows)
    if halves.refused and (mode == "on" or not halves.kept):
        halves.release()
        if mode == "on":
            raise BadInput(f"a {what} matrix has more precision than float16 holds", where=f"{flag} on",
                           expected="matrices a bfloat16 or float16 checkpoint holds",
                           found=f"{halves.refused} of {len(weights)} would round", fix=f"use {flag} auto or off")
        return f"no {what} matrix is held exactly by float16 (float32 weights): none made"
    return halves


def _copies(target, modes: dict[str, str], claim: str | None, compiled: bool,
            free: float | None) -> tuple[dict, list[str]]:
    """The copies each mode asks for (a kind that another's ``on``, ``claim``, takes every row count from is not
    made), in ``PRODUCTS`` order, each ``auto`` one within what is left of the memory guard; and why any were not
    made."""
    weights = target_weights(target)
    made, notes = {}, []
    for name in PRODUCTS[1:]:
        mode = modes[name]
        if mode == "off" or (claim and claim != name):
            notes.append(f"{name} {mode}" if mode == "off" else f"{name}: {FLAGS[claim]} on takes every row count")
            continue
        room = free if mode == "on" else (None if free is None else packed.PACK_MEMORY_SHARE * free
                                          - sum(c.mib for c in made.values()))
        got = _make(name, mode, target, weights, compiled, room)
        if isinstance(got, str):
            notes.append(got)
        else:
            made[name] = got
    return made, notes


def setup(target, mode: str, step: Callable[[int], None], *, fp16: str = "off", compiled: bool = False,
          clock: Callable[[], float] = time.perf_counter, available: Callable[[], float | None] = packed.available_mib,
          repeats: int = 3, progress: bool = False) -> PackedChoice:
    """Make ``target``'s packed (``mode``) and half-width (``fp16``) copies, or not, and say which row counts run on
    each.

    ``off``: no copies of that kind (any the target had are dropped). ``on``: copies, every row count of
    ``PACK_ROWS`` on them, refused in one line where the build, dtype, compiled layers or (half-width) a matrix
    float16 would round cannot run them, or they exceed the memory available; one kind ``on`` at most. ``auto``:
    copies only where all of them together take at most ``PACK_MEMORY_SHARE`` of the memory available and the
    matrices are large enough to time, then ``choose`` by timing ``step``; none kept where no row count gains."""
    modes = {"packed": mode, "fp16": fp16}
    for name, m in modes.items():
        if m not in MODES:
            raise BadInput("unknown target copies mode", where=FLAGS[name], expected="auto, on or off", found=repr(m))
    if mode == fp16 == "on":
        raise BadInput("two kinds of copies each claim every row count", where="--cpu-packed on, --cpu-target-fp16 on",
                       expected="on for one of them at most (auto for the other)", found="both on")
    claim = next((name for name, m in modes.items() if m == "on"), None)
    drop(target)
    made, notes = _copies(target, modes, claim, compiled, available())
    target.packs, target.halves = made.get("packed"), made.get("fp16")
    step_ms = {}
    if claim:
        made[claim].rows = set(PACK_ROWS)
        notes.insert(0, f"{claim} on: every row count up to 16")
    elif made:
        times = _timed(target, made, step, clock=clock, repeats=repeats, progress=progress)
        step_ms = {str(r): {k: 1000 * v for k, v in t.items()} for r, t in times.items()}
        for name, c in made.items():
            if not c.rows:
                notes.append(f"{name}: no row count faster by more than {MARGIN:.0%}, none kept")
        notes.insert(0, f"timed: a copy kept where faster than plain by more than {MARGIN:.0%}")
        drop(target, keep={name for name, c in made.items() if c.rows})
    p, h = target.packs, target.halves
    return PackedChoice(mode, sorted(p.rows) if p is not None else [], p.mib if p is not None else 0.0,
                        "; ".join(notes), step_ms, fp16, sorted(h.rows) if h is not None else [],
                        h.mib if h is not None else 0.0)


def drop(target, keep: set[str] = frozenset()) -> None:
    """Release the target's copies, but those of the kinds in ``keep``."""
    if "packed" not in keep:
        packed.release(target.packs)
        target.packs = None
    if "fp16" not in keep:
        packed.release(target.halves)
        target.halves = None


def _timed(target, copies: dict, step, *, clock, repeats: int, progress: bool) -> dict[int, dict[str, float]]:
    """``choose`` once per target, thread count and products; later engines over the same target reuse its times."""
    from tqdm.auto import tqdm

    key = (torch.get_num_threads(), tuple(copies))
    known = _TIMED.setdefault(target, {})
    if key in known:
        assign(copies, known[key])
    else:  # choose sets each set's rows
        with tqdm(total=len(PACK_ROWS), desc="timing target products", disable=not progress, leave=False) as bar:
            known[key] = choose(step, copies, clock=clock, repeats=repeats, bar=bar)
    return known[key]


@dataclass
class DraftHalves:
    """The drafter's half-width and int8 copies on one engine (recorded by the bench)."""

    mode: str  # --cpu-draft-fp16: auto, on or off, as asked
    matrices: int = 0  # drafter matrices whose products run on half-width copies
    mib: float = 0.0  # memory the half-width copies take
    why: str = ""  # one line: why these, or why none
    int8: str = "off"  # --cpu-draft-int8: auto, on or off, as asked
    int8_matrices: int = 0  # drafter matrices whose products run on int8 copies
    int8_mib: float = 0.0  # memory the int8 copies take


def draft_setup(drafter, mode: str, *, int8: str = "off", compiled: bool = False) -> DraftHalves:
    """Make ``drafter``'s int8 (``int8``) and half-width (``mode``) copies, or not.

    int8: ``auto`` and ``on`` run the products of ``DRAFT_INT8`` on int8 copies (lossy: the proposals may change,
    the tokens the target keeps never do), ``auto`` where this build and the drafter's dtype can, ``on`` refused in
    one line where they cannot; ``off`` none. Half-width, over the matrices left: ``off`` none; ``auto`` every
    matrix float16 holds exactly (none where this build or dtype cannot run them); ``on`` the same, refused in one
    line where they cannot run or a matrix would not be held exactly. Any copies the drafter had are dropped first."""
    for flag, m in (("--cpu-draft-fp16", mode), ("--cpu-draft-int8", int8)):
        if m not in MODES:
            raise BadInput(f"unknown drafter {'half-width' if flag.endswith('fp16') else 'int8'} mode", where=flag,
                           expected="auto, on or off", found=repr(m))
    for copies in (drafter.halves, drafter.int8):
        packed.release(copies)
    drafter.halves = drafter.int8 = None
    out = DraftHalves(mode, int8=int8)
    rest = list(DRAFT_MATRICES)
    if int8 != "off":
        cannot = _copy_refusal("int8", drafter, compiled, "drafter")
        if cannot and int8 == "on":
            raise BadInput("int8 drafter copies cannot run here", where="--cpu-draft-int8 on", expected="auto or off",
                           found=cannot)
        if not cannot:
            drafter.int8 = packed.Int8Set([getattr(drafter, name) for name in DRAFT_INT8])
            out.int8_matrices, out.int8_mib = drafter.int8.kept, drafter.int8.mib
            rest = [name for name in rest if name not in DRAFT_INT8]
    out.why = _draft_fp16(drafter, mode, rest, compiled)
    if drafter.halves is not None:
        out.matrices, out.mib = drafter.halves.kept, drafter.halves.mib
    return out


def _draft_fp16(drafter, mode: str, names: list[str], compiled: bool) -> str:
    """Make the drafter's half-width copies of ``names`` for ``mode``; the one line saying what was made, or why
    none."""
    if mode == "off":
        return "off: the drafter's products in float32 over its float32 matrices"
    cannot = _copy_refusal("fp16", drafter, compiled, "drafter")
    if cannot:
        if mode == "on":
            raise BadInput("half-width drafter copies cannot run here", where="--cpu-draft-fp16 on",
                           expected="auto or off", found=cannot)
        return cannot
    weights = [getattr(drafter, name) for name in names]
    halves = _halves(weights, mode, "drafter", "--cpu-draft-fp16")
    if isinstance(halves, str):
        return halves
    drafter.halves = halves
    return f"{halves.kept} of {len(weights)} matrices held exactly by float16 after a power-of-two scale"


