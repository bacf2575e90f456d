"""`invoke bench`: baseline versus speculative tok/s with peers, repeats, median and spread."""

from __future__ import annotations

from runbooks._common import cli_errors, emit, finish, finish_text, parse_int, task


@task(
    default=True,
    help={
        "target": "target model: embedded name (smollm2-135m), folder or repo id",
        "drafter": "drafter folder; default drafters/smollm2-135m-default",
        "prompts": "gsm8k-eval, humaneval, builtin, or a prompts file",
        "num_prompts": "how many prompts (default 4)",
        "max_new_tokens": "tokens per prompt, end-of-sequence ignored (default 128)",
        "steps": "draft steps (one sweep point; see --sweep)",
        "topk": "tree branching (1 = chain)",
        "draft_tokens": "draft-token budget incl. the root",
        "sweep": "several points 'steps,topk[,draft_tokens];...' e.g. '3,1;5,1;4,4,16'",
        "repeats": "timed passes over all prompts and methods (default 3)",
        "warmup": "untimed runs per method first (default 1)",
        "device": "cpu or cuda[:N]",
        "dtype": "float32, bfloat16 or float16",
        "graphs": "CUDA graphs: auto (on with CUDA), on, off, both (also time eager vs graphed)",
        "peers": "comma list of hf_generate, hf_prompt_lookup, hf_static_compile ('' for none)",
        "compile": "inductor-compiled layers inside the CUDA graphs: auto (on with graphs), on, off",
        "fused": "greedy chains as one draft and one verify program per cycle: auto (on with graphs), on, off",
        "profile": "CUDA: kernels per decode, verify and draft step (count, time by kind, top kernels)",
        "cpu_step_threads": "CPU: threads for the engine's decode, draft and verify steps (default 1; 0 = torch's)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/bench/NAME.json",
        "compare": "compare with baselines/bench/NAME.json (default: the recorded run with the same config)",
    },
)
def bench(c, target="smollm2-135m", drafter=None, prompts="gsm8k-eval", num_prompts=4, max_new_tokens=128,
          steps=None, topk=None, draft_tokens=None, sweep=None, repeats=3, warmup=1, device="cpu",
          dtype="float32", graphs="auto", peers="hf_generate,hf_prompt_lookup,hf_static_compile",
          compile="auto", fused="auto", profile=False, json=False, record=None, compare=None, cpu_step_threads=1):
    """Engine baseline, EAGLE-3 speculative (sweep) and transformers peers, side by side."""
    with cli_errors():
        from eaglekb.measure import bench as lib
        from eaglekb.measure.setup import DEFAULT_DRAFTER

        cfg = lib.BenchConfig(
            target=target, drafter=drafter or DEFAULT_DRAFTER, prompts=prompts,
            num_prompts=parse_int(num_prompts, "--num-prompts"), max_new_tokens=parse_int(max_new_tokens, "--max-new-tokens"),
            sweep=lib.parse_sweep(sweep, parse_int(steps, "--steps"), parse_int(topk, "--topk"),
                                  parse_int(draft_tokens, "--draft-tokens")),
            repeats=parse_int(repeats, "--repeats"), warmup=parse_int(warmup, "--warmup"), device=device, dtype=dtype,
            graphs=graphs, peers=[p.strip() for p in str(peers).split(",") if p.strip()],
            compile=str(compile), fused=str(fused), profile=bool(profile),
            cpu_step_threads=parse_int(cpu_step_threads, "--cpu-step-threads"),
        )
        report = lib.run(cfg, progress=not json)
        doc = report.to_dict()
        config = dict(report.config, prompts_manifest=report.prompts_manifest, failures=report.failures)
        doc.update(finish(kind="bench", record=record, compare=compare, config=config, metrics=report.metrics,
                          noise=lib.noise(report), summary=report.summary))
    emit(doc, lib.render_text(report) + finish_text(doc), json)


@task(
    help={
        "url": "a running SGLang server (python -m sglang.launch_server ... --speculative-algorithm EAGLE3)",
        "prompts": "gsm8k-eval, humaneval, builtin, or a prompts file (sent as text)",
        "num_prompts": "how many prompts (default 4)",
        "max_new_tokens": "tokens per request, end-of-sequence ignored (default 128)",
        "repeats": "timed passes (default 3)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/bench/NAME.json",
        "compare": "compare with baselines/bench/NAME.json",
    },
)
def sglang(c, url="http://127.0.0.1:30000", prompts="gsm8k-eval", num_prompts=4, max_new_tokens=128, repeats=3,
           json=False, record=None, compare=None):
    """Benchmark a running SGLang server: tok/s and accept length from meta_info (single stream)."""
    with cli_errors():
        from eaglekb.data.prompts import eval_prompts
        from eaglekb.measure.sglang import bench as bench_server
        from eaglekb.models.server import SGLangClient

        pset = eval_prompts(prompts, parse_int(num_prompts, "--num-prompts"))
        client = SGLangClient(url)
        info = client.server_info()
        res = bench_server(client, [p.text for p in pset.prompts], parse_int(max_new_tokens, "--max-new-tokens"),
                           repeats=parse_int(repeats, "--repeats"))
        spread = res.pop("spread")
        config = {"backend": "sglang", "url": url, "prompts": prompts, "prompts_manifest": pset.manifest,
                  "max_new_tokens": max_new_tokens, "server_info": {k: info.get(k) for k in (
                      "model_path", "speculative_algorithm", "speculative_draft_model_path",
                      "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size",
                      "version") if isinstance(info, dict)}}
        metrics = {"sglang": res}
        doc = {"metrics": metrics, "config": config}
        doc.update(finish(kind="bench", record=record, compare=compare, config=config, metrics=metrics,
                          noise={"repeats": int(repeats), "spread_kind": "range",
                                 "spread": {f"sglang.{k}": v for k, v in spread.items()}, "tolerance_rel": 0.25},
                          summary=f"SGLang {res['median_tok_s']:.1f} tok/s"
                          + (f", accept_len {res['accept_len']:.2f}" if "accept_len" in res else "")))
    emit(doc, f"SGLang at {url}: {res['median_tok_s']:.1f} tok/s"
         + (f", accept_len {res['accept_len']:.2f}" if "accept_len" in res else "") + finish_text(doc), json)
