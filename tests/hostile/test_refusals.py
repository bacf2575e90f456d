"""Every option takes effect or is refused in one line that names it as the user typed it (issue 26): options
that would be accepted and ignored, counts that used to be clamped, budgets that are no time at all, repeated
prompts, refusals that blamed another option, and the help a newcomer reads first (issue 27)."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from helpers.hostile import refused as _refused, all_tasks, one_line_failure, options, run_cli

NO_EFFECT = "would have no effect"




@pytest.fixture(scope="module")
def stored(ws):
    """A folder whose manifest says the dataset stores its features (enough for the option checks)."""
    from eaglekb.formats.shards import FORMAT

    folder = ws.root / "in-stored"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": FORMAT, "identity": {"config": {"features": "stored"}},
                                                      "shards": {}}))
    return folder


DATAGEN = ["datagen", "--target=in/target", "--prompts-file=in/prompts.txt"]
BAD = [
    # ignored switches: a device that cannot honour them
    (["bench", "--graphs=on"], "--graphs", NO_EFFECT), (["bench", "--graphs=both"], "--graphs", NO_EFFECT),
    (["bench", "--profile"], "--profile", NO_EFFECT),
    (["bench", "--device=cuda", "--graphs=off", "--profile"], "--profile", NO_EFFECT),
    (["bench", "--device=cuda", "--cpu-step-threads=4"], "--cpu-step-threads", NO_EFFECT),
    (["bench", "--device=cuda", "--cpu-packed=off"], "--cpu-packed", NO_EFFECT),
    (["bench", "--device=cuda", "--cpu-draft-fp16=off"], "--cpu-draft-fp16", NO_EFFECT),
    (["bench", "--device=cuda", "--cpu-target-fp16=off"], "--cpu-target-fp16", NO_EFFECT),
    # a sweep and the single-point options beside it; a bad sweep is blamed on --sweep
    (["bench", "--steps=5", "--sweep=3,1"], "--steps", NO_EFFECT),
    (["bench", "--topk=4", "--sweep=3,1"], "--topk", NO_EFFECT),
    (["bench", "--draft-tokens=8", "--sweep=3,1"], "--draft-tokens", NO_EFFECT),
    (["bench", "--sweep=3,1,4,5"], "--sweep", "bad sweep point"), (["bench", "--sweep=3,x"], "--sweep", "'x'"),
    (["bench", "--sweep=3,1;"], "--sweep", "bad sweep point"), (["bench", "--sweep=0,1"], "--sweep", "'0'"),
    (["bench", "--sweep=;"], "--sweep", "bad sweep point"), (["bench", "--sweep=3,1,99999999"], "--sweep", ""),
    # sampling options in greedy mode, and others the rest of the command makes moot
    ([*DATAGEN, "--temperature=0.9"], "--temperature", NO_EFFECT), ([*DATAGEN, "--top-p=0.5"], "--top-p", NO_EFFECT),
    ([*DATAGEN, "--per-source=5"], "--per-source", NO_EFFECT), ([*DATAGEN, "--corpus=wiki"], "--corpus", NO_EFFECT),
    ([*DATAGEN, "--seed=3"], "--seed", NO_EFFECT),
    ([*DATAGEN, "--features=online", "--no-final-hidden"], "--no-final-hidden", NO_EFFECT),
    ([*DATAGEN, "--server-model=m"], "--server-model", NO_EFFECT),
    ([*DATAGEN, "--server=http://127.0.0.1:1", "--generator=engine"], "--generator", NO_EFFECT),
    (["datagen", "--target=in/target", "--corpus=wiki", "--corpus=wiki"], "--corpus", "given twice"),
    (["finetune", "--data=in", "--no-remap"], "--no-remap", NO_EFFECT),
    (["finetune", "--data=in", "--steps=5", "--epochs=3"], "--epochs", NO_EFFECT),
    (["finetune", "--data=in", "--val-data=in", "--val-fraction=0.2"], "--val-fraction", NO_EFFECT),
    (["finetune", "--data=in", "--mapping=in/mapping.safetensors", "--draft-vocab-size=99"], "--draft-vocab-size",
     "disagrees with --mapping"),
    (["finetune", "--data=in", "--init=in/drafter", "--draft-vocab-size=99"], "--draft-vocab-size",
     "disagrees with --init"),
    (["finetune", "--data=in", "--init=in/drafter", "--intermediate-size=32"], "--intermediate-size",
     "disagrees with --init"),
    (["vocab.build", "--out=out/v.safetensors", "--draft-vocab-size=8", "--counts=in/counts.safetensors", "--seed=3"],
     "--seed", NO_EFFECT),
    (["vocab.build", "--out=out/v.safetensors", "--draft-vocab-size=8", "--counts=in/counts.safetensors",
      "--holdout=4"], "--holdout", NO_EFFECT),
    # budgets that are no time at all, and text where a number belongs (never the "internal error" line)
    ([*DATAGEN, "--time-budget-s=-5"], "--time-budget-s", "out of range"),
    ([*DATAGEN, "--time-budget-s=nan"], "--time-budget-s", "not a number"),
    ([*DATAGEN, "--time-budget-s=abc"], "--time-budget-s", "not a number"),
    ([*DATAGEN, "--time-budget-s=0"], "--time-budget-s", "out of range"),
    (["story.run", "--tiny", "--soft-limit-s=-5"], "--soft-limit-s", "out of range"),
    # internal names never reach the user: the options as typed
    (["finetune", "--data=in", "--max-len=3"], "--max-len", "out of range"),
    (["finetune", "--data=in", "--batching=sorted"], "--batching", "not an accepted value"),
    (["finetune", "--data=in", "--compile=sometimes"], "--compile", "not an accepted value"),
    (["finetune", "--data=in", "--method=p-eagle", "--compile=step"], "--compile", "one pass"),
    (["bench", "--compile=step"], "--compile", "not an accepted value"),  # one TTT step: training's value only
    (["probe", "--min-draft-prob=1.5"], "--min-draft-prob", "out of range"),
    (["probe", "--min-draft-prob=1"], "--min-draft-prob", "0 <= p < 1"),
    (["probe", "--topk=2", "--min-draft-prob=0.3"], "--min-draft-prob", "--topk 2"),
    (["bench", "--sweep=3,1;4,4,16", "--min-draft-prob=0.3"], "--min-draft-prob", "--topk 4"),
    (["bench", "--fused=always"], "--fused", "not an accepted value"),
    (["bench", "--cpu-packed=fast"], "--cpu-packed", "not an accepted value"),
    (["bench", "--cpu-draft-fp16=fast"], "--cpu-draft-fp16", "not an accepted value"),
    (["bench", "--cpu-target-fp16=fast"], "--cpu-target-fp16", "not an accepted value"),
    (["docs.deploy", "0.1", "--alias-type=hard"], "--alias-type", ""),
]


@pytest.mark.parametrize("argv, option, fragment", BAD, ids=[" ".join(a[0:1] + a[-1:]) for a, _, _ in BAD])
def test_an_option_that_cannot_take_effect_is_refused_before_work(ws, argv, option, fragment):
    line = _refused(run_cli(argv), option, fragment)
    assert "internal error" not in line


def test_an_online_target_beside_stored_features_is_refused(ws, stored):
    _refused(run_cli(["finetune", f"--data={stored}", "--online-target=in/target"]), "--online-target", "stores")
    assert run_cli(["finetune", f"--data={stored}"]).reached == "eaglekb.training.train"


def test_the_same_options_at_their_defaults_or_where_they_work_pass(ws):
    """The refusals above are about the combination: each option alone, where it works, reaches the work."""
    for argv in (["bench", "--sweep=3,1;5,1;4,4,16"], ["bench", "--steps=5", "--topk=1"], ["bench", "--graphs=off"],
                 [*DATAGEN, "--mode=sampled", "--temperature=0.9", "--top-p=0.5"], [*DATAGEN, "--temperature=0.7"],
                 ["datagen", "--target=in/target", "--corpus=wiki", "--per-source=5", "--seed=3"],
                 ["finetune", "--data=in", "--steps=5"], ["finetune", "--data=in", "--epochs=2"],
                 # the recorded recipes pass the init drafter's own sizes: they agree, and run
                 ["finetune", "--data=in", "--init=in/drafter", "--draft-vocab-size=40", "--intermediate-size=64"],
                 # a wider MLP than the init drafter's widens it (training.drafters.widen_mlp)
                 ["finetune", "--data=in", "--init=in/drafter", "--intermediate-size=128"],
                 ["finetune", "--data=in", "--mapping=in/mapping.safetensors", "--draft-vocab-size=40"]):
        res = run_cli(argv)
        assert res.reached, (argv, res)


def test_a_sweep_point_the_engine_refuses_is_blamed_on_the_sweep():
    from eaglekb.engine.generate import SpecConfig
    from eaglekb.io.errors import BadInput
    from runbooks.bench import _sweep_blamed

    with pytest.raises(BadInput) as exc:
        with _sweep_blamed(True):
            SpecConfig(steps=3, topk=1, draft_tokens=9)
    assert exc.value.where == "--sweep" and "draft-tokens" in exc.value.line()
    with pytest.raises(BadInput) as exc:
        with _sweep_blamed(False):
            SpecConfig(steps=3, topk=1, draft_tokens=9)
    assert exc.value.where == "--draft-tokens"


# --------------------------------------------------------------------------- counts never clamped, prompts once


def test_more_prompts_than_the_set_holds_are_refused_not_clamped(tmp_path):
    from eaglekb.data.prompts import BUILTIN_PROMPTS, eval_prompts
    from eaglekb.io.errors import BadInput

    f = tmp_path / "p.txt"
    f.write_text("one\ntwo\n")
    for spec, n in (("builtin", len(BUILTIN_PROMPTS) + 1), (str(f), 3)):
        with pytest.raises(BadInput, match="fewer prompts than --num-prompts") as exc:
            eval_prompts(spec, n)
        assert exc.value.where == "--num-prompts"
    assert len(eval_prompts(str(f), 2).prompts) == 2 and len(eval_prompts("builtin", 8).prompts) == 8


@pytest.mark.parametrize("text, lines", [("a\nb\na\n", "line 3 repeats line 1"),
                                         ('{"prompt": "hi"}\nhi\n', "line 2 repeats line 1"),
                                         ('{"messages": [{"role": "user", "content": "x"}]}\n\n x \n',
                                          "line 3 repeats line 1")])
def test_a_prompt_given_twice_is_refused_with_both_lines(ws, tmp_path, text, lines):
    f = tmp_path / "dup.txt"
    f.write_text(text)
    _refused(run_cli(["datagen", "--target=in/target", f"--prompts-file={f}"]), "the same prompt twice", lines)


# --------------------------------------------------------------------------- finetune --stop-after


def test_stop_after_says_there_is_no_drafter_yet(ws, monkeypatch, tmp_path):
    from helpers.datagen import make_target, prompts, small_cfg

    from eaglekb import training
    from eaglekb.data import datagen
    from eaglekb.data.generation import load_target
    from eaglekb.training import loop

    target = load_target(make_target(tmp_path / "target"), dtype="float32")
    datagen.run(target, prompts(6), tmp_path / "data", small_cfg(max_new_tokens=8), progress=False)
    monkeypatch.setattr(training, "train", loop.train)  # the real training, this once
    out = ws.out / "stopped"
    argv = ["finetune", f"--data={tmp_path / 'data'}", f"--out={out}", "--draft-vocab-size=40", "--steps=4",
            "--stop-after=2", "--batch-size=2", "--ttt-steps=2", "--intermediate-size=32", "--device=cpu"]
    res = run_cli(argv)
    assert res.code == 0, res
    assert "no drafter yet" in res.out and "--resume" in res.out and "drafter: " not in res.out, res.out
    assert not (out / "drafter").exists() and (out / "checkpoints").is_dir()
    doc = json.loads(run_cli([*argv[:2], f"--out={ws.out / 'stopped2'}", *argv[3:], "--json"]).out.splitlines()[-1])
    assert doc["drafter"] is None


# --------------------------------------------------------------------------- help and parse errors (issue 27)


def test_help_shows_each_options_kind_and_real_default(ws):
    res = run_cli(["--help", "bench"])
    assert res.code == 0 and "STRING" not in res.out, res.out
    for fragment in ("--num-prompts=INT", "[default: 4]", "--graphs=auto|on|off|both", "--record=NAME",
                     "--drafter=PATH", "--profile "):
        assert fragment in res.out, (fragment, res.out)
    assert run_cli(["bench", "--help"]).out == res.out
    for name, task in sorted(all_tasks().items()):
        out = run_cli(["--help", name]).out
        assert "STRING" not in out and out.startswith("Usage: invoke"), (name, out[:300])
        for opt, default in options(task).items():
            text = task.help_texts.get(opt, "")
            typed = re.search(r"\(default:? (-?[0-9]+(?:\.[0-9]+)?)(?![0-9.:])", text)
            if typed and default not in (inspect.Parameter.empty, None):
                assert float(typed.group(1)) == float(default), f"{name} --{opt}: help says {typed.group(1)}, " \
                                                                 f"the code {default}"


@pytest.mark.parametrize("argv, fragments", [
    (["prob"], ("No idea what 'prob' is", "`invoke probe`", "invoke --list")),
    (["docs.buld"], ("`invoke docs.build`",)),
    (["bench", "--stesp=3"], ("did you mean --steps",)),
    (["bench", "--num-prompts"], ("option --num-prompts needs a value", "invoke --help bench")),
    (["models.prepare", "-inf"], ("option --name needs a value", "'-inf'", "--OPTION=VALUE")),
])
def test_a_typo_gets_a_suggestion(ws, argv, fragments):
    res = run_cli(argv)
    assert res.code == 2 and len(res.err_lines) == 1, res
    for f in fragments:
        assert f in res.err_lines[0], (f, res.err)
