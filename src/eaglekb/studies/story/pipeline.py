"""The story run as named stages, in order: start, data, mappings, Phase 0, Phase 1, verdicts, export.

Owns ``run`` (the order of the stages over one ``RunState``), the verdict stage (``judge``: every probed
drafter against break-even at the median measured cycle time and plain-decode rate, ``verdicts``), the export
stage (the main drafters that fit ``export_max_mib``) and the close of the run. Knows nothing about how each stage
does its work.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any, Callable

from eaglekb.measure import viability
from eaglekb.studies.story.arms import phase0, phase1
from eaglekb.studies.story.config import MAIN_RUNS, StoryConfig
from eaglekb.studies.story.drafters import export_drafters, fit_budget, folder_bytes
from eaglekb.studies.story.stages import RunState, build_mappings, generate_data, start


def verdicts(rows: dict[str, dict], cycle_ms: float, baseline_tok_s: float, steps: int) -> dict[str, dict]:
    """Each drafter's accept length against break-even at one cycle time and plain-decode rate."""
    out = {}
    for k, r in rows.items():
        pr = viability.plan(baseline_tok_s=baseline_tok_s, cycle_ms=cycle_ms,
                            accept_len=max(r["online_accept_len"], 1.0), steps=steps, topk=1)
        out[k] = {"accept_len": round(r["online_accept_len"], 4), "breakeven_len": round(pr.breakeven_len, 4),
                  "margin_x": round(r["online_accept_len"] / pr.breakeven_len, 4), "viable": bool(pr.viable),
                  "predicted_speedup_x": round(pr.speedup_x, 4), "own_cycle_viable": bool(r.get("viable"))}
    return out


def judge(st: RunState) -> None:
    """Stage 4: the verdicts, each probed drafter at the median measured cycle time and plain-decode rate."""
    doc = st.story.doc
    rows = {k: v for k, v in doc["arms"].items() if "online_accept_len" in v}
    if rows:
        cyc = median(r["cycle_ms"] for r in rows.values())
        base = median(r["baseline_tok_s"] for r in rows.values())
        doc["verdict_basis"] = {"cycle_ms": round(cyc, 4), "baseline_tok_s": round(base, 2),
                                "steps": st.cfg.probe_steps, "topk": 1,
                                "what": "median of the probes' measured cycle time and plain-decode rate"}
        doc["verdicts"] = verdicts(rows, cyc, base, st.cfg.probe_steps)
        for k, v in doc["verdicts"].items():
            st.say(f"verdict {k}: accept_len {v['accept_len']:.2f} vs break-even {v['breakeven_len']:.2f} "
                   f"({v['margin_x']:.2f}x): {'viable' if v['viable'] else 'NOT viable'}")
    st.story.save()


def export_main(st: RunState) -> None:
    """Stage 5: the main drafters that fit ``export_max_mib``, most useful first, as pieces in ``out``."""
    t0 = time.perf_counter()
    doc, cfg = st.story.doc, st.cfg
    folders = {k: Path(doc["runs"][k]["drafter"]) for k in MAIN_RUNS if k in doc["runs"]}
    keep = fit_budget({k: folder_bytes(f) for k, f in folders.items()}, int(cfg.export_max_mib * (1 << 20)))
    left = [k for k in folders if k not in keep]
    if left:
        doc["skipped"].append(f"export {', '.join(left)}: over --export-max-mib {cfg.export_max_mib} "
                              "(invoke story.export brings them in another call)")
    doc["drafters_export"] = export_drafters({k: folders[k] for k in keep}, st.out)
    st.story.stage("export_drafters", time.perf_counter() - t0)


def finish(st: RunState) -> dict[str, Any]:
    """Mark the run complete, save, close the progress bar, and log what the output folder holds."""
    st.story.doc["complete"] = True
    st.story.save()
    if st.story.bar is not None:
        st.story.bar.close()
        st.story.bar = None
    sizes = {p.name: p.stat().st_size for p in st.out.iterdir()}
    st.say(f"done in {st.elapsed():.1f} s; {len(sizes)} files under {st.out}: {sizes}")
    return st.story.doc


def run(cfg: StoryConfig, out: str | Path, *, command: str | None = None,
        log: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, Any]:
    """The whole story on one machine; returns the story document also written to ``out/story.json``.

    ``log`` gets one timestamped line per event; ``progress`` adds a bar over the run's stages (log lines
    then go through the bar's writer so they do not break it).
    """
    st = start(cfg, out, command=command, log=log, progress=progress, t_start=time.perf_counter())
    generate_data(st)
    build_mappings(st)
    phase0(st)
    phase1(st)
    judge(st)
    if cfg.export_drafters:
        export_main(st)
    return finish(st)
