"""`invoke bench`: baseline versus speculative tok/s with peers, repeats, median and spread."""

from __future__ import annotations

import contextlib
from typing import Iterator

from runbooks._common import cli_errors, emit, finish, finish_text, parse_int, refuse_ignored, shape_from_record, task, whole
from runbooks._options import MAX_DRAFT_STEPS

_SWEEP_FORM = "points 'steps,topk[,draft_tokens]' separated by ';' (e.g. '3,1;5,1;4,4,16')"


def _sweep(text: str) -> list[tuple[int, int, int | None]]:
    """``--sweep '3,1;5,1;4,4,16'`` as (steps, topk, draft tokens) points; anything else is one line that names
    --sweep and the point (never blamed on --steps, --topk or --draft-tokens)."""
    from eaglekb.io.errors import BadInput

    points = []
    for item in str(text).split(";"):
        parts = [p.strip() for p in item.split(",")]
        if not item.strip() or not 1 <= len(parts) <= 3 or not parts[0]:
            raise BadInput("bad sweep point", where="--sweep", expected=_SWEEP_FORM, found=repr(item.strip())[:80])
        try:
            steps = whole(1, MAX_DRAFT_STEPS)(parts[0], "--sweep")
            topk = whole(1, 1024)(parts[1], "--sweep") if len(parts) > 1 and parts[1] else 1
            tokens = whole(1, 1 << 16)(parts[2], "--sweep") if len(parts) > 2 and parts[2] else None
        except BadInput as exc:
            raise BadInput("bad sweep point", where="--sweep", expected=f"{_SWEEP_FORM}; steps at most "
                           f"{MAX_DRAFT_STEPS}, topk at most 1024, draft tokens at most {1 << 16}",
                           found=f"{item.strip()!r}: {exc.found}"[:120]) from None
        points.append((steps, topk, tokens))
    return points


@contextlib.contextmanager
def _sweep_blamed(swept: bool) -> Iterator[None]:
    """With --sweep, a refusal of a point's steps, topk or draft tokens names --sweep (the option typed)."""
    from eaglekb.io.errors import BadInput

    try:
        yield
    except BadInput as exc:
        if not swept or exc.where not in ("--steps", "--topk", "--draft-tokens", "--steps/--topk"):
            raise
        raise BadInput(exc.what, where="--sweep", expected=exc.expected,
                       found=f"{exc.found} (a point's {exc.where.replace('--', '')})", fix=exc.fix) from None


