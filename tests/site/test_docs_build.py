"""The strict site build: passes on the repository, fails with one line on a bad citation."""

import shutil

import pytest

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
    ],
)
def test_bad_reference_fails_build_with_one_line(tmp_path, edit, fragment):
    proc = _broken(tmp_path, edit)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if "eaglekb:" in l]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
