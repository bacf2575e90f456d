"""Prompt files and prompt sets: the one reader and writer, the training and evaluation sets.

Owns:

* the prompt file formats, read with one set of one-line errors (the file and line
  number, what was expected) and written atomically:

  - a *prompts file*: JSON lines with ``"prompt"`` or ``"messages"``, or plain text,
    one prompt per line (``read_prompts_file`` / ``write_prompts_file``);
  - a *prompt-sets file*: JSON lines ``{"set", "id", "messages"}`` with a
    ``.manifest.json`` beside it holding each set's manifest (``read_prompt_sets`` /
    ``write_prompt_sets``; the story's A / B / eval prompts);

* ``training_prompts``: the training set of a datagen run, a corpus mix (train splits of
  plain or derived corpora, ``per_source`` a cap, 0 = all) or a prompts file, checked disjoint
  from every evaluation set (``gsm8k-eval``, ``humaneval``, ``builtin`` and the eval splits of
  the corpora it draws on), by prompt and by message;
* slices of a mix (``--slice K/N``: ``parse_slice``, ``item_key``, ``slice_of``, ``take_slice``):
  each prompt goes to a slice by a stable hash of its underlying item, so N sessions generate
  disjoint parts of one mix that together are all of it, never splitting an item's variants;
* the source an id names (``source_of``: prompt ids are ``SOURCE:KEY``, dataset sequence ids add
  ``@tT#k`` for sampled responses) and a source name as a metric key (``source_key``);
* ``eval_prompts``: an evaluation set by name (``builtin``, a held-out corpora set
  such as ``gsm8k-eval``, ``NAME-heldout`` for the held-out split of training corpus NAME, or
  a prompts file) for probe and bench.

Knows nothing about tokenizers, models, datasets or the task runner; the corpora
themselves (sources, splits, manifests) are ``eaglekb.data.corpora``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from eaglekb.data import corpora
from eaglekb.data.corpora import Prompt, PromptSet, prompts_hash
from eaglekb.io.errors import BadInput
from eaglekb.io.files import (DuplicateKey, atomic_write_json, atomic_write_text, not_a_file, read_json, read_text,
                              unique_keys)

#: The training corpora of ``invoke datagen`` when none is given.
DEFAULT_CORPORA = ("wiki", "chitchat", "gsm8k")

#: A few held-out prompts for tests and machines without the corpus packages.
BUILTIN_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the factorial of n.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip.",
    "A farmer has 12 sheep and buys 7 more. How many sheep does he have?",
    "Translate 'good morning' into Spanish and German.",
    "Give a short definition of photosynthesis.",
    "What are the first five prime numbers?",
)

# ----------------------------------------------------------------------------- reading


def _lines(path: Path, expected: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the non-blank lines of a prompt file."""
    if not path.is_file():
        raise not_a_file(path, "prompts file", expected)
    for n, line in enumerate(read_text(path, what="prompts file").splitlines(), 1):
        if line.strip():
            yield n, line


def _row(line: str, where: str) -> dict:
    try:
        row = json.loads(line, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise BadInput("prompts file line gives a key twice", where=where, expected="each key once",
                       found=f"{exc.args[0]!r} twice") from None
    except json.JSONDecodeError as exc:
        raise BadInput("prompts file line is not JSON", where=where, found=exc.msg) from None
    if not isinstance(row, dict):
        raise BadInput("prompts file line is not a JSON object", where=where, found=type(row).__name__)
    return row


def _messages(row: dict, where: str) -> tuple[dict[str, str], ...]:
    if "messages" in row:
        msgs = row["messages"]
        if not (isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in msgs)):
            raise BadInput("prompts file messages need a role and a content", where=where,
                           expected='[{"role": "system|user|assistant", "content": "text"}, ...]',
                           found=json.dumps(msgs)[:80])
        return tuple({"role": m["role"], "content": m["content"]} for m in msgs)
    if "prompt" in row:
        return ({"role": "user", "content": str(row["prompt"])},)
    raise BadInput("prompts file line has neither 'prompt' nor 'messages'", where=where,
                   expected='{"prompt": ...} or {"messages": [...]}', found=", ".join(row))


