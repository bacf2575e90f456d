"""When EAGLE-3 pays on SGLang, as a function of the target's plain decode step: a cycle model from measured parts.

Owns the model and its arithmetic (``invoke plan.curve``), and the published points it is set beside (``ANCHORS``,
recorded by ``invoke plan.anchors``):

- SGLang's speculative cycle at batch 1 = verify + draft + fixed host/scheduler work. A memory-bound target
  reads its weights once whether it scores 1 token or k + 1, so the verify costs about one plain step P of the
  target (``verify_x`` plain steps; 1 by default). The draft passes (one drafter layer, ``steps`` times) and
  the host/scheduler work do not grow with the target: together they are ``fixed_ms``.
- ``fixed_ms`` is fitted from measured sets where the same run timed SGLang plain and SGLang EAGLE-3 on the
  same prompts (the servers' own timestamps: decode time over verify count is the cycle, decode time over
  tokens the plain step): fixed = cycle - verify_x * P, per set; the fit is their mean, min and max kept.
- For a target whose plain step is P: cycle(P) = verify_x * P + fixed; break-even accept length cycle(P) / P;
  speedup at accept length A = A * P / cycle(P); A pays from P > fixed / (A - verify_x); a published
  (P, speedup) point implies the accept length speedup * cycle(P) / P, which the model must find plausible
  (between 1 and steps + 1) or it does not describe that system.

This is a prediction from the targets measured, to be checked on others. Pure Python; knows nothing about
baselines files or the task runner (the task reads the records and passes their metrics in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eaglekb.io.errors import BadInput

#: The plain steps (ms) and accept lengths (bonus included) a curve is priced at unless told otherwise.
PLAIN_MS = (1.0, 1.6, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 40.0)
ACCEPT_LENS = (2.0, 2.5, 3.0, 3.5, 4.0)

#: Arithmetic on recorded inputs: a rerun gives the same numbers to rounding.
NOISE: dict[str, Any] = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 1e-9}

SPEC = "sglang.server.cycle_ms"
PLAIN = "sglang_plain.server.cycle_ms"


def _positive(value: float, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadInput("must be a positive number", where=where, expected="a finite number > 0", found=repr(value))
    return float(value)


def cycle_ms(plain_ms: float, fixed_ms: float, verify_x: float = 1.0) -> float:
    """The predicted speculative cycle of a target whose plain step is ``plain_ms``."""
    return verify_x * _positive(plain_ms, "plain step") + fixed_ms


def breakeven_len(plain_ms: float, fixed_ms: float, verify_x: float = 1.0) -> float:
    """The accept length at which speculation only matches plain decoding: cycle(P) / P."""
    return cycle_ms(plain_ms, fixed_ms, verify_x) / plain_ms


def speedup_x(plain_ms: float, accept_len: float, fixed_ms: float, verify_x: float = 1.0) -> float:
    """Decode speedup over plain at ``accept_len`` tokens per cycle: A * P / cycle(P)."""
    return _positive(accept_len, "accept length") * plain_ms / cycle_ms(plain_ms, fixed_ms, verify_x)


def pays_from_ms(accept_len: float, fixed_ms: float, verify_x: float = 1.0) -> float | None:
    """The plain step above which ``accept_len`` pays (speedup > 1): fixed / (A - verify_x); None when it
    never does (A <= verify_x)."""
    if accept_len <= verify_x:
        return None
    return fixed_ms / (accept_len - verify_x)


def implied_accept_len(plain_ms: float, measured_speedup_x: float, fixed_ms: float, verify_x: float = 1.0) -> float:
    """The accept length a (plain step, speedup) point needs under the model: speedup * cycle(P) / P."""
    return _positive(measured_speedup_x, "speedup") * breakeven_len(plain_ms, fixed_ms, verify_x)


@dataclass
class MeasuredSet:
    """One prompt set of one record: SGLang plain and EAGLE-3 timed in the same run."""

    key: str
    record: str
    prompt_set: str
    plain_step_ms: float
    cycle_ms: float
    accept_len: float | None = None
    measured_speedup_x: float | None = None


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def key_of(text: str) -> str:
    """A metric key (``[a-z0-9_]``) from a record or set name."""
    out = "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")
    return out if out and out[0].isalnum() else f"k{out}"


def sets_from_metrics(record: str, metrics: dict[str, Any]) -> list[MeasuredSet]:
    """Every prompt set of a bench.sglang record's metrics that holds both servers' cycle; one line when none."""
    found = []
    for name, node in metrics.items():
        plain, spec = _get(node, PLAIN), _get(node, SPEC)
        if not isinstance(node, dict) or not isinstance(plain, (int, float)) or not isinstance(spec, (int, float)):
            continue
        found.append(MeasuredSet(
            key=f"{key_of(record.split('/')[-1])}_{key_of(name)}", record=record, prompt_set=name,
            plain_step_ms=_positive(plain, f"{record} {name}.{PLAIN}"),
            cycle_ms=_positive(spec, f"{record} {name}.{SPEC}"),
            accept_len=_get(node, "sglang.accept_len"),
            measured_speedup_x=_get(node, "vs.sglang_spec_vs_plain_x")))
    if not found:
        raise BadInput("no prompt set timed both servers", where=f"--from-record {record}",
                       expected=f"a bench.sglang record with SET.{SPEC} and SET.{PLAIN} (run with --plain-url)",
                       found="none", fix="record one: invoke bench.sglang --url SPEC --plain-url PLAIN --record NAME")
    return found


@dataclass
class Fit:
    fixed_ms: float
    fixed_min_ms: float
    fixed_max_ms: float
    per_set_ms: dict[str, float]


def fit_fixed(sets: list[MeasuredSet], verify_x: float = 1.0) -> Fit:
    """The fixed part (draft + host/scheduler) per set, cycle - verify_x * P, and their mean, min and max."""
    if not sets:
        raise BadInput("nothing to fit", where="--from-record", expected="at least one measured set", found="none")
    per = {s.key: s.cycle_ms - verify_x * s.plain_step_ms for s in sets}
    bad = {k: v for k, v in per.items() if v <= 0}
    if bad:
        key, value = next(iter(bad.items()))
        raise BadInput("speculative cycle not above the verify's share of it", where=key,
                       expected=f"cycle > {verify_x:g} x plain step (a positive fixed part)",
                       found=f"fixed part {value:.3f} ms", fix="lower --verify-x, or check the record's timings")
    values = list(per.values())
    return Fit(fixed_ms=sum(values) / len(values), fixed_min_ms=min(values), fixed_max_ms=max(values), per_set_ms=per)


@dataclass
class CurveReport:
    fit: Fit
    sets: list[MeasuredSet]
    verify_x: float
    plain_ms: list[float]
    accept_lens: list[float]
    anchors: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (plain step ms, speedup)


def _num(prefix: str, value: float) -> str:
    return prefix + f"{value:g}".replace(".", "_").replace("-", "m").replace("+", "")


def curve(sets: list[MeasuredSet], *, plain_ms: list[float] | tuple[float, ...] = PLAIN_MS,
          accept_lens: list[float] | tuple[float, ...] = ACCEPT_LENS, verify_x: float = 1.0,
          anchors: dict[str, tuple[float, float]] | None = None) -> CurveReport:
    """Fit the fixed part from ``sets`` and price every plain step and accept length."""
    _positive(verify_x, "--verify-x")
    for p in plain_ms:
        _positive(p, "--plain-ms")
    for a in accept_lens:
        if _positive(a, "--accept-len") < 1.0:
            raise BadInput("accept length below 1", where="--accept-len", expected=">= 1 (the bonus token)", found=f"{a:g}")
    if not plain_ms or not accept_lens:
        raise BadInput("nothing to price", where="--plain-ms/--accept-len", expected="at least one value each", found="none")
    for key, (p, s) in (anchors or {}).items():
        _positive(p, f"anchor {key} plain_step_ms")
        _positive(s, f"anchor {key} speedup_x")
    return CurveReport(fit=fit_fixed(sets, verify_x), sets=sets, verify_x=verify_x, plain_ms=sorted(set(plain_ms)),
                       accept_lens=sorted(set(accept_lens)), anchors=dict(anchors or {}))


def metrics(r: CurveReport) -> dict[str, Any]:
    """The report as a baseline metric tree (every leaf name carries its unit)."""
    f, vx = r.fit, r.verify_x
    m: dict[str, Any] = {"fixed_ms": f.fixed_ms, "fixed_min_ms": f.fixed_min_ms, "fixed_max_ms": f.fixed_max_ms,
                         "sets_count": len(r.sets), "sets": {}, "plain": {}, "pays_from": {}}
    for s in r.sets:
        entry = {"plain_step_ms": s.plain_step_ms, "cycle_ms": s.cycle_ms, "fixed_ms": f.per_set_ms[s.key],
                 "predicted_cycle_ms": cycle_ms(s.plain_step_ms, f.fixed_ms, vx)}
        if isinstance(s.accept_len, (int, float)) and s.accept_len > 0:
            entry["accept_len"] = s.accept_len
            entry["predicted_speedup_x"] = speedup_x(s.plain_step_ms, s.accept_len, f.fixed_ms, vx)
        if isinstance(s.measured_speedup_x, (int, float)):
            entry["measured_speedup_x"] = s.measured_speedup_x
        m["sets"][s.key] = entry
    for p in r.plain_ms:
        m["plain"][_num("p", p)] = {
            "plain_step_ms": p, "cycle_ms": cycle_ms(p, f.fixed_ms, vx), "breakeven_len": breakeven_len(p, f.fixed_ms, vx),
            "speedup": {_num("a", a) + "_x": speedup_x(p, a, f.fixed_ms, vx) for a in r.accept_lens}}
    for a in r.accept_lens:
        mid, lo, hi = (pays_from_ms(a, x, vx) for x in (f.fixed_ms, f.fixed_min_ms, f.fixed_max_ms))
        if mid is not None:
            m["pays_from"][_num("a", a)] = {"accept_len": a, "plain_step_ms": mid, "plain_step_lo_ms": lo,
                                            "plain_step_hi_ms": hi}
    if r.anchors:
        m["anchors"] = {k: {"plain_step_ms": p, "speedup_x": s, "predicted_cycle_ms": cycle_ms(p, f.fixed_ms, vx),
                            "implied_accept_len": implied_accept_len(p, s, f.fixed_ms, vx)}
                        for k, (p, s) in r.anchors.items()}
    return {k: v for k, v in m.items() if v != {}}


def summary(r: CurveReport) -> str:
    """One line for the baseline's summary field."""
    f = r.fit
    parts = [f"fixed part {f.fixed_ms:.2f} ms ({f.fixed_min_ms:.2f}-{f.fixed_max_ms:.2f}, {len(r.sets)} sets)"]
    for a in r.accept_lens:
        p = pays_from_ms(a, f.fixed_ms, r.verify_x)
        parts.append(f"accept {a:g} pays from a {p:.2f} ms plain step" if p is not None else f"accept {a:g} never pays")
    return "; ".join(parts) + " (predicted)"


