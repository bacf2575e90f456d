"""Two draft-vocab mappings side by side: position matches, set overlap, coverage, and why they differ.

Owns: ``coverage`` (the share of a token distribution a mapping holds),
``compare_mappings`` (the comparison document), ``explain`` (one line on why positions
disagree when the sets overlap: the sorted-id shift), ``comparison_metrics`` (the
baseline metric tree, names carrying units) and ``render_comparison``.

Knows nothing about reading mapping files (``eaglekb.formats.mapping``), counting tokens,
drafter weights or the task runner.
"""

from __future__ import annotations

from typing import Any

import torch

from eaglekb.formats.mapping import Mapping, TokenCounts
from eaglekb.io.errors import Incompatible


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


def _positions(a: Mapping, b: Mapping) -> dict[str, Any]:
    """Draft ids where both mappings hold the same target token."""
    sa, sb = a.selected, b.selected
    n = min(sa.numel(), sb.numel())
    same = sa[:n] == sb[:n]
    pos_matches = int(same.sum())
    run, run_start = _longest_run(same)
    first_diff = int((~same).nonzero()[0]) if bool((~same).any()) else None
    doc: dict[str, Any] = {
        "position_matches": pos_matches,
        "positions_compared": n,
        "position_match_pct": 100.0 * pos_matches / max(a.draft_vocab_size, b.draft_vocab_size),
        "longest_matching_run": run,
        "longest_matching_run_start": run_start if run else None,
        "first_mismatch": None,
        "identical": bool(a.draft_vocab_size == b.draft_vocab_size and pos_matches == n),
    }
    if first_diff is not None:
        doc["first_mismatch"] = {"draft_id": first_diff, "a_target_id": int(sa[first_diff]),
                                 "b_target_id": int(sb[first_diff])}
    return doc


def _sets(a: Mapping, b: Mapping) -> dict[str, Any]:
    """Set overlap, and where each shared token sits in A and in B (the shift explains position mismatches)."""
    ta, tb = a.t2d, b.t2d
    inter = int((ta & tb).sum())
    union = int((ta | tb).sum())
    shared = (ta & tb).nonzero().reshape(-1)
    shift = b.positions()[shared] - a.positions()[shared]
    return {
        "set_overlap": inter,
        "only_a": a.draft_vocab_size - inter,
        "only_b": b.draft_vocab_size - inter,
        "jaccard": inter / union if union else 1.0,
        "overlap_pct_of_a": 100.0 * inter / a.draft_vocab_size,
        "shared_same_row": int((shift == 0).sum()),
        "shared_shifted": int((shift != 0).sum()),
        "shift_abs_median_rows": float(shift.abs().float().median()) if shift.numel() else 0.0,
        "shift_abs_max_rows": int(shift.abs().max()) if shift.numel() else 0,
    }


def compare_mappings(a: Mapping, b: Mapping, reference: TokenCounts | None = None,
                     reference_name: str = "reference") -> dict[str, Any]:
    """Position matches, set overlap, Jaccard, coverage and the sorted-id shift of two mappings."""
    if a.vocab_size != b.vocab_size:
        raise Incompatible("mappings are for different target vocab sizes", where=f"{a.source} vs {b.source}",
                           expected=f"the same target vocab ({a.vocab_size})", found=str(b.vocab_size),
                           fix="mappings of different targets cannot be compared or remapped")
    doc: dict[str, Any] = {
        "a": {"source": a.source, "draft_vocab_size": a.draft_vocab_size},
        "b": {"source": b.source, "draft_vocab_size": b.draft_vocab_size},
        "vocab_size": a.vocab_size,
        **_positions(a, b),
        **_sets(a, b),
    }
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
