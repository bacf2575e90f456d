"""Viability arithmetic for speculative decoding: is a drafter worth its cycle?

Owns: the formulas that turn (baseline tok/s, cycle time, accept length, draft
steps) into speculative tok/s, break-even accept length, the accept length and
per-step acceptance a target throughput needs, and whether a chain of k draft
steps can reach it at all. Pure Python; knows nothing about models or files.

Definitions (brief/ecosystem.md):
- accept_len: mean tokens emitted per draft/verify cycle, bonus token included.
- spec tok/s = accept_len / cycle time.
- A chain of k draft steps with per-step (conditional) acceptance p emits
  E(p, k) = (1 - p^(k+1)) / (1 - p) tokens per cycle (Leviathan et al. 2023),
  at most k + 1; the unbounded chain gives E = 1 / (1 - p).
- Tree drafting (topk > 1) raises the per-step acceptance but not the ceiling:
  a cycle still emits at most depth + 1 tokens, and at most num_draft_tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from eaglekb.io.errors import BadInput


def expected_accept_len(p: float, steps: int | None) -> float:
    """E(p, k): mean tokens per cycle for per-step acceptance p and k steps (None = unbounded)."""
    _check_prob(p, "p")
    if steps is None:
        return math.inf if p >= 1.0 else 1.0 / (1.0 - p)
    if p >= 1.0:
        return float(steps + 1)
    return (1.0 - p ** (steps + 1)) / (1.0 - p)


def ceiling(steps: int | None, draft_tokens: int | None = None) -> float:
    """Most tokens one cycle can emit: depth + 1 (whatever the topk), capped by the draft-token budget."""
    if steps is None:
        return math.inf
    cap = steps + 1
    if draft_tokens is not None:
        cap = min(cap, draft_tokens)
    return float(cap)


def required_p(accept_len: float, steps: int | None) -> float | None:
    """Per-step acceptance p with E(p, k) = accept_len; None when k steps cannot reach it (p < 1)."""
    if accept_len <= 1.0:
        return 0.0
    if steps is None:
        return 1.0 - 1.0 / accept_len
    if accept_len >= steps + 1:
        return None  # only p = 1 (every draft accepted, always) reaches k + 1; above it, nothing
    lo, hi = 0.0, 1.0
    for _ in range(200):  # E is increasing in p: bisection to machine precision
        mid = (lo + hi) / 2
        if expected_accept_len(mid, steps) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fewest_steps(accept_len: float) -> int:
    """The fewest draft steps k whose chain reaches accept_len with p < 1 (k + 1 > accept_len)."""
    return max(0, math.floor(accept_len))


@dataclass
class TargetReport:
    target_tok_s: float
    required_accept_len: float
    required_p_unbounded: float | None
    required_p_steps: float | None
    reachable: bool
    fewest_steps: int
    required_p_at_fewest_steps: float | None


@dataclass
class PlanReport:
    baseline_tok_s: float
    cycle_ms: float
    accept_len: float | None
    steps: int | None
    topk: int
    draft_tokens: int | None
    ceiling_len: float
    breakeven_len: float
    breakeven_p_unbounded: float | None
    breakeven_p_steps: float | None
    breakeven_reachable: bool
    spec_tok_s: float | None = None
    speedup_x: float | None = None
    viable: bool | None = None
    implied_p_steps: float | None = None
    implied_p_unbounded: float | None = None
    accept_len_exceeds_ceiling: bool = False
    targets: list[TargetReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_prob(p: float, name: str) -> None:
    if not (0.0 <= p <= 1.0):
        raise BadInput("probability out of range", where=name, expected="0 <= p <= 1", found=str(p))


def _positive(value: float, option: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise BadInput("must be a positive number", where=option, expected="a finite number > 0", found=repr(value))


def plan(
    *,
    baseline_tok_s: float,
    cycle_ms: float,
    accept_len: float | None = None,
    targets: list[float] | tuple[float, ...] = (),
    steps: int | None = None,
    topk: int = 1,
    draft_tokens: int | None = None,
) -> PlanReport:
    """The whole viability report for one configuration."""
    _positive(baseline_tok_s, "--baseline-tps")
    _positive(cycle_ms, "--cycle-ms")
    if accept_len is not None:
        _positive(accept_len, "--accept-len")
        if accept_len < 1.0:
            raise BadInput(
                "accept length below 1", where="--accept-len",
                expected=">= 1 (the bonus token is always emitted)", found=str(accept_len),
            )
    for t in targets:
        _positive(t, "--target-tps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise BadInput("draft steps must be a whole number >= 1", where="--steps", expected="1, 2, 3, ...", found=repr(steps))
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise BadInput("topk must be a whole number >= 1", where="--topk", expected="1, 2, ...", found=repr(topk))
    if draft_tokens is not None and (not isinstance(draft_tokens, int) or draft_tokens < 2):
        raise BadInput("draft-token budget too small", where="--draft-tokens", expected="an integer >= 2", found=repr(draft_tokens))

    cycle_s = cycle_ms / 1000.0
    cap = ceiling(steps, draft_tokens)
    breakeven = baseline_tok_s * cycle_s
    be_p_steps = required_p(breakeven, steps) if steps is not None else None
    report = PlanReport(
        baseline_tok_s=baseline_tok_s,
        cycle_ms=cycle_ms,
        accept_len=accept_len,
        steps=steps,
        topk=topk,
        draft_tokens=draft_tokens,
        ceiling_len=cap,
        breakeven_len=breakeven,
        breakeven_p_unbounded=required_p(breakeven, None),
        breakeven_p_steps=be_p_steps,
        breakeven_reachable=breakeven < cap,
    )
    if accept_len is not None:
        report.spec_tok_s = accept_len / cycle_s
        report.speedup_x = report.spec_tok_s / baseline_tok_s
        report.viable = accept_len > breakeven
        report.implied_p_unbounded = required_p(accept_len, None)
        report.accept_len_exceeds_ceiling = accept_len > cap
        if steps is not None and topk == 1:
            report.implied_p_steps = required_p(accept_len, steps)
    for t in targets:
        need = t * cycle_s
        k_min = fewest_steps(need)
        report.targets.append(
            TargetReport(
                target_tok_s=t,
                required_accept_len=need,
                required_p_unbounded=required_p(need, None),
                required_p_steps=required_p(need, steps) if steps is not None and need < cap else None,
                reachable=need < cap,
                fewest_steps=k_min,
                required_p_at_fewest_steps=required_p(need, k_min),
            )
        )
    return report


def _pct(p: float | None) -> str:
    return "n/a" if p is None else f"{100 * p:.1f}%"


def render_text(r: PlanReport) -> str:
    """Human-readable report, one finding per line."""
    chain = "unbounded chain" if r.steps is None else f"{r.steps} draft steps (topk {r.topk})"
    lines = [
        f"baseline {r.baseline_tok_s:g} tok/s, cycle {r.cycle_ms:g} ms, {chain}; ceiling {r.ceiling_len:g} tokens/cycle",
        f"break-even accept_len = {r.baseline_tok_s:g} x {r.cycle_ms / 1000:g} s = {r.breakeven_len:.2f}"
        f" (per-step acceptance {_pct(r.breakeven_p_steps)} at {r.steps} steps; {_pct(r.breakeven_p_unbounded)} unbounded)"
        if r.steps is not None
        else f"break-even accept_len = {r.breakeven_len:.2f} (per-step acceptance {_pct(r.breakeven_p_unbounded)})",
    ]
    if r.accept_len is not None:
        verdict = "VIABLE" if r.viable else "NOT VIABLE (below break-even)"
        lines.append(
            f"accept_len {r.accept_len:g} -> {r.spec_tok_s:.1f} tok/s ({r.speedup_x:.2f}x baseline): {verdict}"
        )
        if r.implied_p_steps is not None:
            lines.append(f"  implies per-step acceptance {_pct(r.implied_p_steps)} at {r.steps} steps")
        if r.accept_len_exceeds_ceiling:
            lines.append(f"  WARNING: accept_len {r.accept_len:g} exceeds the ceiling {r.ceiling_len:g} of this chain")
    for t in r.targets:
        head = f"target {t.target_tok_s:g} tok/s needs accept_len {t.required_accept_len:.2f}"
        if t.reachable and r.steps is not None:
            lines.append(f"{head}: per-step acceptance {_pct(t.required_p_steps)} at {r.steps} steps "
                         f"({_pct(t.required_p_unbounded)} if the chain were unbounded)")
        elif t.reachable:
            lines.append(f"{head}: per-step acceptance {_pct(t.required_p_unbounded)}")
        else:
            lines.append(
                f"{head}: UNREACHABLE with {r.steps} steps at any accuracy (ceiling {r.ceiling_len:g}); "
                f"needs >= {t.fewest_steps} steps, then {_pct(t.required_p_at_fewest_steps)} per step "
                f"(the 1/(1-p) reading says {_pct(t.required_p_unbounded)})"
            )
    return "\n".join(lines)


#: Arithmetic is exact: a rerun must give the same numbers to rounding.
NOISE: dict[str, Any] = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 1e-9}


def _key(value: float) -> str:
    return "t" + (f"{value:g}".replace(".", "_").replace("-", "m"))


def metrics(r: PlanReport) -> dict[str, Any]:
    """The report as a baseline metric tree (every leaf name carries its unit)."""
    m: dict[str, Any] = {
        "breakeven_len": r.breakeven_len,
        "breakeven_p_unbounded_frac": r.breakeven_p_unbounded,
    }
    if r.steps is not None:
        m["ceiling_len"] = r.ceiling_len
        if r.breakeven_p_steps is not None:
            m["breakeven_p_steps_frac"] = r.breakeven_p_steps
    if r.accept_len is not None:
        m["spec_tok_s"] = r.spec_tok_s
        m["speedup_x"] = r.speedup_x
        if r.implied_p_steps is not None:
            m["implied_p_steps_frac"] = r.implied_p_steps
    if r.targets:
        m["unreachable_targets_count"] = sum(not t.reachable for t in r.targets)
        m["targets"] = {}
        for t in r.targets:
            entry: dict[str, Any] = {
                "required_len": t.required_accept_len,
                "fewest_steps": t.fewest_steps,
            }
            for name, value in (
                ("required_p_unbounded_frac", t.required_p_unbounded),
                ("required_p_steps_frac", t.required_p_steps),
                ("required_p_at_fewest_steps_frac", t.required_p_at_fewest_steps),
            ):
                if value is not None:
                    entry[name] = value
            m["targets"][_key(t.target_tok_s)] = entry
    return {k: v for k, v in m.items() if v is not None}


def summary(r: PlanReport) -> str:
    """One line for the baseline's summary field."""
    parts = [f"break-even accept_len {r.breakeven_len:.2f}"]
    if r.accept_len is not None:
        parts.append(f"accept_len {r.accept_len:g} gives {r.spec_tok_s:.1f} tok/s ({'viable' if r.viable else 'not viable'})")
    bad = [t for t in r.targets if not t.reachable]
    if bad:
        parts.append(
            "unreachable with %s steps: %s" % (r.steps, ", ".join(f"{t.target_tok_s:g} tok/s" for t in bad))
        )
    return "; ".join(parts)


