"""bench: every method on the same prompts, medians and spreads, sweep names, peers, runbook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


from eaglekb.measure import bench
from eaglekb.io.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def test_parse_sweep():
    assert bench.parse_sweep("3,1;5,1,6;4,4,16", None, None, None) == [(3, 1, None), (5, 1, 6), (4, 4, 16)]
    assert bench.parse_sweep(None, 2, None, None) == [(2, 1, None)]
    with pytest.raises(BadInput):
        bench.parse_sweep("x,1", None, None, None)


def test_bench_run_on_tiny_target(tiny_pair):  # noqa: F811
    target, drafter = tiny_pair
    cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                            max_new_tokens=8, sweep=[(2, 1, None), (2, 2, 5)], repeats=2, warmup=1)
    r = bench.run(cfg, progress=False)
    names = set(r.metrics)
    assert {"engine", "spec_s2_k1_n3", "spec_s2_k2_n5", "hf_generate", "hf_prompt_lookup"} <= names
    assert r.failures["hf_static_compile"].startswith("skipped")
    spec = r.metrics["spec_s2_k1_n3"]
    assert spec["cycle_ms"] == pytest.approx(spec["draft_ms"] + spec["verify_ms"] + spec["overhead_ms"], rel=1e-6)
    assert spec["vs_engine_x"] > 0 and "vs_hf_generate_x" in spec and spec["accept_len"] >= 1
    noise = bench.noise(r)
    assert noise["repeats"] == 2 and "engine.median_tok_s" in noise["spread"]
    from eaglekb.kb.baselines import build
    build(kind="bench", name="t", config=r.config, metrics=r.metrics, noise=noise)
    assert "tok/s" in bench.render_text(r)
    # the fastest point is named, with the SGLang command that serves it (plain when it does not pay)
    best = max(("spec_s2_k1_n3", "spec_s2_k2_n5"), key=lambda n: r.metrics[n]["median_tok_s"])
    b = r.metrics["best"]
    named = f"spec_s{b['steps_count']}_k{b['topk_count']}_n{b['draft_tokens_count']}"
    assert named == best == r.config["best"]["method"]
    text = bench.render_text(r)
    assert "best on this machine" in text and r.config["best"]["sglang_command"] in text
    assert "sglang.launch_server" in r.config["best"]["sglang_command"]


def test_bench_serves_the_best_point_with_matching_sglang_flags():
    cfg = bench.BenchConfig(drafter="drafters/d", device="cuda", dtype="bfloat16")
    specs = [bench.SpecConfig(steps=3), bench.SpecConfig(steps=4, topk=4, draft_tokens=16)]
    metrics = {"spec_s3_k1_n4": {"median_tok_s": 900.0, "vs_engine_x": 1.25},
               "spec_s4_k4_n16": {"median_tok_s": 1000.0, "vs_engine_x": 1.39}}
    served = bench.serve_best(cfg, metrics, specs, "/m/target")
    assert served["metrics"] == {"steps_count": 4, "topk_count": 4, "draft_tokens_count": 16, "vs_engine_x": 1.39}
    flags = served["config"]["sglang_flags"].split()
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert {"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": "drafters/d",
            "--speculative-num-steps": "4", "--speculative-eagle-topk": "4",
            "--speculative-num-draft-tokens": "16"}.items() <= pairs.items()
    assert served["config"]["sglang_command"].split()[:5] == ["python", "-m", "sglang.launch_server", "--model-path",
                                                             "/m/target"]
    slow = {k: dict(v, vs_engine_x=0.8) for k, v in metrics.items()}
    plain = bench.serve_best(cfg, slow, specs, "/m/target")
    assert not plain["config"]["pays"] and "--speculative" not in plain["config"]["sglang_command"]
    assert bench.serve_best(cfg, metrics, [], "/m/target") == {}
    # a drafter SGLang cannot serve (P-EAGLE): the best point without an SGLang command, and why
    parallel = bench.serve_best(cfg, metrics, specs, "/m/target", unservable="no parallel drafting")
    assert parallel["metrics"] == served["metrics"] and parallel["config"]["sglang_command"] is None
    assert parallel["config"]["sglang_refusal"] == "no parallel drafting"
    assert bench.serve_best(cfg, slow, specs, "/m/target", unservable="no parallel drafting") == plain


def test_bench_fused_chain_and_tree_on_cpu_same_acceptance(tiny_pair):  # noqa: F811
    target, drafter = tiny_pair
    runs = {}
    for fused in ("off", "on"):
        cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                                max_new_tokens=12, sweep=[(3, 1, None), (2, 2, 5)], repeats=1, warmup=0, peers=[],
                                fused=fused)
        runs[fused] = bench.run(cfg, progress=False)
    assert runs["on"].config["fused_chain_main"] and not runs["off"].config["fused_chain_main"]
    assert runs["on"].config["fused_tree_main"] and not runs["off"].config["fused_tree_main"]
    for name in ("spec_s3_k1_n4", "spec_s2_k2_n5"):
        assert runs["on"].metrics[name]["accept_len"] == runs["off"].metrics[name]["accept_len"]
    with pytest.raises(BadInput, match="fused"):
        bench.run(bench.BenchConfig(target=str(target), drafter=str(drafter), fused="maybe"), progress=False)


def test_bench_runbook_bad_input_is_one_line(tiny_pair):  # noqa: F811
    target, drafter = tiny_pair
    out = subprocess.run([sys.executable, "-m", "invoke", "bench", "--target", str(target), "--drafter",
                          str(drafter), "--prompts", "builtin", "--peers", "vllm", "--record", "x-test"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert out.returncode != 0 and len(errors) == 1 and "unknown peer" in errors[0]
    assert not (ROOT / "baselines" / "bench" / "x-test.json").exists()


def test_bench_sglang_unreachable_is_one_line():
    out = subprocess.run([sys.executable, "-m", "invoke", "bench.sglang", "--url", "http://127.0.0.1:9",
                          "--prompts", "builtin", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "unreachable" in out.stderr and out.stderr.strip().count("\n") == 0
    json_lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert json_lines == []


def test_a_p_eagle_drafters_impossible_points_are_refused_before_any_weights(tmp_path, monkeypatch):
    """A tree or a chain longer than one pass proposes, for a P-EAGLE drafter: bench and probe refuse it from the
    drafter's config.json alone, naming the option typed, before the target or the drafter loads."""
    from eaglekb.measure import probe, setup
    from eaglekb.models.drafter import save_drafter
    from eaglekb.models.parallel_drafter import to_parallel
    from helpers.models import tiny_drafter

    parallel = str(save_drafter(to_parallel(tiny_drafter(), 3), tmp_path / "p-eagle"))

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the points were checked")

    monkeypatch.setattr(setup, "load", no_load)
    with pytest.raises(BadInput, match="chains only") as err:
        bench.run(bench.BenchConfig(drafter=parallel, sweep=[(3, 1, None), (4, 4, 16)]), progress=False)
    assert err.value.where == "--topk"
    with pytest.raises(BadInput, match="more draft steps") as err:
        probe.run(probe.ProbeConfig(drafter=parallel, steps=4), progress=False)
    assert "<= 3" in err.value.line()
    with pytest.raises(AssertionError, match="weights loaded"):  # a chain it can draft goes on to the load
        bench.run(bench.BenchConfig(drafter=parallel, sweep=[(3, 1, None)]), progress=False)


