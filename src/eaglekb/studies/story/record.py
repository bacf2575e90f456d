"""What a story run yields as baselines: plain dicts of baseline fields, for ``eaglekb.kb`` to validate and write.

Owns which baselines a run's story.json yields and their names (``PREFIX-a`` / ``PREFIX-b`` datagen,
``PREFIX-mapping-a-vs-b`` vocab, ``PREFIX-ARM`` finetune and probe, ``PREFIX-verdicts`` plan), the provenance
of the machine that ran it, and the noise of results about retrained drafters. Knows nothing about the
baselines schema or files (the runbook hands these dicts to ``eaglekb.kb.baselines.build`` and ``write``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglekb import __version__, training
from eaglekb.data import datagen
from eaglekb.io.errors import SchemaError
from eaglekb.io.files import flatten
from eaglekb.measure import probe
from eaglekb.measure.provenance import from_device_env
from eaglekb.studies.story.config import MAPPING_NOISE
from eaglekb.studies.story.document import load


def retrained_noise(base: dict, metrics: dict) -> dict:
    """The noise of a result about a drafter that a rerun trains again (not the same file probed twice).

    Measured over three H200 runs of the story: a retrained drafter's accept lengths moved by up to 2.4%,
    validation accuracies by up to 1.6 points (1.3 at step 0), and the details behind them more: per-depth and
    conditional acceptance fractions by up to 0.084, accept-length histogram counts by up to 20 of 455. So
    acceptance values get 5%, percentages 2 points, fractions 0.1 and counts 25% + 10; timing tolerances stay
    as ``base`` has them (a slower machine must show up as not reproduced).
    """
    tol = dict(base.get("tolerance_abs", {}))
    for path, value in flatten(metrics).items():
        if path in tol or path.endswith(("_tok_s", "_ms", "_s", "_x")) or path == "breakeven_len":
            continue
        if path.endswith("_pct"):
            tol[path] = 2.0
        elif path.endswith("_frac"):
            tol[path] = 0.1
        elif path.endswith("_count"):
            tol[path] = 0.25 * abs(float(value)) + 10
    return dict(base, tolerance_rel=max(base.get("tolerance_rel", 0.0), 0.05), tolerance_abs=tol)


def verdict_noise(metrics: dict) -> dict:
    """As a probe's: accept length within 2% (greedy), timing-derived values within 50%."""
    tol = {p: abs(float(v)) * 0.5 + 1e-9 for p, v in flatten(metrics).items()
           if p.endswith(("breakeven_len", "_x"))}
    return {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02, "tolerance_abs": tol}


def _provenance(doc: dict, command: str, commit: str | None) -> dict[str, Any]:
    """The provenance of the machine that ran the story (it has no git checkout: the commit is given)."""
    prov = from_device_env(doc.get("provenance") or doc["env"], command, commit)
    if prov.get("versions", {}).get("eaglekb") is None:
        prov["versions"] = dict(prov.get("versions", {}), eaglekb=__version__)
    return prov


def _run_specs(prefix: str, name: str, r: dict) -> list[dict[str, Any]]:
    """The finetune baseline of one trained drafter, and its probe baseline when it was probed."""
    config = dict(r["config"], device_run_wall_s=r.get("wall_s"), drafter_files=r.get("drafter_files"))
    out = [dict(kind="finetune", name=f"{prefix}-{name}", config=config, metrics=r["metrics"],
                noise=retrained_noise(training.NOISE, r["metrics"]), summary=r["summary"],
                series=r.get("series") or None)]
    if r.get("probe"):
        p = r["probe"]
        pconfig = dict(p["config"], prompts_manifest=p.get("prompts_manifest"), device_run_wall_s=p.get("wall_s"),
                       drafter_arm=name)
        out.append(dict(kind="probe", name=f"{prefix}-{name}", config=pconfig, metrics=p["metrics"],
                        noise=retrained_noise(probe.noise(p["metrics"]), p["metrics"]),
                        summary=f"{name}: {p['summary']}"))
    return out


def _verdict_spec(prefix: str, doc: dict) -> dict[str, Any]:
    """The plan baseline: every probed drafter against break-even at the median measured cycle."""
    basis = doc["verdict_basis"]
    metrics = {k.replace("-", "_"): {m: v[m] for m in ("accept_len", "breakeven_len", "margin_x",
                                                      "predicted_speedup_x")}
               for k, v in doc["verdicts"].items()}
    viable = sorted(k for k, v in doc["verdicts"].items() if v["viable"])
    return dict(
        kind="plan", name=f"{prefix}-verdicts",
        config={"basis": basis, "viable": {k: v["viable"] for k, v in doc["verdicts"].items()},
                "drafters": sorted(doc["verdicts"])},
        metrics=metrics, noise=verdict_noise(metrics),
        summary=f"at {basis['cycle_ms']} ms per cycle and {basis['baseline_tok_s']} tok/s plain decode: "
                + (f"viable: {', '.join(viable)}" if viable else "no drafter is above break-even"))


def baseline_specs(run_dir: str | Path, *, prefix: str, command: str, commit: str | None) -> list[dict[str, Any]]:
    """The baselines a story run yields, as ``eaglekb.kb.baselines.build`` keyword arguments (nothing checked
    or written here): datagen per domain, the mapping comparison, each drafter's training and probe, verdicts.
    """
    doc = load(run_dir)
    try:
        return _specs(doc, prefix, command, commit)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:  # a story.json from elsewhere, incomplete
        raise SchemaError("story document lacks what a finished run records", where=f"{run_dir}/story.json",
                          expected="the fields story.run writes", found=f"{type(exc).__name__}: {exc}"[:200]) from None


def _specs(doc: dict, prefix: str, command: str, commit: str | None) -> list[dict[str, Any]]:
    common = dict(provenance=_provenance(doc, command, commit), created_at=doc["env"].get("time"))
    out = []
    for dom, d in sorted(doc.get("datagen", {}).items()):
        out.append(dict(kind="datagen", name=f"{prefix}-{dom}", config=d["config"], metrics=d["metrics"],
                        noise=datagen.NOISE, summary=d["summary"]))
    if doc.get("mappings"):
        m = doc["mappings"]
        out.append(dict(kind="vocab", name=f"{prefix}-mapping-a-vs-b", config=m["config"], metrics=m["metrics"],
                        noise=MAPPING_NOISE, summary=m["explanation"]))
    for name, r in sorted(doc.get("runs", {}).items()):
        out += _run_specs(prefix, name, r)
    if doc.get("verdicts"):
        out.append(_verdict_spec(prefix, doc))
    return [dict(spec, **common) for spec in out]
