"""Prompt files and prompt sets: one reader with one-line errors, atomic writes, training and eval sets."""

import pytest

from eaglekb.data import prompts
from eaglekb.data.corpora import Prompt, PromptSet, prompts_hash
from eaglekb.io.errors import BadInput, MissingFile


def _set(name: str, texts: list[str]) -> PromptSet:
    items = [Prompt(id=f"{name}:{i}", source=name, messages=({"role": "user", "content": t},))
             for i, t in enumerate(texts)]
    return PromptSet(name, items, manifest={"source": name, "count": len(items), "sha256": prompts_hash(items)})


def test_prompts_file_formats_and_errors(tmp_path):
    with pytest.raises(MissingFile):
        prompts.read_prompts_file(tmp_path / "none.txt")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\nplain line\n\n{"messages": [{"role": "user", "content": "yo"}]}\n')
    ps = prompts.read_prompts_file(f)
    assert [p.text for p in ps.prompts] == ["hi", "plain line", "yo"]
    assert [p.id for p in ps.prompts] == ["p.jsonl:1", "p.jsonl:2", "p.jsonl:4"]
    for bad, match in (('{"oops": 1}\n', "neither"), ('{"messages": [{"role": "user"}]}\n', "role and a content"),
                       ("{not json\n", "not JSON"), ("\n\n", "empty")):
        f.write_text(bad)
        with pytest.raises(BadInput, match=match) as err:
            prompts.read_prompts_file(f)
        assert "\n" not in err.value.line()
    f.write_text('{"oops": 1}\n')
    with pytest.raises(BadInput, match="p.jsonl:1"):
        prompts.read_prompts_file(f)


def test_written_prompts_file_reads_back(tmp_path):
    src = _set("x", ["héllo", "two\nlines"])
    out = prompts.write_prompts_file(tmp_path / "eval.jsonl", src.prompts)
    back = prompts.read_prompts_file(out)
    assert [p.messages for p in back.prompts] == [p.messages for p in src.prompts]
    assert not list(tmp_path.glob(".*.tmp"))


def test_prompt_sets_round_trip_and_errors(tmp_path):
    f = tmp_path / "sets.jsonl"
    sets = {"A": _set("a", ["one", "two"]), "B": _set("b", ["three"]), "eval": _set("e", ["four"])}
    prompts.write_prompt_sets(f, sets)
    back = prompts.read_prompt_sets(f, ("A", "B", "eval"))
    assert {k: [p.id for p in v.prompts] for k, v in back.items()} == {k: [p.id for p in v.prompts]
                                                                        for k, v in sets.items()}
    assert back["A"].manifest["source"] == "a" and back["A"].manifest["file"] == "sets.jsonl"
    assert back["A"].manifest["sha256"] == sets["A"].manifest["sha256"]
    f.write_text('{"set": "C", "id": "x:1", "messages": []}\n')
    with pytest.raises(BadInput, match="prompt-sets line") as err:
        prompts.read_prompt_sets(f, ("A",))
    assert f"{f}:1" in err.value.line()
    with pytest.raises(MissingFile, match="story.prompts"):
        prompts.read_prompt_sets(tmp_path / "none.jsonl", ("A",), made_by="the file invoke story.prompts writes")


def test_eval_prompts_by_name():
    ps = prompts.eval_prompts("builtin", 3)
    assert len(ps) == 3 and ps.manifest["source"] == "builtin"
    with pytest.raises(BadInput, match="unknown prompt set"):
        prompts.eval_prompts("nope", 2)
    with pytest.raises(BadInput, match="positive"):
        prompts.eval_prompts("builtin", 0)


def test_training_prompts_refuse_evaluation_sets():
    with pytest.raises(BadInput, match="evaluation set"):
        prompts.training_prompts(["humaneval"], per_source=2)


#: The builtin evaluation prompts as recorded baselines used them (never change).
BUILTIN_SHA256 = "f4945a6bdb181230a50c971f5f341bf8bb6d89c1fca4159bfd97a3ba040ae6d3"


def test_builtin_prompts_are_unchanged():
    ps = prompts.eval_prompts("builtin")
    assert (len(ps), ps.manifest["sha256"]) == (8, BUILTIN_SHA256)


def test_training_prompts_take_the_derived_corpora_whole():
    ps = prompts.training_prompts(["gsm8k-instruct", "gpqa", "chitchat-multi:1"], per_source=0, seed=2)
    sizes = {m["source"]: (m["items"], m["count"], m["variants"]) for m in ps.manifest["mix"]}
    assert sizes == {"gsm8k-instruct": (1119, 2238, 2), "gpqa": (188, 188, 1), "chitchat-multi": (3287, 3287, 1)}
    assert len(ps) == ps.manifest["count"] == 2238 + 188 + 3287 and len({p.id for p in ps.prompts}) == len(ps)
    assert ps.manifest["distinct_prompts"] <= len(ps) and ps.manifest["per_source"] is None
    assert {"builtin", "gsm8k-eval", "gpqa-eval", "gsm8k-instruct-eval", "chitchat-eval",
            "chitchat-multi-eval"} <= set(ps.manifest["eval_splits_excluded"])
    assert len(prompts.training_prompts(["wiki-instruct"], per_source=5)) == 5


@pytest.mark.parametrize("spec", ["humaneval", "humaneval:1", "gsm8k-eval"])
def test_training_prompts_refuse_evaluation_sets_by_any_name(spec):
    with pytest.raises(BadInput, match="evaluation set"):
        prompts.training_prompts([spec], per_source=0)


def test_training_prompts_refuse_a_file_holding_an_evaluation_prompt(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text("Tell me a joke.\n" + prompts.BUILTIN_PROMPTS[2].lower() + "\n")
    with pytest.raises(BadInput, match="overlap") as err:
        prompts.training_prompts(prompts_file=str(f))
    assert "builtin" in err.value.line() and "mine.jsonl:2" in err.value.line()
    f.write_text("Tell me a joke.\n")
    assert len(prompts.training_prompts(prompts_file=str(f))) == 1


def test_the_source_of_prompt_and_sequence_ids():
    ps = _set("gsm8k", ["a", "b"])
    assert [prompts.source_of(p.id) for p in ps.prompts] == ["gsm8k", "gsm8k"]
    assert prompts.source_of("wiki-instruct:Star Wars: Episode I#3@t0.8#1") == "wiki-instruct"
    assert prompts.source_of("p.jsonl:4") == "p.jsonl" and prompts.source_of("no-colon") == "unknown"
    assert prompts.source_key("p.jsonl") == "p_jsonl" and prompts.source_key("_x") == "x"