def render_text(r: CurveReport) -> str:
    """Human-readable report: the fit, then one line per plain step."""
    f, vx = r.fit, r.verify_x
    lines = [f"cycle(P) = {vx:g} x P + {f.fixed_ms:.3f} ms (fixed part: draft + host/scheduler, fitted from "
             f"{len(r.sets)} sets, {f.fixed_min_ms:.3f}-{f.fixed_max_ms:.3f} ms)"]
    for s in r.sets:
        lines.append(f"  {s.record} {s.prompt_set}: plain step {s.plain_step_ms:.3f} ms, cycle {s.cycle_ms:.3f} ms, "
                     f"fixed {f.per_set_ms[s.key]:.3f} ms")
    head = "  ".join(f"A={a:g}" for a in r.accept_lens)
    lines.append(f"plain ms   cycle ms   break-even   speedup at {head}")
    for p in r.plain_ms:
        ups = "  ".join(f"{speedup_x(p, a, f.fixed_ms, vx):.2f}x" for a in r.accept_lens)
        lines.append(f"{p:8g}   {cycle_ms(p, f.fixed_ms, vx):8.2f}   {breakeven_len(p, f.fixed_ms, vx):10.2f}   {ups}")
    for a in r.accept_lens:
        p = pays_from_ms(a, f.fixed_ms, vx)
        lines.append(f"accept {a:g} pays from a plain step of {p:.2f} ms" if p is not None else f"accept {a:g} never pays")
    for key, (p, s) in r.anchors.items():
        lines.append(f"anchor {key}: plain step {p:.2f} ms, {s:.2f}x -> needs accept "
                     f"{implied_accept_len(p, s, f.fixed_ms, vx):.2f} under this model")
    lines.append("a prediction from the measured sets, not a measurement of any other target")
    return "\n".join(lines)


