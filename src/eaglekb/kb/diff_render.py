"""Renderings of a baselines diff: a pull-request comment (Markdown), terminal text, one JSON document.

Owns: turning an ``eaglekb.kb.diff.DiffReport`` into text: flag marks, number and
value formatting, the per-baseline Markdown tables with folded details. Knows
nothing about git, the schema or how changes were judged (``eaglekb.kb.diff``
decides that), nor about the task runner.
"""

from __future__ import annotations

import json
from typing import Any

from eaglekb.kb.diff import BaselineChange, DiffReport, SeriesChange, ValueChange

FLAG_MARK = {"regression": "⚠️ regression", "improvement": "✅ improvement",
             "changed": "🔶 changed", "within-noise": "within noise"}


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.6g}"


def _val(v: Any, width: int = 60) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(v: Any) -> str:
    return "`" + _val(v).replace("|", "\\|").replace("`", "'") + "`"


def _code(text: Any) -> str:
    """Text from a file (a parse error quoting it, a path) as a code span: rendered as text, never as HTML."""
    return "`" + " ".join(str(text).replace("`", "'").split()) + "`"


def _rel(r: float | None) -> str:
    return "–" if r is None else f"{r * 100:+.2f}%"


def _value_rows(items: list[ValueChange]) -> list[str]:
    rows = ["| key | old | new |", "|---|---|---|"]
    for c in items:
        old = "*(absent)*" if c.change == "added" else _cell(c.old)
        new = "*(absent)*" if c.change == "removed" else _cell(c.new)
        rows.append(f"| `{c.path}` | {old} | {new} |")
    return rows


def _details(title: str, items: list[ValueChange]) -> list[str]:
    if not items:
        return []
    return ["", f"<details><summary>{title} ({len(items)})</summary>", "", *_value_rows(items), "", "</details>"]


def _heading(c: BaselineChange) -> str:
    if c.status == "renamed":
        return f"### `{c.old_path}` → `{c.new_path}` (renamed)"
    flags = [FLAG_MARK[f] for f in ("regression", "improvement", "changed") if c.count(f)]
    return f"### `{c.id}` ({c.status})" + (" — " + ", ".join(flags) if flags else "")


def to_markdown(report: DiffReport) -> str:
    """A pull-request comment: summary, one table per changed baseline, details folded."""
    out = [f"## Baselines diff: {report.label('a')} → {report.label('b')}", "",
           f"**{report.count('regression')} regression(s) ⚠️, {report.count('improvement')} improvement(s) ✅"
           + (f", {report.count('changed')} other change(s) beyond noise 🔶" if report.count("changed") else "")
           + f"** — baselines: {report.tally()}"]
    if report.threshold_rel is not None:
        out.append(f"\nFlagged when |Δ| > {report.threshold_rel * 100:g}% of the old value (--threshold).")
    else:
        out.append("\nFlagged when |Δ| exceeds the noise the baseline records (max of tolerances and spread).")
    if report.problems:
        out += ["", "### Unreadable baselines", ""]
        out += [f"- **{_code(p.revision)}** {_code(p.path)}: {_code(p.error)}" for p in report.problems]
    for c in report.changes:
        out += ["", _heading(c)]
        if c.metrics:
            out += ["", "| metric | old | new | Δ | Δ% | noise ± | |", "|---|---:|---:|---:|---:|---:|---|"]
            out += [f"| `{m.path}` | {_num(m.old)} | {_num(m.new)} | {m.delta:+.4g} | {_rel(m.rel)} "
                    f"| {_num(m.allowed)} | {FLAG_MARK[m.flag]} |" for m in c.metrics]
        for title, values in (("Metrics added", c.metrics_added), ("Metrics removed", c.metrics_removed)):
            if values and c.status in ("added", "removed"):
                out += ["", "| metric | value |", "|---|---:|", *(f"| `{p}` | {_num(v)} |" for p, v in values.items())]
            elif values:
                out += ["", f"{title}: " + ", ".join(f"`{p}` = {_num(v)}" for p, v in values.items())]
        for s in c.series:
            out += ["", f"Series `{s.name}`: {_series_text(s)}"]
        if c.status in ("changed", "renamed") and not (c.metrics or c.metrics_added or c.metrics_removed):
            out += ["", f"Metrics unchanged ({c.metrics_unchanged})."]
        out += _details("Config changes", c.config) if c.status in ("changed", "renamed") else \
            _details("Config", c.config)
        out += _details("Environment and provenance changes", c.environment)
        out += _details("Noise, direction and description changes", c.other)
    return "\n".join(out) + "\n"


def _series_text(s: SeriesChange) -> str:
    if s.change != "changed":
        return f"{s.change} ({s.points_new or s.points_old} points)"
    parts = [f"{s.points_changed} point(s) changed"]
    if s.max_abs_change is not None:
        parts.append(f"max |Δ| {s.max_abs_change:.4g} at {s.x} {s.max_at}")
    if s.points_added or s.points_removed:
        parts.append(f"{s.points_added} added, {s.points_removed} removed")
    return "; ".join(parts + s.notes)


def to_text(report: DiffReport) -> str:
    """Plain lines for a terminal."""
    lines = [report.summary()]
    lines += [f"unreadable: {p.line()}" for p in report.problems]
    for c in report.changes:
        lines.append(f"{c.status}: {c.old_path} → {c.new_path}" if c.status == "renamed" else f"{c.status}: {c.id}")
        for m in c.metrics:
            lines.append(f"  {m.path}: {_num(m.old)} → {_num(m.new)} ({m.delta:+.4g}, {_rel(m.rel)}; "
                         f"noise ±{_num(m.allowed)}) {m.flag}")
        lines += [f"  metric added {p} = {_num(v)}" for p, v in c.metrics_added.items()]
        lines += [f"  metric removed {p} = {_num(v)}" for p, v in c.metrics_removed.items()]
        lines += [f"  series {s.name}: {_series_text(s)}" for s in c.series]
        for title, items in (("config", c.config), ("env", c.environment), ("other", c.other)):
            if c.status in ("changed", "renamed"):
                lines += [f"  {title} {v.path}: {_val(v.old, 40)} → {_val(v.new, 40)}" if v.change == "changed"
                          else f"  {title} {v.path} {v.change}: {_val(v.new if v.change == 'added' else v.old, 40)}"
                          for v in items]
    return "\n".join(lines)


def to_json(report: DiffReport) -> dict[str, Any]:
    """The report as one JSON-ready document (with the summary and flag counts)."""
    doc = report.model_dump(mode="json")
    doc["summary"] = report.summary()
    doc["counts"] = {f: report.count(f) for f in ("regression", "improvement", "changed", "within-noise")}
    return doc
