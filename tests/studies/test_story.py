"""`invoke story.*` end to end on CPU (tiny random Llama, tiny budgets), and the story's error paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile
from eaglekb.kb import baselines
from eaglekb.studies import story
from helpers import background

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["a-scratch", "b-noremap", "b-remap", "b-scratch"]


def _invoke(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def _tiny_run_job(tmp_path_factory):
    """`invoke story.run --tiny` into a new temp folder, as a function to run now or in the background; it returns
    the output folder."""
    base = tmp_path_factory.mktemp("story")

    def run():
        out, work = base / "out", base / "work"  # the export test reads work as tiny_run.parent / "work"
        proc = background.run([sys.executable, "-m", "invoke", "story.run", "--tiny", "--threads", "1", "--work",
                               str(work), "--out", str(out)], cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return out

    return run


def background_job(item):
    """The tiny story run, started when the test run begins (tests/conftest.py): a child process that needs
    nothing of this one, so it runs beside the tests before this module's."""
    return ("story-tiny", _tiny_run_job) if "tiny_run" in item.fixturenames else None


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return background.take("story-tiny", lambda: _tiny_run_job(tmp_path_factory)())


def test_tiny_story_runs_every_arm_at_equal_budgets(tiny_run):
    files = sorted(p.name for p in tiny_run.iterdir())
    assert len(files) <= 8 and all((tiny_run / f).stat().st_size < 16 << 20 for f in files)
    doc = json.loads((tiny_run / "story.json").read_text())
    assert doc["complete"] and not doc["skipped"]
    assert doc["provenance"]["command"].startswith("invoke story.run")
    assert set(doc["verdicts"]) == set(ARMS)
    runs = doc["runs"]
    assert set(runs) == set(ARMS) | {"b-noremap-small", "b-remap-small", "b-scratch-small"}
    # equal data and step budgets for the Phase 1 arms
    assert len({runs[a]["metrics"]["run"]["optimizer_steps"] for a in ARMS[1:]}) == 1
    assert len({runs[a]["config"]["data"] for a in ARMS[1:]}) == 1
    assert "no-remap" in runs["b-noremap"]["config"]["mapping_report"]["remap"]
    assert isinstance(runs["b-remap"]["config"]["mapping_report"]["remap"], dict)
    assert runs["b-scratch"]["config"]["init"] is None
    for a in ARMS:
        m = runs[a]["metrics"]
        assert "first_step_loss" in m["start"] and {"acc", "full_acc", "cond_acc"} <= set(m["val"])
        assert runs[a]["series"]["train_loss"]["points"]["1"] == m["start"]["first_step_loss"]
        on = runs[a]["probe"]["metrics"]["online"]
        assert on["accept_len"] >= 1.0 and on["cycle_ms"] > 0 and runs[a]["probe"]["metrics"]["breakeven_len"] > 0
    assert set(doc["drafters_export"]["drafters"]) == set(ARMS)


def test_record_builds_every_baseline_and_unpacks_drafters(tiny_run, tmp_path):
    proc = _invoke("story.record", str(tiny_run), "tiny", "--commit", "0" * 40, "--dry-run",
                   "--drafters", str(tmp_path / "drafters"), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = set(res["baselines"])
    assert {"datagen/tiny-a", "datagen/tiny-b", "vocab/tiny-mapping-a-vs-b", "plan/tiny-verdicts"} <= ids
    assert {f"finetune/tiny-{a}" for a in ARMS} | {f"probe/tiny-{a}" for a in ARMS} <= ids
    assert not (ROOT / "baselines" / "finetune" / "tiny-a-scratch.json").exists()  # dry run wrote nothing
    assert not (tmp_path / "drafters").exists()  # the pieces were checked, nothing unpacked
    story.unpack_drafters(tiny_run, tmp_path / "drafters")
    for a in ARMS:
        assert (tmp_path / "drafters" / a / "model.safetensors").is_file()
    specs = story.baseline_specs(tiny_run, prefix="tiny", command="c", commit="0" * 40)
    assert all(isinstance(s, dict) for s in specs)  # plain fields: kb validates and writes them
    b = {x.id: x for x in (baselines.build(**s) for s in specs)}
    assert set(b) == ids
    plan = b["plan/tiny-verdicts"]
    assert plan.provenance.git_commit == "0" * 40 and plan.provenance.command == "c"
    assert set(plan.metrics) == {a.replace("-", "_") for a in ARMS}


def test_unpack_refuses_corrupt_or_missing_pieces(tiny_run, tmp_path):
    copy = tmp_path / "out"
    copy.mkdir()
    for p in tiny_run.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    part = copy / "drafters.tar.part00"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="corrupt"):
        story.unpack_drafters(copy, tmp_path / "d")
    assert not (tmp_path / "d").exists()
    part.unlink()
    with pytest.raises(MissingFile, match="missing"):
        story.unpack_drafters(copy, tmp_path / "d")


