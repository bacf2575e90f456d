"""Draft-vocab mappings: token counts, building d2t/t2d, reading and comparing mappings.

Owns: the token-count file (``counts`` int64 ``[vocab]`` in safetensors, with a JSON
manifest), ``counts_from_token_ids`` (the one counting rule: loss-masked training-target
tokens only), counting real prompt text through a tokenizer's chat template, the
mapping build with SpecForge / speculators semantics, the mapping file, loading a
mapping from any of the places one lives (an eaglekb mapping file, a drafter folder,
SpecForge's ``vocab_mapping.pt``, speculators' ``d2t.npy``/``t2d.npy``) with one-line
errors, and ``compare_mappings``.

The build rule (checked against SpecForge ``specforge/data/preprocessing.py``
``process_token_dict_to_mappings`` and speculators
``src/speculators/data_generation/vocab_mapping.py``
``build_vocab_mappings_from_distribution``; see docs/howto/vocab.md):

1. count target-token frequencies over loss-masked tokens;
2. take the top N by count, ties by lower token id (speculators sorts on
   ``(-count, id)``; SpecForge's ``Counter.most_common`` keeps insertion order, which is
   id order when the counts come as a per-id vector, as here);
3. when fewer than N tokens were seen, add the smallest unseen ids of ``0..N-1``;
4. sort ascending; ``d2t[i] = selected[i] - i``; ``t2d`` marks the selected ids.

Knows nothing about drafter weights (see ``eaglekb.training.remap``), training or the task runner.
Safetensors, ``weights_only`` torch loads and ``allow_pickle=False`` numpy loads only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError

COUNTS_FORMAT = "eaglekb-token-counts"
MAPPING_FORMAT = "eaglekb-vocab-mapping"
FORMAT_VERSION = 1
META_KEY = "eaglekb"


# ----------------------------------------------------------------------------- counts


@dataclass
class TokenCounts:
    """How often each target token occurs as a training target (loss-masked)."""

    counts: torch.Tensor  # int64 [vocab_size]
    meta: dict[str, Any] = field(default_factory=dict)  # manifest, tokenizer, what was counted

    @property
    def vocab_size(self) -> int:
        return int(self.counts.numel())

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def seen(self) -> int:
        return int((self.counts > 0).sum())


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

    Reads the shards through ``eaglekb.data.datagen.open_dataset`` (manifest, shard sizes
    checked); the target vocab size comes from the dataset's manifest.
    """
    from eaglekb.data import datagen

    ds = datagen.open_dataset(path)
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
    return _save(path, {"counts": counts.counts.to(torch.int64).contiguous()}, meta)


def load_counts(path: str | Path) -> TokenCounts:
    """Read a token-count file, or the counts stored inside a mapping file."""
    tensors, meta = _load_safetensors(path)
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


# ----------------------------------------------------------------------------- mappings


@dataclass
class Mapping:
    """A draft-vocab mapping: ``target_id = i + d2t[i]``; ``t2d`` marks the selected target ids."""

    d2t: torch.Tensor  # int64 [draft_vocab]
    vocab_size: int
    counts: TokenCounts | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def selected(self) -> torch.Tensor:
        return torch.arange(self.draft_vocab_size, dtype=torch.int64) + self.d2t

    @property
    def t2d(self) -> torch.Tensor:
        t2d = torch.zeros(self.vocab_size, dtype=torch.bool)
        t2d[self.selected] = True
        return t2d

    def positions(self) -> torch.Tensor:
        """``[vocab]`` int64: the draft row of each target token, -1 when not in the mapping."""
        pos = torch.full((self.vocab_size,), -1, dtype=torch.int64)
        pos[self.selected] = torch.arange(self.draft_vocab_size, dtype=torch.int64)
        return pos


