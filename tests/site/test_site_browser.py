"""The built site in a real browser: headless Debian Chromium through Python playwright.

The site is built once (tests/helpers/site.py), served on 127.0.0.1 from a thread, and every page
is opened with every request recorded: nothing may leave 127.0.0.1 (other hosts do not resolve in
this browser, so a failing test cannot reach the network either). Playwright never downloads a
browser here: it drives /usr/bin/chromium; the module is skipped, with the reason, without it.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from helpers import background
from helpers.site import (CHROMIUM, CHROMIUM_ARGS, ROOT, browser_skip_reason, check_metrics_table, git_env, serve,
                          working_tree_repo)

_SKIP = browser_skip_reason()
pytestmark = [pytest.mark.browser] + ([pytest.mark.skip(reason=_SKIP)] if _SKIP else [])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # The resolver rule makes every host but 127.0.0.1 unresolvable: a page that tries to reach
        # the network fails here (and the request is still recorded and reported) instead of leaking.
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                      args=CHROMIUM_ARGS + ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def base_url(site):  # noqa: F811 - the imported session fixture
    with serve(site) as url:
        yield url


class Tab:
    """A page in a fresh browser context that records every request and every failed response."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.requests: list[str] = []
        self.failed: list[str] = []
        self.context.on("request", lambda r: self.requests.append(r.url))
        self.context.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.status} {r.url}"))
        # ERR_ABORTED: the next navigation cancelled a request still in flight (search worker, favicon)
        self.context.on("requestfailed", lambda r: "ERR_ABORTED" not in (r.failure or "")
                        and self.failed.append(f"failed ({r.failure}) {r.url}"))
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.console: list[str] = []  # what the browser console shows as an error (a 404 shows here too)
        self.page.on("console", lambda m: m.type == "error" and self.console.append(f"{self.page.url}: {m.text}"))

    def goto(self, url: str):
        response = self.page.goto(url, wait_until="load")
        assert response is not None, url
        assert response.status == 200, f"{url}: HTTP {response.status}"
        return response

    def assert_offline(self):
        offsite = sorted({u for u in self.requests if not _local(u)})
        assert not offsite, "requests left 127.0.0.1:\n" + "\n".join(offsite)


def _local(url: str) -> bool:
    parsed = urlparse(url)
    if parsed.scheme in ("data", "blob", "about"):
        return True
    return parsed.scheme in ("http", "https", "ws") and parsed.hostname == "127.0.0.1"


@pytest.fixture
def tab(browser):
    t = Tab(browser)
    yield t
    t.context.close()


# --------------------------------------------------------------------------- helpers


def _site_url() -> str:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"]


def _nav_paths() -> list[str]:
    """Every page in mkdocs.yml's nav, as a site path ('' for the home page)."""
    out: list[str] = []

    def walk(node):
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, str) and not re.match(r"^[a-z]+://", node):
            stem = re.sub(r"\.(md|ipynb)$", "", node)
            stem = "" if stem == "index" else re.sub(r"/?index$", "/", stem)
            out.append(stem if stem == "" or stem.endswith("/") else stem + "/")

    walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    return out


def _sitemap_paths(site: Path) -> list[str]:  # noqa: F811
    ns = {"s": "http://www.sitemaps.org/schemas/sitemap/0.9"}
    locs = [e.text for e in ET.parse(site / "sitemap.xml").getroot().findall("s:url/s:loc", ns)]
    prefix = _site_url()
    return [loc.removeprefix(prefix) for loc in locs]


# --------------------------------------------------------------------------- tests


def test_every_page_loads_and_nothing_leaves_the_machine(site, base_url, tab):  # noqa: F811
    nav = _nav_paths()
    pages = _sitemap_paths(site)
    missing = [p for p in nav if p not in pages]
    assert not missing, f"nav pages missing from the built sitemap: {missing}"
    assert any(p.startswith("baselines/probe/") for p in pages), "generated baseline pages not in the sitemap"
    # The baseline pages are opened (and their requests checked) by the table test below.
    for path in dict.fromkeys(p for p in nav + pages if not re.match(r"baselines/[a-z]+/", p)):
        tab.goto(base_url + path)
        assert tab.page.locator("h1").count() >= 1, f"{path}: no heading rendered"
    tab.page.wait_for_load_state("networkidle")
    tab.assert_offline()
    # Nothing missing, not even the version selector's versions.json (an unversioned build has no selector),
    # and nothing in the console.
    assert not tab.failed, "assets failed to load:\n" + "\n".join(tab.failed)
    assert not any(u.endswith("/versions.json") for u in tab.requests)
    assert not tab.console, "console errors:\n" + "\n".join(tab.console)


