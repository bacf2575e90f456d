"""`invoke plan`: viability arithmetic (break-even, required accept length, chain ceiling)."""

from __future__ import annotations

from eaglekb.measure import viability
from runbooks._common import cli_errors, command_line, emit, finish, forced, finish_text, env_pairs, parse_floats, parse_int, real, task, text, whole
from runbooks._options import MAX_DRAFT_STEPS



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



@task(
    iterable=["env", "variant"],
    help={
        "target": "the served model: embedded name, Hugging Face repo id or folder (default smollm2-135m)",
        "site": "the serving stack's folder (invoke sglang.install), put on the servers' PYTHONPATH only",
        "url": "a running server with an untrained drafter (with --plain-url: nothing is launched)",
        "plain_url": "a running plain server of the same target",
        "drafter_out": "folder for the untrained drafter (default .eaglekb/plan/TARGET-untrained)",
        "draft_vocab_size": "draft vocabulary of the drafter you will train (default 32768, capped at the target's)",
        "steps": "--speculative-num-steps (default 3)",
        "topk": "--speculative-eagle-topk (default 1)",
        "draft_tokens": "--speculative-num-draft-tokens (default steps + 1 for a chain)",
        "prompts": "builtin (default), gsm8k-eval, humaneval, mtbench, CORPUS-heldout or a prompts file",
        "num_prompts": "prompts timed (default 4)",
        "max_new_tokens": "tokens per request, end-of-sequence ignored (default 128)",
        "repeats": "timed passes (default 3)",
        "port": "the plain server's port; the speculative one gets port + 1 (default 30100)",
        "mem_fraction_static": "SGLang --mem-fraction-static for each server, passed as given (default: 0.8 of the "
                               "GPU shared among the servers, 0.4 each for two; the servers start one after another, "
                               "each told its share as a fraction of the memory free as it starts)",
        "variant": "NAME=FLAGS: one more speculative server with these extra SGLang flags (KEY=VALUE tokens set its "
                   "environment), timed against the same plain server; repeatable",
        "max_total_tokens": "KV pool cap in tokens for both servers (lets them share one GPU)",
        "cuda_graph_max_bs": "largest batch captured in CUDA graphs (default 8: batch 1 is what is timed)",
        "extra": "more SGLang flags for both servers, as one quoted string",
        "env": "KEY=VALUE for both server processes, repeatable (e.g. SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1)",
        "timeout_s": "seconds to wait for each server's /health (default 900)",
        "drafter_only": "write the untrained drafter, print how to serve it beside a plain server, time nothing",
        "json": "print one JSON document as the last line",
        "record": "write baselines/plan/NAME.json",
        "compare": "compare with baselines/plan/NAME.json",
    },
    options={"draft_vocab_size": whole(1, 1 << 22), "steps": whole(1, MAX_DRAFT_STEPS), "topk": whole(1, 64),
             "draft_tokens": whole(2, 1024), "num_prompts": whole(1, 1024), "max_new_tokens": whole(8, 1 << 16),
             "repeats": whole(1, 100), "port": whole(1, 65534), "mem_fraction_static": real(above=0, hi=1),
             "max_total_tokens": whole(1, 1 << 40), "cuda_graph_max_bs": whole(1, 1 << 16),
             "timeout_s": whole(1, 86400), "extra": text},
)
def sglang(c, target="smollm2-135m", site=None, url=None, plain_url=None, drafter_out=None, draft_vocab_size=32768,
           steps=3, topk=1, draft_tokens=None, prompts="builtin", num_prompts=4, max_new_tokens=128, repeats=3,
           port=30100, mem_fraction_static=None, max_total_tokens=None, cuda_graph_max_bs=8, extra="", env=None,
           timeout_s=900, drafter_only=False, variant=None, json=False, record=None, compare=None):
    """Break-even on SGLang before training: the plain step and the EAGLE-3 cycle with an untrained drafter."""
    with cli_errors():
        import shlex

        from eaglekb.io.errors import BadInput
        from eaglekb.measure.sglang import plan as lib

        cfg = lib.PlanConfig(target=target, site=site, url=url, plain_url=plain_url, drafter_out=drafter_out,
                             draft_vocab_size=draft_vocab_size, steps=steps, topk=topk, draft_tokens=draft_tokens,
                             prompts=prompts, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                             repeats=repeats, port=port, mem_fraction_static=mem_fraction_static,
                             max_total_tokens=max_total_tokens, cuda_graph_max_bs=cuda_graph_max_bs,
                             extra=shlex.split(extra or ""), env=env_pairs(env, "--env"), timeout_s=timeout_s,
                             drafter_only=bool(drafter_only), variants=_variants(variant))
        if drafter_only and (record or compare):
            raise BadInput("nothing is timed with --drafter-only", where="--record/--compare",
                           expected="no --record with --drafter-only", found=str(record or compare))
        res = lib.run(cfg, progress=not json)
        if drafter_only:
            emit({"config": res["config"], "commands": res["commands"]}, res["summary"], json)
            return
        doc = {"metrics": res["metrics"], "config": res["config"]}
        doc.update(finish(kind="plan", record=record, compare=compare, config=res["config"], metrics=res["metrics"],
                          noise={"repeats": int(repeats), "spread_kind": "range", "spread": res["spread"],
                                 "tolerance_rel": 0.15},
                          summary=res["summary"]))
    emit(doc, res["summary"] + finish_text(doc), json)


