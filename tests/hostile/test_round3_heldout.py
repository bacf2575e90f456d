"""Held-out hostile cases of round three, by kind: recipe files (YAML tags, duplicate keys, alias bombs, deep
nesting, values a task would read as options), a run folder that is a file, `models.random --set` values a
config cannot hold, and a hand-edited baseline's parse error in the Markdown diff (rendered as text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglekb.data.prompts import read_prompts_file
from eaglekb.io.errors import BadInput, MissingFile
from helpers.hostile import refused, run_cli

ROOT = Path(__file__).resolve().parents[2]

GOOD = "name: t\nsteps:\n  plan: {baseline_tps: 82, cycle_ms: 30}\n"
BOMB = ("[&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
        "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]")


def _recipe(ws, text: str, name: str = "r.yaml"):
    path = ws.root / "rc" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return f"rc/{name}"


# --------------------------------------------------------------------------- recipe files


@pytest.mark.parametrize("text, fragments", [
    (GOOD + "  plan: {baseline_tps: 90, cycle_ms: 30}\n", ("duplicate key", "r.yaml:4", "'plan' also on line 3")),
    ("name: t\nsteps:\n  plan: {baseline_tps: 82, baseline_tps: 90}\n", ("duplicate key", "'baseline_tps'")),
    ("name: t\nname: u\nsteps: {plan: {}}\n", ("duplicate key", "r.yaml:2")),
    ("name: t\ntarget: " + BOMB + "\nsteps: {plan: {}}\n", ("aliases are expanded", "r.yaml")),
    ("name: t\nsteps: {plan: {baseline_tps: " + BOMB + "}}\n", ("aliases are expanded",)),
    ("name: t\nsteps: {plan: {baseline_tps: " + "[" * 3000 + "]" * 3000 + "}}\n", ("nested too deeply", "r.yaml")),
    ("name: !!python/object/apply:os.system ['true']\nsteps: {plan: {}}\n", ("not valid YAML", "r.yaml:1")),
    ("- plan\n", ("not a recipe", "found list")),
    ("name: t\nsteps:\n  plan: {baseline_tps: \"82\\0\", cycle_ms: 30}\n", ("cannot be passed", "--baseline-tps")),
    ("name: t\nsteps:\n  plan: {baseline_tps: 82, cycle_ms: 30, record: --help}\n", ("cannot be passed", "--record")),
], ids=["dup-step", "dup-option", "dup-top", "bomb-target", "bomb-option", "deep", "python-tag", "list-root", "nul",
        "help-word"])
def test_a_hostile_recipe_is_one_line_naming_the_file(ws, text, fragments):
    path = _recipe(ws, text)
    before = ws.state()
    refused(run_cli(["recipe", path, "--dry-run"]), *fragments)
    assert ws.state() == before


def test_merge_keys_and_anchors_that_expand_small_still_work(ws):
    text = "name: t\nsteps:\n  plan: &b {baseline_tps: 82, cycle_ms: 30}\n  plan@2: {<<: *b, cycle_ms: 40}\n"
    res = run_cli(["recipe", _recipe(ws, text), "--dry-run"])
    assert res.code == 0 and "--cycle-ms 40" in res.out, res


def test_a_value_starting_with_a_dash_is_passed_as_the_options_value(ws):
    res = run_cli(["recipe", _recipe(ws, GOOD), "--dry-run", "--set", "plan.baseline_tps=-5"])
    assert res.code == 0 and "--baseline-tps=-5 " in res.out, res


def test_an_empty_only_and_a_run_folder_that_is_a_file_are_refused_before_any_step(ws):
    path = _recipe(ws, GOOD)
    refused(run_cli(["recipe", path, "--dry-run", "--only", ","]), "--only")
    before = ws.state()
    refused(run_cli(["recipe", path, "--run-dir", "in/prompts.txt"]), "--run-dir in/prompts.txt", "a file")
    assert ws.state() == before and not (ws.root / ".eaglekb" / "history").exists()


# --------------------------------------------------------------------------- models.random --set


@pytest.mark.parametrize("setting", ["hidden_size=1e308", "hidden_size=nan", "hidden_size=abc", "num_hidden_layers=0",
                                     "num_hidden_layers=-2", "rms_norm_eps=inf", "rope_theta=-1"])
def test_a_config_value_no_model_can_have_is_refused_naming_set(setting):
    from eaglekb.io.errors import BadInput
    from eaglekb.models import random_copy
    from runbooks.models import _overrides

    # the task's work (random_copy) is stubbed in this module: the check it runs before building the config
    with pytest.raises(BadInput) as err:
        random_copy._check_overrides(_overrides([setting]))
    assert f"--set {setting.partition('=')[0]}=" in str(err.value)


def test_ordinary_config_values_pass():
    from eaglekb.models import random_copy
    from runbooks.models import _overrides

    random_copy._check_overrides(_overrides(["hidden_size=64", "rms_norm_eps=1e-5", "model_type=llama"]))


# --------------------------------------------------------------------------- a hand-edited baseline in a diff


def test_a_parse_error_quoting_a_baseline_is_text_in_the_markdown_diff():
    from eaglekb.kb.diff import DiffReport, Problem
    from eaglekb.kb.diff_render import to_markdown

    error = "found metrics.x<img src=x onerror=alert(1)>`: key must match"
    report = DiffReport(rev_a="a", rev_b="WORKTREE", commit_a=None, commit_b=None, threshold_rel=None, changes=[],
                        problems=[Problem(revision="working tree", path="baselines/plan/x.json", error=error)],
                        unchanged=0)
    line = next(ln for ln in to_markdown(report).splitlines() if "onerror" in ln)
    assert "`found metrics.x<img src=x onerror=alert(1)>': key must match`" in line


# --------------------------------------------------------------------------- numbers past what a plan can mean


@pytest.mark.parametrize("argv, option", [
    (["plan", "--baseline-tps=1e308", "--cycle-ms=30"], "--baseline-tps"),
    (["plan", "--baseline-tps=82", "--cycle-ms=1e-308"], "--cycle-ms"),
    (["plan", "--baseline-tps=82", "--cycle-ms=30", "--accept-len=1e308"], "--accept-len"),
    (["plan", "--baseline-tps=82", "--cycle-ms=30", "--target-tps=1e300"], "--target-tps"),
], ids=["tps", "cycle", "accept", "target"])
def test_a_plan_number_that_overflows_its_arithmetic_is_refused_as_the_option(ws, argv, option):
    before = ws.state()
    refused(run_cli(argv), "out of range", option)
    assert ws.state() == before


# --------------------------------------------------------------------------- a key given twice, a folder for a file


def test_a_key_given_twice_is_refused_wherever_json_is_read(ws):
    """A drafter config, a prompts line and a baseline that give one key twice: a plain JSON load keeps the last
    one silently; each is one line naming the key."""
    import shutil

    drafter = ws.root / "rc" / "dup-drafter"
    shutil.copytree(ws.inputs / "drafter", drafter)
    text = (drafter / "config.json").read_text()
    (drafter / "config.json").write_text(text.replace("{", '{"hidden_size": 7, ', 1))
    refused(run_cli(["inspect", "rc/dup-drafter"]), "key twice", "hidden_size")
    base = json.loads((ROOT / "baselines" / "plan" / "k25-investigation.json").read_text())
    (ws.root / "baselines" / "plan").mkdir(parents=True, exist_ok=True)
    (ws.root / "baselines" / "plan" / "dup.json").write_text(
        json.dumps(base, indent=2).replace("{", '{"kind": "plan", ', 1))
    res = run_cli(["baselines.check"])
    assert res.code != 0 and "key twice" in res.out + res.err, res
    (ws.root / "baselines" / "plan" / "dup.json").unlink()
    prompts = ws.root / "rc" / "dup.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "a"}], "messages": []}\n')
    with pytest.raises(BadInput, match="key twice"):
        read_prompts_file(prompts)


def test_a_folder_where_a_file_belongs_is_said_to_be_a_folder(ws):
    folder = ws.root / "rc" / "a-folder"
    folder.mkdir(parents=True, exist_ok=True)
    with pytest.raises(MissingFile, match="is a folder"):
        read_prompts_file(folder)
    refused(run_cli(["vocab.compare", "rc/a-folder", "in/mapping.safetensors"]), "folder")