def select_top(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The selected target ids (sorted ascending) for ``counts``: see the module docstring."""
    counts = torch.as_tensor(counts).to(torch.int64).reshape(-1)
    vocab = counts.numel()
    n = int(draft_vocab_size)
    if not 0 < n <= vocab:
        raise BadInput("draft vocab size out of range", where="--draft-vocab-size",
                       expected=f"1..{vocab} (the target vocab)", found=str(n))
    seen = int((counts > 0).sum())
    # Stable sort on descending count: equal counts keep ascending id order.
    order = torch.sort(-counts, stable=True).indices
    chosen = order[: min(n, seen)]
    if seen < n:
        taken = torch.zeros(vocab, dtype=torch.bool)
        taken[chosen] = True
        pad = (~taken[:n]).nonzero().reshape(-1)[: n - seen]  # smallest unseen ids of 0..N-1
        chosen = torch.cat([chosen, pad])
    return torch.sort(chosen).values


def build_mapping(counts: TokenCounts, draft_vocab_size: int) -> Mapping:
    """A mapping of the ``draft_vocab_size`` most frequent target tokens (SpecForge semantics)."""
    selected = select_top(counts.counts, draft_vocab_size)
    d2t = selected - torch.arange(selected.numel(), dtype=torch.int64)
    covered = int(counts.counts[selected].sum())
    meta = {
        "draft_vocab_size": int(draft_vocab_size),
        "vocab_size": counts.vocab_size,
        "seen_tokens": counts.seen,
        "padded_tokens": max(0, int(draft_vocab_size) - counts.seen),
        "total_tokens": counts.total,
        "coverage_frac": covered / counts.total if counts.total else 0.0,
        "rule": "top-N by count, ties by lower id, pad with smallest unseen ids of 0..N-1, sorted; "
                "d2t[i] = selected[i] - i (SpecForge / speculators)",
    }
    return Mapping(d2t=d2t, vocab_size=counts.vocab_size, counts=counts, meta=meta)


def save_mapping(path: str | Path, mapping: Mapping, *, with_counts: bool = True) -> Path:
    """Write ``{d2t, t2d[, counts]}`` + metadata as one safetensors file, atomically."""
    tensors = {"d2t": mapping.d2t.to(torch.int64).contiguous(), "t2d": mapping.t2d.contiguous()}
    meta = {"format": MAPPING_FORMAT, "version": FORMAT_VERSION, **mapping.meta,
            "vocab_size": mapping.vocab_size, "draft_vocab_size": mapping.draft_vocab_size}
    if with_counts and mapping.counts is not None:
        tensors["counts"] = mapping.counts.counts.to(torch.int64).contiguous()
        meta["counts_meta"] = mapping.counts.meta
    return _save(path, tensors, meta)


def check_mapping(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int | None, where: str) -> torch.Tensor:
    """Validate a d2t (and t2d); return the selected target ids. One line per problem."""
    if d2t.dim() != 1 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise SchemaError("d2t must be a 1-D integer tensor", where=f"{where}:d2t",
                          expected="int64 [draft_vocab]", found=f"{d2t.dtype} {list(d2t.shape)}")
    if d2t.numel() == 0:
        raise SchemaError("d2t is empty", where=f"{where}:d2t", expected="at least one entry", found="0")
    if t2d is not None:
        if t2d.dim() != 1:
            raise SchemaError("t2d must be a 1-D tensor", where=f"{where}:t2d", found=str(list(t2d.shape)))
        if vocab_size is not None and t2d.numel() != vocab_size:
            raise Incompatible("t2d length is not the target vocab size", where=f"{where}:t2d",
                               expected=str(vocab_size), found=str(t2d.numel()))
        vocab_size = t2d.numel()
    selected = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)
    lo, hi = int(selected.min()), int(selected.max())
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        raise BadInput("d2t maps outside the target vocab", where=f"{where}:d2t",
                       expected=f"i + d2t[i] in [0, {(vocab_size or 0) - 1}]", found=f"[{lo}, {hi}]")
    steps = selected[1:] - selected[:-1]
    if steps.numel():
        dup = (steps == 0).nonzero().reshape(-1)
        if dup.numel():
            i = int(dup[0])
            raise BadInput("d2t repeats a target token", where=f"{where}:d2t",
                           expected="each target id once",
                           found=f"target id {int(selected[i])} at draft ids {i} and {i + 1}")
        back = (steps < 0).nonzero().reshape(-1)
        if back.numel():
            i = int(back[0])
            raise BadInput("d2t is not sorted by target id", where=f"{where}:d2t",
                           expected="i + d2t[i] increasing (SpecForge sorts the selected ids)",
                           found=f"draft id {i + 1} -> {int(selected[i + 1])} after draft id {i} -> "
                                 f"{int(selected[i])}", fix="rebuild with invoke vocab.build")
    if t2d is not None:
        marked = t2d.to(torch.bool)
        n_marked = int(marked.sum())
        if n_marked != d2t.numel() or not bool(marked[selected].all()):
            missing = selected[~marked[selected]]
            detail = (f"t2d marks {n_marked} tokens for {d2t.numel()} draft ids"
                      + (f"; target id {int(missing[0])} (draft id "
                         f"{int((selected == missing[0]).nonzero()[0])}) is not marked" if missing.numel() else ""))
            raise BadInput("t2d does not match d2t", where=f"{where}:t2d",
                           expected="t2d true exactly at i + d2t[i]", found=detail,
                           fix="rebuild t2d from d2t")
    return selected


def load_mapping(path: str | Path) -> Mapping:
    """A mapping from an eaglekb mapping file, a drafter folder, SpecForge's ``.pt`` or speculators' ``.npy``."""
    p = Path(path)
    if not p.exists():
        raise MissingFile("mapping not found", where=str(p),
                          expected="a mapping .safetensors, a drafter folder, a SpecForge vocab_mapping.pt "
                                   "or a folder with d2t.npy/t2d.npy")
    if p.is_dir() and (p / "config.json").is_file():
        return _mapping_from_drafter(p)
    if p.is_dir() and (p / "d2t.npy").is_file():
        import numpy as np

        try:
            d2t = torch.from_numpy(np.load(p / "d2t.npy", allow_pickle=False))
            t2d = torch.from_numpy(np.load(p / "t2d.npy", allow_pickle=False)) if (p / "t2d.npy").is_file() else None
        except (ValueError, OSError) as exc:
            raise IntegrityError("unreadable .npy mapping", where=str(p), found=str(exc)[:160]) from None
        selected = check_mapping(d2t, t2d, None, str(p))
        vocab = int(t2d.numel()) if t2d is not None else int(selected.max()) + 1
        return Mapping(d2t.to(torch.int64), vocab, source=str(p), meta={"origin": "speculators d2t.npy/t2d.npy"})
    if p.suffix in (".pt", ".pth"):
        try:
            doc = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise IntegrityError("unreadable .pt mapping (only tensors are loaded, no pickle)", where=str(p),
                                 found=str(exc).splitlines()[0][:160]) from None
        if not isinstance(doc, dict) or "d2t" not in doc:
            raise SchemaError("not a vocab mapping", where=str(p), expected="a dict with d2t and t2d",
                              found=type(doc).__name__)
        d2t, t2d = torch.as_tensor(doc["d2t"]), (torch.as_tensor(doc["t2d"]) if "t2d" in doc else None)
        check_mapping(d2t, t2d, None, str(p))
        if t2d is None:
            raise SchemaError("mapping has no t2d: the target vocab size is unknown", where=str(p),
                              expected="d2t and t2d", found="d2t only")
        return Mapping(d2t.to(torch.int64), int(t2d.numel()), source=str(p), meta={"origin": "SpecForge .pt"})
    tensors, meta = _load_safetensors(p)
    if "d2t" not in tensors:
        raise SchemaError("not a vocab mapping", where=str(p), expected="tensors d2t and t2d",
                          found=", ".join(sorted(tensors)) or "no tensors")
    vocab = meta.get("vocab_size")
    t2d = tensors.get("t2d")
    check_mapping(tensors["d2t"], t2d, vocab, str(p))
    if vocab is None:
        if t2d is None:
            raise SchemaError("mapping has no t2d and no vocab_size: the target vocab size is unknown",
                              where=str(p), expected="t2d or metadata vocab_size", found="neither")
        vocab = int(t2d.numel())
    counts = None
    if "counts" in tensors:
        counts = TokenCounts(tensors["counts"].to(torch.int64), meta.get("counts_meta") or {})
        if counts.vocab_size != vocab:
            raise Incompatible("counts length is not the target vocab size", where=f"{p}:counts",
                               expected=str(vocab), found=str(counts.vocab_size))
    meta = {k: v for k, v in meta.items() if k != "counts_meta"}
    return Mapping(tensors["d2t"].to(torch.int64), int(vocab), counts=counts, meta=meta, source=str(p))


def _mapping_from_drafter(folder: Path) -> Mapping:
    from safetensors import safe_open

    from eaglekb.models.drafter import read_config, weight_files

    cfg, fmt = read_config(folder)
    found: dict[str, torch.Tensor] = {}
    rows = None
    for file in weight_files(folder):
        try:
            with safe_open(str(file), framework="pt") as fh:
                for key in fh.keys():
                    if key in ("d2t", "t2d"):
                        found[key] = fh.get_tensor(key)
                    elif key.endswith("lm_head.weight"):
                        rows = fh.get_slice(key).get_shape()[0]
        except Exception as exc:
            raise IntegrityError("unreadable safetensors file (truncated or corrupt)", where=str(file),
                                 found=str(exc).splitlines()[0][:160]) from None
    if "d2t" not in found:
        raise SchemaError("drafter has no d2t", where=str(folder), expected="a d2t tensor", found="absent",
                          fix="a drafter without d2t uses the full target vocab; nothing to compare")
    d2t = found["d2t"].reshape(-1)
    if rows is not None and rows != d2t.numel():
        raise Incompatible("lm_head rows do not match d2t length", where=f"{folder}:lm_head.weight",
                           expected=f"{d2t.numel()} rows (one per d2t entry)", found=f"{rows} rows")
    if d2t.numel() != cfg.draft_vocab_size:
        raise Incompatible("d2t length does not match draft_vocab_size", where=f"{folder}:d2t",
                           expected=str(cfg.draft_vocab_size), found=str(d2t.numel()))
    check_mapping(d2t, found.get("t2d"), cfg.vocab_size, str(folder))
    return Mapping(d2t.to(torch.int64), cfg.vocab_size, source=str(folder),
                   meta={"origin": f"drafter ({fmt} format)"})


# ----------------------------------------------------------------------------- compare


def _longest_run(flags: torch.Tensor) -> tuple[int, int]:
    """(length, start) of the longest run of True."""
    best, start, run, run_start = 0, 0, 0, 0
    for i, f in enumerate(flags.tolist()):
        if f:
            if run == 0:
                run_start = i
            run += 1
            if run > best:
                best, start = run, run_start
        else:
            run = 0
    return best, start


def coverage(mapping: Mapping, counts: TokenCounts) -> float:
    """Share of a token distribution (counts) whose tokens are in the mapping, in [0, 1]."""
    if counts.vocab_size != mapping.vocab_size:
        raise Incompatible("counts and mapping have different target vocab sizes", where="coverage",
                           expected=str(mapping.vocab_size), found=str(counts.vocab_size))
    total = counts.total
    return float(counts.counts[mapping.selected].sum()) / total if total else 0.0


def compare_mappings(a: Mapping, b: Mapping, reference: TokenCounts | None = None,
                     reference_name: str = "reference") -> dict[str, Any]:
    """Position matches, set overlap, Jaccard, coverage and the sorted-id shift of two mappings."""
    if a.vocab_size != b.vocab_size:
        raise Incompatible("mappings are for different target vocab sizes", where=f"{a.source} vs {b.source}",
                           expected=f"the same target vocab ({a.vocab_size})", found=str(b.vocab_size),
                           fix="mappings of different targets cannot be compared or remapped")
    sa, sb = a.selected, b.selected
    n = min(sa.numel(), sb.numel())
    same = sa[:n] == sb[:n]
    pos_matches = int(same.sum())
    run, run_start = _longest_run(same)
    ta, tb = a.t2d, b.t2d
    inter = int((ta & tb).sum())
    union = int((ta | tb).sum())
    # Where each shared token sits in A and in B: the shift explains the position mismatches.
    shared = (ta & tb).nonzero().reshape(-1)
    shift = b.positions()[shared] - a.positions()[shared]
    first_diff = int((~same).nonzero()[0]) if bool((~same).any()) else None
    doc: dict[str, Any] = {
        "a": {"source": a.source, "draft_vocab_size": a.draft_vocab_size},
        "b": {"source": b.source, "draft_vocab_size": b.draft_vocab_size},
        "vocab_size": a.vocab_size,
        "position_matches": pos_matches,
        "positions_compared": n,
        "position_match_pct": 100.0 * pos_matches / max(a.draft_vocab_size, b.draft_vocab_size),
        "longest_matching_run": run,
        "longest_matching_run_start": run_start if run else None,
        "set_overlap": inter,
        "only_a": a.draft_vocab_size - inter,
        "only_b": b.draft_vocab_size - inter,
        "jaccard": inter / union if union else 1.0,
        "overlap_pct_of_a": 100.0 * inter / a.draft_vocab_size,
        "shared_same_row": int((shift == 0).sum()),
        "shared_shifted": int((shift != 0).sum()),
        "shift_abs_median_rows": float(shift.abs().float().median()) if shift.numel() else 0.0,
        "shift_abs_max_rows": int(shift.abs().max()) if shift.numel() else 0,
        "first_mismatch": None,
        "identical": bool(a.draft_vocab_size == b.draft_vocab_size and pos_matches == n),
    }
    if first_diff is not None:
        doc["first_mismatch"] = {"draft_id": first_diff, "a_target_id": int(sa[first_diff]),
                                 "b_target_id": int(sb[first_diff])}
    cov: dict[str, dict[str, float]] = {}
    for label, counts in (("a_counts", a.counts), ("b_counts", b.counts), (reference_name, reference)):
        if counts is not None:
            cov[label] = {"a": coverage(a, counts), "b": coverage(b, counts), "total_tokens": counts.total}
    doc["coverage"] = cov
    doc["explanation"] = explain(doc)
    return doc


def explain(doc: dict[str, Any]) -> str:
    """One line on why positions disagree when the sets overlap (the sorted-id shift)."""
    if doc["identical"]:
        return "the mappings are identical"
    pm, ov = doc["position_matches"], doc["set_overlap"]
    na, nb = doc["a"]["draft_vocab_size"], doc["b"]["draft_vocab_size"]
    fm = doc["first_mismatch"]
    if ov == 0:
        return "the mappings share no target token: a drafter trained on one has no usable lm_head row for the other"
    head = (f"only {pm} of {max(na, nb)} positions match, yet {ov} target tokens "
            f"({100.0 * ov / na:.1f}% of A) are in both sets")
    if fm is None:
        return head + "; B extends A"
    return (head + f": each d2t is sorted by target id, so from draft id {fm['draft_id']} on "
            f"(A -> {fm['a_target_id']}, B -> {fm['b_target_id']}) every token one set holds and the other "
            f"does not pushes all later shared tokens to another row ({doc['shared_shifted']} of {ov} shared "
            f"tokens moved, median {doc['shift_abs_median_rows']:.0f} rows); compare by set overlap and "
            "coverage, and remap lm_head rows by target id")


def comparison_metrics(doc: dict[str, Any]) -> dict[str, Any]:
    """The baseline metric tree of a comparison (names carry units)."""
    m: dict[str, Any] = {
        "draft_vocab_a_tokens": doc["a"]["draft_vocab_size"],
        "draft_vocab_b_tokens": doc["b"]["draft_vocab_size"],
        "target_vocab_tokens": doc["vocab_size"],
        "position_matches_count": doc["position_matches"],
        "position_match_pct": round(doc["position_match_pct"], 4),
        "longest_matching_run_count": doc["longest_matching_run"],
        "set_overlap_count": doc["set_overlap"],
        "only_a_count": doc["only_a"],
        "only_b_count": doc["only_b"],
        "jaccard_frac": round(doc["jaccard"], 6),
        "overlap_of_a_pct": round(doc["overlap_pct_of_a"], 4),
        "shared_same_row_count": doc["shared_same_row"],
        "shared_shifted_count": doc["shared_shifted"],
    }
    cov = {}
    for label, c in doc["coverage"].items():
        key = label.replace("-", "_")
        cov[key] = {"a_pct": round(100.0 * c["a"], 4), "b_pct": round(100.0 * c["b"], 4),
                    "total_tokens": c["total_tokens"]}
    if cov:
        m["coverage"] = cov
    return m


def render_comparison(doc: dict[str, Any]) -> str:
    na, nb = doc["a"]["draft_vocab_size"], doc["b"]["draft_vocab_size"]
    lines = [
        f"A: {doc['a']['source']} ({na} draft tokens)",
        f"B: {doc['b']['source']} ({nb} draft tokens), target vocab {doc['vocab_size']}",
        f"position matches : {doc['position_matches']} of {max(na, nb)} ({doc['position_match_pct']:.2f}%), "
        f"longest run {doc['longest_matching_run']}",
        f"set overlap      : {doc['set_overlap']} (A only {doc['only_a']}, B only {doc['only_b']}), "
        f"Jaccard {doc['jaccard']:.4f}",
        f"shared tokens    : {doc['shared_same_row']} on the same row, {doc['shared_shifted']} shifted "
        f"(median {doc['shift_abs_median_rows']:.0f}, max {doc['shift_abs_max_rows']} rows)",
    ]
    for label, c in doc["coverage"].items():
        lines.append(f"coverage of {label:<10}: A {100 * c['a']:.2f}%, B {100 * c['b']:.2f}% "
                     f"of {c['total_tokens']:,} tokens")
    lines.append(f"why: {doc['explanation']}")
    return "\n".join(lines)


def render_build(mapping: Mapping, path: Path | None = None) -> str:
    m = mapping.meta
    lines = [f"mapping: {mapping.draft_vocab_size} of {mapping.vocab_size} target tokens"
             + (f" -> {path}" if path else ""),
             f"counted {m.get('total_tokens', 0):,} tokens, {m.get('seen_tokens', 0):,} distinct; "
             f"top {mapping.draft_vocab_size} cover {100 * m.get('coverage_frac', 0):.2f}%"]
    if m.get("padded_tokens"):
        lines.append(f"note: only {m['seen_tokens']} tokens seen; padded with {m['padded_tokens']} unseen ids "
                     f"from 0..{mapping.draft_vocab_size - 1} (SpecForge does the same)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- files


def _save(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True, default=str)})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _load_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise MissingFile("file not found", where=str(p))
    try:
        with safe_open(str(p), framework="pt") as fh:
            raw = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:
        raise IntegrityError("unreadable safetensors file (truncated or corrupt)", where=str(p),
                             expected="a complete safetensors file", found=str(exc).splitlines()[0][:160]) from None
    meta: dict[str, Any] = {}
    if META_KEY in raw:
        try:
            meta = json.loads(raw[META_KEY])
        except ValueError:
            raise SchemaError("metadata is not JSON", where=f"{p}:{META_KEY}") from None
    return tensors, meta
