"""When EAGLE-3 pays on SGLang against the target's plain step: the cycle model's arithmetic, its fit, the
`invoke plan.curve` and `invoke plan.anchors` records, and the plot the site draws from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekb.io.errors import BadInput
from eaglekb.measure import breakeven_curve as bc

ROOT = Path(__file__).resolve().parents[2]
FIT_RECORDS = ("h200-sglang-s3-vs-plain", "h200-sglang-batch")


def invoke(*args, root: Path):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "EAGLEKB_ROOT": str(root)}, timeout=300)


# --------------------------------------------------------------------------- arithmetic, by hand


def test_cycle_breakeven_and_speedup_on_hand_computed_cases():
    # plain step 2 ms, fixed part 4 ms: cycle 6 ms, break-even 3 tokens a cycle, accept 3 exactly breaks even
    assert bc.cycle_ms(2.0, 4.0) == pytest.approx(6.0)
    assert bc.breakeven_len(2.0, 4.0) == pytest.approx(3.0)
    assert bc.speedup_x(2.0, 3.0, 4.0) == pytest.approx(1.0)
    # a 12 ms target: cycle 16 ms, accept 2 -> 2 x 12 / 16 = 1.5x
    assert bc.speedup_x(12.0, 2.0, 4.0) == pytest.approx(1.5)
    assert bc.breakeven_len(12.0, 4.0) == pytest.approx(16 / 12)
    # a verify of 2 plain steps: cycle 2 x 12 + 6 = 30 ms, break-even 2.5
    assert bc.cycle_ms(12.0, 6.0, verify_x=2.0) == pytest.approx(30.0)
    assert bc.breakeven_len(12.0, 6.0, verify_x=2.0) == pytest.approx(2.5)


def test_pays_from_is_where_the_speedup_crosses_one():
    assert bc.pays_from_ms(2.5, 3.0) == pytest.approx(2.0)  # 3 / (2.5 - 1)
    assert bc.speedup_x(2.0, 2.5, 3.0) == pytest.approx(1.0)
    assert bc.speedup_x(2.1, 2.5, 3.0) > 1.0 > bc.speedup_x(1.9, 2.5, 3.0)
    assert bc.pays_from_ms(1.0, 3.0) is None  # one token a cycle never pays
    assert bc.pays_from_ms(2.0, 3.0, verify_x=2.0) is None


def test_implied_accept_len_inverts_the_speedup():
    assert bc.implied_accept_len(12.0, 0.75, 4.0) == pytest.approx(1.0)  # 0.75 x 16 / 12
    assert bc.implied_accept_len(5.0, bc.speedup_x(5.0, 3.2, 4.0), 4.0) == pytest.approx(3.2)


# --------------------------------------------------------------------------- fit and report


def _metrics(plain_ms, cycle_ms, accept=2.0, ratio=0.7):
    return {"sglang": {"accept_len": accept, "server": {"cycle_ms": cycle_ms}},
            "sglang_plain": {"server": {"cycle_ms": plain_ms}}, "vs": {"sglang_spec_vs_plain_x": ratio}}


def test_fit_takes_cycle_minus_plain_per_set_and_keeps_the_range():
    metrics = {"a": _metrics(1.5, 5.5), "b": _metrics(2.0, 5.0), "concurrency": {"c1": {"speedup_x": 0.6}}}
    sets = bc.sets_from_metrics("bench/x-1", metrics)
    assert [s.key for s in sets] == ["x_1_a", "x_1_b"]  # sets without both servers' cycle are skipped
    fit = bc.fit_fixed(sets)
    assert (fit.fixed_ms, fit.fixed_min_ms, fit.fixed_max_ms) == pytest.approx((3.5, 3.0, 4.0))
    report = bc.curve(sets, plain_ms=[2.0, 12.0], accept_lens=[2.5])
    m = bc.metrics(report)
    assert m["plain"]["p12"]["cycle_ms"] == pytest.approx(15.5)
    assert m["plain"]["p2"]["speedup"]["a2_5_x"] == pytest.approx(2.5 * 2 / 5.5)
    assert m["pays_from"]["a2_5"]["plain_step_ms"] == pytest.approx(3.5 / 1.5)
    assert m["pays_from"]["a2_5"]["plain_step_lo_ms"] == pytest.approx(2.0)
    assert m["sets"]["x_1_a"]["predicted_speedup_x"] == pytest.approx(2.0 * 1.5 / 5.0)
    assert "(predicted)" in bc.summary(report) and "pays from" in bc.render_text(report)


@pytest.mark.parametrize("metrics, fragment", [
    ({"a": {"sglang": {"server": {"cycle_ms": 5.0}}}}, "no prompt set timed both servers"),
    ({"a": _metrics(6.0, 5.0)}, "cycle not above"),
    ({"a": _metrics(-1.0, 5.0)}, "positive"),
])
def test_bad_records_are_one_line(metrics, fragment):
    with pytest.raises(BadInput) as exc:
        bc.fit_fixed(bc.sets_from_metrics("bench/x", metrics))
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_accept_below_one_is_refused():
    sets = bc.sets_from_metrics("bench/x", {"a": _metrics(1.5, 5.5)})
    with pytest.raises(BadInput, match="accept length below 1"):
        bc.curve(sets, accept_lens=[0.5])


# --------------------------------------------------------------------------- the tasks and the plot


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A project root holding the two measured records the fit reads, and the anchors `plan.anchors` writes."""
    root = tmp_path_factory.mktemp("curve")
    (root / "baselines/bench").mkdir(parents=True)
    for name in FIT_RECORDS:
        shutil.copy(ROOT / f"baselines/bench/{name}.json", root / "baselines/bench")
    for entry in bc.ANCHORS:
        out = invoke("plan.anchors", "--record", entry["name"], "--json", root=root)
        assert out.returncode == 0, out.stderr
    return root