# --------------------------------------------------------------------------- published anchors

INVESTIGATION = "brief/investigation.md: the K2.5 EAGLE-3 investigation record"

#: Points the curve is set beside: a target's plain step (ms) and the speedup EAGLE-3 got on SGLang, each citing
#: where it was read. ``plain_step_ms`` is 1000 / plain tok/s where only throughput is published (batch-1
#: throughput read as one step per token: prefill included, so an upper bound on the step). Every anchor holds
#: ``plain_step_ms`` and ``speedup_x``, which ``invoke plan.curve --anchor NAME`` reads (kind reference).
ANCHORS: tuple[dict[str, Any], ...] = (
    dict(kind="reference", name="sglang-docs-llama31-8b-h100",
         summary="SGLang docs: Llama-3.1-8B-Instruct on MT-bench, one H100: 158.34 tok/s plain, 373.25 with EAGLE-3",
         metrics={"plain_tok_s": 158.34, "eagle3_tok_s": 373.25, "speedup_x": 373.25 / 158.34,
                  "plain_step_ms": 1000 / 158.34},
         config={"engine": "SGLang", "target_model": "meta-llama/Llama-3.1-8B-Instruct", "gpus": "1x H100",
                 "prompts": "MT-bench", "batch": 1,
                 "speculation": "EAGLE-3; the table does not state its steps/topk/draft tokens"},
         citation={"document": "SGLang documentation: Speculative Decoding", "section": "Performance Highlights",
                   "url": "https://docs.sglang.io/advanced_features/speculative_decoding.html",
                   "note": "throughput table; speedup_x = 373.25 / 158.34; plain_step_ms = 1000 / 158.34"}),
    dict(kind="reference", name="qwen3-8b-eagle3-h200",
         summary="Tengyunw qwen3_8b_eagle3 model card: Qwen3-8B on SGLang, one H200: 187 tok/s plain, 365 with "
                 "EAGLE-3",
         metrics={"plain_tok_s": 187.0, "eagle3_tok_s": 365.0, "speedup_x": 365.0 / 187.0,
                  "plain_step_ms": 1000 / 187.0},
         config={"engine": "SGLang", "target_model": "Qwen/Qwen3-8B", "gpus": "1x H200", "dtype": "bfloat16",
                 "speculation": {"steps": 6, "topk": 10, "draft_tokens": 32},
                 "cuda_graph_max_bs": 2, "prompts": "not stated (the card evaluates on ShareGPT, GSM8K, HumanEval, "
                                                   "MT-bench, Alpaca)"},
         citation={"document": "Hugging Face model card Tengyunw/qwen3_8b_eagle3 (its drafter's authors)",
                   "section": "Introduce (tps table); How to use (launch command)",
                   "url": "https://huggingface.co/Tengyunw/qwen3_8b_eagle3",
                   "note": "tps table: qwen3-8b h200 187, qwen3-8b-eagle3 h200 365; speculation from the card's "
                           "launch command (a tree, not 3/1/4); plain_step_ms = 1000 / 187"}),
    dict(kind="reference", name="k25-sglang-step-and-speedup",
         summary="K2.5 on SGLang (TP8 over PCIe): plain step ~12 ms, EAGLE-3 cycle 29-30 ms, 60 vs 82.5 tok/s "
                 "at accept ~2.0",
         metrics={"plain_step_ms": 12.0, "cycle_ms": 29.5, "plain_tok_s": 82.5, "eagle3_tok_s": 60.0,
                  "speedup_x": 60.0 / 82.5, "accept_len": 2.0},
         config={"target_model": "Kimi-K2.5 (MoE, 61 layers, ~1T params)",
                 "serving": "SGLang of the time, tensor parallel 8, GPUs over PCIe",
                 "speculation": {"algorithm": "EAGLE3", "steps": 2, "topk": 1, "draft_tokens": 3},
                 "verify": "extend mode without CUDA graphs (F04)", "batch": "single stream"},
         citation={"document": INVESTIGATION, "section": "Baselines and the regression; The arithmetic",
                   "url": None,
                   "note": "the midpoints bench/k25-sglang-regression and bench/k25-cycle-split record (82-83 and "
                           "59-61 tok/s, 29-30 ms), put in one record for the curve; speedup_x = 60 / 82.5; "
                           "accept ~2.0 as the record's arithmetic uses it"}),
)

