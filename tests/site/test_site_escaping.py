"""Strings from data never run on the site: a baseline with <script>, Markdown links and placeholders
in its summary, config, provenance and citation builds into escaped text; a huge one is capped or refused."""

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers.site import build_copy as build
from helpers.site import copy_site

SCRIPT = "<script>alert('xss')</script>"
HOSTILE = [SCRIPT, "[click](javascript:alert(1))", "<img src=x onerror=alert(1)>", "{{ commands }}",
           "`code` **bold** | cell", "line one\nline two", "$\\frac{1}{0}$"]


def _site_root(tmp_path: Path) -> Path:
    """A copy of the checkout without the notebook (it would execute: slow) and the links to it."""
    root = copy_site(tmp_path / "repo")
    shutil.rmtree(root / "docs/notebooks")
    yml = (root / "mkdocs.yml").read_text().replace("      - notebooks/viability.ipynb\n", "").replace(
        "  - Notebooks:\n", "")
    (root / "mkdocs.yml").write_text(yml)
    for page in (root / "docs").rglob("*.md"):
        text = page.read_text()
        if "viability.ipynb" in text:
            page.write_text(re.sub(r"\]\([./]*notebooks/viability\.ipynb\)", "](../index.md)", text))
    return root


def _plant(root: Path, name: str, edit) -> Path:
    src = json.loads((root / "baselines/plan/k25-investigation.json").read_text())
    src["name"], src["source"], src["citation"] = name, "measured", None
    edit(src)
    path = root / "baselines/plan" / f"{name}.json"
    path.write_text(json.dumps(src, sort_keys=True, indent=2, ensure_ascii=False) + "\n")
    return path


def _hostile(doc: dict) -> None:
    doc["summary"] = " ".join(HOSTILE)
    doc["config"] = {**doc["config"], "note": SCRIPT, "links": HOSTILE, f"key{SCRIPT}": 1}
    doc["provenance"]["command"] = f"invoke plan `{SCRIPT}`"
    doc["provenance"]["host"]["cpu"] = SCRIPT
    doc["provenance"]["env"] = {"NCCL_X": SCRIPT}
    doc["series"] = {"evil": {"x": SCRIPT + " $x$", "unit": "_len", "points": {"1": 1.0, "2": 2.0}}}


def _huge(doc: dict) -> None:
    doc["summary"] = "x" * 200_000
    doc["config"] = {**doc["config"], **{f"k{i}": "y" * 300 for i in range(9000)}}
    doc["series"] = {"curve": {"x": "step", "unit": "_len", "points": {str(i): float(i % 7) for i in range(20_000)}}}


def test_data_strings_are_escaped_and_huge_baselines_capped(tmp_path):
    root = _site_root(tmp_path)
    _plant(root, "hostile", _hostile)
    huge = _plant(root, "huge", _huge)
    assert 3 << 20 < huge.stat().st_size < 4 << 20  # under the file limit: rendered, but capped
    site = tmp_path / "site"
    proc = build(root, site)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (site / "baselines/plan/hostile/index.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page and 'href="javascript' not in page
    assert "&lt;script&gt;alert" in page or "&#60;script&#62;alert" in page
    assert "invoke plan" in page and "{{" not in page.replace("&#123;&#123;", "")
    assert "Available tasks" not in page and "### `invoke" not in page  # {{ commands }} was not expanded
    for html in site.rglob("*.html"):
        assert "<script>alert" not in html.read_text(), html
    # The Markdown agents read (the page's copy and llms-full.txt): no tag and no link can form from data.
    for md in (site / "baselines/plan/hostile/index.md", site / "llms-full.txt"):
        text = re.sub(r"(`+)(?:(?!\1).)*?\1", "", md.read_text(encoding="utf-8"))  # code spans show text as is
        # an escaped "<" (\< or &lt;) and an escaped "]" (\]) are text in every Markdown renderer
        assert not re.search(r"(?<!\\)<(script|img)", text), md
        assert not re.search(r"(?<!\\)\]\(javascript:", text), md
    assert "<script" not in (site / "assets/plots/plan-hostile-evil.svg").read_text()
    big = (site / "baselines/plan/huge/index.html").stat().st_size
    assert big < 1_000_000, big  # rows, strings and points capped
    assert "more rows: see the JSON file" in (site / "baselines/plan/huge/index.html").read_text()
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert total < 80_000_000, total


def test_baseline_over_the_file_limit_fails_the_build_with_one_line(tmp_path):
    root = copy_site(tmp_path / "repo")
    path = _plant(root, "too-big", lambda d: d.update(summary="z" * (5 << 20)))
    proc = build(root, tmp_path / "site")
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if "eaglekb:" in l]
    assert len(lines) == 1 and "too large" in lines[0] and str(path) in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
