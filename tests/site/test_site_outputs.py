"""The built site's small promises, read from its files: the notebook's plot, the commands page's tables,
how hosts are shown, published baseline files, no version selector outside mike, one description of the
default init for new lm_head rows."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from eaglekb.training import remap
from helpers.site import ROOT, check_metrics_table


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


class _Rows(HTMLParser):
    """Cells per row of every table in a page."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th") and self.rows:
            self.rows[-1].append("")

    def handle_data(self, data):
        if self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_notebook_executes_and_shows_its_plot(site):
    page = (site / "notebooks/viability/index.html").read_text(encoding="utf-8")
    assert "recomputed break-even matches" in page
    images = re.findall(r'<img[^>]+src="data:image/png;base64,([A-Za-z0-9+/=]{2000,})"', page)
    assert images, "the plot cell has no image output"


def test_commands_page_keeps_every_option_in_its_cell(site):
    parser = _Rows()
    parser.feed((site / "reference/commands/index.html").read_text(encoding="utf-8"))
    option_rows = [[c.strip() for c in r] for r in parser.rows if r and r[0].strip().startswith("--")]
    assert len(option_rows) > 50
    assert all(len(r) == 2 for r in option_rows), [r for r in option_rows if len(r) != 2][:3]
    helps = {r[0]: r[1] for r in option_rows}
    assert "flag a metric when |change| > PCT percent of the old value" in helps["--threshold"]
    md = (site / "reference/commands/index.md").read_text(encoding="utf-8")  # the copy agents read
    assert r"flag a metric when \|change\| > PCT percent" in md


def test_hosts_are_rendered_without_none(site):
    h200 = _text(site / "baselines/probe/h200-smollm2-default-fp32/index.html")
    assert "None x16" not in h200 and "None" not in re.search(r"host: (.*)", h200).group(1)
    assert "16 cores, CPU model not recorded; GPUs: NVIDIA H200" in h200
    cpu = _text(site / "baselines/probe/smollm2-135m-default/index.html")
    assert re.search(r"host: .+ \(\d+ cores\); GPUs: none", cpu)


def test_copied_reports_show_the_reports_system_not_the_copying_machine(site):
    data = json.loads((ROOT / "baselines/bench/k25-cycle-split.json").read_text())
    page = _text(site / "baselines/bench/k25-cycle-split/index.html")
    assert f"measured on: {data['config']['target']}" in page and data["config"]["serving"] in page
    assert "copied on:" in page and "it measured nothing" in page
    assert not re.search(r"^host: ", page, re.M), "a copied report shows the copying machine as its host"


def test_every_baseline_file_is_published_beside_its_page(site):
    for path in sorted((ROOT / "baselines").glob("*/*.json")):
        rel = path.relative_to(ROOT).as_posix()
        assert (site / rel).read_bytes() == path.read_bytes(), rel
        page = (site / rel[: -len(".json")] / "index.html").read_text(encoding="utf-8")
        assert f'href="../{path.name}"' in page, rel


def test_every_baseline_page_tables_the_numbers_in_its_json(site):
    """The first table of each baseline's page (its metrics) shows every metric with the JSON's value; the browser
    test reads one page of each kind the same way through chromium."""
    for path in sorted((ROOT / "baselines").glob("*/*.json")):
        rel = path.relative_to(ROOT / "baselines").with_suffix("").as_posix()
        page = (site / "baselines" / rel / "index.html").read_text(encoding="utf-8")
        article = page[page.index("<article"):]
        table = article[article.index("<table"):article.index("</table>")]
        parser = _Rows()
        parser.feed(table)
        shown = {r[0].strip(): r[1] for r in parser.rows if len(r) >= 2}  # the parser has decoded the entities
        check_metrics_table(rel, json.loads(path.read_text())["metrics"], shown)


def test_unversioned_build_asks_for_no_versions_file(site):
    for page in ("index.html", "findings/F01-breakeven-not-one/index.html"):
        config = re.search(r'<script id="__config" type="application/json">(.*?)</script>',
                           (site / page).read_text(encoding="utf-8"), re.S).group(1)
        assert json.loads(config).get("version") is None, page


# --------------------------------------------------------------------------- one description of the default init

_INIT_NAMES = "|".join(re.escape(i) for i in remap.INITS)


def _sources() -> dict[str, str]:
    pages = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")}
    pages["runbooks/remap.py"] = (ROOT / "runbooks/remap.py").read_text(encoding="utf-8")
    pages["runbooks/finetune.py"] = (ROOT / "runbooks/finetune.py").read_text(encoding="utf-8")
    return pages


def test_every_page_names_the_init_the_code_uses_for_new_rows():
    assert remap.DEFAULT_INIT == "target-scaled"
    said = []
    for where, text in _sources().items():
        flat = " ".join(text.split())
        for m in re.finditer(rf"`?({_INIT_NAMES})`? \(default with(?:out)? --target\)", flat):
            said.append((where, m.group(0)))
            want = remap.FALLBACK_INIT if "without" in m.group(0) else remap.DEFAULT_INIT
            assert m.group(1) == want, (where, m.group(0))
        assert "by the fitted map" not in flat, where
        for m in re.finditer(r"rows of new tokens[^.]*", flat):
            assert remap.DEFAULT_INIT in m.group(0), (where, m.group(0))
    assert any(w == "runbooks/remap.py" for w, _ in said)
    assert remap.DEFAULT_INIT in " ".join((ROOT / "docs/howto/train.md").read_text().split())


@pytest.mark.parametrize("page", ["howto/vocab.md", "howto/train.md", "howto/new-target.md"])
def test_pages_that_describe_the_remap_say_target_scaled(page):
    assert "target-scaled" in (ROOT / "docs" / page).read_text(encoding="utf-8")
