"""The knowledge base's own records and the index agents read.

Owns: the finding schema (claim, status and the reason for it, scope, evidence as baseline ids,
the commands that reproduce it), the game plan's machine-readable part (current phase, decision
rule, next steps with their commands) and recipes (ordered steps, each a command with the shape of
its output), all read from Markdown front matter; checking that every cited baseline exists; the
machine-readable index of findings, baselines, plan and recipes (``index``, published as
knowledge.json, with site URLs relative to the site root); and the plain text agents read
(``agent_text``: llms.txt and llms-full.txt with relative links and without table padding).
Knows nothing about MkDocs: the docs hooks call it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from eaglekb.io.errors import DocsError, SchemaError
from eaglekb.io.files import flatten
from eaglekb.kb import render
from eaglekb.kb.current import headline as current_headline
from eaglekb.kb.reproduce import allowed_delta, is_timing
from eaglekb.kb.schema import Baseline, direction, unit_of

Status = Literal["open", "confirmed", "refuted", "superseded", "contested"]
STATUSES: tuple[str, ...] = ("open", "confirmed", "refuted", "superseded", "contested")
INDEX_VERSION = 3
_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)
_ID = re.compile(r"^F\d{2}-[a-z0-9-]+$")


def _commands(value: Any) -> list[str]:
    """One command or a list of them, each ``invoke ...`` on one line (what a reader types, in order)."""
    items = [value] if isinstance(value, str) else list(value or [])
    for item in items:
        if not isinstance(item, str) or not item.startswith("invoke ") or "\n" in item or "`" in item:
            raise ValueError(f"not an invoke command: {item!r} (prose belongs in the page body)")
    if not items:
        raise ValueError("at least one command")
    return items


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Finding(Record):
    """One finding: a claim with its status, why it has that status, its scope and evidence."""

    id: str = Field(description="F<NN>-slug, also the page's file name")
    title: str
    claim: str = Field(description="what we hold to be true, in one or two sentences")
    status: Status
    status_reason: str = Field(description="why the status: what settles it, or what is missing to settle it")
    scope: str = Field(description="where the claim holds: system, versions, model sizes")
    evidence: list[str] = Field(min_length=1, description="baseline ids (KIND/NAME)")
    reproduce: list[str] = Field(description="the runbook commands that reproduce this kind of result, in order")
    superseded_by: str | None = None
    headline: str | None = Field(None, description="the finding's headline number in a few words, with "
                                 "placeholders (rendered in llms.txt and knowledge.json)")
    page: str | None = Field(None, description="docs path, filled in when read from a page")

    @field_validator("reproduce", mode="before")
    @classmethod
    def _reproduce_commands(cls, v: Any) -> list[str]:
        return _commands(v)


class PlanStep(Record):
    """One next step of the game plan."""

    title: str
    why: str
    commands: list[str]
    evidence: list[str] = Field(default_factory=list, description="baseline ids the step builds on")

    @field_validator("commands", mode="before")
    @classmethod
    def _step_commands(cls, v: Any) -> list[str]:
        return _commands(v)


class Plan(Record):
    """The game plan's machine-readable part (docs/plan.md front matter)."""

    current_phase: str
    decision_rule: str
    next_steps: list[PlanStep] = Field(min_length=1)


class RecipeStep(Record):
    """One step of a recipe: a command and the shape of what it prints or writes."""

    step: str = Field(description="short name, e.g. vocab.build")
    command: str
    expect: str = Field(description="the shape of the output: lines, files, the baseline it records")
    alternative: str | None = Field(None, description="another command for the same step, e.g. vocab.compare + remap")

    @field_validator("command", "alternative")
    @classmethod
    def _one_command(cls, v: str | None) -> str | None:
        return None if v is None else _commands(v)[0]


class Recipe(Record):
    """An ordered recipe (a how-to page's front matter ``recipe``)."""

    id: str
    title: str
    steps: list[RecipeStep] = Field(min_length=1)
    page: str | None = None


