"""The knowledge base's own records: findings and their evidence.

Owns: the finding schema (claim, status, scope, evidence as baseline ids,
reproduce command), reading findings from Markdown front matter, checking that
every cited baseline exists, and the machine-readable index of findings and
baselines that agents read. Knows nothing about MkDocs: the docs hooks call it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eaglekb.io.errors import DocsError, SchemaError
from eaglekb.io.files import flatten
from eaglekb.kb.schema import Baseline

Status = Literal["open", "confirmed", "refuted", "superseded", "contested"]
STATUSES: tuple[str, ...] = ("open", "confirmed", "refuted", "superseded", "contested")
_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)
_ID = re.compile(r"^F\d{2}-[a-z0-9-]+$")


class Finding(BaseModel):
    """One finding: a claim with its status, scope and evidence."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="F<NN>-slug, also the page's file name")
    title: str
    claim: str = Field(description="what we hold to be true, in one or two sentences")
    status: Status
    scope: str = Field(description="where the claim holds: system, versions, model sizes")
    evidence: list[str] = Field(min_length=1, description="baseline ids (KIND/NAME)")
    reproduce: str = Field(description="the runbook command that reproduces this kind of result")
    superseded_by: str | None = None
    page: str | None = Field(None, description="docs path, filled in when read from a page")


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


def parse_finding(meta: dict[str, Any], where: str) -> Finding:
    try:
        finding = Finding.model_validate({k: v for k, v in meta.items() if k != "page"} | {"page": where})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise DocsError("finding front matter invalid", where=where, expected=f"field {loc} valid", found=first["msg"]) from None
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


def check_evidence(findings: dict[str, Finding], baselines: dict[str, Baseline]) -> None:
    """Raise DocsError for the first finding citing a baseline that does not exist."""
    for finding in findings.values():
        for bid in finding.evidence:
            if bid not in baselines:
                raise DocsError(
                    "finding cites a baseline that does not exist",
                    where=finding.page or finding.id,
                    expected="an id listed by `invoke baselines.check`",
                    found=bid,
                )
        if finding.superseded_by and finding.superseded_by not in findings:
            raise DocsError("superseded_by names no finding", where=finding.page or finding.id, found=finding.superseded_by)


def index(findings: dict[str, Finding], baselines: dict[str, Baseline]) -> dict[str, Any]:
    """The machine-readable knowledge index: findings and baselines with their key metrics."""
    return {
        "schema_version": 1,
        "findings": {
            fid: f.model_dump(exclude_none=True) for fid, f in sorted(findings.items())
        },
        "baselines": {
            bid: {
                "kind": b.kind,
                "source": b.source,
                "summary": b.summary,
                "created_at": b.created_at,
                "command": b.provenance.command,
                "config": b.config,
                "git_commit": b.provenance.git_commit,
                "metrics": flatten(b.metrics),
                "file": f"baselines/{b.kind}/{b.name}.json",
            }
            for bid, b in sorted(baselines.items())
        },
    }
