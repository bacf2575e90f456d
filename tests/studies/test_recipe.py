"""Recipes (eaglekb.studies.recipe, runbooks/recipe.py): strict keys, overrides, dry-run, step choice, resume,
failure, and every committed recipe checked against the real tasks. Steps run through a fake runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from eaglekb.io.errors import BadInput
from eaglekb.studies import recipe as lib
from runbooks import _dryrun
from runbooks.recipe import task_options

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SPECS = task_options(tasks.ns)

SMALL = """\
name: small
target: smollm2-135m
device: cpu
steps:
  datagen: {corpus: [wiki, chitchat], per_source: 4, out: "{run}/data"}
  vocab.build: {dataset: ["{run}/data"], draft_vocab_size: 256, out: "{run}/vocab.safetensors"}
  finetune: {data: "{run}/data", steps: 4, compile: off, profile: true, out: "{run}/train"}
  probe: {drafter: "{run}/train/drafter", num_prompts: 2}
  bench: {drafter: "{run}/train/drafter", peers: ""}
"""


def write(tmp_path: Path, text: str = SMALL) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str = SMALL, **kw) -> lib.Recipe:
    return lib.load(write(tmp_path, text), SPECS, root=ROOT, run_dir=kw.pop("run_dir", tmp_path / "run"), **kw)


class FakeRunner:
    """Records each command; exits with the code given for a task (0 otherwise)."""

    def __init__(self, codes: dict[str, int] | None = None):
        self.codes, self.calls = codes or {}, []

    def __call__(self, argv: list[str], cwd: Path) -> int:
        self.calls.append(argv)
        return self.codes.get(argv[1], 0)


def run(rec: lib.Recipe, runner: FakeRunner, **kw) -> lib.Outcome:
    steps = lib.select(rec, only=kw.pop("only", None), start=kw.pop("start", None))
    planned = lib.plan(rec, steps, SPECS, **kw)
    return lib.execute(rec, planned, runner=runner, log=lambda s: None)


def test_commands_are_built_from_the_recipe_with_shared_values(tmp_path):
    rec = load(tmp_path)
    cmds = {s.key: s.command for s in rec.steps}
    run_text = str((tmp_path / "run").resolve())
    assert cmds["datagen"] == (f"invoke datagen --target smollm2-135m --device cpu --corpus wiki --corpus chitchat "
                               f"--per-source 4 --out {run_text}/data")
    assert "--target" not in cmds["vocab.build"]  # only renders --corpus text: never given the recipe's target
    assert cmds["finetune"].endswith("--compile off --profile --out " + f"{run_text}/train")
    assert "--peers ''" in cmds["bench"]
    # sglang.install's --target is the folder it installs into: the recipe's target (a model) never fills it
    with pytest.raises(BadInput, match="missing required option of invoke sglang.install"):
        load(tmp_path, SMALL.replace("steps:\n", "steps:\n  sglang.install: {pieces: .eaglekb/sglang/stack}\n"))


def test_default_run_folder_is_under_the_root_and_written_relative(tmp_path):
    rec = lib.load(write(tmp_path), SPECS, root=ROOT)
    assert rec.run == ROOT.resolve() / ".eaglekb" / "runs" / "small"
    assert "--out .eaglekb/runs/small/data" in rec.steps[0].command


@pytest.mark.parametrize("text, fragment", [
    (SMALL + "colour: red\n", "unknown top-level key"),
    (SMALL.replace("  probe:", "  prob:"), "did you mean probe?"),
    (SMALL.replace("steps: 4,", "stepz: 4,"), "did you mean steps?"),
    (SMALL.replace("device: cpu", "device: gpu"), "bad device"),
    (SMALL.replace("name: small", "name: ../x"), "bad recipe name"),
    (SMALL.replace('"{run}/train/drafter", num', '"{runn}/train/drafter", num'), "unknown placeholder"),
    (SMALL.replace("profile: true", "profile: 3"), "option is a switch"),
    (SMALL.replace("vocab.build: {dataset", "vocab.build: {datasets"), "did you mean dataset?"),
    ("- a list\n", "not a recipe"),
    ("name: [\n", "not valid YAML"),
])
def test_strict_keys_are_one_line_naming_file_and_key(tmp_path, text, fragment):
    with pytest.raises(BadInput) as exc:
        load(tmp_path, text)
    line = exc.value.line()
    assert fragment in line and "\n" not in line
    assert str(tmp_path / "r.yaml") in line


def test_a_missing_required_option_is_refused(tmp_path):
    with pytest.raises(BadInput, match="missing required option of invoke vocab.build"):
        load(tmp_path, SMALL.replace(', out: "{run}/vocab.safetensors"', ""))


def test_overrides_set_step_options_and_top_level_keys(tmp_path):
    rec = load(tmp_path, sets=["finetune.steps=100", "finetune.batch-size=16", "device=cuda", "nproc=2",
                               "datagen.corpus=[gsm8k]", "bench.peers="])
    cmds = {s.key: s.command for s in rec.steps}
    assert "--steps 100 " in cmds["finetune"] and "--batch-size 16" in cmds["finetune"]
    assert "--device cuda --nproc 2" in cmds["finetune"] and "--nproc 2" in cmds["datagen"]
    assert "--nproc" not in cmds["probe"]  # probe has no --nproc
    assert "--corpus gsm8k " in cmds["datagen"] and "chitchat" not in cmds["datagen"]
    assert "--peers" not in cmds["bench"]  # an empty value: the option left out
    for bad, fragment in (("finetune.stepz=1", "did you mean steps?"), ("fintune.steps=1", "did you mean finetune?"),
                          ("colour=red", "unknown top-level key"), ("novalue", "bad override")):
        with pytest.raises(BadInput, match=fragment.replace("?", r"\?")):
            load(tmp_path, sets=[bad])


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    path = write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "invoke", "recipe", str(path), "--dry-run", "--run-dir",
                          str(tmp_path / "run"), "--set", "finetune.steps=7"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("invoke ")]
    assert [line.split()[1] for line in lines] == ["datagen", "vocab.build", "finetune", "probe", "bench"]
    assert "--steps 7 " in lines[2]
    assert not (tmp_path / "run").exists()


def test_only_and_from_choose_steps(tmp_path):
    rec = load(tmp_path)
    assert [s.key for s in lib.select(rec, only="probe,datagen")] == ["datagen", "probe"]
    assert [s.key for s in lib.select(rec, start="finetune")] == ["finetune", "probe", "bench"]
    with pytest.raises(BadInput, match="did you mean probe"):
        lib.select(rec, only="prob")
    with pytest.raises(BadInput, match="not both"):
        lib.select(rec, only="probe", start="bench")


def test_a_run_writes_its_state_and_resume_skips_finished_steps(tmp_path):
    rec = load(tmp_path)
    first = FakeRunner({"finetune": 3})
    outcome = run(rec, first)
    assert (outcome.code, outcome.failed) == (3, "finetune")
    assert [a[1] for a in first.calls] == ["datagen", "vocab.build", "finetune"]  # stopped at the failure
    state = json.loads((tmp_path / "run" / lib.STATE_FILE).read_text())
    assert state["steps"]["datagen"]["exit_code"] == 0 and state["steps"]["datagen"]["finished"]
    assert state["steps"]["finetune"]["exit_code"] == 3
    assert state["steps"]["datagen"]["command"] == rec.steps[0].command
    # without --resume a folder with finished steps is refused
    with pytest.raises(BadInput, match="--resume"):
        run(rec, FakeRunner())
    # --resume: finished steps skipped; finetune continues from its checkpoint
    ckpt = tmp_path / "run" / "train" / "checkpoints" / "step-0000002"
    second = FakeRunner()
    outcome = run(rec, second, resume=True, newest_checkpoint=lambda out: ckpt if out.name == "train" else None)
    assert outcome.code == 0 and outcome.skipped == ["datagen", "vocab.build"]
    assert [a[1] for a in second.calls] == ["finetune", "probe", "bench"]
    assert second.calls[0][-1] == "--resume"
    state = json.loads((tmp_path / "run" / lib.STATE_FILE).read_text())
    assert all(s["exit_code"] == 0 for s in state["steps"].values())
    # a changed option reruns that step and every step after it
    third = FakeRunner()
    run(load(tmp_path, sets=["vocab.build.draft_vocab_size=512"]), third, resume=True)
    assert [a[1] for a in third.calls] == ["vocab.build", "finetune", "probe", "bench"]
    # --only runs a finished step again without --resume
    fourth = FakeRunner()
    run(rec, fourth, explicit=True, only="probe")
    assert [a[1] for a in fourth.calls] == ["probe"]


def test_the_task_exits_with_the_failing_steps_code(tmp_path):
    text = SMALL.replace("name: small", "name: failing").replace(
        "  datagen: {corpus: [wiki, chitchat], per_source: 4, out: \"{run}/data\"}\n",
        "  plan: {baseline_tps: 0}\n")
    path = write(tmp_path, text)
    out = subprocess.run([sys.executable, "-m", "invoke", "recipe", str(path), "--run-dir", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "error: step plan failed with exit code 2" in out.stderr.splitlines()[-1]
    state = json.loads((tmp_path / "run" / lib.STATE_FILE).read_text())
    assert list(state["steps"]) == ["plan"] and state["steps"]["plan"]["exit_code"] == 2


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_committed_recipe_parses_and_its_commands_are_real(path):
    text = path.read_text(encoding="utf-8")
    rec = lib.load(path, SPECS, root=ROOT, record_prefix="check" if "{record:" in text else None)
    assert rec.name == path.stem
    assert text.startswith(f"# recipes/{path.name}:"), "a comment header says what it reproduces"
    planned = lib.plan(rec, lib.select(rec), SPECS, dry_run=True)
    assert lib.render_plan(rec, planned).count("\ninvoke ") == len(rec.steps)
    for step in rec.steps:
        calls = _dryrun.parse(step.command, tasks.ns)  # invoke's own parser, against the real tasks
        assert len(calls) == 1
        problems = [p for p in _dryrun.check(step.command, tasks.ns, ROOT, None) if "option" in p or ":" in p]
        assert problems == [], (step.key, problems)


def test_the_recipe_task_is_listed():
    out = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert "recipe" in out.stdout


def _prepared(name: str) -> bool:
    from eaglekb.models import sources

    try:
        return (Path(sources.resolve(name)) / "config.json").is_file()
    except Exception:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _prepared("smollm2-135m"), reason="needs `invoke models.prepare smollm2-135m`")
def test_the_tiny_recipe_runs_end_to_end_on_cpu(tmp_path):
    run_dir = tmp_path / "tiny"
    out = subprocess.run([sys.executable, "-m", "invoke", "recipe", "recipes/tiny-cpu.yaml", "--run-dir",
                          str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert out.returncode == 0, out.stderr[-2000:]
    state = json.loads((run_dir / lib.STATE_FILE).read_text())
    assert [s["exit_code"] for s in state["steps"].values()] == [0] * 6
    assert (run_dir / "train" / "drafter" / "model.safetensors").is_file()
    again = subprocess.run([sys.executable, "-m", "invoke", "recipe", "recipes/tiny-cpu.yaml", "--run-dir",
                            str(run_dir), "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("skip ") == 6


def test_run_recipe_plans_or_runs_in_one_call(tmp_path):
    path = write(tmp_path)
    doc = lib.run_recipe(path, SPECS, root=ROOT, run_dir=tmp_path / "run", dry_run=True, start="probe")
    assert doc["exit_code"] == 0 and [s["step"] for s in doc["steps"]] == ["probe", "bench"]
    assert doc["text"].splitlines()[1].startswith("invoke probe ")
    runner = FakeRunner({"bench": 5})
    doc = lib.run_recipe(path, SPECS, root=ROOT, run_dir=tmp_path / "run", runner=runner)
    assert (doc["exit_code"], doc["failed"], doc["ran"][-1]) == (5, "bench", "bench")
    assert len(runner.calls) == 5


def test_record_prefix_names_each_recording_step_once_and_keeps_a_steps_own(tmp_path):
    rec = load(tmp_path, SMALL.replace('  probe: {drafter: "{run}/train/drafter", num_prompts: 2}',
                                       '  probe: {drafter: "{run}/train/drafter", num_prompts: 2, record: mine}\n'
                                       '  probe@chat: {drafter: "{run}/train/drafter", prompts: builtin}'),
               record_prefix="run1")
    names = {s.key: s.options.get("record") for s in rec.steps}
    assert names == {"datagen": "run1-datagen", "vocab.build": "run1-vocab-build", "finetune": "run1-finetune",
                     "probe": "mine", "probe@chat": "run1-probe-chat", "bench": "run1-bench"}
    assert all(f"--record {n}" in s.command for s, n in zip(rec.steps, names.values()))
    seen: list[str] = []
    lib.load(write(tmp_path), SPECS, root=ROOT, run_dir=tmp_path / "run", record_prefix="x",
             check_name=lambda name, where: seen.append(f"{where}: {name}"))
    assert seen[0] == "--record-prefix x: x-datagen" and len(seen) == 5


SGLANG = """\
name: serve
target: smollm2-135m
steps:
  plan.sglang: {prompts: gsm8k-eval}
  bench.sglang: {engine: true, plan: "plan/{record:plan.sglang}"}
