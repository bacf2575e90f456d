"""eaglekb.kb.reproduce: the two-part verdict (deterministic metrics, then timings normalised by the run's
calibration), so that a slower machine reads "acceptance reproduced; this machine is 1.4x slower"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglekb.kb import baselines as bl
from eaglekb.kb import reproduce as rp

ROOT = Path(__file__).resolve().parents[2]
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02,
         "tolerance_abs": {"baseline_tok_s": 14.0, "online.cycle_ms": 32.0, "online.spec_tok_s": 15.0,
                           "measured_speedup_x": 0.5, "breakeven_len": 0.9}}


def probe(accept=2.02, base=28.0, cycle=64.0, spec=31.0, exact=1.0, name="demo"):
    return bl.build(kind="probe", name=name, config={"steps": 3},
                    metrics={"baseline_tok_s": base, "breakeven_len": base * cycle / 1000,
                             "measured_speedup_x": spec / base,
                             "online": {"accept_len": accept, "cycle_ms": cycle, "spec_tok_s": spec,
                                        "exact_match_frac": exact, "cycles_count": 251}},
                    noise=NOISE, command="invoke probe", provenance=_prov())


def _prov():
    return {"command": "invoke probe", "git_commit": None, "git_dirty": None, "host": {}, "versions": {}}


@pytest.mark.parametrize("kind, path, timing", [
    ("probe", "online.accept_len", False), ("probe", "online.exact_match_frac", False),
    ("probe", "online.accept_len_hist.len1_count", False), ("probe", "offline.acc_step1_frac", False),
    ("probe", "online.cycle_ms", True), ("probe", "baseline_tok_s", True), ("probe", "measured_speedup_x", True),
    ("probe", "breakeven_len", True), ("probe", "vs_reference_x", False), ("bench", "spec_s3_k1_n4.vs_engine_x", True),
    ("bench", "graphs.eager.verify_vs_decode_x", True), ("finetune", "throughput.train_s", True),
    ("finetune", "run.optimizer_steps", False), ("datagen", "bytes_per_token_bytes", False),
    ("plan", "spec_tok_s", False), ("plan", "breakeven_len", False), ("reference", "decode_tok_s", False),
])
def test_timing_or_deterministic(kind, path, timing):
    assert rp.is_timing(kind, path) is timing


def test_slower_machine_reproduces_acceptance_and_says_how_much_slower():
    recorded = probe()
    slow = probe(base=14.0, cycle=128.0, spec=15.5)  # every timing 2x slower, acceptance equal
    cmp = bl.compare(slow, recorded)
    assert cmp.reproduced and cmp.timing_reproduced
    assert cmp.calibration.slower_x == pytest.approx(2.0)
    text = cmp.text()
    assert text.startswith("reproduced probe/demo: acceptance reproduced")
    assert "this machine is 2.00x slower" in text and "NOT" not in text
    cycle = next(c for c in cmp.checks if c.path == "online.cycle_ms")
    assert cycle.timing and cycle.normalised == pytest.approx(64.0)
    # Without normalising the same run would have failed on its timings (cycle 128 ms, allowed +/-32).
    assert abs(cycle.new - cycle.recorded) > cycle.allowed
    assert "1.40x slower" in bl.compare(probe(base=20.0, cycle=64.0 * 1.4, spec=31.0 / 1.4), recorded).text()


def test_faster_machine_is_said_to_be_faster():
    cmp = bl.compare(probe(base=56.0, cycle=32.0, spec=62.0), probe())
    assert cmp.reproduced and "this machine is 2.00x faster" in cmp.text()


def test_acceptance_change_is_not_reproduced_whatever_the_speed():
    cmp = bl.compare(probe(accept=1.8), probe())
    assert not cmp.reproduced and cmp.timing_reproduced
    text = cmp.text()
    assert text.startswith("NOT reproduced probe/demo: acceptance NOT reproduced (1 of 3 metrics")
    assert "online.accept_len: recorded 2.02, now 1.8" in text


def test_timing_regression_beyond_the_machine_speed_is_reported():
    # Same plain-decode speed, but the speculative cycle doubled: a real regression of the cycle.
    cmp = bl.compare(probe(cycle=128.0, spec=15.0), probe())
    assert cmp.reproduced and cmp.timing_reproduced is False
    text = cmp.text()
    assert "acceptance reproduced" in text and "timings outside tolerance after normalising" in text
    assert "online.cycle_ms: recorded 64, now 128 (128 at the recorded speed)" in text


def test_without_calibration_timings_are_compared_as_measured():
    old = bl.build(kind="datagen", name="d", config={}, metrics={"generate_tok_s": 100.0, "tokens_count": 500},
                   noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.25}, provenance=_prov())
    new = bl.build(kind="datagen", name="d", config={}, metrics={"generate_tok_s": 50.0, "tokens_count": 500},
                   noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.25}, provenance=_prov())
    cmp = bl.compare(new, old)
    assert cmp.reproduced and cmp.timing_reproduced is False and cmp.calibration is None
    assert "results reproduced" in cmp.text() and "no calibration in this run" in cmp.text()


def test_recorded_probe_against_itself_on_a_slower_machine():
    """The real default-drafter baseline: the same acceptance at 1.73x slower plain decode reproduces."""
    data = json.loads((ROOT / "baselines/probe/smollm2-135m-default.json").read_text())
    recorded = bl.parse(json.dumps(data), "recorded")
    m = data["metrics"]
    m["baseline_tok_s"] /= 1.73
    m["online"]["spec_tok_s"] /= 1.73
    for key in ("cycle_ms", "draft_ms", "verify_ms", "overhead_ms"):
        m["online"][key] *= 1.73
    cmp = bl.compare(bl.parse(json.dumps(data), "slow"), recorded)
    assert cmp.reproduced and cmp.timing_reproduced, cmp.text()
    assert "this machine is 1.73x slower" in cmp.text()
