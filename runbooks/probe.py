"""`invoke probe`: plug a drafter into a target; acceptance offline and online, and a verdict."""

from __future__ import annotations

from runbooks._common import cli_errors, emit, finish, finish_text, parse_floats, parse_int, shape_from_record, task

DEFAULT_RECORD = "cpu-smollm2-default-stop-s3-gsm8k"  # the embedded default probe, newest record



def _one_float(value, option):
    values = parse_floats(value, option)
    return values[0] if values else None


@task(
    default=True,
    help={
        "target": "target model: embedded name (smollm2-135m), folder or repo id",
        "drafter": "drafter folder (SGLang/SpecForge or speculators format); default: the target's own (drafters/smollm2-135m-default, drafters/qwen2.5-coder-0.5b-r3, drafters/qwen2.5-coder-1.5b-r2)",
        "reference_drafter": "a second drafter to judge against (same target)",
        "prompts": "held-out prompts: gsm8k-eval, humaneval, mtbench, builtin, CORPUS-heldout, or a prompts file (text or JSON lines)",
        "num_prompts": "how many prompts (default 8)",
        "max_new_tokens": "tokens to generate per prompt (default 64)",
        "steps": "draft steps per cycle (SGLang --speculative-num-steps, default 3)",
        "topk": "tree branching (1 = chain; SGLang --speculative-eagle-topk)",
        "draft_tokens": "draft-token budget incl. the root (SGLang --speculative-num-draft-tokens)",
        "shape_from": "bench/NAME: the best point of that recorded sweep (same prompt set, drafter and kind of "
                      "device) as --steps, --topk and --draft-tokens",
        "temperature": "0 = greedy (exactness checked); > 0 = sampled verification",
        "min_draft_prob": "a chain ends after a drafted token whose draft probability is below this (0 = always "
                          "--steps tokens; 0.3: deep where the drafter is sure, short where it is not)",
        "device": "cpu or cuda[:N]",
        "dtype": "float32 (exactness holds), bfloat16 or float16",
        "baseline_tps": "override the measured baseline tok/s in the verdict",
        "cycle_ms": "override the measured cycle time (ms) in the verdict",
        "json": "print one JSON document as the last line",
        "record": "write baselines/probe/NAME.json",
        "compare": "compare with baselines/probe/NAME.json (default: the recorded run with the same config)",
    },
)
def probe(c, target="smollm2-135m", drafter=None, reference_drafter=None, prompts="gsm8k-eval", num_prompts=8,
          max_new_tokens=64, steps=3, topk=1, draft_tokens=None, temperature=0.0, device="cpu",
          dtype="float32", baseline_tps=None, cycle_ms=None, json=False, record=None, compare=None, shape_from=None,
          min_draft_prob=0.0):
    """Offline (teacher-forced) and online acceptance, exactness, and viable-or-not against break-even."""
    with cli_errors():
        from eaglekb.io.progress import announce

        values = dict(locals())
        announce(f"loading {target} and its drafter ...", enabled=not json)  # at once: the imports take seconds
        from eaglekb.measure import probe as lib
        from eaglekb.measure.setup import default_drafter

        shape = shape_from_record(shape_from, values, also=("min_draft_prob",), prompts=prompts, drafter=drafter or default_drafter(target),
                                  device=device)
        if shape:
            steps, topk, draft_tokens = shape["steps"], shape["topk"], shape["draft_tokens"]
            min_draft_prob = shape["min_draft_prob"]

        cfg = lib.ProbeConfig(
            target=target, drafter=drafter or default_drafter(target), reference_drafter=reference_drafter,
            prompts=prompts, num_prompts=parse_int(num_prompts, "--num-prompts"),
            max_new_tokens=parse_int(max_new_tokens, "--max-new-tokens"), steps=parse_int(steps, "--steps"),
            topk=parse_int(topk, "--topk"), draft_tokens=parse_int(draft_tokens, "--draft-tokens"),
            temperature=_one_float(temperature, "--temperature"), device=device, dtype=dtype,
            baseline_tps=_one_float(baseline_tps, "--baseline-tps"), cycle_ms=_one_float(cycle_ms, "--cycle-ms"),
            min_draft_prob=float(min_draft_prob),
        )
        cfg.spec()  # the draft shape's rules (and --min-draft-prob's) before anything loads
        report = lib.run(cfg, progress=not json)
        if shape:
            report.config["shape_from"] = shape["from"]  # where the shape came from, in the record
        doc = report.to_dict()
        config = dict(report.config, prompts_manifest=report.prompts_manifest)
        # The embedded default (no options) always answers "did it reproduce the recorded result?".
        compare = compare or (DEFAULT_RECORD if cfg == lib.ProbeConfig() and not record else None)
        doc.update(finish(kind="probe", record=record, compare=compare, config=config, metrics=report.metrics,
                          noise=lib.noise(report.metrics), summary=report.summary))
    emit(doc, lib.render_text(report) + finish_text(doc), json)