"""


def test_a_step_refers_to_an_earlier_steps_record(tmp_path):
    """``{record:STEP}``: the record an earlier step writes (from --record-prefix or its own record option), so a
    bench prices with the plan the same run recorded; without one, or naming a later step, one line."""
    rec = load(tmp_path, SGLANG, record_prefix="h1")
    assert "--plan plan/h1-plan-sglang --record h1-bench-sglang" in rec.steps[1].command
    own = load(tmp_path, SGLANG.replace("{prompts: gsm8k-eval}", "{prompts: gsm8k-eval, record: before}"))
    assert "--plan plan/before" in own.steps[1].command
    later = SGLANG.replace("plan/{record:plan.sglang}", "plan/{record:bench.sglang}")
    for text, kw in ((SGLANG, {}), (later, {"record_prefix": "h1"})):
        with pytest.raises(BadInput, match="no record to refer to") as exc:
            load(tmp_path, text, **kw)
        assert "steps.bench.sglang.plan" in exc.value.line() and "{record:" in exc.value.line()


def test_a_record_prefix_the_baselines_refuse_is_one_line_before_any_step(tmp_path):
    path = write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "invoke", "recipe", str(path), "--run-dir", str(tmp_path / "run"),
                          "--record-prefix", "a" * 95], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: not an accepted value; in --record-prefix aaa")
    assert not (tmp_path / "run").exists()


SERVERS = """\
name: servers
target: smollm2-135m
always: [sglang.stop@spec, sglang.stop@plain]
steps:
  sglang.launch@plain: {port: 30000}
  sglang.launch@spec: {drafter: drafters/smollm2-135m-default, port: 30001}
  bench.sglang: {url: "http://127.0.0.1:30001", plain_url: "http://127.0.0.1:30000"}
  sglang.profile: {url: "http://127.0.0.1:30001"}
  sglang.stop@spec: {port: 30001}
  sglang.stop@plain: {port: 30000}
