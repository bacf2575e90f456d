"""Render baselines as Markdown and SVG for the site, llms-full.txt and PR comments.

Owns: turning ``Baseline`` objects into Markdown tables (metrics, provenance,
noise), formatted single values, and SVG plots (matplotlib, no JavaScript,
stable output), and ``safe`` / ``code``: every string that comes from data (a
baseline's summary, config, provenance, citation; a finding's text) is written
with the characters HTML or Markdown would act on as character references, on one
line, cut at ``MAX_TEXT`` characters, so that a ``<script>`` or a Markdown link in
a baseline shows as text and never runs. Tables stop at ``MAX_ROWS`` rows and plots
draw at most ``MAX_POINTS`` points, so a huge baseline cannot blow up the site.
Knows nothing about MkDocs: the docs hooks call these functions and decide where
the text goes.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any, Iterable

from eaglekb.io.errors import DocsError
from eaglekb.io.files import flatten
from eaglekb.kb.schema import KINDS, NAME_RULES, SCHEMA_VERSION, UNITS, Baseline, direction, json_schema, unit_of
from eaglekb.measure.viability import expected_accept_len


#: Longest data string shown (the rest is cut, with a note); rows per table; points per plotted curve.
MAX_TEXT = 300
MAX_ROWS = 400
MAX_POINTS = 2000
#: Characters that HTML or Markdown act on (tags, entities, emphasis, links and images, code spans, table
#: cells, attribute lists and docs placeholders ``{...}``, backslash escapes). An underscore is left as it
#: is: Python-Markdown does not emphasise inside words, and metric names stay searchable in the HTML.
_ACTIVE = frozenset("&<>\"'`*{}[]()#|!~$\\")  # not "_": metric names stay searchable text


def safe(value: Any, limit: int = MAX_TEXT) -> str:
    """Data text for a Markdown page: one line, at most ``limit`` characters (then a note), and every
    character that HTML or Markdown would act on written as a character reference (shown as itself)."""
    text = "null" if value is None else str(value)
    cut = len(text) - limit if len(text) > limit else 0
    text = text[:limit] if cut else text
    out = "".join(f"&#{ord(ch)};" if ch in _ACTIVE else (" " if ch in "\r\n\t\x0b\x0c\x85\u2028\u2029" else
                                                        "\ufffd" if ord(ch) < 32 or ord(ch) == 127 else ch)
                  for ch in text)
    return out + (f" … ({cut:,} more characters in the JSON file)" if cut else "")


def code(value: Any, limit: int = MAX_TEXT) -> str:
    """Data text in a code font (``<code>``, not backticks: a backtick in the data cannot end it)."""
    return f"<code>{safe(value, limit)}</code>"


def _capped(rows: list[str], total: int) -> list[str]:
    """Table rows, with one closing row saying how many more the JSON file holds."""
    if total <= MAX_ROWS:
        return rows
    return rows[:MAX_ROWS] + [f"| … {total - MAX_ROWS:,} more rows: see the JSON file |" + " |" * (rows[0].count("|") - 2)]


def fmt(value: float, unit: str | None = None) -> str:
    """A number as the site shows it: integers plain, others to 4 significant digits (from 1,000 on, whole and
    grouped: 75,812, never 7.581e+04)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 100):
        text = f"{int(value):,}"
    elif abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif unit == "_frac":
        text = f"{value:.4f}"
    else:
        text = f"{value:.4g}"
    return text


def metric_value(baseline: Baseline, path: str) -> float:
    flat = flatten(baseline.metrics)
    if path.startswith("metrics."):
        path = path[len("metrics."):]
    if path not in flat:
        raise DocsError(
            "metric not found",
            where=f"{baseline.id}",
            expected="one of " + ", ".join(sorted(flat)),
            found=path,
        )
    return flat[path]


def metric_text(baseline: Baseline, path: str) -> str:
    value = metric_value(baseline, path)
    path = path.removeprefix("metrics.")
    unit = unit_of(path.rsplit(".", 1)[-1])
    spread = baseline.noise.spread.get(path)
    text = fmt(value, unit)
    if unit == "_frac":
        text = f"{100 * value:.1f}%"
    if spread:
        text += f" ±{fmt(spread / 2, unit)}" if baseline.noise.spread_kind == "reported-range" else f" (spread {fmt(spread, unit)})"
    return text


