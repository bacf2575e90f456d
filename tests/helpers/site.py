"""Shared by the site tests: build the site once per test session, serve a folder on 127.0.0.1.

``built_site`` caches its result for the whole session; the ``site`` fixture (tests/conftest.py)
hands it to every module that asks. The build itself starts when the run begins and runs beside the
other tests (``site_job``, helpers/background.py).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.server
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest

from helpers import background

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
_BUILT: dict[str, Path] = {}


def build_env(**extra: str) -> dict[str, str]:
    """The environment of a build (in a background job: the one the run began with, helpers/background.py)."""
    return {**background.environ(), "NO_MKDOCS_2_WARNING": "1", "PYTHONUNBUFFERED": "1", **extra}


def site_job(tmp_path_factory: pytest.TempPathFactory):
    """The strict build of this checkout into a new session temp folder, as a function to run now or in the
    background (tests/conftest.py starts it when the run begins); it returns the site folder."""
    out = tmp_path_factory.mktemp("site")

    def build() -> Path:
        proc = build_copy(ROOT, out, timeout=600)
        assert proc.returncode == 0, "strict site build failed:\n" + (proc.stderr + proc.stdout)[-3000:]
        return out

    return build


def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mkdocs build --strict` of this checkout into a session temp folder, once per session (its plots
    drawn as in any build and kept for the builds of copies: ``_PLOT_MEMO_CLI``): the background job "site"
    when the run started one, else built now."""
    if "site" not in _BUILT:
        _BUILT["site"] = background.take("site", lambda: site_job(tmp_path_factory)())
    return _BUILT["site"]


def copy_site(dst: Path) -> Path:
    """What a site build reads (docs, baselines, library, runbooks, mkdocs.yml, tasks.py), copied to DST."""
    for name in ("docs", "baselines", "src", "runbooks"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "tasks.py"):
        shutil.copy(ROOT / name, dst / name)
    return dst


#: The mkdocs command line with the site's plots memoised on disk (run with ``python -c``). Drawing the SVG
#: plots of every baseline with matplotlib is most of a build's time (about 20 s of 25 s before the first
#: page), and every copy of the checkout draws the same ones. The plot functions of the copy's own library
#: (the module its hooks import: same path, put first as they do) are wrapped: a plot is drawn by the real
#: function the first time and read back as those bytes afterwards, keyed by the function, its arguments
#: (each baseline's whole JSON) and the copy's library source. A baseline a test plants or edits is a new
#: key, so it is drawn.
#: The llmstxt plugin's Markdown of each page (``_generate_page_markdown``: half of what is left of a build, and
#: the same for most pages of every copy) is memoised the same way, keyed by everything it reads: the page's
#: HTML, its options with the output path taken relative to the site folder (the only argument that differs
#: between copies; the project's preprocess hook ignores it) and the preprocess module's source. A page a test
#: changes is a new key. Everything else is the unchanged `mkdocs build`; its output is the same bytes.
_PLOT_MEMO_CLI = r"""
import functools, hashlib, json, os, sys
from pathlib import Path

root = Path(os.environ["EAGLEKB_ROOT"])
sys.path.insert(0, str(root / "src"))
from eaglekb.kb import render

cache = Path(os.environ["EAGLEKB_TEST_PLOT_CACHE"])
code = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((root / "src/eaglekb").rglob("*.py")))).hexdigest()


def _arg(a):
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    return a.model_dump_json() if hasattr(a, "model_dump_json") else repr(a)


def _memo(fn):
    @functools.wraps(fn)
    def drawn(*args, **kwargs):
        key = json.dumps([code, fn.__name__, _arg(args), sorted((k, _arg(v)) for k, v in kwargs.items())])
        path = cache / (hashlib.sha256(key.encode()).hexdigest() + ".svg")
        if path.is_file():
            return path.read_text(encoding="utf-8")
        svg = fn(*args, **kwargs)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(svg, encoding="utf-8")
        os.replace(tmp, path)
        return svg
    return drawn


for name in ("series_svg", "viability_svg", "overlay_svg"):
    setattr(render, name, _memo(getattr(render, name)))

try:
    from mkdocs_llmstxt._internal import plugin as _llms
except ImportError:  # another version of the plugin: its pages are converted as in any build
    _llms = None
if _llms is not None and hasattr(_llms, "_generate_page_markdown"):
    _site = Path(sys.argv[sys.argv.index("-d") + 1]).resolve()
    _convert = _llms._generate_page_markdown

    @functools.wraps(_convert)
    def _converted(html, **kw):
        pre = kw.get("preprocess")
        pre_src = Path(pre).read_text(encoding="utf-8") if pre and Path(pre).is_file() else None
        args = sorted(dict(kw, path=os.path.relpath(kw["path"], _site)).items())
        key = json.dumps(["llmstxt", html, args, pre_src])
        path = cache / (hashlib.sha256(key.encode()).hexdigest() + ".md")
        if path.is_file():
            return path.read_text(encoding="utf-8")
        md = _convert(html, **kw)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(md, encoding="utf-8")
        os.replace(tmp, path)
        return md

    _llms._generate_page_markdown = _converted

from mkdocs.__main__ import cli

cli(prog_name="mkdocs")
"""
_PLOT_CACHE: list[Path] = []
_PLOT_CACHE_LOCK = threading.Lock()


