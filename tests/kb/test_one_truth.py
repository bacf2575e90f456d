"""One truth, kept by tests: what the published site says agrees with itself and with baselines/.

Read from the pages' Markdown and the baselines' JSON directly (no site build): headline numbers come from
placeholders; a superseded finding does not speak as open or current; a record's drafter path still holds the
files it hashed (``invoke baselines.check``); a reproduce command names only paths a clone has or a step of the
same commands writes; a figure and the figure it is compared with come from one run; every target a baseline
names has a page; a probe's verdict agrees with the speed it measured.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from eaglekb.kb import baselines as bl
from eaglekb.kb import knowledge, pages
from eaglekb.kb.schema import RECIPE_PREFIX
from eaglekb.measure import viability
from eaglekb.models import sources

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RECORDS = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text()) for p in sorted((ROOT / "baselines").glob("*/*.json"))}
FINDINGS = knowledge.load_findings(DOCS / "findings")
METRIC = re.compile(r"\{\{\s*metric\s+(\S+)\s+(\S+)\s*\}\}")


def test_every_headline_number_comes_from_a_placeholder():
    for fid, f in FINDINGS.items():
        assert f.headline and "{{ metric" in f.headline, fid
        assert pages.hand_typed_figures(f.headline) == [], (fid, f.headline)
    for page in pages.PRESENT_PAGES:
        text = (DOCS / page).read_text()
        assert pages.hand_typed_figures(text) == [], page
        meta = pages.front_matter_texts(text, page) if text.startswith("---") else []
        assert [(k, pages.hand_typed_figures(v)) for k, v in meta if pages.hand_typed_figures(v)] == [], page


def test_every_claim_takes_its_figures_from_placeholders():
    """A finding's claim states its measured figures through ``metric``/``config`` placeholders (a goal through
    ``quote``), so the claim, the headline and the page body cannot drift apart."""
    typed = {fid: [fig for _, fig in pages.hand_typed_figures(f.claim)] for fid, f in FINDINGS.items()}
    bad = {fid: figs for fid, figs in typed.items() if figs}
    assert not bad, f"hand-typed figures in claims: {bad}"
    for fid, f in FINDINGS.items():
        for bid, _path in METRIC.findall(f.claim):
            assert bid in RECORDS, (fid, bid)


def test_no_title_holds_a_figure():
    """The hooks print a finding's title as text (placeholders are not rendered there), so a title states the
    finding in words and leaves its numbers to the rendered claim and headline."""
    bad = {fid: [fig for _, fig in pages.hand_typed_figures(f.title)] for fid, f in FINDINGS.items()}
    bad = {fid: figs for fid, figs in bad.items() if figs or "{{" in FINDINGS[fid].title}
    assert not bad, f"figures or placeholders in finding titles: {bad}"


def test_no_placeholder_in_the_fields_printed_as_text():
    """A finding's status reason and scope are printed as they are written (only the claim and the headline are
    rendered), so a placeholder there would reach the reader as raw template text."""
    bad = {fid: [k for k in ("status_reason", "scope") if "{{" in str(getattr(f, k, "") or "")]
           for fid, f in FINDINGS.items()}
    assert not {fid: ks for fid, ks in bad.items() if ks}, bad


def test_a_target_page_names_its_drafter_by_the_hash_the_records_store():
    stored = {entry["sha256"] for d in RECORDS.values()
              for entry in (d["provenance"].get("inputs") or {}).values()
              if entry["role"] in ("drafter", "init") and entry.get("sha256")}
    for page in sorted((DOCS / "targets").glob("*.md")):
        named = set(re.findall(r"\b[0-9a-f]{64}\b", page.read_text()))
        assert named <= stored, f"{page.name}: {sorted(named - stored)} is no drafter hash a baseline stores"
    assert "35af1cca8e51e558253081b6dd88f54770dfabd5c86e6d6c555d97df1afa6abc" in \
        (DOCS / "targets/qwen2.5-coder-0.5b.md").read_text()  # r2, never committed: named by its hash


def test_the_drafter_table_names_each_drafter_by_the_hash_the_records_store():
    """``DRAFTERS`` (each embedded target's own drafter): a committed home is a folder git holds; a home kept
    outside the repository names the content hash the baselines store for it (over config.json +
    model.safetensors), never the hash of one of its files."""
    import subprocess

    from eaglekb.measure.setup import DRAFTERS

    stored = {entry["sha256"] for d in RECORDS.values() for entry in (d["provenance"].get("inputs") or {}).values()
              if entry["role"] == "drafter" and entry.get("sha256")}
    tracked = subprocess.run(["git", "ls-files", "--", "drafters"], cwd=DOCS.parent, capture_output=True, text=True,
                             check=True).stdout.split()
    for target, home in DRAFTERS.items():
        if home.committed:
            assert f"{home.path}/model.safetensors" in tracked and f"{home.path}/config.json" in tracked, target
        else:
            assert home.sha256 in stored, f"{target}: {home.sha256} is no drafter hash a baseline stores"


def test_hand_typed_figure_is_caught():
    assert pages.hand_typed_figures("runs 1.51x the engine, 717 tok/s") == [(1, "1.51"), (1, "717")]
    assert pages.hand_typed_figures("runs {{ metric bench/x best.vs_engine_x }}x on an H200") == []


def test_a_superseded_finding_does_not_speak_as_open_or_current():
    for fid, f in FINDINGS.items():
        evidence = [RECORDS[b] for b in f.evidence if b in RECORDS]
        if f.status in ("open", "contested"):
            assert not evidence or not all(r.get("superseded_by") for r in evidence), \
                f"{fid} is {f.status} but every baseline it rests on is superseded"
        if f.status == "superseded":
            assert f.superseded_by in FINDINGS, fid
            assert f.status_reason.startswith(f"Superseded by {f.superseded_by.split('-')[0]}"), fid
            assert not re.search(r"\bOpen\b:|\bis (?:now )?the (?:current|default)\b", f.status_reason + f.title), fid


def _drafter_record(root: Path, files: dict[str, bytes]) -> bl.Baseline:
    record = bl.load(ROOT / "baselines/bench/cpu-smollm2-r6-builtin.json")
    folder = root / "drafters/smollm2-135m-r6"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return record


def test_check_flags_a_drafter_path_that_now_holds_other_files(tmp_path):
    record = _drafter_record(tmp_path, {"config.json": b"{}", "model.safetensors": b"other weights"})
    problem = bl.drafter_moved(record, tmp_path)
    assert problem and "drafters/smollm2-135m-r6 now holds other files" in problem
    assert bl.drafter_moved(record, tmp_path / "elsewhere") is None  # not in this tree: nothing to compare


def test_check_passes_a_drafter_path_that_still_holds_its_files(tmp_path):
    src = ROOT / "drafters/smollm2-135m-r6"
    record = _drafter_record(tmp_path, {})
    for f in src.iterdir():
        (tmp_path / "drafters/smollm2-135m-r6" / f.name).symlink_to(f)
    assert bl.drafter_moved(record, tmp_path) is None


def test_every_record_names_the_drafter_it_read_or_why_not():
    sha = re.compile(r"^[0-9a-f]{64}$")
    for bid, data in RECORDS.items():
        for key, entry in (data["provenance"].get("inputs") or {}).items():
            if entry["role"] == "drafter":
                assert (entry["sha256"] and sha.match(entry["sha256"])) or entry["unknown"], (bid, key)
    ok, problems = bl.check_all(ROOT)
    assert [p for p in problems if "now holds other files" in p] == []


def _ignored(paths: list[str]) -> set[str]:
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(paths),
                          capture_output=True, text=True, check=False)
    return set(proc.stdout.split())


def test_every_reproduce_command_names_only_paths_a_clone_has(checkout_producers):
    import tasks
    from runbooks import _dryrun

    # what every record's command, finding's reproduce command, recipe step and documented command writes
    # (tests/conftest.py: built once from the same files for tests/test_recorded_commands.py too)
    producers = checkout_producers
    named: dict[str, list[str]] = {}
    for bid, data in RECORDS.items():
        cmd = data["provenance"].get("reproduce")
        if not cmd:
            continue
        if cmd.startswith(RECIPE_PREFIX):
            recipe = cmd[len(RECIPE_PREFIX):].split()[0]
            assert (ROOT / recipe).is_file(), f"{bid}: {cmd}: no recipe file {recipe} in the tree"
            continue
        for call in _dryrun.parse(cmd, tasks.ns):
            for name in sorted(call.typed - _dryrun.NAME_OPTIONS - _dryrun.OUTPUT_OPTIONS):
                values = call.values.get(name)
                for v in values if isinstance(values, list) else [values]:
                    if isinstance(v, str) and _dryrun._PATHLIKE.search(v) and "://" not in v \
                            and not v.startswith(("$", "/")) and v not in sources.SOURCES:
                        named.setdefault(v, []).append(bid)
    ignored = _ignored(list(named))
    bad = {p: bids for p, bids in named.items()
           if not producers.writes(p) and (p in ignored or not producers.has(p))}
    assert not bad, "reproduce commands name paths a clone lacks:\n" + "\n".join(
        f"{p}: {', '.join(b)}" for p, b in sorted(bad.items()))


def _sentences(text: str) -> list[str]:
    body = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", body):
        if block.lstrip().startswith("|"):
            out += block.splitlines()  # a table: each row is one comparison
        else:
            out += re.split(r"(?:(?<=[.;:])|(?<=[.;:]\)))\s+(?=[A-Z(])", " ".join(block.split()))
    return out


def _pages() -> list[Path]:
    return [*sorted((DOCS / "findings").glob("F*.md")), DOCS / "index.md", DOCS / "plan.md", DOCS / "story.md",
            *sorted((DOCS / "targets").glob("*.md"))]


def test_a_figure_and_the_figure_it_is_compared_with_come_from_one_run():
    """Where a sentence or table row puts a ratio against the engine beside the engine's own rate, or a
    ratio against transformers beside transformers' rate, both come from one baseline."""
    pairs = (("vs_engine_x", "engine.median_tok_s"), ("vs_hf_static_compile_x", "hf_static_compile.median_tok_s"))
    bad = []
    for page in _pages():
        for sentence in _sentences(page.read_text()):
            cited = METRIC.findall(sentence)
            for ratio, rate in pairs:
                ratios = {b for b, p in cited if p.endswith(ratio)}
                rates = {b for b, p in cited if p == rate}
                if len(ratios) == 1 and rates and rates != ratios:
                    bad.append(f"{page.relative_to(ROOT)}: {sorted(ratios)} beside {sorted(rates)}: {sentence[:160]}")
    assert not bad, "\n".join(bad)


def test_every_target_a_baseline_names_has_a_page():
    named = {d["config"].get("target") for d in RECORDS.values()} & set(sources.SOURCES)
    assert "smollm2-135m" in named and "qwen2.5-coder-0.5b" in named
    missing = sorted(t for t in named if not (DOCS / "targets" / f"{t}.md").is_file())
    assert not missing, f"targets without docs/targets/<target>.md: {missing}"


@pytest.mark.parametrize("predicted, measured, viable, word", [
    (True, None, True, "viable"),
    (False, None, False, "NOT viable (below break-even)"),
    (True, 0.91, False, "NOT viable (measured 0.91x plain decoding; break-even predicted a gain)"),
    (False, 1.20, True, "viable (measured 1.20x plain decoding)"),
])
def test_the_verdict_follows_a_measured_speed(predicted, measured, viable, word):
    assert viability.verdict_text(predicted, measured) == (viable, word)


def test_every_recorded_verdict_agrees_with_its_measured_speed():
    for bid, data in RECORDS.items():
        x = data["metrics"].get("measured_speedup_x") if data["kind"] == "probe" else None
        summary = data.get("summary") or ""
        if x is None or "viable" not in summary:
            continue
        says_viable = "NOT viable" not in summary
        assert says_viable == (x > 1.0), (bid, x, summary)
