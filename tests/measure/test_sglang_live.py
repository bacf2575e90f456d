"""The SGLang path end to end against stand-ins: launch and stop, the bench with our engine and parity,
concurrency levels, the profiler-trace split, and the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eaglekb.io.errors import BadInput, Incompatible, Unavailable
from eaglekb.measure.sglang import bench as sglang_bench, trace as sglang_trace
from eaglekb.measure.sglang.config import LaunchConfig
from eaglekb.measure.sglang.server import launch, stop, wait_ready
from helpers.sglang_stub import decode_trace as _trace, serve, stub_package

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_waits_for_health_then_stop_ends_it(tmp_path):
    site = stub_package(tmp_path / "site")
    port = _free_port()
    cfg = LaunchConfig("/m/target", "/m/drafter", port=port, extra=["--stub-delay", "1.5"])
    doc = wait_ready(launch(cfg, site=site, state_dir=tmp_path / "state"), timeout_s=30, progress=False,
                     interval_s=0.2)
    assert doc["server_info"]["speculative_algorithm"] == "EAGLE3" and doc["ready_s"] >= 1.0
    assert (tmp_path / "state" / f"server-{port}.json").is_file()
    with pytest.raises(BadInput, match="already running"):
        launch(cfg, site=site, state_dir=tmp_path / "state")
    res = stop(port, state_dir=tmp_path / "state")
    assert res["was_running"] and not (tmp_path / "state" / f"server-{port}.json").exists()
    with pytest.raises(Exception, match="no server started"):
        stop(port, state_dir=tmp_path / "state")


def test_a_server_that_dies_at_start_up_is_named_with_its_last_log_lines(tmp_path):
    site = stub_package(tmp_path / "site")
    cfg = LaunchConfig("/m/target", port=_free_port(), extra=["--stub-die"])
    with pytest.raises(Unavailable, match="exited during start-up") as err:
        wait_ready(launch(cfg, site=site, state_dir=tmp_path / "state"), timeout_s=30, progress=False, interval_s=0.2)
    assert "CUDA out of memory (stub)" in str(err.value) and "\n" not in str(err.value)


def _greedy(target_dir):
    """The tiny target's own greedy continuation (transformers, float32): what a real server would return."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()

    def gen(ids, n):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out[0, len(ids):].tolist()

    return gen


