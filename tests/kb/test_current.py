"""The current view (eaglekb.kb.current) and the checks of the pages that state present numbers (eaglekb.kb.pages)."""

from __future__ import annotations

import pytest

from eaglekb.kb import baselines as bl
from eaglekb.kb import current as cv
from eaglekb.kb import pages

NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.05}


@pytest.fixture
def root(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    for name, weights in (("a", b"round-a"), ("b", b"round-b")):
        folder = tmp_path / "drafters" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}\n")
        (folder / "model.safetensors").write_bytes(weights)
    return tmp_path


def _probe(root, name, drafter, created, accept, topk=1, superseded_by=None):
    config = {"target": "smollm2-135m", "drafter": f"drafters/{drafter}", "prompts": "gsm8k-eval", "device": "cpu",
              "dtype": "float32", "steps": 3, "topk": topk, "draft_tokens": 4 if topk == 1 else 16,
              "temperature": 0.0, "num_prompts": 8, "max_new_tokens": 64}
    return bl.build(kind="probe", name=name, config=config, noise=NOISE, root=root, created_at=created,
                    metrics={"online": {"accept_len": accept}, "breakeven_len": 1.7, "measured_speedup_x": 1.4},
                    command=f"invoke probe --record {name}").model_copy(update={"superseded_by": superseded_by})


def _bench(root, name, drafter, created, engine, **settings):
    config = {"target": "smollm2-135m", "drafter": f"drafters/{drafter}", "prompts": "gsm8k-eval", "device": "cpu",
              "dtype": "float32", "num_prompts": 4, "max_new_tokens": 128, **settings}
    metrics = {"engine": {"median_tok_s": engine},
               "spec_s3_k1_n4": {"median_tok_s": 25.0, "vs_engine_x": 1.4, "accept_len": 2.3},
               "spec_s4_k4_n16": {"median_tok_s": 22.0, "vs_engine_x": 1.2, "accept_len": 3.3}}
    return bl.build(kind="bench", name=name, config=config, metrics=metrics, noise=NOISE, root=root,
                    created_at=created, command=f"invoke bench --record {name}")


def test_one_newest_row_per_setup_chain_and_tree_apart(root):
    old = _probe(root, "old", "a", "2026-01-01T00:00:00Z", 2.0)
    new = _probe(root, "new", "a", "2026-01-02T00:00:00Z", 2.5)
    other = _probe(root, "other-drafter", "b", "2026-01-01T00:00:00Z", 1.5)
    tree = _probe(root, "tree", "a", "2026-01-01T00:00:00Z", 3.6, topk=4)
    gone = _probe(root, "gone", "a", "2026-01-03T00:00:00Z", 9.0, superseded_by="probe/new")
    rows = cv.view({b.id: b for b in (old, new, other, tree, gone)})
    by_id = {r["baseline"]: r for r in rows}
    assert set(by_id) == {"probe/new", "probe/other-drafter", "probe/tree"}  # one answer per setup
    assert by_id["probe/new"]["replaces"] == ["probe/old"] and by_id["probe/tree"]["shape"] == "tree"
    assert by_id["probe/new"]["drafter"]["sha256"] != by_id["probe/other-drafter"]["drafter"]["sha256"]
    assert by_id["probe/new"]["reproduce"] == "invoke probe --compare new"
    sup = cv.superseded({b.id: b for b in (old, new, other, tree, gone)}, rows)
    assert sup == {"probe/old": "probe/new", "probe/gone": "probe/new"}
    assert "accept length 2.5" in cv.headline(by_id["probe/new"])


def test_plain_decoding_is_one_setup_whatever_the_drafter(root):
    r2 = _bench(root, "bench-r2", "a", "2026-01-01T00:00:00Z", 651.9)
    r4 = _bench(root, "bench-r4", "b", "2026-01-02T00:00:00Z", 757.3)
    baselines = {r2.id: r2, r4.id: r4}
    rows = cv.view(baselines)
    plain = [r for r in rows if r["shape"] == "plain"]
    assert [r["baseline"] for r in plain] == ["bench/bench-r4"] and plain[0]["replaces"] == ["bench/bench-r2"]
    assert {(r["baseline"], r["shape"]) for r in rows if r["shape"] != "plain"} == {
        ("bench/bench-r2", "chain"), ("bench/bench-r2", "tree"), ("bench/bench-r4", "chain"), ("bench/bench-r4", "tree")}
    # The old bench's engine number is superseded on its plain row, its chain row is still its drafter's current one.
    sup = cv.superseded(baselines, rows)
    assert pages.stale("bench/bench-r2", "engine.median_tok_s", baselines, rows, sup) == "bench/bench-r4"
    assert pages.stale("bench/bench-r2", "spec_s3_k1_n4.median_tok_s", baselines, rows, sup) is None
    assert pages.stale("bench/bench-r4", "engine.median_tok_s", baselines, rows, sup) is None
    assert "engine 757.3 tok/s" in cv.table(rows)


def test_cpu_packed_on_and_off_are_two_setups_and_older_records_keep_their_key(root):
    auto = _bench(root, "auto", "a", "2026-01-01T00:00:00Z", 19.0, cpu_packed="auto")
    off = _bench(root, "off", "a", "2026-01-01T01:00:00Z", 23.0, cpu_packed="off")
    later = _bench(root, "auto-again", "a", "2026-01-02T00:00:00Z", 20.0, cpu_packed="auto")
    older = _bench(root, "older", "a", "2025-12-01T00:00:00Z", 21.0)
    baselines = {b.id: b for b in (auto, off, later, older)}
    rows = cv.view(baselines)
    chains = {r["baseline"]: r for r in rows if r["shape"] == "chain"}
    assert set(chains) == {"bench/off", "bench/auto-again", "bench/older"}  # the off run does not supersede auto
    assert chains["bench/auto-again"]["replaces"] == ["bench/auto"]
    assert "cpu_packed" not in chains["bench/older"]["config"]  # a record without the setting keeps its old key
    sup = cv.superseded(baselines, rows)
    assert sup.get("bench/auto") == "bench/auto-again" and "bench/off" not in sup


@pytest.mark.parametrize("text, figures", [
    ("accept length 2.54 on GSM8K", ["2.54"]),
    ("for 2,221 more steps", ["2,221"]),
    ("150 and 200 tok/s, a 30 ms cycle, 65% and 2x", ["200", "30", "65", "2"]),
    ("Kimi-K2.5 on 8 PCIe GPUs, smollm2-135m on an H200, Phase 0, F12, r4, 2 steps, v0.5.17", []),
    ("{{ metric plan/x breakeven_len }} and `invoke plan --cycle-ms 30` and [a](b/1.5.md)", []),
    ("```\n3.14 ms\n```\nabove one", []),
])
def test_hand_typed_figures(text, figures):
    assert [f for _, f in pages.hand_typed_figures(text)] == figures