def test_baseline_tables_show_the_numbers_in_the_json(site, base_url, tab):  # noqa: F811
    """In the browser, the first baseline of each kind (test_site_outputs checks every page's HTML the same way)."""
    files = sorted((ROOT / "baselines").glob("*/*.json"))
    assert files
    for path in [sorted(d.glob("*.json"))[0] for d in sorted({p.parent for p in files})]:
        rel = path.relative_to(ROOT / "baselines").with_suffix("").as_posix()
        data = json.loads(path.read_text())
        tab.goto(f"{base_url}baselines/{rel}/")
        rows = tab.page.locator("article table").first.evaluate(
            "t => [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.innerText))")
        check_metrics_table(rel, data["metrics"], {r[0].strip(): r[1] for r in rows})
    pages = [p for p in _sitemap_paths(site) if re.match(r"baselines/[a-z]+/", p)]
    assert sorted(pages) == sorted(f"baselines/{p.relative_to(ROOT / 'baselines').with_suffix('').as_posix()}/"
                                   for p in files), "baseline pages and baselines/*/*.json differ"
    tab.assert_offline()
    assert not tab.failed, tab.failed
    assert not tab.console, tab.console


def test_break_even_number_is_on_the_investigation_page(base_url, tab):
    data = json.loads((ROOT / "baselines/plan/k25-investigation.json").read_text())
    tab.goto(f"{base_url}baselines/plan/k25-investigation/")
    expected = f"{data['metrics']['breakeven_len']:.4g}"
    assert expected == "2.46"
    cell = tab.page.locator("article table tr", has=tab.page.locator("code", has_text="breakeven_len")).locator("td").nth(1)
    assert cell.inner_text().strip() == expected


def test_search_finds_a_finding(base_url, tab):
    tab.goto(base_url)
    box = tab.page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("break-even", delay=40)
    hit = tab.page.locator(".md-search-result__item a[href*='findings/F01-']").first
    hit.wait_for(state="visible", timeout=15_000)
    hit.click()
    tab.page.wait_for_url(re.compile(r".*/findings/F01-[^/]+/.*"))
    assert "F01-" in tab.page.locator("h1").first.inner_text()
    tab.assert_offline()


def test_notebook_renders_with_its_output(base_url, tab):
    tab.goto(f"{base_url}notebooks/viability/")
    text = tab.page.locator("body").inner_text()
    assert "recomputed break-even matches" in text
    assert "Traceback" not in text
    plot = tab.page.locator("img[src^='data:image/png']").first
    plot.scroll_into_view_if_needed()
    plot.wait_for(state="visible")
    width, height = plot.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert width > 300 and height > 200, (width, height)  # the plot cell's figure, drawn
    tab.assert_offline()
    assert not tab.failed and not tab.console, (tab.failed, tab.console)


def test_home_page_screenshot_and_version_line(base_url, tab, tmp_path_factory):
    tab.goto(base_url)
    tab.page.wait_for_load_state("networkidle")
    line = tab.page.locator("article").inner_text()
    assert re.search(r"eaglekb \d+\.\d+\S*, baselines at commit ([0-9a-f]{7,}|uncommitted)", line), line[:500]
    shot = tmp_path_factory.mktemp("screenshots") / "home.png"
    tab.page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    print(f"home page screenshot: {shot}")
    tab.assert_offline()


# --------------------------------------------------------------------------- versioned site (mike)


def _version_label(locator) -> tuple[str, str]:
    """(version, alias) of a version selector entry: 'VERSION<span class=md-version__alias>ALIAS</span>'."""
    return tuple(locator.evaluate(
        "e => [[...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim(),"
        " [...e.querySelectorAll('.md-version__alias')].map(a => a.textContent.trim()).join(' ')]"))


_MIKE_TESTS = ("test_version_selector_works_offline", "test_every_page_of_the_published_version_loads_clean",
               "test_killing_serve_versions_leaves_no_mike_serve")


def _deploy_job(tmp_path_factory):
    """`invoke docs.deploy 0.1` (alias latest, the default) in a throwaway repo holding this working tree, as a
    function to run now or in the background; it returns (repo, exit code, log). (One version: each deploy is a
    full build, and the selector is the same code for one entry or many.)"""
    folder = tmp_path_factory.mktemp("repo")

    def deploy():
        repo = working_tree_repo(folder)
        log = repo.parent / "deploy.log"
        with open(log, "w") as out:
            # `invoke docs.deploy VERSION`: alias latest and the site root redirecting to it are the defaults.
            proc = background.run([sys.executable, "-m", "invoke", "docs.deploy", "0.1", "--json"], cwd=repo,
                                  env=git_env(EAGLEKB_ROOT=str(repo)), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=600)
        return repo, proc.returncode, log

    return deploy