# --------------------------------------------------------------------------- reading pages


def split_front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    match = _FRONT.match(text)
    if not match:
        return {}, text
    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise SchemaError("front matter is not valid YAML", where=where, found=str(exc).splitlines()[0]) from None
    if not isinstance(meta, dict):
        raise SchemaError("front matter is not a mapping", where=where, found=type(meta).__name__)
    return meta, text[match.end():]


def _validated(model: type[Record], data: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise DocsError(f"{model.__name__.lower()} front matter invalid", where=where, expected=f"field {loc} valid",
                        found=first["msg"]) from None


def parse_finding(meta: dict[str, Any], where: str) -> Finding:
    finding = _validated(Finding, {k: v for k, v in meta.items() if k != "page"} | {"page": where}, where)
    if not _ID.match(finding.id):
        raise DocsError("finding id malformed", where=where, expected="F<NN>-slug (e.g. F01-breakeven)", found=finding.id)
    if Path(where).stem != finding.id:
        raise DocsError("finding id does not match its file name", where=where, expected=Path(where).stem, found=finding.id)
    return finding


def load_findings(folder: Path) -> dict[str, Finding]:
    """Every findings/F*.md page's finding, by id."""
    out: dict[str, Finding] = {}
    for path in sorted(folder.glob("F*.md")):
        meta, _ = split_front_matter(path.read_text(encoding="utf-8"), str(path))
        finding = parse_finding(meta, f"findings/{path.name}")
        out[finding.id] = finding
    return out


def load_plan(path: Path) -> Plan:
    """The game plan's front matter (docs/plan.md)."""
    meta, _ = split_front_matter(path.read_text(encoding="utf-8"), str(path))
    return _validated(Plan, meta, path.name)


def load_recipes(docs: Path) -> dict[str, Recipe]:
    """Every page's front matter ``recipe`` under DOCS, by recipe id."""
    out: dict[str, Recipe] = {}
    for path in sorted(docs.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        if not text.startswith("---"):
            continue
        meta, _ = split_front_matter(text, str(path))
        if "recipe" in meta:
            rel = path.relative_to(docs).as_posix()
            recipe = _validated(Recipe, dict(meta["recipe"], page=rel), rel)
            out[recipe.id] = recipe
    return out


def check_evidence(findings: dict[str, Finding], baselines: dict[str, Baseline], plan: Plan | None = None) -> None:
    """Raise DocsError for the first finding or plan step citing a baseline that does not exist."""
    cited = [(f.page or f.id, bid) for f in findings.values() for bid in f.evidence]
    if plan is not None:
        cited += [("plan.md: next_steps", bid) for step in plan.next_steps for bid in step.evidence]
    for where, bid in cited:
        if bid not in baselines:
            raise DocsError("cites a baseline that does not exist", where=where,
                            expected="an id listed by `invoke baselines.check`", found=bid)
    for finding in findings.values():
        if finding.superseded_by and finding.superseded_by not in findings:
            raise DocsError("superseded_by names no finding", where=finding.page or finding.id, found=finding.superseded_by)


# --------------------------------------------------------------------------- the index


def page_url(src: str) -> str:
    """A docs source path as its site URL relative to the site root: findings/F01-x.md -> findings/F01-x/."""
    stem = re.sub(r"\.(md|ipynb)$", "", src)
    if stem == "index":
        return ""
    return re.sub(r"(^|/)index$", r"\1", stem).rstrip("/") + "/"


def baseline_urls(bid: str) -> dict[str, str]:
    """Where a baseline is on the site: its page and the published copy of its JSON file."""
    return {"page": f"baselines/{bid}/", "json": f"baselines/{bid}.json"}


def key_metrics(b: Baseline) -> dict[str, dict[str, Any]]:
    """The metrics that are judged (a better direction), each with its unit, noise and whether it is a timing."""
    out: dict[str, dict[str, Any]] = {}
    for path, value in flatten(b.metrics).items():
        better = direction(b, path)
        if better == "none":
            continue
        unit = unit_of(path.rsplit(".", 1)[-1])
        out[path] = {"value": value, "unit": unit, "better": better, "allowed": allowed_delta(b, path),
                     "spread": b.noise.spread.get(path), "timing": is_timing(b.kind, path)}
    return out


def _baseline_entry(b: Baseline, cited_by: list[str], superseded_by: str | None = None) -> dict[str, Any]:
    p = b.provenance
    system = render.measured_system(b)
    return {
        "kind": b.kind, "source": b.source, "summary": b.summary, "created_at": b.created_at,
        "command": p.reproduce if b.source == "measured" else None, "recorded_with": p.command,
        "inputs": {k: v.model_dump(exclude_none=True) for k, v in (p.inputs or {}).items()},
        "superseded_by": superseded_by,
        "config": b.config, "git_commit": p.git_commit, "git_dirty": p.git_dirty,
        "metrics": flatten(b.metrics), "key_metrics": key_metrics(b), "noise": b.noise.model_dump(),
        "host": p.host.model_dump(), "host_text": render.host_text(p.host),
        "host_role": "copied the cited numbers (measured nothing)" if system else "measured this result",
        "measured_on": system, "versions": {k: v for k, v in p.versions.items() if v}, "env": p.env,
        "citation": b.citation.model_dump() if b.citation else None,
        "file": f"baselines/{b.kind}/{b.name}.json", **baseline_urls(b.id), "cited_by": cited_by,
    }


def _finding_entry(f: Finding) -> dict[str, Any]:
    out = f.model_dump(exclude_none=True)
    out["headline"] = f.headline
    out["source"] = f"docs/{f.page}" if f.page else None
    out["page"] = page_url(f.page) if f.page else None
    out["evidence_urls"] = {bid: baseline_urls(bid) for bid in f.evidence}
    return out


def index(findings: dict[str, Finding], baselines: dict[str, Baseline], plan: Plan | None = None,
          recipes: dict[str, Recipe] | None = None, defaults: dict[str, str] | None = None,
          current: list[dict[str, Any]] | None = None, superseded: dict[str, str] | None = None) -> dict[str, Any]:
    """The machine-readable knowledge index (knowledge.json): URLs are relative to the site root; DEFAULTS
    names what the runbooks use when no option is given (the default target and drafter); CURRENT is the
    current view (``eaglekb.kb.current.view``) and SUPERSEDED what no longer holds, by id."""
    cited: dict[str, list[str]] = {}
    for fid, f in sorted(findings.items()):
        for bid in f.evidence:
            cited.setdefault(bid, []).append(fid)
    out: dict[str, Any] = {
        "schema_version": INDEX_VERSION,
        "urls": "relative to the site root (where this file is); a baseline's JSON is published beside its page",
        "defaults": dict(defaults or {}),
        "findings": {fid: _finding_entry(f) for fid, f in sorted(findings.items())},
        "baselines": {bid: _baseline_entry(b, cited.get(bid, []), (superseded or {}).get(bid))
                      for bid, b in sorted(baselines.items())},
    }
    if current is not None:
        out["current"] = [dict(row, headline=current_headline(row), **baseline_urls(row["baseline"]))
                          for row in current]
    if plan is not None:
        out["plan"] = dict(plan.model_dump(), page=page_url("plan.md"))
    if recipes:
        out["recipes"] = {rid: dict(r.model_dump(), page=page_url(r.page or "")) for rid, r in sorted(recipes.items())}
    return out


# --------------------------------------------------------------------------- llms.txt, llms-full.txt

_LINK = re.compile(r"\]\((?P<url>[^)\s]+)\)")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _table_row(line: str) -> str:
    cells = [c.strip() for c in _CELL_SPLIT.split(line.strip())[1:-1]]
    if cells and all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
        cells = ["---"] * len(cells)
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def agent_text(text: str, base_urls: list[str], exists: Callable[[str], bool], folder: str = "") -> str:
    """llms.txt, llms-full.txt and the pages' Markdown copies as agents should read them: links under the
    site's base URL (the longest of BASE_URLS that matches) made relative to the file's FOLDER (relative to
    the site root; "" for the llms files), a link to an ``index.md`` the site lacks (a notebook page has
    none) sent to the page itself, and Markdown tables without the padding that aligns their columns."""
    bases = sorted({b.rstrip("/") + "/" for b in base_urls if b}, key=len, reverse=True)

    def link(m: re.Match) -> str:
        url = m.group("url")
        base = next((b for b in bases if url.startswith(b)), None)
        if base is None:
            return m.group(0)
        url = url[len(base):]
        path, _, anchor = url.partition("#")
        if path.endswith("index.md") and not exists(path):
            path = path[: -len("index.md")]
        rel = posixpath.relpath(path or ".", folder or ".") + ("/" if path.endswith("/") or not path else "")
        rel = "./" if rel in (".", "./") else rel.removeprefix("./")
        return f"]({rel}{'#' + anchor if anchor else ''})"

    lines = []
    fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.lstrip().startswith("|") and line.rstrip().endswith("|"):
            line = _table_row(line)
        lines.append(line if fence else _LINK.sub(link, line))
    return "\n".join(lines)


def md_text(value: Any) -> str:
    """Data text for one line of llms.txt: Markdown's active characters escaped, on one line."""
    text = " ".join(str(value).split())
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def finding_line(f: Finding, headline: str | None) -> str:
    """A finding as llms.txt lists it: link, status, headline number."""
    url = page_url(f.page or f"findings/{f.id}.md") + "index.md"
    head = f"; {md_text(headline)}" if headline else ""
    return f"- [{f.id}: {md_text(f.title)}]({url}): **{f.status}**{head}"


def current_line(row: dict[str, Any]) -> str:
    """A row of the current view as llms.txt lists it: link, setup, numbers, reproduce command."""
    def ident(x: dict[str, Any] | None) -> str:
        return "-" if x is None else f"{x['path']} ({(x['sha256'] or 'hash unknown')[:12]})"

    what = {"probe": "acceptance", "bench": "throughput"}[row["kind"]]
    setup_text = ", ".join(f"{k} {v}" for k, v in row["config"].items() if v is not None and k != "point")
    text = (f"{what} on {row['machine']}; target {ident(row['target'])}; drafter {ident(row['drafter'])}; "
            f"prompts {row['prompts']['name']}; {row['shape']}; {setup_text}: {current_headline(row)}")
    reproduce = f"; reproduce: `{row['reproduce']}`" if row.get("reproduce") and "`" not in row["reproduce"] else ""
    return f"- [{md_text(row['baseline'])}]({baseline_urls(row['baseline'])['page']}index.md): {md_text(text)}{reproduce}"


def llms_txt(text: str, findings: list[str], current: list[str]) -> str:
    """llms.txt per the llms.txt convention: the plugin's sections, with the Findings section one line per
    finding (status, headline number) after its index, and a "Current results" section after "Start"."""
    parts = re.split(r"(?m)^(?=## )", text)
    out = []
    for part in parts:
        title = part.splitlines()[0] if part.startswith("## ") else None
        if title == "## Findings":
            index_line = next((l for l in part.splitlines() if l.rstrip().endswith("findings/index.md)")), None)
            part = "\n".join(["## Findings", "", *([index_line] if index_line else []), *findings]) + "\n\n"
        out.append(part)
        if title == "## Start":
            out.append("\n".join(["## Current results", "",
                                  "The newest result per setup (target and drafter by sha256, prompts, machine, "
                                  "config), chain and tree apart; knowledge.json holds the same rows as `current`.",
                                  "", *current]) + "\n\n")
    return "".join(out)