def _variants(given) -> dict:
    """``--variant NAME=FLAGS`` (repeatable) as {name: {"extra", "env"}}; a name given twice is refused."""
    from eaglekb.io.errors import BadInput
    from eaglekb.measure.sglang.plan import parse_variant

    out: dict = {}
    for text in given or []:
        name, v = parse_variant(text)
        if name in out:
            raise BadInput("a variant name given twice", where=f"--variant {text}", expected="one NAME per variant",
                           found=name)
        out[name] = v
    return out


def _record(given: str, option: str, kind: str):
    """The baseline NAME under ``kind`` (or ``KIND/NAME``) a ``--from-record``/``--anchor`` names; one line when
    it is malformed or not recorded."""
    from eaglekb.io.errors import BadInput, MissingFile
    from eaglekb.kb import baselines

    bid = given if "/" in given else f"{kind}/{given}"
    try:
        baselines.split_id(bid)
    except BadInput:
        raise BadInput("not a baseline id", where=f"{option} {given}",
                        expected=f"NAME under {kind}/ or KIND/NAME", found=given) from None
    if not baselines.exists(bid):
        raise MissingFile("no such baseline", where=f"{option} {given}", expected=f"baselines/{bid}.json",
                          found="no such file", fix="invoke baselines.check lists what is recorded")
    return baselines.load_id(bid)


def _speculation(b) -> dict:
    info = b.config.get("server_info") or {}
    return {"steps": info.get("speculative_num_steps"), "topk": info.get("speculative_eagle_topk"),
            "draft_tokens": info.get("speculative_num_draft_tokens")}


