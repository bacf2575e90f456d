"""Break-even before training (plan.sglang), the prediction bench.sglang records, and prompt-set keys."""

from __future__ import annotations

import pytest

from eaglekb.data.prompts import set_keys
from eaglekb.formats.drafter import read_config
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.measure import viability
from eaglekb.measure.sglang import bench as sglang_bench, plan
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
