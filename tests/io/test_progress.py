"""eaglekb.io.progress: a stage that runs longer than the allowed silence says it is still working."""

from __future__ import annotations

import io
import threading

from eaglekb.io.progress import still_working


def test_a_long_stage_says_it_is_still_working_and_a_short_one_says_nothing():
    out = io.StringIO()
    gate = threading.Event()
    with still_working("offline acceptance", every=0.01, stream=out):
        gate.wait(0.2)  # the stage runs past several silences
    lines = out.getvalue().splitlines()
    assert lines and all(l.startswith("still working: offline acceptance (") for l in lines)
    quiet = io.StringIO()
    with still_working("loading", every=60, stream=quiet):
        pass
    with still_working("anything", every=0.01, stream=quiet, enabled=False):
        gate.wait(0.05)
    assert quiet.getvalue() == ""