def test_bad_prompts_file_is_one_clear_error(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"set": "A", "id": "x:1", "messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    with pytest.raises(BadInput) as e:
        story.read_prompts(f)
    assert f"{f}:2" in e.value.line()
    f.write_text('{"set": "A", "id": "x:1", "messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(BadInput, match="empty"):
        story.read_prompts(f)
    with pytest.raises(MissingFile):
        story.load(tmp_path)
    proc = _invoke("story.record", str(tmp_path), "x", "--dry-run")
    assert proc.returncode != 0 and proc.stderr.strip().startswith("error:") and len(proc.stderr.splitlines()) == 1


def test_export_after_the_run_is_checked_against_the_trained_hashes(tiny_run, tmp_path):
    work = tiny_run.parent / "work"
    proc = _invoke("story.export", "--work", str(work), "--names", "b-remap,a-scratch", "--out", str(tmp_path / "x"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = story.unpack_drafters(tiny_run, tmp_path / "d", tmp_path / "x")
    assert sorted(got) == ["a-scratch", "b-remap"]
    # a drafter changed after training is refused: the export no longer matches what the run recorded
    (work / "run-b-remap" / "drafter" / "config.json").write_text("{}")
    story.export_from_work(work, ["b-remap"], tmp_path / "y")
    with pytest.raises(IntegrityError, match="not the one the run trained"):
        story.unpack_drafters(tiny_run, tmp_path / "e", tmp_path / "y")
    assert not (tmp_path / "e").exists()
    with pytest.raises(MissingFile, match="no such drafter"):
        story.export_from_work(work, ["nope"], tmp_path / "z")


def test_retrained_noise_loosens_acceptance_details_not_timings():
    base = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02,
            "tolerance_abs": {"breakeven_len": 0.9}}
    metrics = {"breakeven_len": 1.8, "online": {"accept_len": 1.85, "cycle_ms": 5.0, "cycles_count": 400},
               "offline": {"acc_step1_frac": 0.5}, "val": {"acc": {"step0_pct": 55.0}}}
    n = story.retrained_noise(base, metrics)
    assert n["tolerance_rel"] == 0.05 and n["tolerance_abs"]["breakeven_len"] == 0.9
    assert n["tolerance_abs"]["val.acc.step0_pct"] == 2.0 and n["tolerance_abs"]["offline.acc_step1_frac"] == 0.1
    assert n["tolerance_abs"]["online.cycles_count"] == 110.0
    assert "online.cycle_ms" not in n["tolerance_abs"] and "online.accept_len" not in n["tolerance_abs"]


def test_export_budget_keeps_the_most_useful_drafters_that_fit():
    mib = 1 << 20
    sizes = {"b-remap": 19 * mib, "a-scratch": 19 * mib, "b-noremap": 19 * mib, "b-scratch": 19 * mib}
    assert story.fit_budget(sizes, 60 * mib) == ["b-remap", "a-scratch", "b-noremap"]
    assert story.fit_budget(sizes, 10 * mib) == []
    assert story.MAIN_RUNS[0] == "b-remap"