def read_prompts_file(path: str | Path) -> PromptSet:
    """Prompts from a file: JSON lines with "prompt" or "messages", or plain text, one prompt per line."""
    path = Path(path)
    prompts = []
    seen: dict[str, int] = {}
    for n, line in _lines(path, "a prompts file (JSON lines or one prompt per line)"):
        if line.lstrip().startswith("{"):
            messages = _messages(_row(line, f"{path}:{n}"), f"{path}:{n}")
        else:
            messages = ({"role": "user", "content": line.strip()},)
        key = json.dumps(messages, sort_keys=True)
        if key in seen:  # the same prompt twice would be generated or measured twice, unsaid
            raise BadInput("prompts file holds the same prompt twice", where=f"{path}:{n}",
                           expected="each prompt once", found=f"line {n} repeats line {seen[key]}",
                           fix="remove the repeated lines")
        seen[key] = n
        prompts.append(Prompt(id=f"{path.name}:{n}", source=path.name, messages=messages))
    if not prompts:
        raise BadInput("prompts file is empty", where=str(path), expected="at least one prompt", found="none")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return PromptSet(path.stem, prompts, manifest={"source": str(path), "count": len(prompts),
                                                    "sha256": prompts_hash(prompts), "file_sha256": digest})


def manifest_path(path: str | Path) -> Path:
    """The manifest beside a prompt-sets file (``NAME.manifest.json``)."""
    return Path(path).with_suffix(".manifest.json")


def read_prompt_sets(path: str | Path, names: Sequence[str], *,
                     made_by: str = "a prompt-sets file") -> dict[str, PromptSet]:
    """{set name: PromptSet} of a prompt-sets file and its manifest; every set in ``names`` must hold prompts."""
    path = Path(path)
    rows: dict[str, list[Prompt]] = {k: [] for k in names}
    for n, line in _lines(path, made_by):
        where = f"{path}:{n}"
        row = _row(line, where)
        if not isinstance(row.get("set"), str) or row["set"] not in rows or not isinstance(row.get("id"), str):
            sets = "|".join(f'"{k}"' for k in names)
            raise BadInput("not a prompt-sets line", where=where,
                           expected=f'{{"set": {sets}, "id": "...", "messages": [...]}}', found=line[:80])
        rows[row["set"]].append(Prompt(id=row["id"], source=source_of(row["id"]), messages=_messages(row, where)))
    empty = [k for k, v in rows.items() if not v]
    if empty:
        raise BadInput("a prompt set is empty", where=str(path), expected=f"prompts in sets {', '.join(names)}",
                       found=f"none in {', '.join(empty)}")
    man = manifest_path(path)
    manifests = read_json(man, what="prompts manifest") if man.is_file() else {}
    if not isinstance(manifests, dict) or not all(isinstance(v, dict) for v in manifests.values()):
        raise BadInput("prompts manifest is not an object of sets", where=str(man), expected='{"SET": {...}}',
                       found=type(manifests).__name__)
    out = {}
    for k, items in rows.items():
        m = dict(manifests.get(k) or {"source": str(path)}, file=path.name, set=k, count=len(items),
                 sha256=prompts_hash(items))
        out[k] = PromptSet(f"{path.stem}-{k}", items, manifest=m)
    return out


# ----------------------------------------------------------------------------- writing


def prompt_line(prompt: Prompt, set_name: str | None = None) -> str:
    """One JSON line: ``{"messages"}``, or ``{"set", "id", "messages"}`` in a prompt-sets file."""
    row: dict[str, Any] = {"set": set_name, "id": prompt.id} if set_name is not None else {}
    row["messages"] = list(prompt.messages)
    return json.dumps(row, ensure_ascii=False) + "\n"


def write_prompts_file(path: str | Path, prompts: Iterable[Prompt]) -> Path:
    """Write a prompts file (``{"messages": [...]}`` per line) atomically."""
    return atomic_write_text(path, "".join(prompt_line(p) for p in prompts))


def write_prompt_sets(path: str | Path, sets: dict[str, PromptSet]) -> Path:
    """Write a prompt-sets file and its manifest (each set's manifest) atomically."""
    atomic_write_text(path, "".join(prompt_line(p, name) for name, ps in sets.items() for p in ps.prompts))
    atomic_write_json(manifest_path(path), {name: ps.manifest for name, ps in sets.items()})
    return Path(path)


# ----------------------------------------------------------------------------- prompt sets


def parse_slice(spec: str | None) -> tuple[int, int] | None:
    """``K/N`` (slice K of N, 1-based) -> (K, N); None or empty -> None; anything else one line (``--slice``)."""
    if spec is None or str(spec) == "":
        return None
    k, sep, n = str(spec).strip().partition("/")
    if not (sep and k.isascii() and k.isdecimal() and n.isascii() and n.isdecimal() and 1 <= int(k) <= int(n)):
        raise BadInput("not a slice", where="--slice", expected="K/N with 1 <= K <= N (slice K of N, e.g. 1/3)",
                       found=repr(str(spec))[:80])
    return int(k), int(n)