def config_text(baseline: Baseline, path: str, where: str) -> str:
    """One config value of a baseline as the site shows it (a number, a string, a list of numbers)."""
    node = baseline.config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise DocsError("config field not found", where=where, expected="a dotted path into the baseline's "
                               "config", found=path)
        node = node[part]
    if isinstance(node, list) and all(isinstance(v, (int, float)) for v in node):
        return ", ".join(fmt(v) for v in node)
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return fmt(node)
    if isinstance(node, str):
        return node
    raise DocsError("config field is not a value", where=where, expected="a number, a string or a list of "
                       "numbers", found=type(node).__name__)


def _unit_label(path: str) -> str:
    unit = unit_of(path.rsplit(".", 1)[-1])
    return UNITS[unit][0] if unit else ""


def metrics_table(baseline: Baseline) -> str:
    head = ["| metric | value | unit | better | spread | tolerance |", "|---|---|---|---|---|---|"]
    rows: list[str] = []
    flat = flatten(baseline.metrics)
    for path, value in list(flat.items())[:MAX_ROWS + 1]:
        unit = unit_of(path.rsplit(".", 1)[-1])
        spread = baseline.noise.spread.get(path)
        tol = baseline.noise.tolerance_abs.get(path)
        tol_text = fmt(tol, unit) if tol is not None else f"{100 * baseline.noise.tolerance_rel:g}% rel"
        rows.append(
            f"| {code(path)} | {fmt(value, unit)} | {_unit_label(path)} | {direction(baseline, path)} | "
            f"{fmt(spread, unit) if spread is not None else '-'} | {tol_text} |"
        )
    return "\n".join(head + _capped(rows, len(flat)))


