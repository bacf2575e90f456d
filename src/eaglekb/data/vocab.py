"""Token counts for draft-vocab mappings: what the target actually emits, counted.

Owns: the token-count file (``counts`` int64 ``[vocab]`` in safetensors, with a JSON
manifest), ``counts_from_token_ids`` (the one counting rule: loss-masked training-target
tokens only, as SpecForge and speculators count), counting real prompt text through a
tokenizer's chat template (``counts_from_prompts``), counting datagen datasets
(``counts_from_dataset``, ``counts_from_datasets``) with an optional held-out split by prompt
(``held_out``: 1 in K prompts, greedy and sampled responses of a prompt on one side), and the held-out
distribution coverage is measured on (``heldout_counts``). The counts feed
``eaglekb.formats.mapping.build_mapping``.

Knows nothing about the mapping format (``eaglekb.formats.mapping``), drafter weights
(``eaglekb.training.remap``), training or the task runner. Safetensors only.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable, Sequence

import torch

from eaglekb.formats.mapping import FORMAT_VERSION, TokenCounts, read_tensor_file, save_tensor_file
from eaglekb.formats.shards import open_dataset, shard_sequence_ids
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, SchemaError
from eaglekb.io.files import read_safetensors
from eaglekb.models.drafter import drafter_config_for_target

COUNTS_FORMAT = "eaglekb-token-counts"
_SAMPLE_SUFFIX = re.compile(r"@t[^@#]*#\d+$")  # eaglekb.data.datagen.sequence_id's extra-sample suffix


# ----------------------------------------------------------------------------- counts


def counts_from_token_ids(ids, loss_mask, vocab_size: int) -> torch.Tensor:
    """Counts (int64 ``[vocab_size]``) of the token ids where ``loss_mask`` is non-zero.

    ``ids`` and ``loss_mask`` have the same shape (any shape; flattened). This is the
    rule SpecForge and speculators use: only loss-bearing (assistant) tokens count.
    """
    ids = torch.as_tensor(ids).reshape(-1)
    mask = torch.as_tensor(loss_mask).reshape(-1)
    if ids.numel() != mask.numel():
        raise BadInput("token ids and loss mask differ in length", where="counts_from_token_ids",
                       expected=f"{ids.numel()} mask entries", found=str(mask.numel()))
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise BadInput("token ids are not integers", where="counts_from_token_ids",
                       expected="an integer tensor", found=str(ids.dtype))
    picked = ids[mask.to(torch.bool)].to(torch.int64)
    if picked.numel() and (int(picked.min()) < 0 or int(picked.max()) >= vocab_size):
        raise BadInput("token id outside the target vocab", where="counts_from_token_ids",
                       expected=f"ids in [0, {vocab_size - 1}]",
                       found=f"[{int(picked.min())}, {int(picked.max())}]")
    return torch.bincount(picked, minlength=vocab_size).to(torch.int64)


def content_mask(offsets: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """1 for each token whose character span overlaps one of ``spans`` (message contents)."""
    out = []
    for start, end in offsets:
        out.append(int(end > start and any(start < s_end and end > s_start for s_start, s_end in spans)))
    return out


def counts_from_prompts(prompts, tokenizer, *, roles: Iterable[str] = ("user",), batch: int = 512,
                        progress: bool = False) -> TokenCounts:
    """Count the tokens of message contents rendered through the tokenizer's chat template.

    The stand-in for training targets until responses are generated: each prompt is
    rendered as the target sees it; only the contents of messages whose role is in
    ``roles`` count (template markers and the default system prompt do not), the way a
    loss mask keeps assistant content only.
    """
    vocab = len(tokenizer)
    roles = set(roles)
    items = list(getattr(prompts, "prompts", prompts))
    picked: list[int] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(items), desc="counting tokens", unit="prompt", leave=False)
    for lo in range(0, len(items), batch):
        chunk = items[lo: lo + batch]
        conversations = [[dict(m) for m in p.messages] for p in chunk]
        texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=False)
                 for c in conversations]
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        for p, conv, text, ids, offsets in zip(chunk, conversations, texts, enc["input_ids"],
                                               enc["offset_mapping"]):
            spans, cursor = [], 0
            for m in conv:
                at = text.find(m["content"], cursor)
                if at < 0:
                    raise IntegrityError("message content not found in the rendered chat template",
                                         where=getattr(p, "id", "prompt"), expected="the content verbatim",
                                         found=repr(m["content"][:40]))
                cursor = at + len(m["content"])
                if m["role"] in roles:
                    spans.append((at, cursor))
            mask = content_mask(offsets, spans)
            picked.extend(i for i, keep in zip(ids, mask) if keep)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    ids_t = torch.tensor(picked, dtype=torch.int64)
    counts = counts_from_token_ids(ids_t, torch.ones_like(ids_t), vocab)
    manifest = getattr(prompts, "manifest", None)
    meta = {
        "what": "message-content tokens of prompts rendered through the chat template "
                f"(roles: {', '.join(sorted(roles))}); a stand-in for assistant targets",
        "prompts_count": len(items),
        "tokens": len(picked),
        "tokenizer": getattr(tokenizer, "name_or_path", None),
        "manifest": manifest,
    }
    return TokenCounts(counts, meta)


def prompt_of(sequence_id: str) -> str:
    """The prompt a sequence answers: its id without datagen's ``@tT#k`` extra-sample suffix."""
    m = _SAMPLE_SUFFIX.search(sequence_id)
    return sequence_id[: m.start()] if m else sequence_id


