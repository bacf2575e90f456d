"""The strict site build: passes on the repository, fails with one line on a bad citation."""

import json
import re
import shutil

import pytest

from helpers import background
from helpers.site import build_copy as build
from helpers.site import copy_site




def test_site_renders_baselines_and_is_offline(site):
    page = (site / "baselines/plan/k25-investigation/index.html").read_text()
    assert "2.46" in page and "breakeven_len" in page
    assert (site / "assets/plots/plan-k25-investigation.svg").read_text().startswith("<?xml")
    home = (site / "index.html").read_text()
    assert "82.5" in home and "fonts.googleapis" not in home
    for html in site.rglob("*.html"):
        text = html.read_text()
        assert "fonts.googleapis.com" not in text and "cdn.jsdelivr" not in text, html


def test_findings_and_llms_outputs(site):
    assert "Status: confirmed" in (site / "findings/F02-chain-ceiling/index.html").read_text()
    assert (site / "llms.txt").is_file() and (site / "llms-full.txt").is_file()
    import json

    index = json.loads((site / "knowledge.json").read_text())
    assert index["findings"]["F02-chain-ceiling"]["evidence"] == ["plan/k25-investigation", "plan/k25-unbounded-reading"]


def test_story_page_overlays_the_arms(site):
    page = (site / "story/index.html").read_text()
    assert page.count("data:image/svg+xml;base64,") >= 2  # train_loss and val_acc0 of the three Phase 1 arms
    assert "story-h200-b-remap" in page and "{{" not in page
    assert (site / "assets/story/h200-run1.log").is_file()


def test_notebook_executes(site):
    assert "recomputed break-even matches" in (site / "notebooks/viability/index.html").read_text()


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _as_v1(data):
    data["schema_version"] = 1
    data["provenance"].pop("inputs")
    data["provenance"].pop("reproduce")


def background_job(item):
    """The build a selected bad-reference test checks, to start when the run begins (tests/conftest.py)."""
    if getattr(item, "originalname", None) != "test_bad_reference_fails_build_with_one_line":
        return None
    edit = item.callspec.params["edit"]

    def make(tmp_path_factory):
        folder = tmp_path_factory.mktemp("broken")
        return lambda: _broken(folder, edit)

    return item.nodeid, make


def _broken(tmp_path, edit):
    root = copy_site(tmp_path / "repo")
    edit(root)
    # No notebooks needed to prove a citation failure: keeps the test fast.
    shutil.rmtree(root / "docs/notebooks")
    text = (root / "mkdocs.yml").read_text().replace("      - notebooks/viability.ipynb\n", "").replace("  - Notebooks:\n", "")
    (root / "mkdocs.yml").write_text(text)
    return build(root, tmp_path / "site")


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda r: (r / "docs/plan.md").write_text((r / "docs/plan.md").read_text() + "\n{{ cite plan/nope }}\n"),
         "plan/nope"),
        (lambda r: (r / "docs/index.md").write_text("{{ metric plan/k25-investigation no_such_ms }}\n"),
         "no_such_ms"),
        (lambda r: (r / "docs/index.md").write_text("{{ frobnicate }}\n"), "unknown placeholder"),
        (lambda r: (r / "docs/index.md").write_text(
            "{{ overlay no_such_series finetune/story-h200-b-remap finetune/story-h200-b-scratch }}\n"),
         "no_such_series"),
        (lambda r: (r / "baselines/plan/k25-phase0-verdict.json").unlink(), "plan/k25-phase0-verdict"),
        (lambda r: (r / "docs/findings/F08-unsynchronised-timing.md").write_text(
            (r / "docs/findings/F08-unsynchronised-timing.md").read_text().replace(
                "evidence:\n  - bench/k25-cycle-split\n  - bench/k25-unreproducible-boot\n  - bench/h200-smollm2-default-bf16\n",
                "evidence: []\n")),
         "evidence"),
        (lambda r: _edit_json(r / "baselines/probe/smollm2-135m-default.json",
                              lambda d: d["provenance"].pop("inputs")), "probe/smollm2-135m-default.json"),
        (lambda r: _edit_json(r / "baselines/probe/smollm2-135m-default.json",
                              lambda d: d["provenance"]["inputs"].pop("drafter")), "lacks 'drafter'"),
        (lambda r: _edit_json(r / "baselines/bench/cpu-smollm2-default.json", _as_v1), "schema v1 baseline"),
        (lambda r: (r / "docs/index.md").write_text(
            "{{ metric bench/h200-smollm2-default-r2 engine.median_tok_s }}\n"), "superseded"),
        (lambda r: (r / "docs/agents.md").write_text("The default drafter accepts 2.54 tokens.\n"),
         "hand-typed figure"),
        (lambda r: (r / "docs/index.md").write_text("{{ config plan/k25-investigation no_such_field }}\n"),
         "no_such_field"),
        (lambda r: (r / "mkdocs.yml").write_text(re.sub(r"      - Findings:\n(          .*\n)+", "",
                                                        (r / "mkdocs.yml").read_text())),
         "docs/findings/F01-breakeven-not-one.md"),
    ],
)
def test_bad_reference_fails_build_with_one_line(request, tmp_path, edit, fragment):
    proc = background.take(request.node.nodeid, lambda: _broken(tmp_path, edit))  # built early, or now
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if "eaglekb:" in l]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_new_finding_joins_the_navigation_and_llms_txt(planted_site):
    """Findings F13 and later (written by others) need no nav edit: the build lists every findings/F*.md.
    (The build of a copy holding F99, helpers.planted.add_finding; it also holds test_site_escaping's baselines.)"""
    assert planted_site.finding.is_file() and "id: F99-a-new-finding" in planted_site.finding.read_text()
    proc = planted_site.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = planted_site.site
    assert 'href="../F99-a-new-finding/"' in (site / "findings/F01-breakeven-not-one/index.html").read_text()
    llms = (site / "llms.txt").read_text()
    assert "](findings/F99-a-new-finding/index.md): **confirmed**" in llms