def _flat_any(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        out: list[tuple[str, Any]] = []
        for k in sorted(obj):
            out.extend(_flat_any(obj[k], f"{prefix}{k}."))
        return out
    return [(prefix.rstrip("."), obj)]


def _cell(value: Any) -> str:
    return safe(value)


def kv_table(data: dict[str, Any], head: tuple[str, str] = ("field", "value")) -> str:
    pairs = _flat_any(data)
    rows = [f"| {code(k, 120)} | {_cell(v)} |" for k, v in pairs[:MAX_ROWS + 1]]
    return "\n".join([f"| {head[0]} | {head[1]} |", "|---|---|"] + _capped(rows, len(pairs)))


def host_text(host: Any) -> str:
    """A provenance host in one line; a part the capture could not read is said to be unrecorded
    (an H200 machine's CPU model was not readable there: "16 cores, CPU model not recorded")."""
    cores = f"{host.cpu_count} cores" if host.cpu_count else "core count not recorded"
    cpu = f"{host.cpu} ({cores})" if host.cpu else f"{cores}, CPU model not recorded"
    gpus = ", ".join(str(g.get("name", "?")) for g in host.gpus[:16]) or "none"
    load = (f"; load {' / '.join(f'{x:g}' for x in host.load_avg)} (1 / 5 / 15 min, the run's own threads included)"
            if host.load_avg else "")
    return (f"{cpu}; GPUs: {gpus}" + (f"; driver {host.gpu_driver}" if host.gpu_driver else "")
            + (f"; CUDA {host.cuda}" if host.cuda else "") + load)


def measured_system(baseline: Baseline) -> str | None:
    """The system a recorded (copied) result was measured on, from its config (target, serving, engine)
    or its citation; None for a result measured by a runbook (its provenance host measured it)."""
    if baseline.source != "recorded":
        return None
    parts = [str(baseline.config[k]) for k in ("target", "serving", "engine", "system")
             if isinstance(baseline.config.get(k), str)]
    return "; ".join(parts) or (f"as described in {baseline.citation.document}" if baseline.citation else None)


def inputs_lines(baseline: Baseline) -> list[str]:
    """One list item per input the run read: its path and sha256 (or why it is unknown), and how it was known."""
    lines = []
    for key, e in sorted((baseline.provenance.inputs or {}).items())[:MAX_ROWS]:
        ident = f"sha256 {code(e.sha256)}" if e.sha256 else f"sha256 unknown: {safe(e.unknown, 1000)}"
        how = f" ({safe(e.basis, 1000)})" if e.basis else ""
        lines.append(f"    - {code(key)} = {code(e.path, 1000)} ({safe(e.role)}): {ident}{how}")
    return lines


def provenance_block(baseline: Baseline) -> str:
    p = baseline.provenance
    system = measured_system(baseline)
    host = ([f"- **measured on**: {safe(system, 1000)} (the cited report's system)",
             f"- **copied on**: {safe(host_text(p.host), 1000)} (the machine that recorded the report's numbers "
             "into this file; it measured nothing)"] if system else
            [f"- **host**: {safe(host_text(p.host), 1000)}"])
    inputs = inputs_lines(baseline)
    lines = [
        *([f"- **reproduce**: {code(p.reproduce, 1000)}"] if p.reproduce else []),
        f"- **command**: {code(p.command, 1000)}" + (" (the command that recorded it)" if p.reproduce else ""),
        *(["- **inputs** (identity by content):", *inputs] if inputs else []),
        f"- **git**: {code(p.git_commit or 'unknown')}" + (" (dirty)" if p.git_dirty else ""),
        *host,
        "- **versions**: " + safe(", ".join(f"{k} {v}" for k, v in sorted(p.versions.items()) if v), 2000),
        f"- **created**: {safe(baseline.created_at)}",
    ]
    if p.env:
        lines.append("- **environment**: " + ", ".join(code(f"{k}={v}") for k, v in sorted(p.env.items())[:MAX_ROWS]))
    return "\n".join(lines)


def baseline_page(baseline: Baseline, plots: Iterable[str] = (), superseded_by: str | None = None) -> str:
    """The whole Markdown page of one baseline; SUPERSEDED_BY (its own mark, or the newer result on its setup)
    is shown at the top."""
    parts = [f"# {baseline.id}", ""]
    if superseded_by:
        parts += ['!!! warning "Superseded: not a current result"', f"    {safe(superseded_by, 1000)}", ""]
    if baseline.summary:
        parts += [f"**{safe(baseline.summary, 1000)}**", ""]
    if baseline.source == "recorded" and baseline.citation:
        c = baseline.citation
        cite = c.document + (f", {c.section}" if c.section else "") + (f" ({c.url})" if c.url else "")
        parts += [
            '!!! quote "Recorded from an external report, not measured here"',
            f"    {safe(cite, 1000)}." + (f" {safe(c.note, 1000)}." if c.note else ""),
            "",
        ]
    else:
        p = baseline.provenance
        parts += ['!!! success "Measured by a runbook"',
                  f"    Reproduce (reruns it and compares, records nothing): {code(p.reproduce or p.command, 1000)}", "",
                  f"    Recorded with: {code(p.command, 1000)}", ""]
    plots = list(plots)
    if plots:  # curves first: a long metric table would push them out of sight
        parts += ["## Plots", ""] + [line for rel in plots for line in (f"![{baseline.id}]({rel})", "")]
    parts += ["## Metrics", "", metrics_table(baseline), ""]
    parts += [
        "## Noise",
        "",
        f"{baseline.noise.repeats} repeat(s); spread is {safe(baseline.noise.spread_kind)}; relative tolerance "
        f"{100 * baseline.noise.tolerance_rel:g}%.",
        "",
        "## Config",
        "",
        kv_table(baseline.config),
        "",
        "## Provenance",
        "",
        provenance_block(baseline),
        "",
        f"Source file: `baselines/{baseline.kind}/{baseline.name}.json` (schema v{baseline.schema_version}).",
        "",
    ]
    return "\n".join(parts)


def index_table(baselines: dict[str, Baseline], link: Any = None) -> str:
    rows = ["| baseline | source | summary | created |", "|---|---|---|---|"]
    for bid in sorted(baselines):
        b = baselines[bid]
        name = f"[{bid}]({link(bid)})" if link else f"`{bid}`"
        rows.append(f"| {name} | {b.source} | {safe(b.summary or '', 200)} | {safe(b.created_at[:10])} |")
    return "\n".join(rows)


def schema_reference() -> str:
    """The baseline schema reference (kinds, units, better direction, the JSON Schema), as Markdown."""
    units = "\n".join(f"| `{u}` | {desc} | {better} |" for u, (desc, better) in UNITS.items())
    kinds = "\n".join(f"| `{k}` | {desc} |" for k, desc in KINDS.items())
    schema = json.dumps(json_schema(), indent=2, sort_keys=True)
    return (
        f"### Kinds\n\n| kind | holds |\n|---|---|\n{kinds}\n\n"
        f"### Metric units\n\nEvery metric name ends in one of these suffixes.\n\n"
        f"| suffix | unit | better by default |\n|---|---|---|\n{units}\n\n"
        "### Better direction\n\nA baseline's `better` map decides; otherwise the first of these words found in the "
        "metric's dotted path, in this order; otherwise the unit's default above.\n\n"
        "| word | better |\n|---|---|\n" + "\n".join(f"| `{w}` | {d} |" for w, d in NAME_RULES) + "\n\n"
        f"### JSON Schema (v{SCHEMA_VERSION})\n\n```json\n{schema}\n```\n"
    )


# --------------------------------------------------------------------------- plots


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    # Matplotlib names clip paths with random ids: fix them for stable, diffable output.
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "eaglekb"
    matplotlib.rcParams["text.parse_math"] = False  # labels come from data: "$" is a dollar, not TeX
    import matplotlib.pyplot as plt

    return plt


def _thin(xs: list[str]) -> list[str]:
    """At most ``MAX_POINTS`` evenly spaced x values (the last one kept): a long curve stays a small SVG."""
    if len(xs) <= MAX_POINTS:
        return xs
    step = -(-len(xs) // MAX_POINTS)
    return xs[::step] + ([xs[-1]] if (len(xs) - 1) % step else [])


def series_svg(baseline: Baseline, name: str) -> str:
    """A line plot of one series of a baseline."""
    series = baseline.series[name]
    plt = _pyplot()
    xs = _thin(sorted(series.points, key=lambda k: float(k)))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([float(x) for x in xs], [series.points[x] for x in xs], marker=".")
    ax.set_xlabel(series.x)
    ax.set_ylabel(f"{name} ({UNITS[series.unit][0]})")
    ax.set_title(f"{baseline.id}: {name}")
    ax.grid(alpha=0.3)
    return _svg(fig)


def overlay_svg(baselines: list[Baseline], name: str) -> str:
    """One series of several baselines on one set of axes (for example the arms of a comparison)."""
    missing = [b.id for b in baselines if name not in b.series]
    if missing:
        raise DocsError("no such series", where=", ".join(missing), expected=name,
                       found="series: " + ", ".join(sorted(baselines[0].series)))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for b in baselines:
        pts = b.series[name].points
        xs = _thin(sorted(pts, key=lambda k: float(k)))
        ax.plot([float(x) for x in xs], [pts[x] for x in xs], marker="." if len(xs) < 40 else None,
                linewidth=1.2, label=b.name)
    first = baselines[0].series[name]
    ax.set_xlabel(first.x)
    ax.set_ylabel(f"{name} ({UNITS[first.unit][0]})")
    ax.set_title(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def viability_svg(baseline: Baseline, max_steps: int = 7) -> str:
    """Accept length against per-step acceptance for chains of 1..max_steps, with break-even
    and the plan's accept length: the finite-chain ceiling made visible."""
    cfg = baseline.config
    breakeven = metric_value(baseline, "breakeven_len")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ps = [i / 200 for i in range(200)]
    for k in range(1, max_steps + 1):
        style = "-" if k == cfg.get("steps") else ":"
        ax.plot(ps, [expected_accept_len(p, k) for p in ps], style, label=f"{k} steps", linewidth=2 if style == "-" else 1)
    ax.plot(ps[:-20], [expected_accept_len(p, None) for p in ps[:-20]], "k--", linewidth=1, label="1/(1-p), unbounded")
    ax.axhline(breakeven, color="red", linewidth=1)
    ax.annotate(f"break-even {breakeven:.2f}", (0.02, breakeven), color="red", va="bottom")
    for t in cfg.get("targets") or []:
        need = t * cfg["cycle_ms"] / 1000
        ax.axhline(need, color="gray", linewidth=0.8, linestyle="-.")
        ax.annotate(f"{t:g} tok/s needs {need:.2f}", (0.02, need), color="gray", va="bottom", fontsize=8)
    if cfg.get("accept_len"):
        ax.axhline(cfg["accept_len"], color="green", linewidth=1)
        ax.annotate(f"measured {cfg['accept_len']:g}", (0.55, cfg["accept_len"]), color="green", va="top")
    ax.set_ylim(1, max(8.0, breakeven + 1))
    ax.set_xlim(0, 1)
    ax.set_xlabel("per-step acceptance p")
    ax.set_ylabel("accept length (tokens / cycle)")
    ax.set_title(f"{baseline.id}: the chain ceiling is steps + 1")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return _svg(fig)


def bars_svg(items: list[tuple[str, float, float | None]], ylabel: str, title: str, line: tuple[str, float] | None = None) -> str:
    """A bar chart of (label, value, spread) items, with an optional reference line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = [i[0] for i in items]
    values = [i[1] for i in items]
    errs = [(i[2] or 0) / 2 for i in items]
    ax.bar(range(len(items)), values, yerr=errs, capsize=4, color="#4a6fa5")
    ax.set_xticks(range(len(items)), labels, rotation=15, ha="right", fontsize=8)
    for i, v in enumerate(values):
        ax.annotate(f"{v:g}", (i, v), ha="center", va="bottom", fontsize=8)
    if line:
        ax.axhline(line[1], color="red", linewidth=1)
        ax.annotate(line[0], (len(items) - 0.5, line[1]), color="red", ha="right", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if not all(math.isfinite(v) for v in values):
        raise DocsError("plot value is not finite", where=title, found=str(values))
    return _svg(fig)