def held_out(sequence_id: str, every: int) -> bool:
    """Whether a sequence's prompt falls in the held-out bucket (1 in ``every``, by hash of the prompt id).

    Decided per prompt, so a prompt's greedy and sampled responses land on the same side."""
    digest = hashlib.sha256(prompt_of(sequence_id).encode()).hexdigest()
    return int(digest, 16) % every == 0


def _shard_keep(file: Path, offsets: list[int], every: int, part: str) -> tuple[torch.Tensor | None, int]:
    """Per-token keep mask of one shard for a held-out split (None: keep every token), and the sequences kept."""
    if not every:
        return None, len(offsets) - 1
    ids = shard_sequence_ids(file)
    if ids is None:
        raise SchemaError("shard has no sequence ids, so no held-out split by prompt", where=str(file),
                          fix="regenerate the dataset with this datagen, or count it without --holdout")
    keep = torch.zeros(offsets[-1], dtype=torch.bool)
    kept = 0
    for j, sid in enumerate(ids):
        if held_out(sid, every) == (part == "heldout"):
            keep[offsets[j]: offsets[j + 1]] = True
            kept += 1
    return keep, kept


def counts_from_dataset(path: str | Path, vocab_size: int | None = None, *, holdout: int = 0,
                        part: str = "train") -> TokenCounts:
    """Counts over the loss-masked tokens of a datagen dataset folder (``invoke datagen``).

    Reads the shards through ``eaglekb.formats.shards.open_dataset`` (manifest, shard sizes
    checked); the target vocab size comes from the dataset's manifest. ``holdout`` K > 0 splits
    by prompt (``held_out``): ``part="train"`` counts the prompts outside the 1-in-K bucket,
    ``part="heldout"`` the prompts inside it.
    """
    if holdout < 0 or holdout == 1 or part not in ("train", "heldout"):
        raise BadInput("bad held-out split", where="--holdout", expected="0 (none) or K >= 2 (1 in K prompts)",
                       found=repr(holdout) if part in ("train", "heldout") else f"part {part!r}")
    ds = open_dataset(path)
    vocab = int(vocab_size or ds.target["vocab_size"])
    counts = torch.zeros(vocab, dtype=torch.int64)
    sequences = 0
    for s, file in enumerate(ds.shard_files):
        t = read_safetensors(file, keys=["input_ids", "loss_mask"])
        keep, kept = _shard_keep(file, ds.offsets[s], holdout, part)
        mask = t["loss_mask"] if keep is None else t["loss_mask"] * keep.to(t["loss_mask"].dtype)
        sequences += kept
        counts += counts_from_token_ids(t["input_ids"].to(torch.int64), mask, vocab)
    meta = {"what": "loss-masked (assistant) tokens of a generated dataset", "dataset": str(path),
            "samples_count": sequences, "tokens": int(counts.sum()),
            "manifest": {"prompts": ds.manifest.get("prompts"), "target": ds.target}}
    if holdout:
        meta["split"] = {"holdout_every": holdout, "part": part, "by": "sha256 of the prompt id"}
    return TokenCounts(counts, meta)