"""


def test_always_steps_run_after_a_failure_and_the_run_keeps_its_code(tmp_path):
    """``always``: a recipe that started servers stops them even when a step between fails; the steps after the
    failure that are not ``always`` do not run, and the run's exit code is the failed step's."""
    runner = FakeRunner({"bench.sglang": 4})
    outcome = run(load(tmp_path, SERVERS), runner)
    assert (outcome.code, outcome.failed) == (4, "bench.sglang")
    assert [(a[1], a[-1]) for a in runner.calls][-2:] == [("sglang.stop", "30001"), ("sglang.stop", "30000")]
    assert "sglang.profile" not in [a[1] for a in runner.calls]
    state = json.loads((tmp_path / "run" / lib.STATE_FILE).read_text())
    assert state["steps"]["sglang.stop@plain"]["exit_code"] == 0 and "sglang.profile" not in state["steps"]
    with pytest.raises(BadInput, match="always steps ran after a step failed") as exc:  # they stopped the servers
        run(load(tmp_path, SERVERS), FakeRunner(), resume=True)
    assert "--from STEP" in exc.value.line() and "sglang.stop@spec" in exc.value.line()
    again = FakeRunner()  # --from the first launch: the servers start again
    assert run(load(tmp_path, SERVERS), again, start="sglang.launch@plain", explicit=True).code == 0
    assert len(again.calls) == 6
    clean = FakeRunner()  # without a failure, every step once
    assert run(load(tmp_path, SERVERS, run_dir=tmp_path / "r2"), clean).code == 0 and len(clean.calls) == 6


@pytest.mark.parametrize("value", ["[sglang.stop@nothing]", "sglang.stp@plain", "[{a: 1}]"])
def test_always_names_steps_of_the_recipe(tmp_path, value):
    text = SERVERS.replace("always: [sglang.stop@spec, sglang.stop@plain]", f"always: {value}")
    with pytest.raises(BadInput, match="always names no step of the recipe") as exc:
        load(tmp_path, text)
    assert "r.yaml: always" in exc.value.line() and "Traceback" not in exc.value.line()