@task(
    iterable=["from_record", "anchor", "plain_ms", "accept_len"],
    help={
        "from_record": "a bench.sglang record that timed SGLang plain and EAGLE-3 in one run (NAME under bench/, or KIND/NAME); "
                       "repeatable; every set with both servers' cycle enters the fit",
        "plain_ms": "target plain decode steps to price, ms, comma list or repeated (default 1,1.6,2,3,5,8,12,20,40)",
        "accept_len": "accept lengths to price, bonus included, comma list or repeated (default 2,2.5,3,3.5,4)",
        "verify_x": "verify of steps + 1 tokens in plain steps of the target (1: memory-bound at batch 1)",
        "anchor": "a recorded point with metrics plain_step_ms and speedup_x (NAME under reference/, or KIND/NAME), set beside the curve; "
                  "repeatable (invoke plan.anchors records the published ones)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/plan/NAME.json",
        "compare": "compare with baselines/plan/NAME.json (default: a plan baseline with the same config)",
    },
    options={"plain_ms": text, "accept_len": text, "verify_x": real(above=0, hi=100), "from_record": text,
             "anchor": text},
)
def curve(c, from_record=None, plain_ms=None, accept_len=None, verify_x=1.0, anchor=None, json=False, record=None,
          compare=None):
    """When EAGLE-3 pays on SGLang against the target's plain step: cycle = verify + a fixed part fitted from records."""
    with cli_errors():
        from eaglekb.io.errors import BadInput
        from eaglekb.measure import breakeven_curve as lib

        if not from_record:
            raise BadInput("missing option", where="--from-record", expected="a bench.sglang record timing both servers",
                           found="nothing", fix="e.g. --from-record h200-sglang-s3-vs-plain")
        records = [_record(r, "--from-record", "bench") for r in from_record]
        specs = {b.id: _speculation(b) for b in records}
        if len({tuple(s.items()) for s in specs.values()}) > 1:
            raise BadInput("records of different speculative settings", where="--from-record",
                           expected="one (steps, topk, draft tokens) for the fit", found=str(specs))
        points = {b.id: b for b in (_record(a, "--anchor", "reference") for a in anchor or [])}
        xy = {}
        for bid, b in points.items():
            p, s = b.metrics.get("plain_step_ms"), b.metrics.get("speedup_x")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (p, s)):
                raise BadInput("not an anchor", where=f"--anchor {bid}", expected="metrics plain_step_ms and speedup_x",
                               found=f"plain_step_ms {p!r}, speedup_x {s!r}")
            xy[lib.key_of(b.name)] = (p, s)
        sets = [s for b in records for s in lib.sets_from_metrics(b.id, b.metrics)]
        report = lib.curve(sets, plain_ms=parse_floats(plain_ms, "--plain-ms") or lib.PLAIN_MS,
                           accept_lens=parse_floats(accept_len, "--accept-len") or lib.ACCEPT_LENS,
                           verify_x=float(verify_x), anchors=xy)
        config = dict(from_records=[b.id for b in records], anchors=list(points), verify_x=report.verify_x,
                      plain_ms=report.plain_ms, accept_lens=report.accept_lens, speculation=next(iter(specs.values())),
                      measured_on=sorted({g.get("name", "?") for b in records for g in (b.provenance.host.gpus or [])
                                          if isinstance(g, dict)}))
        doc = {"metrics": lib.metrics(report), "config": config}
        doc.update(finish(kind="plan", record=record, compare=compare, config=config, metrics=doc["metrics"],
                          noise=lib.NOISE, summary=lib.summary(report)))
    emit(doc, lib.render_text(report) + finish_text(doc), json)


@task(help={"record": "record the anchor NAME as baselines/KIND/NAME.json, its citation kept (without: list them)",
            "json": "print one JSON document as the last line"})
def anchors(c, record=None, json=False):
    """The published points the break-even curve is set beside: list them, or record one (source "recorded")."""
    with cli_errors():
        from eaglekb.io.errors import BadInput
        from eaglekb.kb import baselines
        from eaglekb.measure.breakeven_curve import ANCHORS

        ids = [f"{a['kind']}/{a['name']}" for a in ANCHORS]
        if not record:
            emit({"anchors": ids}, "\n".join(f"{i}: {a['summary']} ({a['citation']['url'] or a['citation']['document']})"
                                              for i, a in zip(ids, ANCHORS)), json)
            return
        entry = next((a for a in ANCHORS if a["name"] == record), None)
        if entry is None:
            raise BadInput("no such anchor", where=f"--record {record}", expected=", ".join(a["name"] for a in ANCHORS),
                           found=record)
        b = baselines.build(kind=entry["kind"], name=entry["name"], source="recorded", summary=entry["summary"],
                            citation=entry["citation"], config=entry["config"], metrics=entry["metrics"],
                            noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.0}, command=command_line())
        path = baselines.write(b, force=forced())
    emit({"baseline_id": b.id, "recorded": str(path)}, f"recorded {b.id} -> {path}", json)