@task(
    default=True,
    options={"steps": whole(1, MAX_DRAFT_STEPS)},
    help={
        "target": "target model: embedded name (smollm2-135m), folder or repo id",
        "drafter": "drafter folder; default: the target's own (drafters/smollm2-135m-default, drafters/qwen2.5-coder-0.5b-r3, drafters/qwen2.5-coder-1.5b-r2)",
        "prompts": "gsm8k-eval, humaneval, mtbench, builtin, CORPUS-heldout, or a prompts file",
        "num_prompts": "how many prompts (default 4)",
        "max_new_tokens": "tokens per prompt, end-of-sequence ignored (default 128)",
        "steps": f"draft steps (one sweep point; see --sweep; at most {MAX_DRAFT_STEPS})",
        "topk": "tree branching (1 = chain)",
        "draft_tokens": "draft-token budget incl. the root",
        "sweep": "several points 'steps,topk[,draft_tokens];...' e.g. '3,1;5,1;4,4,16'",
        "min_draft_prob": "every chain point ends after a drafted token whose draft probability is below this "
                          "(0 = always --steps tokens; chains only)",
        "shape_from": "bench/NAME: the best point of that recorded sweep (same prompt set, drafter and kind of "
                      "device) as the one point timed",
        "repeats": "timed passes over all prompts and methods (default 3)",
        "warmup": "untimed runs per method first (default 1)",
        "device": "cpu or cuda[:N]",
        "dtype": "float32, bfloat16 or float16",
        "graphs": "CUDA graphs: auto (on with CUDA), on, off, both (also time eager vs graphed)",
        "peers": "comma list of hf_generate, hf_prompt_lookup, hf_static_compile ('' for none)",
        "compile": "inductor-compiled layers inside the CUDA graphs: auto (on with graphs), on, off",
        "fused": "greedy chains and trees as one draft and one verify program per cycle: auto (on with graphs), on, "
                 "off",
        "profile": "CUDA: kernels per decode, verify and draft step (count, time by kind, top kernels)",
        "cpu_step_threads": "CPU: threads for the engine's decode, draft and verify steps (default 1; 0 = torch's)",
        "cpu_packed": "CPU: target steps on packed weight copies (oneDNN): auto (timed per row count at engine start, "
                      "copies only within half the memory available), on, off",
        "cpu_draft_fp16": "CPU: the drafter's products on float16 copies of the matrices float16 holds exactly "
                          "(float32 arithmetic, half the bytes): auto, on (refused where a matrix would round), off",
        "cpu_draft_int8": "CPU: the drafter's products but fc on int8 copies (FBGEMM dynamic int8; lossy: may lower "
                          "acceptance, never changes the tokens kept): auto (where this build can), on, off (the default)",
        "cpu_target_fp16": "CPU: target steps on float16 copies of its matrices (exact for a bfloat16 checkpoint; "
                           "float32 arithmetic, half the bytes): auto (timed per row count beside --cpu-packed), on "
                           "(every row count), off",
        "json": "print one JSON document as the last line",
        "record": "write baselines/bench/NAME.json",
        "compare": "compare with baselines/bench/NAME.json (default: the recorded run with the same config)",
    },
)
def bench(c, target="smollm2-135m", drafter=None, prompts="gsm8k-eval", num_prompts=4, max_new_tokens=128,
          steps=None, topk=None, draft_tokens=None, sweep=None, repeats=3, warmup=1, device="cpu",
          dtype="float32", graphs="auto", peers="hf_generate,hf_prompt_lookup,hf_static_compile",
          compile="auto", fused="auto", profile=False, json=False, record=None, compare=None, cpu_step_threads=1, shape_from=None,
          cpu_packed="auto", cpu_draft_fp16="auto", cpu_target_fp16="auto", cpu_draft_int8="off", min_draft_prob=0.0):
    """Engine baseline, EAGLE-3 speculative (sweep) and transformers peers, side by side."""
    with cli_errors():
        from eaglekb.measure import bench as lib
        from eaglekb.measure.setup import default_drafter

        cuda = str(device).startswith("cuda")
        refuse_ignored([
            ("steps", bool(sweep), "no --sweep (each sweep point gives its own steps)"),
            ("topk", bool(sweep), "no --sweep (each sweep point gives its own topk)"),
            ("draft_tokens", bool(sweep), "no --sweep (each sweep point gives its own draft tokens)"),
            ("graphs", not cuda and graphs in ("on", "both"), "--device cuda (CUDA graphs need a GPU)"),
            ("profile", not cuda or graphs == "off", "--device cuda with CUDA graphs (it profiles the graphed steps)"),
            ("cpu_step_threads", cuda, "--device cpu (the CPU engine's step threads)"),
            ("cpu_packed", cuda, "--device cpu (packed weight copies for the CPU engine's steps)"),
            ("cpu_draft_fp16", cuda, "--device cpu (half-width drafter copies for the CPU engine's steps)"),
            ("cpu_target_fp16", cuda, "--device cpu (half-width target copies for the CPU engine's steps)"),
            ("cpu_draft_int8", cuda, "--device cpu (int8 drafter copies for the CPU engine's steps)"),
        ], locals())
        shape = shape_from_record(shape_from, locals(), also=("sweep", "min_draft_prob"), prompts=prompts,
                                  drafter=drafter or default_drafter(target), device=device)
        if shape:
            steps, topk, draft_tokens = shape["steps"], shape["topk"], shape["draft_tokens"]
            min_draft_prob = shape["min_draft_prob"]
        cfg = lib.BenchConfig(
            target=target, drafter=drafter or default_drafter(target), prompts=prompts,
            num_prompts=parse_int(num_prompts, "--num-prompts"), max_new_tokens=parse_int(max_new_tokens, "--max-new-tokens"),
            sweep=_sweep(sweep) if sweep else lib.parse_sweep(None, parse_int(steps, "--steps"),
                                                              parse_int(topk, "--topk"),
                                                              parse_int(draft_tokens, "--draft-tokens")),
            repeats=parse_int(repeats, "--repeats"), warmup=parse_int(warmup, "--warmup"), device=device, dtype=dtype,
            graphs=graphs, peers=[p.strip() for p in str(peers).split(",") if p.strip()],
            compile=str(compile), fused=str(fused), profile=bool(profile),
            cpu_step_threads=parse_int(cpu_step_threads, "--cpu-step-threads"), cpu_packed=str(cpu_packed),
            cpu_draft_fp16=str(cpu_draft_fp16), cpu_target_fp16=str(cpu_target_fp16),
            cpu_draft_int8=str(cpu_draft_int8), min_draft_prob=float(min_draft_prob),
        )
        with _sweep_blamed(bool(sweep)):
            cfg.specs()  # each point's rules (and --min-draft-prob's) before anything loads
            report = lib.run(cfg, progress=not json)
        if shape:
            report.config["shape_from"] = shape["from"]  # where the shape came from, in the record
        doc = report.to_dict()
        config = dict(report.config, prompts_manifest=report.prompts_manifest, failures=report.failures)
        doc.update(finish(kind="bench", record=record, compare=compare, config=config, metrics=report.metrics,
                          noise=lib.noise(report), summary=report.summary))
    emit(doc, lib.render_text(report) + finish_text(doc), json)