def request_speedup(timings: dict, accept_len: float, new_tokens: int) -> dict:
    """Speedup of one request of ``new_tokens`` at ``accept_len`` on a server, from a plan.sglang record's
    timings: the plain step and the speculative cycle (ms) and each server's per-request fixed cost (queue,
    prefill, HTTP: ``plain_fixed_ms``, ``spec_fixed_ms``). The first token comes from the prefill; the other
    ``n - 1`` take ``n - 1`` steps plain and ``(n - 1) / accept_len`` cycles speculative. Returns the end-to-end
    ratio (``speedup_x``, what a client sees) and the decode phase's (``decode_speedup_x``)."""
    step, cycle = float(timings["plain_step_ms"]), float(timings["spec_cycle_ms"])
    if step <= 0 or cycle <= 0 or accept_len <= 0:
        raise BadInput("timings and accept length must be positive", where="plan timings",
                       found=f"step {step}, cycle {cycle}, accept {accept_len}")
    n = max(int(new_tokens) - 1, 1)
    plain = float(timings["plain_fixed_ms"]) + n * step
    spec = float(timings["spec_fixed_ms"]) + n / accept_len * cycle
    return {"speedup_x": plain / spec, "decode_speedup_x": accept_len * step / cycle}


def verdict_text(predicted_viable: bool, measured_speedup_x: float | None) -> tuple[bool, str]:
    """(viable, the words) of a verdict. When a speed was measured on this machine (speculative against plain
    decoding, same run) it decides: a measured slowdown is never "viable", whatever break-even predicted. The
    prediction (accept length against break-even) decides only when nothing was measured."""
    if measured_speedup_x is None:
        return predicted_viable, "viable" if predicted_viable else "NOT viable (below break-even)"
    if measured_speedup_x > 1.0:
        return True, f"viable (measured {measured_speedup_x:.2f}x plain decoding)"
    why = "break-even predicted a gain" if predicted_viable else "below break-even"
    return False, f"NOT viable (measured {measured_speedup_x:.2f}x plain decoding; {why})"