def _plot_cache() -> Path:
    """One folder of memoised plots and llmstxt pages per test session (removed at exit)."""
    with _PLOT_CACHE_LOCK:  # a background build and a test may ask first at the same time
        if not _PLOT_CACHE:
            folder = Path(tempfile.mkdtemp(prefix="eaglekb-test-plots-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _PLOT_CACHE.append(folder)
    return _PLOT_CACHE[0]


def build_copy(root: Path, site: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of ROOT (the checkout, or a copy made by ``copy_site``: its own EAGLEKB_ROOT)
    into SITE, its plots and llmstxt pages memoised for the session (``_PLOT_MEMO_CLI``: the same output, made
    once per session). Run through ``background.run``: the run's end stops a build still running in the background."""
    return background.run([sys.executable, "-c", _PLOT_MEMO_CLI, "build", "--strict", "-d", str(site)],
                          cwd=root,
                          env=build_env(EAGLEKB_ROOT=str(root), EAGLEKB_TEST_PLOT_CACHE=str(_plot_cache())),
                          timeout=timeout)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve FOLDER on 127.0.0.1 at a free port from a thread; yields the base URL (ending in /)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def browser_skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found: install Debian's chromium package (apt-get install -y chromium); no browser is downloaded"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python playwright not installed (pip install -e '.[test]')"
    return None


def working_tree_repo(dst: Path) -> Path:
    """A fresh git repository at DST holding this checkout's working tree (tracked plus untracked,
    not ignored files) in one commit, so mike can commit to its own gh-pages branch there."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: mike needs one")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    env = git_env()
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "working tree for the docs deploy test"]):
        subprocess.run(cmd, cwd=dst, env=env, check=True, capture_output=True)
    return dst


def git_env(**extra: str) -> dict[str, str]:
    """A git identity and no user config, so commits work on a bare CI machine."""
    return build_env(**extra, GIT_AUTHOR_NAME="eaglekb tests", GIT_AUTHOR_EMAIL="tests@eaglekb.invalid",
                     GIT_COMMITTER_NAME="eaglekb tests", GIT_COMMITTER_EMAIL="tests@eaglekb.invalid",
                     GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")


def _flat(tree: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in sorted(tree.items()):
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _as_number(text: str) -> float | bool:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    return float(text.replace(",", ""))


def check_metrics_table(rel: str, metrics: dict, shown: dict[str, str]) -> None:
    """Every metric of a baseline's JSON is a row of its page's first table, with the JSON's value."""
    for metric, value in _flat(metrics):
        assert metric in shown, f"{rel}: metric {metric} not in the rendered table ({sorted(shown)})"
        got = _as_number(shown[metric])
        if isinstance(value, bool):
            assert got == value, f"{rel}: {metric} shows {shown[metric]!r}, the JSON has {value}"
        else:
            assert math.isclose(got, value, rel_tol=1e-3, abs_tol=1e-4), \
                f"{rel}: {metric} shows {shown[metric]!r}, the JSON has {value}"