def _plan_record(name: str, variant: str | None = None) -> dict:
    """``plan/NAME`` (or NAME) as {"id", "metrics"}, its timings checked; one line when missing or not a plan.
    With ``variant``: the timings of that ``--variant`` server of the record instead of its default one."""
    from eaglekb.io.errors import BadInput, MissingFile
    from eaglekb.kb import baselines
    from eaglekb.measure.sglang.plan import check_plan, variant_key

    ref = "plan/" + str(name).removeprefix("plan/")
    if not baselines.exists(ref):
        raise MissingFile("no plan record of that name", where=f"--plan {name}", expected=f"baselines/{ref}.json",
                          fix="record one before training: invoke plan.sglang --target TARGET --record NAME")
    metrics = baselines.load_id(ref).metrics
    if variant is None:
        return {"id": ref, "metrics": check_plan(metrics, f"--plan {name}")}
    key = variant_key(variant)
    timed = metrics.get("variants") or {} if isinstance(metrics, dict) else {}
    if key not in timed:
        raise BadInput("the plan record timed no such variant", where=f"--plan-variant {variant}",
                       expected=f"one of {', '.join(sorted(timed)) or 'nothing: it was run without --variant'}",
                       found=str(variant))
    return {"id": ref, "variant": key, "metrics": check_plan(timed[key], f"--plan {name} --plan-variant {variant}")}


@task(
    help={
        "url": "a running SGLang server (python -m sglang.launch_server ..., or invoke sglang.launch)",
        "plain_url": "a plain server of the same model beside a speculative --url: both timed in the same run",
        "prompts": "comma list of gsm8k-eval, humaneval, mtbench, builtin, CORPUS-heldout or prompts files (default gsm8k-eval)",
        "num_prompts": "prompts per set (default 4)",
        "max_new_tokens": "tokens per request, end-of-sequence ignored (default 128)",
        "repeats": "timed passes (default 3)",
        "warmup": "untimed requests per method first (default 1)",
        "target": "the served model (prompt tokens; --engine): embedded name or folder (default smollm2-135m)",
        "engine": "also run our engine in this process on --device, with the server's drafter and config: "
                  "tok/s side by side, accept-length and token parity",
        "device": "with --engine: cuda[:N] (default cuda) or cpu",
        "dtype": "with --engine: bfloat16 (default), float16 or float32 (match the server's --dtype)",
        "concurrency": "comma list of simultaneous requests (e.g. 1,2,4,8,16,32,64) against --url and --plain-url",
        "plan": "a plan.sglang record (plan/NAME, made before training): record the speedup it predicts from our "
                "engine's accept length beside the measured one (needs --engine)",
        "plan_variant": "with --plan: price with that record's --variant server (the SGLang settings you serve with) "
                        "instead of its default one",
        "json": "print one JSON document as the last line",
        "record": "write baselines/bench/NAME.json",
        "compare": "compare with baselines/bench/NAME.json",
    },
)
def sglang(c, url="http://127.0.0.1:30000", plain_url=None, prompts="gsm8k-eval", num_prompts=4, max_new_tokens=128,
           repeats=3, warmup=1, target="smollm2-135m", engine=False, device="cuda", dtype="bfloat16",
           concurrency="", plan=None, plan_variant=None, json=False, record=None, compare=None):
    """Benchmark SGLang servers at batch 1 (and concurrency levels), optionally beside our engine, with parity."""
    with cli_errors():
        refuse_ignored([(name, not engine, "--engine (they set our engine's device and dtype)")
                        for name in ("device", "dtype")]
                       + [("plan_variant", not plan, "--plan (it picks one of that record's servers)")], locals())
        from eaglekb.measure.sglang import bench as lib

        levels = [parse_int(v.strip(), "--concurrency", 1, 4096) for v in str(concurrency or "").split(",") if v.strip()]
        sets = [p.strip() for p in str(prompts).split(",") if p.strip()]
        cfg = lib.SGLangBenchConfig(url=url, plain_url=plain_url, prompts=sets, num_prompts=num_prompts,
                                    max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, target=target,
                                    engine=bool(engine), device=device, dtype=dtype, concurrency=levels,
                                    plan=_plan_record(plan, plan_variant) if plan else None)
        report = lib.run(cfg, progress=not json)
        config = dict(report.config, prompts_manifest=report.manifests)
        doc = {"metrics": report.metrics, "config": config}
        doc.update(finish(kind="bench", record=record, compare=compare, config=config, metrics=report.metrics,
                          noise={"repeats": int(repeats), "spread_kind": "range", "spread": report.spread,
                                 "tolerance_rel": 0.25},
                          summary=report.summary))
    emit(doc, report.summary + finish_text(doc), json)