def background_job(item):
    """The deploy the mike tests read, to start when the run begins (tests/conftest.py), so that its build runs
    beside the tests before them."""
    return ("mike-deploy", _deploy_job) if item.name in _MIKE_TESTS else None


@pytest.fixture(scope="module")
def _mike_deploy(tmp_path_factory):
    """(repo, exit code, deploy log) of the deploy: the background job started with the run, or deployed now."""
    return background.take("mike-deploy", lambda: _deploy_job(tmp_path_factory)())


@pytest.fixture(scope="module")
def versioned_url(_mike_deploy, tmp_path_factory):
    """The gh-pages tree of that deploy, served as a static site."""
    repo, rc, log = _mike_deploy
    output = log.read_text()
    assert rc == 0, output[-2000:]
    doc = json.loads(output.strip().splitlines()[-1])
    assert doc["versions"] == [{"aliases": ["latest"], "title": "0.1", "version": "0.1"}], doc
    assert doc["default"] == "latest" and doc["pushed"] is False
    pages = tmp_path_factory.mktemp("gh-pages")
    tree = subprocess.run(["git", "archive", "--format=tar", "gh-pages"], cwd=repo, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(tree.stdout)) as tar:
        tar.extractall(pages, filter="tar")  # keeps `latest` as the symlink mike made
    assert (pages / "latest").is_symlink() and (pages / "versions.json").is_file()
    with serve(pages) as url:
        yield url


def test_version_selector_works_offline(versioned_url, tab):
    page = tab.page
    tab.goto(versioned_url)  # the root redirects to the default version, the alias `latest`
    page.wait_for_url(re.compile(r".*/latest/$"))
    current = page.locator(".md-version__current")
    current.wait_for(state="visible")
    assert _version_label(current) == ("0.1", "latest")
    assert "docs version 0.1" in page.locator("article").inner_text()
    page.locator(".md-version").hover()  # Material's version menu opens on hover
    links = page.locator(".md-version__list .md-version__link")
    links.first.wait_for(state="visible")
    assert [_version_label(links.nth(i)) for i in range(links.count())] == [("0.1", "latest")]
    links.first.click()
    page.wait_for_url(re.compile(r".*/0\.1/$"))
    current.wait_for(state="visible")
    assert _version_label(current)[0] == "0.1"
    assert "docs version 0.1" in page.locator("article").inner_text()
    assert any(u.endswith("/versions.json") for u in tab.requests)
    assert not tab.failed, tab.failed
    assert not tab.console, tab.console
    tab.assert_offline()


def test_every_page_of_the_published_version_loads_clean(versioned_url, tab):
    """The site as `invoke docs.deploy` publishes it: every nav page under the default alias loads, its
    version selector finds /versions.json, and no request fails and nothing reaches the console."""
    for path in _nav_paths():
        tab.goto(f"{versioned_url}latest/{path}")
        tab.page.locator(".md-version__current").wait_for(state="visible")
    tab.page.wait_for_load_state("networkidle")
    assert any(u.endswith("/versions.json") for u in tab.requests)
    assert not tab.failed, "\n".join(tab.failed)
    assert not tab.console, "\n".join(tab.console)
    tab.assert_offline()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_serving(port: int) -> list[str]:
    """Command lines of live processes that name this port (our own mike serve, if one survived)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().split(") ")[-1].split()[0] == "Z":
                continue  # a zombie is dead already
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"127.0.0.1:{port}" in cmd:
            found.append(f"{proc.name}: {cmd}")
    return found


def test_killing_serve_versions_leaves_no_mike_serve(_mike_deploy, versioned_url):
    """`invoke docs.serve-versions` becomes `mike serve` (no child process): stopping it stops the server."""
    repo, _, _ = _mike_deploy
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "docs.serve-versions", "--addr", f"127.0.0.1:{port}"],
                            cwd=repo, env=git_env(EAGLEKB_ROOT=str(repo)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/versions.json", timeout=2) as r:
                    assert json.loads(r.read())[0]["version"] == "0.1"
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve-versions did not start"
                time.sleep(0.3)
        assert _processes_serving(port), "nothing serves the port"
        proc.terminate()  # what a stop does: SIGTERM to the process the user started
        proc.wait(timeout=20)
        deadline = time.monotonic() + 10
        while _processes_serving(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_serving(port), "a server outlived its task:\n" + "\n".join(_processes_serving(port))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