def test_a_random_p_eagle_drafter_times_the_method_before_training():
    """``random:N:p-eagle:K``: the random EAGLE-3 drafter of ``random:N`` (same weights) as a P-EAGLE drafter of K
    tokens a pass, for timing a drafting method before any drafter is trained; its points are checked from the spec
    before any weights load, and a misspelt spec is one line."""
    from eaglekb.measure import setup
    from helpers.models import tiny_llama_config

    cfg = tiny_llama_config()
    plain = setup.read_drafter("random:40", target_config=cfg)
    parallel = setup.read_drafter("random:40:p-eagle:3", target_config=cfg)
    assert plain.parallel_tokens == 0 and parallel.parallel_tokens == 3
    assert parallel.config.draft_vocab_size == plain.config.draft_vocab_size == 40
    same = {k: v for k, v in parallel.state_dict().items() if k in plain.state_dict()}
    assert all(bool((v == plain.state_dict()[k]).all()) for k, v in same.items() if v.is_floating_point())
    with pytest.raises(BadInput, match="chains only"):
        setup.check_points_before_weights("random:40:p-eagle:3", [bench.SpecConfig(steps=3, topk=2)])
    for bad in ("random:40:p-egle:3", "random:p-eagle", "random:40:p-eagle:3:1", "random:0"):
        with pytest.raises(BadInput, match="not a random drafter spec"):
            setup.read_drafter(bad, target_config=cfg)
    with pytest.raises(BadInput, match="out of range"):
        setup.read_drafter("random:p-eagle:1", target_config=cfg)


def test_a_random_p_eagle_drafter_benches_and_gets_no_sglang_command(tiny_pair):  # noqa: F811
    """A bench of ``random:N:p-eagle:K`` runs (no drafter folder to read) and names why SGLang cannot serve it."""
    target, _ = tiny_pair
    cfg = bench.BenchConfig(target=str(target), drafter="random:40:p-eagle:3", prompts="builtin", num_prompts=1,
                            max_new_tokens=8, sweep=[(2, 1, None), (3, 1, None)], repeats=1, warmup=1, peers=[])
    r = bench.run(cfg, progress=False)
    assert {"engine", "spec_s2_k1_n3", "spec_s3_k1_n4"} <= set(r.metrics)
    if r.config["best"]["pays"]:
        assert r.config["best"]["sglang_command"] is None and "parallel drafting" in r.config["best"]["sglang_refusal"]
    else:  # plain serving: the drafter is not in the command
        assert "--speculative" not in r.config["best"]["sglang_command"]