def test_anchors_task_records_cited_points(scratch):
    from eaglekb.kb import baselines

    for entry in bc.ANCHORS:
        b = baselines.load(scratch / f"baselines/{entry['kind']}/{entry['name']}.json")
        assert b.source == "recorded" and b.citation and b.citation.document
        assert b.metrics["plain_step_ms"] > 0 and b.metrics["speedup_x"] > 0
        assert b.provenance.command.startswith(f"invoke plan.anchors --record {entry['name']}")


def test_anchors_task_lists_without_record_and_refuses_an_unknown_name(tmp_path):
    (tmp_path / "baselines").mkdir()
    out = invoke("plan.anchors", "--json", root=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["anchors"] == [f"{a['kind']}/{a['name']}" for a in bc.ANCHORS]
    assert list((tmp_path / "baselines").iterdir()) == []  # listing writes nothing
    out = invoke("plan.anchors", "--record", "no-such-anchor", root=tmp_path)
    assert out.returncode == 2 and "no such anchor" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_curve_task_writes_a_valid_plan_baseline_and_its_plot(scratch):
    from eaglekb.kb import baselines, breakeven_plot

    args = ["plan.curve", *(a for r in FIT_RECORDS for a in ("--from-record", r)),
            "--anchor", "sglang-docs-llama31-8b-h100", "--plain-ms", "1.6,5,12,20", "--accept-len", "2.5",
            "--accept-len", "3", "--record", "curve-check", "--json"]
    out = invoke(*args, root=scratch)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    b = baselines.load(scratch / "baselines/plan/curve-check.json")
    assert b.kind == "plan" and b.source == "measured" and doc["baseline_id"] == "plan/curve-check"
    assert b.config["from_records"] == [f"bench/{r}" for r in FIT_RECORDS]
    assert b.config["speculation"] == {"steps": 3, "topk": 1, "draft_tokens": 4}
    assert "--compare curve-check" in b.provenance.reproduce
    # the fit is the mean of cycle - plain step over every set of both records
    sets = [s for r in FIT_RECORDS
            for s in bc.sets_from_metrics(r, json.loads((scratch / f"baselines/bench/{r}.json").read_text())["metrics"])]
    assert b.metrics["sets_count"] == len(sets) == 4
    assert b.metrics["fixed_ms"] == pytest.approx(sum(s.cycle_ms - s.plain_step_ms for s in sets) / 4)
    assert set(b.metrics["plain"]) == {"p1_6", "p5", "p12", "p20"} and set(b.metrics["pays_from"]) == {"a2_5", "a3"}
    assert b.metrics["anchors"]["sglang_docs_llama31_8b_h100"]["implied_accept_len"] > 1
    assert breakeven_plot.is_curve(b)
    svg = breakeven_plot.plan_svg(b)
    assert svg.lstrip().startswith(("<?xml", "<svg")) and "sglang-docs-llama31-8b-h100" in svg


@pytest.mark.parametrize("args, fragment", [
    ([], "--from-record"),
    (["--from-record", "no-such-record"], "no such baseline"),
    (["--from-record", "h200-sglang-s3-vs-plain", "--anchor", "h200-sglang-batch"], "no such baseline"),
    (["--from-record", "h200-sglang-s3-vs-plain", "--anchor", "bench/h200-sglang-batch"], "not an anchor"),
    (["--from-record", "h200-sglang-s3-vs-plain", "--accept-len", "two"], "--accept-len"),
    (["--from-record", "h200-sglang-s3-vs-plain", "--verify-x", "0"], "--verify-x"),
])
def test_curve_bad_input_is_one_line_exit_2(scratch, args, fragment):
    out = invoke("plan.curve", *args, root=scratch)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and fragment in lines[0], out.stderr
