"""`invoke plan`: viability arithmetic (break-even, required accept length, chain ceiling)."""

from __future__ import annotations

from eaglekb.measure import viability
from runbooks._common import cli_errors, emit, finish, finish_text, parse_floats, parse_int, task



@task(
    default=True,
    iterable=["target_tps"],
    help={
        "baseline_tps": "baseline decode throughput without speculation, tok/s (e.g. 82)",
        "cycle_ms": "one draft+verify cycle, milliseconds (e.g. 30)",
        "accept_len": "measured mean tokens per cycle, bonus included (e.g. 2.0)",
        "target_tps": "a throughput goal, tok/s; repeatable (--target-tps 150 --target-tps 200)",
        "steps": "draft steps per cycle (chain depth); absent = unbounded chain",
        "topk": "tree drafting branching (1 = chain); the ceiling stays steps + 1",
        "draft_tokens": "draft-token budget per cycle (SGLang --speculative-num-draft-tokens)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/plan/NAME.json",
        "compare": "compare with baselines/plan/NAME.json (default: a plan baseline with the same config)",
    },
)
def plan(c, baseline_tps=None, cycle_ms=None, accept_len=None, target_tps=None, steps=None,
         topk=1, draft_tokens=None, json=False, record=None, compare=None):
    """Break-even accept length, spec tok/s and what each target throughput needs."""
    with cli_errors():
        from eaglekb.io.errors import BadInput

        for value, option in ((baseline_tps, "--baseline-tps"), (cycle_ms, "--cycle-ms")):
            if value is None:
                raise BadInput("missing option", where=option, expected="a number > 0", found="nothing")
        (bt,) = parse_floats(baseline_tps, "--baseline-tps")
        (cm,) = parse_floats(cycle_ms, "--cycle-ms")
        al = parse_floats(accept_len, "--accept-len")
        config = dict(
            baseline_tok_s=bt, cycle_ms=cm, accept_len=al[0] if al else None,
            targets=parse_floats(target_tps, "--target-tps"), steps=parse_int(steps, "--steps"),
            topk=parse_int(topk, "--topk"), draft_tokens=parse_int(draft_tokens, "--draft-tokens"),
        )
        report = viability.plan(**config)
        doc = report.to_dict()
        doc.update(finish(kind="plan", record=record, compare=compare, config=config,
                          metrics=viability.metrics(report), noise=viability.NOISE,
                          summary=viability.summary(report)))
    emit(doc, viability.render_text(report) + finish_text(doc), json)

