"""What the site tests plant in a copy of the checkout, and the one strict build of a copy holding all of it.

A full build of a copy is a minute on a two-core machine (the llmstxt plugin's Markdown of ~200 pages is most
of it), so two tests share one (the ``planted_site`` fixture, tests/site/conftest.py): a new finding F99 that
must join the navigation and llms.txt (test_docs_build) and the hostile and huge baselines whose strings must
build into escaped, capped text (test_site_escaping). Neither touches what the other checks: a finding page
copied from F02 carries no data string of the planted baselines, and the baselines cite no finding.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import background
from helpers.site import build_copy, copy_site

SCRIPT = "<script>alert('xss')</script>"
HOSTILE = [SCRIPT, "[click](javascript:alert(1))", "<img src=x onerror=alert(1)>", "{{ commands }}",
           "`code` **bold** | cell", "line one\nline two", "$\\frac{1}{0}$"]


def without_notebook(root: Path) -> Path:
    """ROOT (a ``copy_site`` copy) without the notebook (it would execute: slow), its nav entry and the
    links to it."""
    shutil.rmtree(root / "docs/notebooks")
    yml = (root / "mkdocs.yml").read_text().replace("      - notebooks/viability.ipynb\n", "").replace(
        "  - Notebooks:\n", "")
    (root / "mkdocs.yml").write_text(yml)
    for page in (root / "docs").rglob("*.md"):
        text = page.read_text()
        if "viability.ipynb" in text:
            page.write_text(re.sub(r"\]\([./]*notebooks/viability\.ipynb\)", "](../index.md)", text))
    return root


def add_finding(root: Path) -> Path:
    """A new finding F99 (a copy of F02 under a new id and title); no nav edit. Returns its page."""
    src = (root / "docs/findings/F02-chain-ceiling.md").read_text()
    page = root / "docs/findings/F99-a-new-finding.md"
    page.write_text(src.replace("id: F02-chain-ceiling", "id: F99-a-new-finding").replace(
        "title: ", "title: A new finding, ", 1))
    return page


def plant(root: Path, name: str, edit) -> Path:
    """A measured plan baseline NAME (a copy of plan/k25-investigation, no citation) changed by EDIT."""
    src = json.loads((root / "baselines/plan/k25-investigation.json").read_text())
    src["name"], src["source"], src["citation"] = name, "measured", None
    edit(src)
    path = root / "baselines/plan" / f"{name}.json"
    path.write_text(json.dumps(src, sort_keys=True, indent=2, ensure_ascii=False) + "\n")
    return path


def hostile(doc: dict) -> None:
    doc["summary"] = " ".join(HOSTILE)
    doc["config"] = {**doc["config"], "note": SCRIPT, "links": HOSTILE, f"key{SCRIPT}": 1}
    doc["provenance"]["command"] = f"invoke plan `{SCRIPT}`"
    doc["provenance"]["host"]["cpu"] = SCRIPT
    doc["provenance"]["env"] = {"NCCL_X": SCRIPT}
    doc["series"] = {"evil": {"x": SCRIPT + " $x$", "unit": "_len", "points": {"1": 1.0, "2": 2.0}}}


def huge(doc: dict) -> None:
    doc["summary"] = "x" * 200_000
    doc["config"] = {**doc["config"], **{f"k{i}": "y" * 300 for i in range(9000)}}
    doc["series"] = {"curve": {"x": "step", "unit": "_len", "points": {str(i): float(i % 7) for i in range(20_000)}}}


@dataclass
class Planted:
    root: Path  # the copy
    site: Path  # its built site
    proc: object  # the build's CompletedProcess
    finding: Path  # docs/findings/F99-a-new-finding.md
    hostile: Path  # baselines/plan/hostile.json
    huge: Path  # baselines/plan/huge.json


def planted_job(tmp_path_factory: pytest.TempPathFactory):
    """A copy without the notebook, with F99 and the hostile and huge baselines, built strict: as a function to
    run now or in the background (tests/conftest.py starts it when the run begins)."""
    base = tmp_path_factory.mktemp("planted")

    def build() -> Planted:
        root = without_notebook(copy_site(base / "repo"))
        finding = add_finding(root)
        bad, big = plant(root, "hostile", hostile), plant(root, "huge", huge)
        site = base / "site"
        return Planted(root, site, build_copy(root, site), finding, bad, big)

    return build


def planted_build(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    """The planted copy built once: the background job "planted" when the run started one, else built now."""
    return background.take("planted", lambda: planted_job(tmp_path_factory)())
