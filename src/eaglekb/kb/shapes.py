"""The draft shape a bench sweep measured best, read back from its record (``--shape-from bench/NAME``).

Owns ``best_shape``: a bench record's best sweep point (steps, topk, draft tokens), checked to be a point that
paid and to belong to the prompt set and drafter it is about to be used with. A command that names the record
keeps its meaning (a record is not rewritten), so choosing the shape by measurement never changes what an older
command runs. Knows nothing about the task runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglekb.io.errors import BadInput, MissingFile
from eaglekb.kb import baselines
from eaglekb.measure import provenance as _prov


def best_shape(ref: str, *, prompts: str | None = None, drafter: str | None = None, device: str | None = None,
               option: str = "--shape-from") -> dict[str, Any]:
    """``bench/NAME`` (or NAME) -> {"steps", "topk", "draft_tokens", "from", "prompts"}: its best point.

    Refused in one line: no such record, a record without a best point (no sweep of the engine, or none that
    paid), another prompt set than ``prompts``, another drafter than ``drafter`` or another kind of device than
    ``device`` (cpu or cuda; each when given): the best shape on one is not the best on another."""
    bid = "bench/" + str(ref).removeprefix("bench/")
    where = f"{option} {ref}"
    if not baselines.exists(bid):
        raise MissingFile("no bench record of that name", where=where, expected=f"baselines/{bid}.json",
                          fix="record a sweep first: invoke bench --sweep '3,1;5,1;4,4,16' --record NAME")
    b = baselines.load_id(bid)
    best = b.metrics.get("best") if isinstance(b.metrics, dict) else None
    shape = {k: (best or {}).get(f"{k}_count") for k in ("steps", "topk", "draft_tokens")}
    if not best or not all(isinstance(v, int) and v > 0 for v in shape.values()):
        raise BadInput("the record holds no measured best point", where=where,
                       expected="a bench sweep of our engine (metrics.best: steps, topk, draft tokens)",
                       found=", ".join(sorted(b.metrics)) if isinstance(b.metrics, dict) else "no metrics")
    if not (b.config.get("best") or {}).get("pays", True) or best.get("vs_engine_x", 2.0) <= 1.0:
        raise BadInput("the record's best point did not pay", where=where,
                       expected="a best point faster than the engine's plain decoding",
                       found=f"{best.get('vs_engine_x', 0):.2f}x the engine")
    recorded = str(b.config.get("prompts"))
    if prompts is not None and str(prompts) != recorded:
        raise BadInput("the shape was chosen on another prompt set", where=where,
                       expected=f"--prompts {recorded} (a shape is chosen per prompt set)", found=f"--prompts {prompts}")
    theirs = str(b.config.get("device") or "cpu").split(":")[0]
    if device is not None and str(device).split(":")[0] != theirs:
        raise BadInput("the shape was measured on another kind of device", where=where,
                       expected=f"--device {theirs} (the best shape differs between a CPU and a GPU)",
                       found=f"--device {device}")
    if drafter is not None and not _same_drafter(b, str(drafter)):
        raise BadInput("the shape was measured with another drafter", where=where,
                       expected=f"--drafter {b.config.get('drafter')} (or a folder holding the same files)",
                       found=f"--drafter {drafter}")
    stop = (best or {}).get("min_draft_prob_frac", 0.0)  # a chain the best point ended on a draft probability
    return dict(shape, **{"from": bid, "prompts": recorded, "min_draft_prob": stop})


def _same_drafter(b: baselines.Baseline, drafter: str) -> bool:
    """The record's drafter and DRAFTER hold the same files (by the sha256 the record stores); by path where the
    record stores none."""
    recorded = [e for e in (b.provenance.inputs or {}).values() if e.role == "drafter"]
    mine = _prov.input_identity("drafter", drafter, baselines.find_root()).get("sha256")
    if recorded and recorded[0].sha256 and mine:
        return recorded[0].sha256 == mine
    theirs = b.config.get("drafter")
    return not theirs or Path(drafter).resolve() == Path(str(theirs)).resolve()
