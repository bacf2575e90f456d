"""Token counts for draft-vocab mappings: what the target actually emits, counted.

Owns: the token-count file (``counts`` int64 ``[vocab]`` in safetensors, with a JSON
manifest), ``counts_from_token_ids`` (the one counting rule: loss-masked training-target
tokens only, as SpecForge and speculators count), counting real prompt text through a
tokenizer's chat template (``counts_from_prompts``) and counting a datagen dataset
(``counts_from_dataset``). The counts feed ``eaglekb.formats.mapping.build_mapping``.

Knows nothing about the mapping format (``eaglekb.formats.mapping``), drafter weights
(``eaglekb.training.remap``), training or the task runner. Safetensors only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import torch

from eaglekb.formats.mapping import FORMAT_VERSION, TokenCounts, read_tensor_file, save_tensor_file
from eaglekb.formats.shards import open_dataset
from eaglekb.io.errors import BadInput, IntegrityError, SchemaError

COUNTS_FORMAT = "eaglekb-token-counts"


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


def counts_from_dataset(path: str | Path, vocab_size: int | None = None) -> TokenCounts:
    """Counts over the loss-masked tokens of a datagen dataset folder (``invoke datagen``).

    Reads the shards through ``eaglekb.formats.shards.open_dataset`` (manifest, shard sizes
    checked); the target vocab size comes from the dataset's manifest.
    """
    ds = open_dataset(path)
    vocab = int(vocab_size or ds.target["vocab_size"])
    counts = torch.zeros(vocab, dtype=torch.int64)
    for ids, mask in ds.token_ids_and_masks():
        counts += counts_from_token_ids(ids.to(torch.int64), mask, vocab)
    return TokenCounts(counts, {
        "what": "loss-masked (assistant) tokens of a generated dataset", "dataset": str(path),
        "samples_count": len(ds), "tokens": int(counts.sum()),
        "manifest": {"prompts": ds.manifest.get("prompts"), "target": ds.target},
    })


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
