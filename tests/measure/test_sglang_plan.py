"""Break-even before training (plan.sglang), the prediction bench.sglang records, and prompt-set keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eaglekb.data.prompts import set_keys
from eaglekb.formats.drafter import read_config
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.io.files import process_alive
from eaglekb.measure import viability
from eaglekb.measure.sglang import bench as sglang_bench, plan
from eaglekb.measure.sglang.server import stop_launched
from helpers.sglang_stub import serve

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMINGS = {"plain_step_ms": 2.0, "spec_cycle_ms": 5.0, "plain_fixed_ms": 20.0, "spec_fixed_ms": 30.0}


def test_set_keys_from_names_and_files(tmp_path):
    f = tmp_path / "My-Prompts.v2.txt"
    f.write_text("hello\n")
    digits = tmp_path / "2024.txt"
    digits.write_text("hi\n")
    keys = set_keys(["gsm8k-eval", str(f), str(digits), "builtin"])
    assert keys == {"gsm8k-eval": "gsm8k_eval", str(f): "my_prompts_v2", str(digits): "set_2024", "builtin": "builtin"}
    with pytest.raises(BadInput, match="share one result key"):
        set_keys(["gsm8k-eval", "gsm8k_eval"])


def test_request_speedup_prices_fixed_cost_and_cycles():
    p = viability.request_speedup(TIMINGS, 2.5, 129)
    assert p["decode_speedup_x"] == pytest.approx(2.5 * 2 / 5)  # exactly break-even in the decode phase: 1.0
    assert p["speedup_x"] == pytest.approx((20 + 128 * 2) / (30 + 128 / 2.5 * 5))
    priced = plan.price(dict(TIMINGS), 129, steps=3)
    assert priced["breakeven_len"] == pytest.approx(2.5)
    assert priced["breakeven_e2e_len"] > 2.5  # the spec server's larger fixed cost moves break-even up
    assert set(priced["at_accept"]) == {"a1_5", "a2", "a2_5", "a3", "a3_5", "a4"}  # a chain of 3 reaches 4 at most
    assert 0 < priced["breakeven_p_frac"] < 1
    with pytest.raises(BadInput):
        viability.request_speedup(dict(TIMINGS, spec_cycle_ms=0), 2.0, 10)


def test_untrained_drafter_has_the_target_shape(tiny_pair, tmp_path):
    target, _ = tiny_pair
    doc = plan.untrained_drafter(target, tmp_path / "d", 64)
    dc, _ = read_config(tmp_path / "d")
    assert not doc["reused"] and dc.draft_vocab_size == 64 and (tmp_path / "d" / "model.safetensors").is_file()
    assert plan.untrained_drafter(target, tmp_path / "d", 64)["reused"]
    with pytest.raises(Incompatible, match="another shape"):
        plan.untrained_drafter(target, tmp_path / "d", 32)


def _pair(target, drafter, per_cycle=1):
    spec_info = {"version": "stub", "model_path": str(target), "speculative_algorithm": "EAGLE3",
                 "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                 "speculative_draft_model_path": str(drafter)}
    s1, url = serve(spec_info, per_cycle=per_cycle)
    s2, plain = serve({"version": "stub", "model_path": str(target)})
    return (s1, s2), url, plain


def test_plan_against_running_servers(tiny_pair):
    target, drafter = tiny_pair
    servers, url, plain = _pair(target, drafter)
    try:
        res = plan.run(plan.PlanConfig(target=str(target), url=url, plain_url=plain, num_prompts=2,
                                       max_new_tokens=12, repeats=2), progress=False)
    finally:
        for s in servers:
            s.shutdown()
    m = res["metrics"]
    assert m["plain_step_ms"] > 0 and m["spec_cycle_ms"] > 0 and m["untrained_accept_len"] == pytest.approx(1.0)
    assert m["breakeven_len"] == pytest.approx(m["spec_cycle_ms"] / m["plain_step_ms"])
    assert res["config"]["steps"] == 3 and not res["config"]["launched"] and "break-even" in res["summary"]
    with pytest.raises(BadInput, match="both running servers or neither"):
        plan.run(plan.PlanConfig(target=str(target), url=url), progress=False)


def test_bench_records_the_prediction_beside_the_measured_ratio(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    servers, url, plain = _pair(target, drafter, per_cycle=2)
    prompts = tmp_path / "my-prompts.txt"
    prompts.write_text("Say hello.\nCount to three.\n")
    try:
        cfg = sglang_bench.SGLangBenchConfig(url=url, plain_url=plain, prompts=[str(prompts)], num_prompts=2,
                                             max_new_tokens=12, repeats=1, target=str(target), engine=True,
                                             device="cpu", dtype="float32",
                                             plan={"id": "plan/x", "metrics": dict(TIMINGS)})
        rep = sglang_bench.run(cfg, progress=False)
        with pytest.raises(BadInput, match="needs our engine"):
            sglang_bench.run(sglang_bench.SGLangBenchConfig(url=url, plain_url=plain, target=str(target),
                                                            plan={"id": "plan/x", "metrics": dict(TIMINGS)}),
                             progress=False)
    finally:
        for s in servers:
            s.shutdown()
    vs = rep.metrics["my_prompts"]["vs"]
    acc = rep.metrics["my_prompts"]["engine_spec"]["accept_len"]
    assert vs["predicted_x"] == pytest.approx(viability.request_speedup(TIMINGS, acc, 12)["speedup_x"])
    assert "prediction_error_pct" in vs and rep.config["plan"] == "plan/x"
    m = rep.metrics["my_prompts"]
    assert vs["same_run_decode_x"] == pytest.approx(acc * m["sglang_plain"]["server"]["cycle_ms"]
                                                    / m["sglang"]["server"]["cycle_ms"])
    assert "same_run_error_pct" in vs


def test_variants_launch_beside_the_pair_and_are_timed_against_one_plain_server(tiny_pair, tmp_path, monkeypatch):
    """--variant NAME=FLAGS: one more speculative server per variant (its flags and environment reach it), all
    launched together on consecutive ports, each timed against the same plain server, all stopped after; a
    variant whose server does not start is reported in the record, and the others are still timed."""
    import socket

    from eaglekb.measure.sglang import server
    from helpers.sglang_stub import stub_package

    target, _ = tiny_pair
    site = stub_package(tmp_path / "site")
    monkeypatch.setattr(server, "STATE_DIR", tmp_path / "state")
    with socket.socket() as sock:  # a free block of five ports
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    variants = dict([plan.parse_variant("draft-triton=--speculative-draft-attention-backend triton"),
                     plan.parse_variant("plan-stream=STUB_PLAN_STREAM=1"),
                     plan.parse_variant("broken=--stub-die")])
    assert variants["plan-stream"] == {"extra": [], "env": {"STUB_PLAN_STREAM": "1"}}
    cfg = plan.PlanConfig(target=str(target), site=str(site), drafter_out=str(tmp_path / "untrained"),
                          draft_vocab_size=64, num_prompts=2, max_new_tokens=12, repeats=1, port=port,
                          timeout_s=60, variants=variants)
    assert plan.mem_fraction(cfg) == pytest.approx(0.16)  # five servers share 0.8 of the GPU
    launched, docs, events = [], [], []
    real_launch, real_ready = plan.launch, plan.wait_ready
    monkeypatch.setattr(plan, "launch", lambda c, **k: launched.append(c) or events.append("launch")
                        or docs.append(real_launch(c, **k)) or docs[-1])
    monkeypatch.setattr(plan, "wait_ready", lambda d, **k: events.append("wait") or real_ready(d, **k))
    free = iter([1.0, 0.8, 0.64, 0.5, 0.4])  # what the GPU has free as each server starts
    monkeypatch.setattr(plan, "free_fraction", lambda: next(free))
    res = plan.run(cfg, progress=False)
    assert [c.port for c in launched] == [port, port + 1, port + 2, port + 3, port + 4]
    assert events == ["launch", "wait"] * 5  # one after another: each healthy before the next starts
    # each server's fifth of 0.8 of the GPU, as a fraction of what is free when it starts
    assert [c.mem_fraction_static for c in launched] == [0.16, 0.2, 0.25, 0.32, 0.4]
    assert res["config"]["launched_mem_fraction_static"] == [0.16, 0.2, 0.25, 0.32, 0.4]
    assert launched[0].draft_model_path is None and all(c.draft_model_path for c in launched[1:])
    assert launched[2].extra[-2:] == ["--speculative-draft-attention-backend", "triton"]
    assert launched[3].env == {"STUB_PLAN_STREAM": "1"} and launched[1].env == {}
    m = res["metrics"]
    assert set(m["variants"]) == {"draft_triton", "plan_stream"}
    for v in m["variants"].values():
        assert v["spec_cycle_ms"] > 0 and v["breakeven_len"] == pytest.approx(v["spec_cycle_ms"] / v["plain_step_ms"])
        assert v["fixed_ms"] == pytest.approx(v["spec_cycle_ms"] - v["plain_step_ms"]) and v["cycle_vs_base_x"] > 0
    assert res["config"]["variants"]["draft-triton"]["extra"] == ["--speculative-draft-attention-backend", "triton"]
    assert "variant draft_triton: cycle" in res["summary"]
    assert "exited during start-up" in res["config"]["variants"]["broken"]["failed"]
    assert "variant broken: did not start" in res["summary"] and "broken" not in m["variants"]
    assert len(docs) == 5 and not any(server.process_alive(d["pid"]) for d in docs)  # every server stopped
    with pytest.raises(BadInput, match="variants are servers this task launches"):
        plan.run(plan.PlanConfig(target=str(target), url="http://127.0.0.1:1", plain_url="http://127.0.0.1:2",
                                 variants=variants), progress=False)
    for bad in ("nothing", "x=", "Upper=--flag"):
        with pytest.raises(BadInput):
            plan.parse_variant(bad)


def test_a_server_the_plan_stops_is_reaped():
    """plan.sglang stops the servers it launched and waits for them: no zombie left, no warning at exit."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    stop_launched({"pid": proc.pid, "_proc": proc})
    assert proc.returncode is not None
    assert not process_alive(proc.pid)
