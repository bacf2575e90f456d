"""`invoke probe` with no arguments: the embedded default on CPU, and its two-part verdict (slow: minutes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekb.measure.setup import DEFAULT_DRAFTER
from eaglekb.models.sources import model_dir, read_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_plain_invoke_probe_prints_a_two_part_verdict():
    if read_manifest(model_dir("smollm2-135m")) is None:
        pytest.skip("smollm2-135m not prepared (invoke models.prepare smollm2-135m)")
    if not (ROOT / DEFAULT_DRAFTER / "model.safetensors").is_file():
        pytest.skip(f"{DEFAULT_DRAFTER} is absent")
    out = subprocess.run([sys.executable, "-m", "invoke", "probe"], cwd=ROOT, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    verdict = out.stdout.strip().splitlines()
    line = next(l for l in verdict if "probe/smollm2-135m-default" in l)
    # Acceptance first, then the machine's speed against the recorded one, then the timings after normalising.
    assert re.match(r"^(NOT )?reproduced probe/smollm2-135m-default: acceptance (NOT )?reproduced \(\d+ metrics", line)
    assert re.search(r"this machine (is \d+\.\d\dx (slower|faster)|runs at the recorded speed) \(baseline_tok_s", line)
    assert re.search(r"\d+ (of \d+ )?timings (within|outside) tolerance after normalising", line)
    history = sorted((ROOT / ".eaglekb/history/probe").glob("*.json"))[-1]
    assert json.loads(history.read_text())["provenance"]["command"] == "invoke probe"
