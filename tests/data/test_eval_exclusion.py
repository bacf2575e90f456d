"""Evaluation prompts never enter training: proved by hash over every training corpus, split and variant.

The evaluation side is every prompt probe and bench may be asked for: ``gsm8k-eval``, ``humaneval``,
``builtin`` and the evaluation split of every corpus (all variants). The training side is the full train
split of every training corpus, plain and derived, with all variants. A training prompt leaks if the sha256
of its normalised text, or of any of its messages, is the hash of an evaluation prompt, or if it contains
the normalised text of a ``gsm8k-eval`` question or a ``builtin`` prompt (a question wrapped in an
instruction is still the question).
"""

from __future__ import annotations

import hashlib

import pytest

from eaglekb.data import corpora, prompts


def _sha(text: str, *, normalised: bool = False) -> str:
    return hashlib.sha256((text if normalised else corpora.normalise(text)).encode()).hexdigest()


def _evaluation_sets() -> list[corpora.PromptSet]:
    sets = [corpora.load(name, split="eval") for name in corpora.EVAL_SETS]
    sets.append(prompts.eval_prompts("builtin"))
    return sets + [corpora.load(name, split="eval", variants=0) for name in corpora.TRAINING_CORPORA]


@pytest.fixture(scope="module")
def eval_hashes() -> set[str]:
    return {_sha(p.text) for s in _evaluation_sets() for p in s.prompts}


class Needles:
    """Normalised evaluation texts that must not occur inside a training prompt, found through an interior word."""

    def __init__(self, texts):
        self.by_word: dict[str, list[str]] = {}
        self.short: list[str] = []
        for text in {corpora.normalise(t) for t in texts}:
            inner = text.split()[1:-1]  # whole words wherever the text occurs (the ends may be glued to others)
            if inner:
                self.by_word.setdefault(max(inner, key=len), []).append(text)
            else:
                self.short.append(text)

    def found_in(self, text: str, words: list[str]) -> str | None:
        """The first needle inside ``text`` (normalised; ``words`` its words), or None."""
        words = set(words) & self.by_word.keys()
        candidates = [n for w in words for n in self.by_word[w]] + self.short
        return next((n for n in candidates if n in text), None)


@pytest.fixture(scope="module")
def needles() -> Needles:
    gsm8k_eval = corpora.load("gsm8k-eval").prompts
    return Needles([p.text for p in gsm8k_eval] + list(prompts.BUILTIN_PROMPTS))


def _leaks(train: corpora.PromptSet, eval_hashes: set[str], needles: Needles) -> list[str]:
    out = []
    for p in train.prompts:
        words = p.text.lower().split()
        text = " ".join(words)  # corpora.normalise, keeping the words
        hashes = {_sha(text, normalised=True)}
        if len(p.messages) > 1:  # one message: its text is the prompt's
            hashes.update(_sha(m["content"]) for m in p.messages)
        inside = needles.found_in(text, words)
        if hashes & eval_hashes or inside:
            out.append(f"{p.id}: {'contains ' + repr(inside[:60]) if inside else 'hash of an evaluation prompt'}")
    return out


def test_evaluation_side_is_complete(eval_hashes, needles):
    assert len(eval_hashes) > 200 + 164 + len(prompts.BUILTIN_PROMPTS)
    assert sum(map(len, needles.by_word.values())) + len(needles.short) == 200 + len(prompts.BUILTIN_PROMPTS)
    assert {"wiki-instruct", "chitchat-multi", "gsm8k-instruct", "wiki", "chitchat"} <= set(corpora.TRAINING_CORPORA)


@pytest.mark.parametrize("name", corpora.TRAINING_CORPORA)
def test_no_training_prompt_is_an_evaluation_prompt(name, eval_hashes, needles):
    train = corpora.load(name, split="train", variants=0)
    assert len(train) > 0 and train.manifest["variants"] == corpora.SOURCES[name].max_variants
    leaks = _leaks(train, eval_hashes, needles)
    assert not leaks, f"{len(leaks)} training prompts of {name} leak evaluation prompts:\n" + "\n".join(leaks[:10])


def test_the_check_finds_planted_leaks(eval_hashes, needles):
    question = corpora.load("gsm8k-eval", limit=1).prompts[0].text
    chat_eval = corpora.load("chitchat", split="eval", limit=1).prompts[0].text
    planted = [
        ("wrapped", ({"role": "user", "content": "Solve step by step.\n\n" + question + "\nThanks"},)),
        ("builtin", ({"role": "user", "content": "  " + prompts.BUILTIN_PROMPTS[3].upper()},)),
        ("message", ({"role": "user", "content": "hey"}, {"role": "assistant", "content": "hi"},
                     {"role": "user", "content": chat_eval})),
        ("clean", ({"role": "user", "content": "Tell me a story about a lighthouse keeper."},)),
    ]
    train = corpora.PromptSet("planted", [corpora.Prompt(f"x:{k}", "x", m) for k, m in planted])
    assert [leak.split(":")[1] for leak in _leaks(train, eval_hashes, needles)] == ["wrapped", "builtin", "message"]
