"""The draft-vocab mapping format: d2t / t2d, building them, and every file a mapping lives in.

Owns: ``check_mapping`` (a d2t, and t2d when present, validated against the target and
draft vocab sizes, one line per problem), ``mapping_from_selected``, ``Mapping`` and
``TokenCounts`` (the counts a mapping file may carry), the mapping build with SpecForge /
speculators semantics (``select_top``, ``build_mapping``), the eaglekb mapping file
(safetensors ``d2t``, ``t2d`` and optional ``counts`` with JSON metadata) and loading a
mapping from any of the places one lives (an eaglekb mapping file, a drafter folder,
SpecForge's ``vocab_mapping.pt``, speculators' ``d2t.npy``/``t2d.npy``) with one-line errors.
Comparing two mappings is ``eaglekb.formats.mapping_compare``.

The build rule (checked against SpecForge ``specforge/data/preprocessing.py``
``process_token_dict_to_mappings`` and speculators
``src/speculators/data_generation/vocab_mapping.py``
``build_vocab_mappings_from_distribution``; see docs/howto/vocab.md):

1. count target-token frequencies over loss-masked tokens (``eaglekb.data.vocab``);
2. take the top N by count, ties by lower token id (speculators sorts on
   ``(-count, id)``; SpecForge's ``Counter.most_common`` keeps insertion order, which is
   id order when the counts come as a per-id vector, as here);
3. when fewer than N tokens were seen, add the smallest unseen ids of ``0..N-1``;
4. sort ascending; ``d2t[i] = selected[i] - i``; ``t2d`` marks the selected ids.

Knows nothing about counting tokens (``eaglekb.data.vocab``), drafter weights beyond
d2t/t2d (``eaglekb.training.remap``), training or the task runner. Safetensors,
``weights_only`` torch loads and ``allow_pickle=False`` numpy loads only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from eaglekb.formats.drafter import read_config, weight_files
from eaglekb.formats.headers import tensor_headers
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError, first_line
from eaglekb.io.files import atomic_save_safetensors, read_safetensors, safetensors_keys

MAPPING_FORMAT = "eaglekb-vocab-mapping"
FORMAT_VERSION = 1
META_KEY = "eaglekb"


# ----------------------------------------------------------------------------- checks


def _check_d2t_shape(d2t: torch.Tensor, draft_vocab_size: int | None, where: str) -> None:
    if draft_vocab_size is not None and tuple(d2t.shape) != (draft_vocab_size,):
        raise Incompatible("d2t length does not match draft_vocab_size", where=f"{where}:d2t",
                           expected=str(draft_vocab_size), found=str(tuple(d2t.shape)))
    if d2t.dim() != 1 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise SchemaError("d2t must be a 1-D integer tensor", where=f"{where}:d2t",
                          expected="int64 [draft_vocab]", found=f"{d2t.dtype} {list(d2t.shape)}")
    if d2t.numel() == 0:
        raise SchemaError("d2t is empty", where=f"{where}:d2t", expected="at least one entry", found="0")


def _check_t2d_shape(t2d: torch.Tensor, vocab_size: int | None, where: str) -> int:
    if t2d.dim() != 1:
        raise SchemaError("t2d must be a 1-D tensor", where=f"{where}:t2d", found=str(list(t2d.shape)))
    if vocab_size is not None and t2d.numel() != vocab_size:
        raise Incompatible("t2d length is not the target vocab size", where=f"{where}:t2d",
                           expected=str(vocab_size), found=str(t2d.numel()))
    return t2d.numel()


def _check_selected(selected: torch.Tensor, vocab_size: int | None, where: str) -> None:
    lo, hi = int(selected.min()), int(selected.max())
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        raise BadInput("d2t maps outside the target vocab", where=f"{where}:d2t",
                       expected=f"i + d2t[i] in [0, {(vocab_size or 0) - 1}]", found=f"[{lo}, {hi}]")
    steps = selected[1:] - selected[:-1]
    if not steps.numel():
        return
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


def _check_t2d_marks(t2d: torch.Tensor, selected: torch.Tensor, where: str) -> None:
    marked = t2d.to(torch.bool)
    n_marked = int(marked.sum())
    if n_marked != selected.numel() or not bool(marked[selected].all()):
        missing = selected[~marked[selected]]
        detail = (f"t2d marks {n_marked} tokens for {selected.numel()} draft ids"
                  + (f"; target id {int(missing[0])} (draft id "
                     f"{int((selected == missing[0]).nonzero()[0])}) is not marked" if missing.numel() else ""))
        raise BadInput("t2d does not match d2t", where=f"{where}:t2d",
                       expected="t2d true exactly at i + d2t[i]", found=detail,
                       fix="rebuild t2d from d2t")


def check_mapping(d2t: torch.Tensor, vocab_size: int | None, draft_vocab_size: int | None,
                  t2d: torch.Tensor | None = None, where: str = "drafter") -> torch.Tensor:
    """Validate d2t (and t2d, when there is one); return the selected target ids ``i + d2t[i]``.

    ``vocab_size`` / ``draft_vocab_size`` None: not checked (a bare mapping file knows
    its vocab only through t2d).
    """
    _check_d2t_shape(d2t, draft_vocab_size, where)
    if t2d is not None:
        vocab_size = _check_t2d_shape(t2d, vocab_size, where)
    selected = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)
    _check_selected(selected, vocab_size, where)
    if t2d is not None:
        _check_t2d_marks(t2d, selected, where)
    return selected


def mapping_from_selected(selected_ids: Sequence[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t and t2d for a set of target token ids (sorted ascending, as SpecForge does)."""
    selected = torch.as_tensor(sorted(set(int(i) for i in selected_ids)), dtype=torch.int64)
    d2t = selected - torch.arange(selected.numel(), dtype=torch.int64)
    check_mapping(d2t, vocab_size, selected.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return d2t, t2d


# ----------------------------------------------------------------------------- mappings


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


def save_tensor_file(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Tensors + JSON metadata (under the ``eaglekb`` key) as one safetensors file, written atomically."""
    return atomic_save_safetensors(path, tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True, default=str)})


def read_tensor_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """All tensors and the JSON metadata of a file written by ``save_tensor_file``."""
    p = Path(path)
    _, raw = safetensors_keys(p)
    tensors = read_safetensors(p)
    meta: dict[str, Any] = {}
    if META_KEY in raw:
        try:
            meta = json.loads(raw[META_KEY])
        except ValueError:
            raise SchemaError("metadata is not JSON", where=f"{p}:{META_KEY}") from None
    return tensors, meta


def save_mapping(path: str | Path, mapping: Mapping, *, with_counts: bool = True) -> Path:
    """Write ``{d2t, t2d[, counts]}`` + metadata as one safetensors file, atomically."""
    tensors = {"d2t": mapping.d2t.to(torch.int64).contiguous(), "t2d": mapping.t2d.contiguous()}
    meta = {"format": MAPPING_FORMAT, "version": FORMAT_VERSION, **mapping.meta,
            "vocab_size": mapping.vocab_size, "draft_vocab_size": mapping.draft_vocab_size}
    if with_counts and mapping.counts is not None:
        tensors["counts"] = mapping.counts.counts.to(torch.int64).contiguous()
        meta["counts_meta"] = mapping.counts.meta
    return save_tensor_file(path, tensors, meta)


def load_mapping(path: str | Path) -> Mapping:
    """A mapping from an eaglekb mapping file, a drafter folder, SpecForge's ``.pt`` or speculators' ``.npy``."""
    p = Path(path)
    if not p.exists():
        raise MissingFile("mapping not found", where=str(p),
                          expected="a mapping .safetensors, a drafter folder, a SpecForge vocab_mapping.pt "
                                   "or a folder with d2t.npy/t2d.npy")
    if p.is_dir() and (p / "config.json").is_file():
        return mapping_from_drafter(p)
    if p.is_dir() and (p / "d2t.npy").is_file():
        return _mapping_from_npy(p)
    if p.suffix in (".pt", ".pth"):
        return _mapping_from_pt(p)
    return _mapping_from_file(p)


def _mapping_from_npy(p: Path) -> Mapping:
    import numpy as np

    try:
        d2t = torch.from_numpy(np.load(p / "d2t.npy", allow_pickle=False))
        t2d = torch.from_numpy(np.load(p / "t2d.npy", allow_pickle=False)) if (p / "t2d.npy").is_file() else None
    except (ValueError, OSError) as exc:
        raise IntegrityError("unreadable .npy mapping", where=str(p), found=str(exc)[:160]) from None
    selected = check_mapping(d2t, None, None, t2d, str(p))
    vocab = int(t2d.numel()) if t2d is not None else int(selected.max()) + 1
    return Mapping(d2t.to(torch.int64), vocab, source=str(p), meta={"origin": "speculators d2t.npy/t2d.npy"})


def _mapping_from_pt(p: Path) -> Mapping:
    try:
        doc = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise IntegrityError("unreadable .pt mapping (only tensors are loaded, no pickle)", where=str(p),
                             found=first_line(exc, 160)) from None
    if not isinstance(doc, dict) or "d2t" not in doc:
        raise SchemaError("not a vocab mapping", where=str(p), expected="a dict with d2t and t2d",
                          found=type(doc).__name__)
    d2t, t2d = torch.as_tensor(doc["d2t"]), (torch.as_tensor(doc["t2d"]) if "t2d" in doc else None)
    check_mapping(d2t, None, None, t2d, str(p))
    if t2d is None:
        raise SchemaError("mapping has no t2d: the target vocab size is unknown", where=str(p),
                          expected="d2t and t2d", found="d2t only")
    return Mapping(d2t.to(torch.int64), int(t2d.numel()), source=str(p), meta={"origin": "SpecForge .pt"})


def _mapping_from_file(p: Path) -> Mapping:
    tensors, meta = read_tensor_file(p)
    if "d2t" not in tensors:
        raise SchemaError("not a vocab mapping", where=str(p), expected="tensors d2t and t2d",
                          found=", ".join(sorted(tensors)) or "no tensors")
    vocab = meta.get("vocab_size")
    t2d = tensors.get("t2d")
    check_mapping(tensors["d2t"], vocab, None, t2d, str(p))
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


def mapping_from_drafter(folder: str | Path) -> Mapping:
    """The mapping stored in a drafter folder (either format); reads d2t/t2d and the lm_head header only."""
    folder = Path(folder)
    cfg, fmt = read_config(folder)
    found: dict[str, torch.Tensor] = {}
    rows = None
    for file in weight_files(folder):
        heads = tensor_headers(file)
        wanted = [k for k in heads if k in ("d2t", "t2d")]
        if wanted:
            found.update(read_safetensors(file, keys=wanted))
        rows = next((h["shape"][0] for k, h in heads.items() if k.endswith("lm_head.weight")), rows)
    if "d2t" not in found:
        raise SchemaError("drafter has no d2t", where=str(folder), expected="a d2t tensor", found="absent",
                          fix="a drafter without d2t uses the full target vocab; nothing to compare")
    d2t = drafter_d2t(found["d2t"], found.get("t2d"), rows, cfg.vocab_size, cfg.draft_vocab_size, str(folder))
    return Mapping(d2t, cfg.vocab_size, source=str(folder), meta={"origin": f"drafter ({fmt} format)"})


def drafter_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None, lm_head_rows: int | None, vocab_size: int,
                draft_vocab_size: int, where: str) -> torch.Tensor:
    """A drafter's d2t (flat int64), checked against its lm_head rows, its config and its t2d."""
    d2t = d2t.reshape(-1)
    if lm_head_rows is not None and lm_head_rows != d2t.numel():
        raise Incompatible("lm_head rows do not match d2t length", where=f"{where}:lm_head.weight",
                           expected=f"{d2t.numel()} rows (one per d2t entry)", found=f"{lm_head_rows} rows")
    if d2t.numel() != draft_vocab_size:
        raise Incompatible("d2t length does not match draft_vocab_size", where=f"{where}:d2t",
                           expected=str(draft_vocab_size), found=str(d2t.numel()))
    check_mapping(d2t, vocab_size, None, t2d, where)
    return d2t.to(torch.int64)
