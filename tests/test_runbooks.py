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


# --------------------------------------------------------------------------- help


NOT_AN_OPTION = object()


def _help_rows(t):
    """(option spec, help text, signature default) for each option of a task's help (``runbooks._help.usage``)."""
    import inspect

    from runbooks._help import usage

    params = {p.name: p.default for p in list(inspect.signature(t.body).parameters.values())[1:]}
    rows: list[list[str]] = []
    for line in usage(t).split("Options:\n", 1)[1].splitlines():
        if line.startswith("    ") and rows:  # a long spec's help, on the next line
            rows[-1][1] = line.strip()
        elif line.startswith("  "):
            spec, _, help_text = line.strip().partition("  ")
            rows.append([spec, help_text.strip()])
    out = []
    for spec, help_text in rows:
        flag = spec.split(" (")[-1].split(", ")[-1].split("=")[0].rstrip(")").replace("--[no-]", "--")
        key = flag[2:].replace("-", "_")
        out.append((spec, help_text, params.get(key, params.get(key + "_", NOT_AN_OPTION))))
    return out


def test_every_option_with_a_default_shows_it_once_and_no_short_flag_is_a_dash():
    from helpers.hostile import all_tasks

    from runbooks._help import _shown

    problems = []
    for name, t in all_tasks().items():
        if not hasattr(t, "help_texts"):
            continue
        rows = _help_rows(t)
        assert rows, name
        for spec, help_text, default in rows:
            if spec.startswith("--, "):
                problems.append(f"{name}: {spec} has '--' as a short flag")
            if default is NOT_AN_OPTION and spec != "--force":
                problems.append(f"{name}: {spec} is no option of the task")
            positional = " (" in spec  # NAME (--name=PATH): given, never defaulted
            shown = "" if positional or default is NOT_AN_OPTION else _shown(default)
            if shown and help_text.count(f"[default: {shown}]") != 1:
                problems.append(f"{name}: {spec} does not show [default: {shown}] once: {help_text[:100]}")
    assert problems == [], "\n".join(problems)


def test_probe_help_labels_names_or_paths_and_shows_every_default():
    out = invoke("probe", "--help")
    assert out.returncode == 0 and not out.stderr, out.stderr
    lines = {line.split("=")[0].split(", ")[-1].strip(): line for line in out.stdout.splitlines() if "--" in line}
    assert "--prompts=NAME|PATH" in lines["--prompts"] and "--target=NAME|PATH" in lines["--target"]
    assert "--drafter=PATH" in lines["--drafter"]  # a folder only
    assert lines["--steps"].endswith("(SGLang --speculative-num-steps) [default: 3]")
    assert lines["--num-prompts"].endswith("how many prompts [default: 8]")


@pytest.mark.parametrize(
    "text, default, shown",
    [
        ("how many prompts (default 8)", 8, "how many prompts [default: 8]"),
        ("draft steps (SGLang --speculative-num-steps, default 3)", 3, "draft steps (SGLang --speculative-num-steps) [default: 3]"),
        ("largest piece in MiB (default 16)", 16.0, "largest piece in MiB [default: 16.0]"),
        ("address (default 127.0.0.1:8000)", "127.0.0.1:8000", "address [default: 127.0.0.1:8000]"),
        ("output folder (default site/)", "site", "output folder [default: site]"),
        ("symlink (default), redirect or copy", "symlink", "symlink, redirect or copy [default: symlink]"),
        ("bfloat16 (default; float32 master weights) or none", "bfloat16",
         "bfloat16 (float32 master weights) or none [default: bfloat16]"),
        ("batch (default 8: batch 1 is what is timed)", 8, "batch (batch 1 is what is timed) [default: 8]"),
        ("install (default; --no-install refuses)", True, "install (--no-install refuses) [default: on]"),
        ("a size (default 4, the usual)", 8, "a size (default 4, the usual) [default: 8]"),  # says another: kept
        ("compare with NAME (default: the run with the same config)", None,
         "compare with NAME (default: the run with the same config)"),
        ("tree branching", 1, "tree branching [default: 1]"),
    ],
)
def test_help_shows_the_real_default_and_drops_a_hand_typed_copy(text, default, shown):
    from runbooks._help import with_default

    assert with_default(text, default) == shown
