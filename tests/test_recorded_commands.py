"""Every command a reader is told to type runs: checked dry, as cheaply as --help (runbooks/_dryrun.py).

The recorded command of EVERY baseline, every finding's ``reproduce`` commands, the game plan's next
steps and the new-target recipe are parsed by invoke's own parser against the real task signatures, their
option values go through each task's option parser, and their paths must resolve on a fresh checkout:
no absolute or /tmp path, and every input either in the checkout or written by a recorded or documented
step. Nothing runs: no model loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tasks
from eaglekb.kb import knowledge
from eaglekb.kb.schema import RECIPE_PREFIX
from eaglekb.measure.command import reproduce_command
from runbooks import _dryrun

ROOT = Path(__file__).resolve().parents[1]
BASELINES = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text())["provenance"]["command"]
             for p in sorted((ROOT / "baselines").glob("*/*.json"))}
FINDINGS = knowledge.load_findings(ROOT / "docs/findings")
PLAN = knowledge.load_plan(ROOT / "docs/plan.md")
REPRODUCE = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text())["provenance"].get("reproduce")
             for p in sorted((ROOT / "baselines").glob("*/*.json"))}
RECIPES = knowledge.load_recipes(ROOT / "docs")


@pytest.fixture(scope="module")
def producers(checkout_producers):
    """What the baselines' recorded commands, the findings' reproduce commands, the recipes' steps and the documented
    commands write, and what git tracks (the session fixture of tests/conftest.py: tests/kb/test_one_truth.py
    reads the same)."""
    return checkout_producers


def _check(command, producers):
    return _dryrun.check(command, tasks.ns, ROOT, producers)


def test_every_baseline_records_a_command_that_runs(producers):
    # A command that read run state a clone lacks (a checkpoint since removed, a folder since renamed) is reproduced
    # by another command (provenance.reproduce: the recipe that produces it, or the same call on today's paths), which
    # the next test checks in full; what ran is kept as it ran: parsed and its options checked, inputs not.
    def rewritten(bid: str) -> bool:
        return REPRODUCE[bid] is not None and REPRODUCE[bid] != reproduce_command(BASELINES[bid])

    bad = {bid: problems for bid, cmd in BASELINES.items()
           if (problems := _check(cmd, None if rewritten(bid) else producers))}
    assert not bad, "recorded commands that cannot run:\n" + "\n".join(
        f"{bid}: {BASELINES[bid]}\n    " + "\n    ".join(p) for bid, p in bad.items())
    assert len(BASELINES) >= 50


def test_every_measured_baseline_carries_a_reproduce_command_that_runs_and_writes_nothing(producers):
    measured = {bid: cmd for bid, cmd in REPRODUCE.items() if cmd is not None}
    assert len(measured) >= 50
    for bid, cmd in measured.items():
        assert "--record" not in cmd.split() and "--force" not in cmd.split(), (bid, cmd)
        if "--record" in BASELINES[bid] and not cmd.startswith(("invoke models.prepare", RECIPE_PREFIX)):
            assert f"--compare {bid.split('/')[1]}" in cmd or "--compare" in cmd, (bid, cmd)
    bad = {bid: p for bid, cmd in measured.items() if (p := _check(cmd, producers))}
    assert not bad, "reproduce commands that cannot run:\n" + "\n".join(
        f"{bid}: {measured[bid]}\n    " + "\n    ".join(p) for bid, p in bad.items())


def test_every_finding_reproduces_with_commands_that_run(producers):
    bad = {(fid, cmd): p for fid, f in FINDINGS.items() for cmd in f.reproduce if (p := _check(cmd, producers))}
    assert not bad, "\n".join(f"{fid}: {cmd}: {p}" for (fid, cmd), p in bad.items())
    for fid, f in FINDINGS.items():
        # `invoke baselines.check` validates files; it reproduces no result.
        assert all(not c.startswith("invoke baselines.check") for c in f.reproduce), fid
        assert f.status_reason.strip(), fid


def test_recipe_and_plan_commands_run(producers):
    recipe = RECIPES["new-target"]
    for step in recipe.steps:
        assert _check(step.command, producers) == [], (step.step, step.command)
        if step.alternative:  # starts from a drafter the reader brings: parse, options and paths, no inputs
            assert _check(step.alternative, None) == [], step.alternative
    for step in PLAN.next_steps:  # K2.5 steps name folders on the serving machine: their inputs are not here
        for command in step.commands:
            assert _check(command, None) == [], command


def test_recipe_is_the_ordered_path_for_a_new_target():
    names = [s.command.split()[1] for s in RECIPES["new-target"].steps]
    order = ["plan", "models.prepare", "datagen", "vocab.build", "finetune", "inspect", "probe", "bench"]
    assert names[:len(order)] == order, names
    assert "--record" in RECIPES["new-target"].steps[-1].command
    alt = RECIPES["new-target"].steps[order.index("finetune")]
    assert alt.alternative and "vocab.compare" in alt.expect and "remap" in alt.expect


@pytest.mark.parametrize("command, fragment", [
    ("python3 -c 'probe.run(ProbeConfig(target=smollm2-135m folder))'", "does not start with `invoke`"),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/invoke/__main__.py vocab.build --out x",
     "does not start with `invoke`"),
    ("invoke probe (same call as the bf16 probe)", "invoke cannot parse it"),
    ("invoke probe --no-such-option 3", "No idea what '--no-such-option' is"),
    ("invoke probe --num-prompts two", "--num-prompts"),
    ("invoke probe --drafter /tmp/eaglekb-story2/run-b/drafter", "a temporary path"),
    ("invoke probe --drafter /data/drafters/x", "an absolute path outside the repository"),
    ("invoke probe --drafter .eaglekb/nobody/writes/this", "no recorded or documented step writes it"),
    ("invoke probe --drafter ../elsewhere/drafter", "outside the repository"),
    ("invoke vocab.compare .eaglekb/vocab/smollm2-chat-4096.safetensors", "did not receive required positional"),
    ("invoke probe --target no-such-model", "not an embedded model"),
    ("invoke bench --dtype float8", "--dtype"),
    ("invoke baselines.diff --json | tail -n 1", "invoke cannot parse it"),
])
def test_commands_that_cannot_run_are_caught(command, fragment, producers):
    problems = _check(command, producers)
    assert any(fragment in p for p in problems), problems


def test_inputs_written_by_an_earlier_step_resolve(producers):
    # finetune reads what the recorded datagen wrote; a probe reads a drafter story.record unpacked.
    assert _check("invoke finetune --data .eaglekb/datasets/smollm2-cpu-6 --device cpu", producers) == []
    assert _check("invoke probe --drafter .eaglekb/story/drafters/b-remap", producers) == []
    assert _check("invoke probe --target smollm2-135m --drafter drafters/smollm2-135m-default", producers) == []
    assert _check("invoke inspect --help", producers) == []
