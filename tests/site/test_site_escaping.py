"""Strings from data never run on the site: a baseline with <script>, Markdown links and placeholders
in its summary, config, provenance and citation builds into escaped text; a huge one is capped or refused."""

import re

from helpers import background
from helpers.planted import plant
from helpers.site import build_copy as build
from helpers.site import copy_site


def test_data_strings_are_escaped_and_huge_baselines_capped(planted_site):
    # The build of a copy holding the hostile and huge baselines (helpers.planted; it also holds
    # test_docs_build's new finding).
    assert planted_site.hostile.is_file()
    assert 3 << 20 < planted_site.huge.stat().st_size < 4 << 20  # under the file limit: rendered, but capped
    site = planted_site.site
    proc = planted_site.proc
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


def _too_big(tmp_path):
    root = copy_site(tmp_path / "repo")
    path = plant(root, "too-big", lambda d: d.update(summary="z" * (5 << 20)))
    return path, build(root, tmp_path / "site")


def background_job(item):
    """The build the file-limit test checks, to start when the run begins (tests/conftest.py)."""
    if getattr(item, "originalname", None) != "test_baseline_over_the_file_limit_fails_the_build_with_one_line":
        return None

    def make(tmp_path_factory):
        folder = tmp_path_factory.mktemp("too-big")
        return lambda: _too_big(folder)

    return item.nodeid, make


def test_baseline_over_the_file_limit_fails_the_build_with_one_line(request, tmp_path):
    path, proc = background.take(request.node.nodeid, lambda: _too_big(tmp_path))  # built early, or now
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if "eaglekb:" in l]
    assert len(lines) == 1 and "too large" in lines[0] and str(path) in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
