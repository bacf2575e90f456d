"""Two EAGLE-3 drafter checkpoints side by side, ending in a one-line verdict.

Owns: ``compare_checkpoints`` (config and tensors of both, keys only one side has, shape
and dtype differences, the overlap of the two d2t mappings, and the verdict: drop-in
compatible, compatible after remap, or incompatible with the reasons) and
``render_comparison``. Each side is read by ``eaglekb.formats.inspect`` (headers and
d2t/t2d only); the mapping overlap comes from ``eaglekb.formats.mapping_compare``.

Knows nothing about the torch module, targets, training or the task runner.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglekb.formats.drafter import REQUIRED_KEYS
from eaglekb.formats.inspect import inspect_with_mapping
from eaglekb.formats.mapping import Mapping
from eaglekb.formats.mapping_compare import compare_mappings
from eaglekb.io.errors import EaglekbError


def compare_checkpoints(a: str | Path, b: str | Path) -> dict:
    """Side-by-side report of two drafter folders ending in a one-line verdict."""
    (ra, sa), (rb, sb) = inspect_with_mapping(a), inspect_with_mapping(b)
    ca, cb = ra["config"], rb["config"]
    config = {k: {"a": ca.get(k), "b": cb.get(k), "same": ca.get(k) == cb.get(k)}
              for k in sorted(set(ca) | set(cb))}
    tensors, only_a, only_b = _tensor_table(_canonical(ra), _canonical(rb))
    shape_diff = [n for n, t in tensors.items() if t["a"] and t["b"] and not t["same_shape"]]
    dtype_diff = [n for n, t in tensors.items() if t["a"] and t["b"] and not t["same_dtype"]]
    mapping = _mapping_overlap(sa, sb, ca.get("vocab_size"), cb.get("vocab_size"))
    why = _incompatibilities(ra, rb, shape_diff, only_a + only_b)
    notes = []
    if only_a or only_b:
        notes.append(f"keys only in A: {only_a or 'none'}; only in B: {only_b or 'none'}")
    if dtype_diff:
        notes.append(f"dtypes differ for {len(dtype_diff)} tensors")
    if ca.get("aux_layer_ids") != cb.get("aux_layer_ids"):
        notes.append(f"aux layer ids differ: {ca.get('aux_layer_ids')} vs {cb.get('aux_layer_ids')} "
                     "(each drafter carries its own; check the target serves both)")
    return {
        "a": {"path": ra["path"], "format": ra["format"], "errors": ra["errors"], "params": ra["params"]},
        "b": {"path": rb["path"], "format": rb["format"], "errors": rb["errors"], "params": rb["params"]},
        "config": config,
        "tensors": tensors,
        "only_a": only_a,
        "only_b": only_b,
        "shape_differences": shape_diff,
        "dtype_differences": dtype_diff,
        "mapping": mapping,
        "notes": notes,
        "verdict": _verdict(why, mapping, ca, cb),
        "compatible": not why,
    }


def _tensor_table(na: dict[str, dict], nb: dict[str, dict]) -> tuple[dict[str, dict], list[str], list[str]]:
    """Each canonical tensor name with both sides' shape and dtype; the names only A and only B hold."""
    names = sorted(set(na) | set(nb))
    tensors = {}
    for n in names:
        ta, tb = na.get(n), nb.get(n)
        tensors[n] = {
            "a": ta, "b": tb,
            "same_shape": bool(ta and tb and ta["shape"] == tb["shape"]),
            "same_dtype": bool(ta and tb and ta["dtype"] == tb["dtype"]),
        }
    only_a = [n for n in names if n in na and n not in nb]
    only_b = [n for n in names if n in nb and n not in na]
    return tensors, only_a, only_b


