"""scripts/gpu_story.py end to end on CPU (tiny random Llama, tiny budgets): the plumbing the GPU run relies on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_story.py"


@pytest.mark.slow
def test_tiny_story_end_to_end(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(SCRIPT), "run", "--tiny", "--threads", "1", "--work", str(work),
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 << 20 for f in files)
    story = json.loads((out / "story.json").read_text())
    assert story["complete"] and not story["skipped"]
    assert set(story["env"]) >= {"python", "torch", "transformers", "cuda", "gpu", "host", "time"}
    arms = ["a-scratch", "b-noremap", "b-remap", "b-scratch"]
    assert set(story["verdicts"]) == set(arms)
    assert {f"finetune-{a}.json" for a in arms + ["b-noremap-small", "b-remap-small", "b-scratch-small"]} <= set(files)
    docs = {a: json.loads((out / f"finetune-{a}.json").read_text()) for a in arms}
    # equal data and step budgets for the Phase 1 arms
    steps = {docs[a]["metrics"]["run"]["optimizer_steps"] for a in arms[1:]}
    assert len(steps) == 1
    assert len({docs[a]["config"]["data"] for a in arms[1:]}) == 1
    assert "no-remap" in docs["b-noremap"]["config"]["mapping_report"]["remap"]
    assert isinstance(docs["b-remap"]["config"]["mapping_report"]["remap"], dict)
    assert docs["b-scratch"]["config"]["init"] is None
    for a, d in docs.items():
        m = d["metrics"]
        assert "first_step_loss" in m["start"] and {"acc", "full_acc", "cond_acc"} <= set(m["val"])
        assert d["series"]["train_loss"]["points"]["1"] == m["start"]["first_step_loss"]
        on = d["probe"]["metrics"]["online"]
        assert on["accept_len"] >= 1.0 and on["cycle_ms"] > 0 and d["probe"]["metrics"]["breakeven_len"] > 0
    # every file records as a baseline (schema-checked, nothing written)
    rec = [sys.executable, str(ROOT / "scripts" / "record_device_run.py")]
    for args in (["finetune", "t", str(out / "finetune-b-remap.json")],
                 ["probe", "t", str(out / "finetune-a-scratch.json"), "--part", "probe"],
                 ["datagen", "t", str(out / "story.json"), "--part", "datagen.b"]):
        r = subprocess.run(rec + args + ["--command", "python3 scripts/gpu_story.py run --tiny", "--commit", "0" * 40,
                                         "--dry-run"], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0 and "valid" in r.stdout, r.stdout + r.stderr