def source_of(sequence_id: str) -> str:
    """The source (corpus, prompts file, ``builtin``) of a prompt id or of a dataset sequence id made from one: the
    part before its first ':' (``gsm8k:12`` and the sampled ``gsm8k:12@t0.8#1`` -> ``gsm8k``); ``unknown`` without
    one. Every prompt id is ``SOURCE:KEY``, so datagen's counts and training's validation read the same source."""
    name, sep, _ = sequence_id.partition(":")
    return name if sep and name else "unknown"


def source_key(name: str) -> str:
    """A source name as a metric key (lower case, letters, digits and underscores)."""
    key = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    return key if key and key[0].isalnum() else f"s_{key}"


def item_key(prompt_id: str) -> str:
    """The underlying item a corpus prompt was made from, named by its plain base corpus: every variant of one
    item, and one title, conversation or question in its plain and derived corpora, share a key
    (``wiki-instruct:Ada Lovelace#3`` and ``wiki:Ada Lovelace`` -> ``wiki:Ada Lovelace``)."""
    name, _, key = prompt_id.partition(":")
    source = corpora.SOURCES.get(name)
    if source is None:
        return prompt_id
    if source.render is not None:  # a derived corpus's ids end in #OPTION (its variant)
        key = key.rsplit("#", 1)[0]
    return f"{source.base or name}:{key}"


def slice_of(prompt_id: str, n: int) -> int:
    """Which of ``n`` slices (1-based) a prompt belongs to: a stable hash of its item (``item_key``), so the
    slices are disjoint and cover the set for any seed or ``per_source``, and an item is never split."""
    return int(hashlib.sha256(f"slice:{item_key(prompt_id)}".encode()).hexdigest(), 16) % n + 1


def take_slice(ps: PromptSet, part: tuple[int, int]) -> PromptSet:
    """Slice K of N of a corpus mix (order kept); the manifest gains ``slice`` and the counts before it."""
    k, n = part
    chosen = [p for p in ps.prompts if slice_of(p.id, n) == k]
    if not chosen:
        raise BadInput("the slice holds no prompts", where="--slice", expected="at least one prompt in it",
                       found=f"0 of the {len(ps.prompts)} prompts in slice {k}/{n}",
                       fix="fewer slices or a larger --per-source")
    by_source = {s: sum(p.source == s for p in chosen) for s in sorted({p.source for p in chosen})}
    manifest = dict(ps.manifest, slice=f"{k}/{n}", count=len(chosen), sha256=prompts_hash(chosen),
                    distinct_prompts=corpora.distinct_count(chosen), unsliced_count=ps.manifest.get("count"),
                    unsliced_sha256=ps.manifest.get("sha256"), slice_counts=by_source)
    return PromptSet(f"{ps.name}-slice{k}of{n}", chosen, manifest=manifest)


def training_prompts(corpus: Sequence[str] | None = None, *, per_source: int | None = 20,
                     prompts_file: str | None = None, seed: int = 0, slice_spec: str | None = None) -> PromptSet:
    """The training prompt set: a corpus mix (train splits) or a prompts file, checked against the eval sets.

    ``corpus``: names from ``corpora.TRAINING_CORPORA``, each optionally ``NAME:K`` (K variants per item of a
    derived corpus, 0 = all); ``per_source``: prompts from each (0 or None = all; a cap: a smaller corpus gives
    all it has, noted in the manifest's ``notes``); ``slice_spec``: ``K/N``, slice K of N of that mix
    (``take_slice``: every corpus dealt out by item, so N sessions make disjoint parts of one mix). The set is
    refused if any prompt, or any message of one, equals a prompt of ``gsm8k-eval``, ``humaneval``, ``builtin``
    or the evaluation split of a corpus it draws on.
    """
    names: list[str] = []
    part = parse_slice(slice_spec)
    if prompts_file:
        if part is not None:
            raise BadInput("a slice is taken of corpora only", where="--slice", expected="--corpus (no --prompts-file)",
                           found=f"--prompts-file {prompts_file}", fix="split the prompts file into files instead")
        ps = read_prompts_file(prompts_file)
    else:
        names = list(corpus or DEFAULT_CORPORA)
        bases = [n.partition(":")[0] for n in names]
        twice = sorted({b for b in bases if bases.count(b) > 1})
        if twice:  # its prompts would go into the data twice
            raise BadInput("corpus given twice", where="--corpus", expected="each corpus once",
                           found=twice[0], fix="give each --corpus once (NAME:K sets a derived corpus's variants)")
        bad = [n for n, b in zip(names, bases)
               if b in corpora.EVAL_SETS or (b in corpora.SOURCES and corpora.SOURCES[b].eval_only)]
        if bad:
            raise BadInput("evaluation set asked for as training data", where="--corpus",
                           expected=", ".join(corpora.TRAINING_CORPORA), found=bad[0],
                           fix="evaluation prompts never go into training")
        ps = corpora.mix(names, per_source=per_source, seed=seed)
        ps.manifest["slice"] = None
        if part is not None:
            ps = take_slice(ps, part)
    splits = [eval_prompts("builtin"), *corpora.eval_splits(names)]
    corpora.check_disjoint(ps, *(corpora.load(name, split="eval") for name in corpora.EVAL_SETS), *splits)
    ps.manifest["eval_sets_excluded"] = list(corpora.EVAL_SETS)
    ps.manifest["eval_splits_excluded"] = [s.name for s in splits]
    return ps


