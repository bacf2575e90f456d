"""Chat sources: read from their package, deduplicated across sources, a deterministic held-out split."""

from __future__ import annotations

import hashlib

import pytest

from eaglekb.data import chat_sources, corpora, prompts
from eaglekb.io.errors import BadInput, SchemaError


@pytest.fixture(scope="module")
def chat_all() -> corpora.PromptSet:
    return corpora.load("chatterbot", split="all")


def _write(folder, name, text):
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_chat_sources_are_registered_training_corpora():
    for source in chat_sources.CHAT_SOURCES:
        assert source.name in corpora.TRAINING_CORPORA
        assert corpora.parse_name(source.name) == (source.name, 1)
        assert corpora.SOURCES[source.name].version == source.version


def test_the_reader_reads_the_packaged_english_dialogs():
    rows = chat_sources.read_chatterbot(corpora.data_path(corpora.SOURCES["chatterbot"]))
    assert len(rows) > 1500  # one row per dialog, repeats included (deduplicated later)
    assert ("ai/000", "What is AI?") in rows
    assert all(text == text.strip() and text for _, text in rows)
    assert {key.split("/")[0] for key, _ in rows} >= {"ai", "greetings", "computers", "science"}


def test_the_reader_skips_empty_dialogs_and_refuses_a_file_without_any(tmp_path):
    _write(tmp_path, "a.yml", "conversations:\n- - ' Hello  '\n  - Hi\n- []\n- - ''\n- - 3\n- Just one line\n")
    assert chat_sources.read_chatterbot(tmp_path / "a.yml") == [("a/000", "Hello"), ("a/004", "Just one line")]
    _write(tmp_path, "b.yml", "categories: [x]\n")
    with pytest.raises(SchemaError, match="no dialogs"):
        chat_sources.read_chatterbot(tmp_path / "b.yml")
    _write(tmp_path, "b.yml", "conversations: [\n")
    with pytest.raises(SchemaError, match="not YAML"):
        chat_sources.read_chatterbot(tmp_path / "b.yml")


def test_deduplication_keeps_the_first_and_drops_what_is_taken():
    rows = [("1", "What is AI?"), ("2", "what  is ai?"), ("3", "Hello"), ("4", "Tell me a joke"), ("5", "  ")]
    out = chat_sources.deduplicated(rows, {"hello"}, corpora.normalise)
    assert out == [("1", "What is AI?"), ("4", "Tell me a joke")]


def test_a_chat_source_drops_prompts_and_messages_of_the_sources_before_it(tmp_path):
    turns = ({"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "What is AI?"},
             {"role": "user", "content": "And you?"})
    earlier = corpora.PromptSet("a", [corpora.Prompt("a:1", "a", turns)])
    calls = []

    def load(name, **kw):
        calls.append((name, kw))
        return earlier

    def registry():
        return {"a": None, "chatterbot": None, "later": None}, load, corpora.normalise

    (made,) = chat_sources.corpus_sources(lambda *args: args, registry)
    reader = made[-1]
    lines = ["'what is  AI?'", "Hello", "HELLO", "hi THERE", "'and you?'", "Good morning"]
    _write(tmp_path, "x.yml", "conversations:\n" + "".join(f"- - {t}\n  - an answer\n" for t in lines))
    assert reader(tmp_path / "x.yml") == [("x/001", "Hello"), ("x/005", "Good morning")]
    assert calls == [("a", {"split": "all", "variants": 0})]  # only the sources registered before it


def test_no_chat_prompt_repeats_a_prompt_or_message_of_a_plain_source(chat_all):
    texts = [corpora.normalise(p.text) for p in chat_all.prompts]
    assert len(texts) == len(set(texts)) > 700
    for name in ("wiki", "chitchat", "gsm8k", "gpqa", "humaneval"):
        other = {corpora.normalise(m["content"]) for p in corpora.load(name, split="all").prompts
                 for m in p.messages}
        assert not other & set(texts), name


def test_the_held_out_split_is_the_hash_bucket_and_disjoint_from_training(chat_all):
    train = corpora.load("chatterbot", split="train")
    held = corpora.load("chatterbot", split="eval")
    assert {p.id for p in train.prompts} | {p.id for p in held.prompts} == {p.id for p in chat_all.prompts}
    assert not {p.id for p in train.prompts} & {p.id for p in held.prompts}
    assert not {corpora.normalise(p.text) for p in train.prompts} & {corpora.normalise(p.text) for p in held.prompts}
    bucket = {p.id for p in chat_all.prompts if int(hashlib.sha256(
        f"chatterbot:{corpora.normalise(p.text)}".encode()).hexdigest(), 16) % corpora.HOLDOUT_BUCKETS == 0}
    assert {p.id for p in held.prompts} == bucket
    assert 0.02 < len(held) / len(chat_all) < 0.09


def test_the_manifest_carries_source_version_count_and_hash():
    ps = corpora.load("chatterbot", split="eval", limit=5)
    m = ps.manifest
    assert (m["source"], m["package"], m["version"], m["license"]) == (
        "chatterbot", "chatterbot-corpus", "1.3.3", "BSD-3-Clause")
    assert m["count"] == 5 and m["split"] == "eval" and m["sha256"] == corpora.prompts_hash(ps.prompts)


def test_the_held_out_split_is_an_evaluation_set_by_name():
    held = prompts.eval_prompts("chatterbot-heldout", 4)
    assert [p.id for p in held.prompts] == [p.id for p in corpora.load("chatterbot", split="eval").prompts[:4]]
    assert prompts.eval_prompts("chitchat-heldout", 2).manifest["split"] == "eval"
    for spec in ("nothing-heldout", "humaneval-heldout", "chatterbot"):
        with pytest.raises(BadInput, match="unknown prompt set"):
            prompts.eval_prompts(spec)
    with pytest.raises(BadInput, match="fewer prompts"):
        prompts.eval_prompts("chatterbot-heldout", 10_000)


def test_training_on_chat_keeps_every_evaluation_prompt_out():
    ps = prompts.training_prompts(["chatterbot", "chitchat-multi"], per_source=0)
    assert "chatterbot-eval" in ps.manifest["eval_splits_excluded"]
    held = {corpora.normalise(p.text) for p in corpora.load("chatterbot", split="eval").prompts}
    assert not held & {corpora.normalise(m["content"]) for p in ps.prompts for m in p.messages}
    assert {p.source for p in ps.prompts} == {"chatterbot", "chitchat-multi"}
