"""Checks of the pages that state the project's present numbers (home, agents, game plan).

Owns: which pages those are (``PRESENT_PAGES``); finding a hand-typed figure in a page's prose
(``hand_typed_figures``: a decimal number, a number with thousands separators, a number with a unit of
a result or a percent, outside placeholders, code, link targets and HTML attributes; names such as
K2.5, H200 or smollm2-135m are not figures); and whether a placeholder presents a superseded result
as current (``stale``: the baseline is marked superseded, or every row of the current view it
contributes to, or the one that holds the cited metric, has a newer result on its setup).

Findings and the story quote the investigation's recorded numbers and older runs on purpose, through
placeholders: they are not checked here. Knows nothing about MkDocs: the docs hooks call it.
"""

from __future__ import annotations

import re
from typing import Any

from eaglekb.kb.current import rows_of, setup
from eaglekb.kb.knowledge import split_front_matter
from eaglekb.kb.schema import Baseline

#: Pages (docs paths) whose numbers are the project's present state: each figure comes from a baseline.
PRESENT_PAGES = ("index.md", "agents.md", "plan.md")

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_PLACEHOLDER = re.compile(r"\{\{.*?\}\}", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`|<code>.*?</code>", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)|<[^>\n]+>")
_UNIT = r"(?:\s?(?:tok/s|ms|s\b|%|x\b|MB|MiB|GB|GiB|K\b|M\b)|x(?=[\s,.;:)]|$))"
_FIGURE = re.compile(
    r"(?<![\w.\-/])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?=" + _UNIT + r"))(?![\w\-]*[a-zA-Z]\d)"
)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(text: str) -> str:
    """TEXT with front matter, code, placeholders, link targets and HTML tags blanked (line numbers kept)."""
    body = text
    if text.startswith("---"):
        meta_end = re.match(r"\A---\s*\n.*?\n---\s*\n", text, re.S)
        if meta_end:
            body = re.sub(r"[^\n]", " ", meta_end.group(0)) + text[meta_end.end():]
    for pattern in (_FENCE, _PLACEHOLDER, _INLINE_CODE, _LINK_TARGET):
        body = pattern.sub(_blank, body)
    return body


def hand_typed_figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) of every hand-typed figure in TEXT's prose."""
    out = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        for m in _FIGURE.finditer(line):
            out.append((number, m.group(0)))
    return out


def front_matter_texts(text: str, where: str) -> list[tuple[str, str]]:
    """(field, text) of the prose fields in a page's front matter that the site renders (the game plan's
    phase, rule and next steps: their ``why`` and ``title``), for the same check."""
    meta, _ = split_front_matter(text, where)
    out = [(k, meta[k]) for k in ("current_phase", "decision_rule") if isinstance(meta.get(k), str)]
    for i, step in enumerate(meta.get("next_steps") or [], 1):
        if isinstance(step, dict):
            out += [(f"next_steps[{i}].{k}", step[k]) for k in ("title", "why") if isinstance(step.get(k), str)]
    return out


def stale(bid: str, path: str | None, baselines: dict[str, Baseline], rows: list[dict[str, Any]],
          superseded: dict[str, str]) -> str | None:
    """What supersedes the result a placeholder presents (baseline BID, metric PATH or the whole baseline),
    or None when it is current."""
    b = baselines.get(bid)
    if b is None:
        return None
    if b.superseded_by:
        return b.superseded_by
    mine = [r for r in rows if r["baseline"] == bid]
    replaced = {old: r["baseline"] for r in rows for old in r["replaces"]}
    if path:
        holding = [r for r in rows if r["baseline"] == bid and path in r["metrics"]]
        if holding:
            return None
        if any(path in _row_metrics(b, r) for r in rows if bid in r["replaces"]):
            return next(r["baseline"] for r in rows if bid in r["replaces"] and path in _row_metrics(b, r))
    if not mine and bid in replaced:
        return superseded.get(bid) or replaced[bid]
    return None


def _row_metrics(b: Baseline, row: dict[str, Any]) -> set[str]:
    """The metric paths of B that a row of the same setup as ROW holds (ROW holds the newer result's)."""
    return {p for r in rows_of(b) if setup(r) == row["key"] for p in r["metrics"]}