def counts_from_datasets(paths: Sequence[str | Path], *, holdout: int = 0, part: str = "train") -> TokenCounts:
    """Counts summed over several datagen datasets of one target (``counts_from_dataset`` each)."""
    parts = [counts_from_dataset(p, holdout=holdout, part=part) for p in paths]
    if not parts:
        raise BadInput("no dataset to count", where="--dataset", expected="one or more dataset folders",
                       found="none")
    first = parts[0]
    for p, c in zip(paths[1:], parts[1:]):
        if c.vocab_size != first.vocab_size:
            raise Incompatible("datasets were generated by targets with different vocabularies",
                               where=f"--dataset {p}", expected=f"target vocab {first.vocab_size} "
                               f"(as --dataset {paths[0]})", found=f"target vocab {c.vocab_size}")
    if len(parts) == 1:
        return first
    total = sum((c.counts for c in parts[1:]), first.counts.clone())
    meta = {"what": first.meta["what"], "datasets": [str(p) for p in paths],
            "samples_count": sum(c.meta["samples_count"] for c in parts), "tokens": int(total.sum()),
            "parts": [c.meta for c in parts]}
    if holdout:
        meta["split"] = first.meta["split"]
    return TokenCounts(total, meta)


def heldout_counts(specs: Sequence[str | Path], *, holdout: int = 0) -> TokenCounts:
    """A held-out token distribution: dataset folders (their 1-in-K held-out prompts with ``holdout`` K,
    else all of them) or token-count / mapping files with counts (as they are)."""
    datasets = [s for s in specs if Path(s).is_dir()]
    files = [s for s in specs if not Path(s).is_dir()]
    parts = ([counts_from_datasets(datasets, holdout=holdout, part="heldout")] if datasets else [])
    parts += [load_counts(f) for f in files]
    if not parts:
        raise BadInput("no held-out data", where="--heldout", expected="dataset folders or count files",
                       found="none")
    for spec, c in zip(list(datasets[:1]) + files, parts):
        if c.vocab_size != parts[0].vocab_size:
            raise Incompatible("held-out data of another target vocabulary", where=f"--heldout {spec}",
                               expected=f"target vocab {parts[0].vocab_size}", found=f"target vocab {c.vocab_size}")
    if len(parts) == 1:
        return parts[0]
    total = sum((c.counts for c in parts[1:]), parts[0].counts.clone())
    return TokenCounts(total, {"what": "held-out tokens", "parts": [c.meta for c in parts],
                               "tokens": int(total.sum())})


def save_counts(path: str | Path, counts: TokenCounts) -> Path:
    """Write a token-count file (safetensors ``counts`` + JSON metadata), atomically."""
    meta = {"format": COUNTS_FORMAT, "version": FORMAT_VERSION, "vocab_size": counts.vocab_size,
            "total_tokens": counts.total, "seen_tokens": counts.seen, **counts.meta}
    return save_tensor_file(path, {"counts": counts.counts.to(torch.int64).contiguous()}, meta)


def load_counts(path: str | Path) -> TokenCounts:
    """Read a token-count file, or the counts stored inside a mapping file."""
    tensors, meta = read_tensor_file(path)
    if "counts" not in tensors:
        raise SchemaError("no counts tensor", where=str(path), expected="a token-count or mapping file "
                          "with 'counts'", found=", ".join(sorted(tensors)) or "no tensors")
    counts = tensors["counts"]
    if counts.dim() != 1 or counts.is_floating_point() or counts.dtype == torch.bool:
        raise SchemaError("counts must be a 1-D integer tensor", where=f"{path}:counts",
                          found=f"{counts.dtype} {list(counts.shape)}")
    if counts.numel() and int(counts.min()) < 0:
        raise SchemaError("negative token count", where=f"{path}:counts", expected=">= 0",
                          found=str(int(counts.min())))
    inner = meta.get("counts_meta", meta)
    return TokenCounts(counts.to(torch.int64), inner)


# ----------------------------------------------------------------------------- what a mapping costs a drafter


def drafter_bytes(target_config, draft_vocab_size: int, *, intermediate_size: int | None = None) -> dict:
    """Parameters and bf16 bytes of the one-layer EAGLE-3 drafter a draft vocabulary implies for a target
    (SGLang layout: fc, midlayer, norm, lm_head, d2t int64, t2d bool; embeddings not stored), from its config.

    ``target_config``: a transformers config or its dict (a dataset manifest's ``target`` will do)."""
    c = drafter_config_for_target(target_config, int(draft_vocab_size), intermediate_size=intermediate_size)
    h, th, hd = c.hidden_size, c.target_hidden_size or c.hidden_size, c.dim_head
    attn = 2 * h * c.num_attention_heads * hd + 2 * (2 * h * c.num_key_value_heads * hd) + c.num_attention_heads * hd * h
    body = 3 * th * h + attn + 3 * h * c.intermediate_size + 4 * h
    head = c.draft_vocab_size * h
    return {"params": body + head, "lm_head_params": head,
            "bytes": 2 * (body + head) + 8 * c.draft_vocab_size + c.vocab_size}
