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


def test_bench_fused_chain_on_cpu_same_acceptance(tiny_pair):  # noqa: F811
    target, drafter = tiny_pair
    runs = {}
    for fused in ("off", "on"):
        cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                                max_new_tokens=12, sweep=[(3, 1, None)], repeats=1, warmup=0, peers=[], fused=fused)
        runs[fused] = bench.run(cfg, progress=False)
    assert runs["on"].config["fused_chain_main"] and not runs["off"].config["fused_chain_main"]
    assert runs["on"].metrics["spec_s3_k1_n4"]["accept_len"] == runs["off"].metrics["spec_s3_k1_n4"]["accept_len"]
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
