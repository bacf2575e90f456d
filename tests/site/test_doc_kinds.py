"""The site's four kinds of page (tutorial, how-to, reference, explanation) plus the journal, checked from the sources.

A how-to is short enough to follow (at most 1,200 words, front matter included); every page speaks of the user's
machine, never of the machines the project was built on; every page is in the navigation, and every target page
in the llms.txt sections too. No site build is needed: these read docs/ and mkdocs.yml.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HOWTO_MAX_WORDS = 1200

#: Wording of the build machines: remote calls, their output folder, carried pieces, leases, transfer limits.
BUILD_MACHINE_WORDS = [
    r"\ba call\b",
    r"\bcalls? \d",
    r"\$OUT\b",
    r"\.carry\b",
    r"\blent\b",
    r"\b(?:minutes|s) of device time\b|\bdevice time (?:used|left)\b",  # not the GPU's own clock (F08)
    r"\b(?:machine|it) (?:goes|went) back\b",
    r"\b64 MiB\b",
    r"\bsession scripts?\b",
    r"runbooks/sessions",
    r"\bthe lease\b",
]


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def _nav_files(entries) -> list[str]:
    out: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                out.extend(_nav_files(value) if isinstance(value, list) else [value])
    return out


def _llms_globs() -> list[str]:
    for plugin in _config()["plugins"]:
        if isinstance(plugin, dict) and "llmstxt" in plugin:
            return [g for globs in plugin["llmstxt"]["sections"].values() for g in globs]
    raise AssertionError("no llmstxt plugin in mkdocs.yml")


@pytest.mark.parametrize("page", sorted(p.name for p in (DOCS / "howto").glob("*.md")))
def test_every_howto_is_short(page):
    words = len((DOCS / "howto" / page).read_text(encoding="utf-8").split())
    assert words <= HOWTO_MAX_WORDS, f"docs/howto/{page}: {words} words (at most {HOWTO_MAX_WORDS}: split it)"


def test_no_build_machine_wording_in_the_docs():
    found = []
    for path in _pages():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in BUILD_MACHINE_WORDS:
                if m := re.search(pattern, line, re.I):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    assert not found, "build-machine wording (write for the user's machine):\n" + "\n".join(found)


def test_every_page_is_in_the_navigation():
    listed = set(_nav_files(_config()["nav"]))
    missing = [rel for p in _pages() if (rel := p.relative_to(DOCS).as_posix()) not in listed
               and not rel.startswith("findings/F")]  # findings are listed by the build hook
    assert not missing, f"pages missing from mkdocs.yml nav: {missing}"


def test_every_target_page_is_in_the_nav_and_the_llms_sections():
    targets = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "targets").glob("*.md"))
    assert targets
    listed = set(_nav_files(_config()["nav"]))
    globs = _llms_globs()
    for rel in targets:
        assert rel in listed, f"{rel} is not in mkdocs.yml nav"
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is in no llmstxt section"


def test_the_nav_has_the_four_kinds_and_the_journal():
    top = [next(iter(e)) if isinstance(e, dict) else e for e in _config()["nav"]]
    for section in ("Home", "Tutorial", "How-to guides", "Reference", "Explanation", "Journal", "For agents"):
        assert section in top, f"nav has no {section!r} section: {top}"