def test_bench_with_our_engine_parity_and_concurrency(tiny_pair):
    target, drafter = tiny_pair
    spec_info = {"version": "stub", "model_path": str(target), "speculative_algorithm": "EAGLE3",
                 "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                 "speculative_draft_model_path": str(drafter)}
    plain_info = {"version": "stub", "model_path": str(target)}
    gen = _greedy(target)
    s1, url = serve(spec_info, gen)
    s2, plain = serve(plain_info, gen)
    try:
        cfg = sglang_bench.SGLangBenchConfig(url=url, plain_url=plain, prompts=["builtin"], num_prompts=2,
                                             max_new_tokens=12, repeats=2, target=str(target), engine=True,
                                             device="cpu", dtype="float32", concurrency=[1, 2])
        rep = sglang_bench.run(cfg, progress=False)
        m = rep.metrics["builtin"]
        assert set(m) >= {"sglang", "sglang_plain", "engine", "engine_spec", "vs", "parity"}
        # the stub returns the target's greedy tokens: our engine (plain and speculative, float32) agrees
        assert m["parity"]["sglang_vs_engine_spec"]["identical_count"] == 2
        assert m["parity"]["sglang_plain_vs_engine"]["identical_count"] == 2
        assert m["sglang"]["accept_len"] == pytest.approx(2.0, rel=0.1)
        assert "accept_len_diff_pct" in m["vs"] and m["sglang"]["server"]["cycle_ms"] >= 0
        assert rep.metrics["concurrency"]["c2"]["sglang"]["output_tok_s"] > 0
        assert "speedup_x" in rep.metrics["concurrency"]["c1"]
        assert rep.config["server_info"]["speculative_num_steps"] == 3
        # the other way round: a plain server given as the speculative one
        with pytest.raises(BadInput, match="no speculative decoding"):
            sglang_bench.run(sglang_bench.SGLangBenchConfig(url=plain, plain_url=url, target=str(target)),
                             progress=False)
    finally:
        s1.shutdown()
        s2.shutdown()


def test_server_of_another_model_is_refused(tiny_pair, tmp_path):
    target, _ = tiny_pair
    s, url = serve({"model_path": str(tmp_path)})
    try:
        with pytest.raises(Incompatible, match="not the bench's target"):
            sglang_bench.run(sglang_bench.SGLangBenchConfig(url=url, target=str(target)), progress=False)
    finally:
        s.shutdown()


def test_trace_split_keys_cycles_on_the_verify_graph(tmp_path):
    import gzip

    path = tmp_path / "x.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_trace(12)).encode()))
    s = sglang_trace.split(sglang_trace.read_trace(path))
    assert s["verify_graph_kernels_count"] == 9 and s["draft_graph_kernels_count"] == 3
    assert s["verify_gpu_ms"] == pytest.approx(0.030) and s["draft_gpu_ms"] == pytest.approx(0.010)
    assert s["eager_gpu_ms"] == pytest.approx(0.005)
    assert s["cycle_ms"] == pytest.approx(0.075) and s["gpu_idle_ms"] == pytest.approx(0.030)
    with pytest.raises(Unavailable, match="too few"):
        sglang_trace.split(sglang_trace.read_trace(_write(tmp_path / "y.json", _trace(3))))


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_cli_refusals_are_one_line(tiny_pair, tmp_path):
    target, _ = tiny_pair
    other = tmp_path / "wide"
    from helpers.models import tiny_drafter, tiny_llama_config
    from eaglekb.models.drafter import save_drafter

    save_drafter(tiny_drafter(tiny_llama_config(hidden_size=64)), other)
    for args in (["sglang.launch", f"--target={target}", f"--drafter={other}", "--port=1"],
                 ["bench.sglang", "--url=http://127.0.0.1:9", "--concurrency=1,x"],
                 ["sglang.install", str(tmp_path), "--target", str(tmp_path / "t")],
                 ["sglang.stop", "--port=1"]):
        out = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (args, out.stderr)
        lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in out.stderr, (args, out.stderr)


def test_a_run_is_a_valid_baseline(tiny_pair):
    from eaglekb.kb.schema import Baseline  # noqa: F401  (the schema the writer validates with)
    from eaglekb.kb import baselines

    target, _ = tiny_pair
    s1, plain = serve({"version": "stub", "model_path": str(target)})
    s2, url = serve({"version": "stub", "model_path": str(target), "speculative_algorithm": "EAGLE3",
                     "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3})
    try:
        rep = sglang_bench.run(sglang_bench.SGLangBenchConfig(url=url, plain_url=plain, prompts=["builtin"],
                                                              num_prompts=2, max_new_tokens=8, repeats=2,
                                                              target=str(target), concurrency=[1, 2]),
                               progress=False)
        b = baselines.build(kind="bench", name="stub-sglang", config=rep.config, metrics=rep.metrics,
                            noise={"repeats": 2, "spread_kind": "range", "spread": rep.spread, "tolerance_rel": 0.25},
                            summary=rep.summary, command="invoke bench.sglang --url X")
        assert b.metrics["concurrency_summary"]["levels_count"] == 2
    finally:
        s1.shutdown()
        s2.shutdown()


def test_profile_task_records_the_split(tiny_pair, tmp_path, monkeypatch):
    target, _ = tiny_pair
    s, url = serve({"version": "stub", "model_path": str(target), "speculative_algorithm": "EAGLE3",
                    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4})
    try:
        res = sglang_bench.profile_split(url, str(target), "builtin", 8, 20, str(tmp_path / "prof"))
        assert res["metrics"]["gpu"]["verify_graph_kernels_count"] == 9
        assert res["metrics"]["request"]["cycle_ms"] >= 0 and res["metrics"]["accept_len"] > 1
        g = res["metrics"]["gpu"]
        assert res["metrics"]["gpu_busy_ms"] == pytest.approx(g["verify_gpu_ms"] + g["draft_gpu_ms"] + g["eager_gpu_ms"])
        assert "under the profiler" in res["summary"]
        from eaglekb.kb import baselines

        baselines.build(kind="bench", name="stub-profile", config=res["config"], metrics=res["metrics"],
                        noise={"repeats": 1, "spread_kind": "none", "spread": {}, "tolerance_rel": 0.25},
                        summary=res["summary"], command="invoke sglang.profile --url X")
    finally:
        s.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_that_dies_mid_run_ends_the_run_with_one_line(tiny_pair):
    target, _ = tiny_pair
    calls = {"n": 0}

    def dying(ids, n):
        calls["n"] += 1
        if calls["n"] > 3:
            raise SystemExit  # the handler drops the connection without an answer, as a crashed server does
        return list(range(n))

    s, url = serve({"version": "stub", "model_path": str(target)}, dying)
    try:
        with pytest.raises(Unavailable) as err:
            sglang_bench.run(sglang_bench.SGLangBenchConfig(url=url, prompts=["builtin"], num_prompts=2,
                                                            max_new_tokens=4, target=str(target)), progress=False)
        assert "\n" not in str(err.value) and url in str(err.value)
    finally:
        s.shutdown()