def _enough(ps: PromptSet, num: int | None, spec: str) -> PromptSet:
    """``ps`` when it holds at least ``num`` prompts; fewer is refused, never clamped to what there is."""
    if num is not None and len(ps.prompts) < num:
        raise BadInput("fewer prompts than --num-prompts", where="--num-prompts",
                       expected=f"at most {len(ps.prompts)} (the prompts {spec} holds)", found=str(num),
                       fix=f"pass --num-prompts {len(ps.prompts)} or a larger prompt set")
    return ps


def set_keys(specs: Sequence[str]) -> dict[str, str]:
    """A metric key for each prompt-set spec (``gsm8k-eval`` -> ``gsm8k_eval``, ``~/my-prompts.txt`` ->
    ``my_prompts``): lower case, every run of other characters one ``_``, a file by its name without the
    suffix, a leading digit or an empty name prefixed ``set_``; two specs that would share a key refused."""
    keys: dict[str, str] = {}
    for spec in specs:
        name = Path(spec).stem if Path(spec).is_file() else str(spec)
        key = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        key = key if key and key[0].isalpha() else f"set_{key}".rstrip("_")
        if key in keys.values():
            other = next(k for k, v in keys.items() if v == key)
            raise BadInput("two prompt sets would share one result key", where=f"--prompts {spec}",
                           expected="sets with distinct names", found=f"{other!r} and {spec!r} both -> {key!r}")
        keys[spec] = key
    return keys


def eval_prompts(spec: str, num: int | None = None) -> PromptSet:
    """An evaluation set: ``builtin``, a corpora eval set (``gsm8k-eval``, ``humaneval``), an evaluation-only
    corpus (``mtbench``), ``NAME-heldout`` (the held-out split of training corpus NAME: ``chatterbot-heldout``,
    ``chitchat-heldout``) or a prompts file.

    ``num``: the first ``num`` prompts; a set with fewer is refused (``--num-prompts``), not clamped."""
    if num is not None and num < 1:
        raise BadInput("number of prompts must be positive", where="--num-prompts", expected=">= 1", found=str(num))
    if spec == "builtin":
        items = [Prompt(id=f"builtin:{i}", source="builtin", messages=({"role": "user", "content": t},))
                 for i, t in enumerate(BUILTIN_PROMPTS)]
        _enough(PromptSet("builtin", items), num, spec)
        items = items[:num]
        return PromptSet("builtin", items, manifest={"source": "builtin", "count": len(items),
                                                     "sha256": prompts_hash(items)})
    if Path(spec).is_file():
        s = _enough(read_prompts_file(spec), num, spec)
        s.prompts = s.prompts[:num] if num else s.prompts
        s.manifest["count"] = len(s.prompts)
        return s
    sets = dict.fromkeys([*corpora.EVAL_SETS, *(n for n, src in corpora.SOURCES.items() if src.eval_only)])
    if spec in sets:
        return _enough(corpora.load(spec, split="eval", limit=num), num, spec)
    if spec.endswith("-heldout") and spec[: -len("-heldout")] in corpora.TRAINING_CORPORA:
        return _enough(corpora.load(spec[: -len("-heldout")], split="eval", limit=num), num, spec)
    raise BadInput("unknown prompt set", where="--prompts",
                   expected="builtin, " + ", ".join(sets) + ", CORPUS-heldout (a training corpus's "
                   "held-out split, e.g. chatterbot-heldout) or a prompts file", found=repr(spec))