def _incompatibilities(ra: dict, rb: dict, shape_diff: list[str], one_sided: list[str]) -> list[str]:
    """Why the two cannot share weights: other target sizes, other shapes, errors, required tensors missing."""
    ca, cb = ra["config"], rb["config"]
    why = []
    for key in ("vocab_size", "hidden_size", "target_hidden_size"):
        if ca.get(key) != cb.get(key):
            why.append(f"{key} {ca.get(key)} vs {cb.get(key)}")
    # A different draft vocab size only changes the mapping-sized tensors: `invoke remap` handles that.
    resized = ca.get("draft_vocab_size") != cb.get("draft_vocab_size")
    shape_diff_left = [n for n in shape_diff if not (resized and n in ("d2t", "lm_head.weight"))]
    if shape_diff_left:
        why.append(f"tensor shapes differ ({', '.join(shape_diff_left[:3])})")
    for label, r in (("A", ra), ("B", rb)):
        if r["errors"]:
            codes = sorted({f["code"] for f in r["findings"] if f["severity"] == "error"})
            why.append(f"{label} has errors ({', '.join(codes)})")
    required_missing = [n for n in one_sided if n in REQUIRED_KEYS and n != "t2d"]
    if required_missing:
        why.append(f"required tensors missing on one side ({', '.join(required_missing)})")
    return why


def _verdict(why: list[str], mapping: dict, ca: dict, cb: dict) -> str:
    if why:
        return "incompatible: " + "; ".join(why)
    if mapping.get("identical"):
        return "drop-in compatible"
    resized = ca.get("draft_vocab_size") != cb.get("draft_vocab_size")
    return ("compatible after remap: " + (
            f"draft vocab {ca.get('draft_vocab_size')} vs {cb.get('draft_vocab_size')}, " if resized else
            "same shapes, but ") + "the d2t mappings differ "
            f"({mapping.get('position_matches')} of {mapping.get('size_a')} positions agree); "
            "lm_head rows must be moved by target token id before reusing weights")


def _canonical(report: dict) -> dict[str, dict]:
    out = {}
    for stored, t in report["tensors"].items():
        canon = stored
        if report["format"] == "speculators" and canon.startswith("layers.0."):
            canon = "midlayer." + canon[len("layers.0."):]
        elif canon.startswith("model."):
            canon = canon[len("model."):]
        out[canon] = t
    return out


def _as_mapping(selected: list[int], vocab: int, label: str) -> Mapping:
    ids = torch.tensor(selected, dtype=torch.int64)
    return Mapping(d2t=ids - torch.arange(ids.numel(), dtype=torch.int64), vocab_size=vocab, source=label)


def _mapping_overlap(sa, sb, vocab_a, vocab_b) -> dict:
    """Overlap of the two mappings, through ``mapping_compare.compare_mappings`` (one implementation)."""
    if sa is None or sb is None or not isinstance(vocab_a, int) or vocab_a != vocab_b:
        return {"available": False}
    try:
        doc = compare_mappings(_as_mapping(sa, vocab_a, "A"), _as_mapping(sb, vocab_a, "B"))
    except (EaglekbError, IndexError, RuntimeError):  # an invalid mapping: inspect's findings say why
        return {"available": False}
    return {
        "available": True,
        "size_a": len(sa),
        "size_b": len(sb),
        "position_matches": doc["position_matches"],
        "position_match_pct": round(doc["position_match_pct"], 2),
        "set_overlap": doc["set_overlap"],
        "jaccard": round(doc["jaccard"], 4),
        "longest_matching_run": doc["longest_matching_run"],
        "shared_shifted": doc["shared_shifted"],
        "identical": doc["identical"],
        "explanation": doc["explanation"],
    }


def render_comparison(report: dict) -> str:
    lines = [f"A: {report['a']['path']} [{report['a']['format']}]",
             f"B: {report['b']['path']} [{report['b']['format']}]", "config:"]
    for k, v in report["config"].items():
        mark = " " if v["same"] else "*"
        lines.append(f" {mark} {k:<26} {str(v['a']):<20} {v['b']}")
    lines.append("tensors:")
    for n, t in report["tensors"].items():
        fa = f"{t['a']['shape']} {t['a']['dtype']}" if t["a"] else "absent"
        fb = f"{t['b']['shape']} {t['b']['dtype']}" if t["b"] else "absent"
        mark = " " if (t["same_shape"] and t["same_dtype"]) else "*"
        lines.append(f" {mark} {n:<42} {fa:<24} {fb}")
    m = report["mapping"]
    if m.get("available"):
        lines.append(f"mapping: {m['position_matches']}/{m['size_a']} positions match "
                     f"({m['position_match_pct']}%), set overlap {m['set_overlap']}, Jaccard {m['jaccard']}")
        if m.get("explanation"):
            lines.append(f"mapping: {m['explanation']}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)
