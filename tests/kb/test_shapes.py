"""--shape-from bench/NAME: the draft shape a recorded sweep measured best, for the same prompts, drafter and device."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eaglekb.io.errors import BadInput, MissingFile
from eaglekb.kb.shapes import best_shape


def test_the_best_point_of_a_recorded_sweep():
    shape = best_shape("bench/h200-smollm2-r6-builtin-wide", prompts="builtin", device="cuda",
                       drafter="drafters/smollm2-135m-default")  # the same files as the record's r6 path
    assert (shape["steps"], shape["topk"], shape["draft_tokens"]) == (4, 8, 32)
    assert shape["from"] == "bench/h200-smollm2-r6-builtin-wide" and shape["prompts"] == "builtin"
    assert best_shape("h200-smollm2-r6")["steps"] == 5  # bench/ may be left out


@pytest.mark.parametrize("ref, kw, error, match", [
    ("bench/nope", {}, MissingFile, "no bench record"),
    ("h200-smollm2-r6", {"prompts": "builtin"}, BadInput, "another prompt set"),
    ("h200-smollm2-r6", {"device": "cpu"}, BadInput, "another kind of device"),
    ("h200-smollm2-r6", {"drafter": "drafters/smollm2-135m-r4"}, BadInput, "another drafter"),
    ("h100-qwen15-r1-sglang-chain", {}, BadInput, "no measured best point"),  # an SGLang run, no engine sweep
])
def test_a_record_that_cannot_give_the_shape_is_one_line(ref, kw, error, match):
    with pytest.raises(error, match=match):
        best_shape(ref, **kw)


@pytest.mark.parametrize("args, fragment", [
    (["probe", "--shape-from=bench/cpu-smollm2-default", "--steps=2"], "--steps"),
    (["bench", "--shape-from=bench/cpu-smollm2-default", "--sweep=3,1"], "--sweep"),
    (["sglang.launch", "--shape-from=bench/h200-smollm2-r6"], "--drafter"),
    (["probe", "--shape-from=bench/h200-smollm2-r6", "--prompts=gsm8k-eval"], "another kind of device"),
])
def test_the_tasks_refuse_a_shape_they_cannot_use(args, fragment):
    out = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert fragment in lines[0]


@pytest.mark.slow
def test_probe_runs_the_recorded_best_shape_on_the_real_model():
    """On the default target and drafter: the CPU sweep's best point is what the probe runs, and the record says
    where the shape came from."""
    import json

    out = subprocess.run([sys.executable, "-m", "invoke", "probe", "--shape-from=bench/cpu-smollm2-default",
                          "--num-prompts=1", "--max-new-tokens=8", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    shape = best_shape("bench/cpu-smollm2-default")
    assert (doc["config"]["steps"], doc["config"]["topk"]) == (shape["steps"], shape["topk"])
    assert doc["config"]["shape_from"] == "bench/cpu-smollm2-default"
