"""The runbook contract through the real `invoke` entry point: --json last line, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
K25 = ["--baseline-tps", "82", "--cycle-ms", "30", "--accept-len", "2.0",
       "--target-tps", "150", "--target-tps", "200", "--steps", "2"]


def invoke(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def test_list_shows_every_task_with_help():
    out = invoke("--list", "--list-format=json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = {c["name"] for c in data["collections"]}
    assert {"plan", "baselines", "docs"} <= names


def test_plan_reproduces_recorded_baseline():
    out = invoke("plan", *K25, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["breakeven_len"] == pytest.approx(2.46)
    assert doc["comparison"]["baseline_id"] == "plan/k25-investigation"
    assert doc["comparison"]["reproduced"] is True
    assert [t["reachable"] for t in doc["targets"]] == [False, False]


def test_plan_text_names_unreachable_targets():
    out = invoke("plan", *K25)
    assert "UNREACHABLE with 2 steps" in out.stdout and "reproduced plan/k25-investigation" in out.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--baseline-tps", "-82", "--cycle-ms", "30"], "--baseline-tps"),
        (["--baseline-tps", "82", "--cycle-ms", "0"], "--cycle-ms"),
        (["--baseline-tps", "fast", "--cycle-ms", "30"], "not a number"),
        (["--cycle-ms", "30"], "missing option"),
        (["--baseline-tps", "82", "--cycle-ms", "30", "--steps", "two"], "--steps"),
        (["--baseline-tps", "82", "--cycle-ms", "30", "--accept-len", "0.3"], "--accept-len"),
    ],
)
def test_plan_bad_input(args, fragment):
    out = invoke("plan", *args)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in out.stderr


def test_record_writes_baseline(tmp_path):
    (tmp_path / "baselines").mkdir()
    out = invoke("plan", *K25, "--record", "scratch", "--json", env={"EAGLEKB_ROOT": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    written = tmp_path / "baselines/plan/scratch.json"
    data = json.loads(written.read_text())
    assert data["source"] == "measured" and data["metrics"]["breakeven_len"] == pytest.approx(2.46)
    assert "--record scratch" in data["provenance"]["command"]


def test_baselines_check_passes_and_fails(tmp_path):
    assert invoke("baselines.check").returncode == 0
    bad = tmp_path / "baselines/plan/bad.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    out = invoke("baselines.check", env={"EAGLEKB_ROOT": str(tmp_path)})
    assert out.returncode == 1 and "bad.json:1:2" in out.stdout
