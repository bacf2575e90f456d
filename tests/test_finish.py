"""runbooks/_common.py finish and finish_text: the verdict a task prints, and the command it records."""

from __future__ import annotations

import json
import sys

import pytest

from eaglekb.kb import baselines as bl
from runbooks._common import finish, finish_text

SITE = "/usr/lib/python3/site-packages/invoke/__main__.py"
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02,
         "tolerance_abs": {"baseline_tok_s": 14.0, "online.cycle_ms": 32.0}}


def _metrics(accept=2.0, base=28.0, cycle=64.0):
    return {"baseline_tok_s": base, "online": {"accept_len": accept, "cycle_ms": cycle, "new_tokens": 512}}


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    monkeypatch.setenv("EAGLEKB_ROOT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [SITE, "probe", "--drafter", str(tmp_path / "d"), "--record", "demo"])
    bl.write(bl.build(kind="probe", name="demo", config={"drafter": "d"}, metrics=_metrics(), noise=NOISE,
                      command="invoke probe --record demo"), tmp_path)
    return tmp_path


def test_a_slower_machine_prints_acceptance_reproduced_and_how_much_slower(root):
    doc = finish(kind="probe", record=None, config={"drafter": "d"}, metrics=_metrics(base=14.0, cycle=128.0),
                 noise=NOISE)
    assert doc["comparison"]["reproduced"] is True and doc["comparison"]["timing_reproduced"] is True
    assert doc["comparison"]["calibration"]["slower_x"] == pytest.approx(2.0)
    text = finish_text(doc)
    assert "reproduced probe/demo: acceptance reproduced" in text and "this machine is 2.00x slower" in text
    assert "NOT" not in text
    history = json.loads(open(doc["history"]).read())
    assert history["provenance"]["command"] == "invoke probe --drafter d --record demo"


def test_a_changed_drafter_is_not_reproduced(root):
    doc = finish(kind="probe", record=None, compare="demo", config={"drafter": "other"},
                 metrics=_metrics(accept=1.5), noise=NOISE)
    assert doc["comparison"]["reproduced"] is False
    assert finish_text(doc).strip().startswith("NOT reproduced probe/demo: acceptance NOT reproduced")


def test_no_recorded_baseline_says_so(root):
    doc = finish(kind="probe", record=None, config={"drafter": "new"}, metrics=_metrics(), noise=NOISE)
    assert "comparison" not in doc and "no recorded baseline with this config" in finish_text(doc)


def test_recording_a_tmp_path_warns(root, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [SITE, "probe", "--drafter", "/tmp/elsewhere/d", "--record", "tmp-run"])
    doc = finish(kind="probe", record="tmp-run", config={"drafter": "x"}, metrics=_metrics(), noise=NOISE)
    assert doc["command_warnings"] and doc["command_warnings"][0].startswith("/tmp/elsewhere/d: a temporary path")
    assert "warning: the recorded command names /tmp/elsewhere/d" in capsys.readouterr().err
    assert bl.load_id("probe/tmp-run", root).provenance.command == "invoke probe --drafter /tmp/elsewhere/d --record tmp-run"
