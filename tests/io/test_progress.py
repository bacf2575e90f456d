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


def test_a_heartbeat_never_lands_inside_a_live_progress_bar():
    from tqdm import tqdm

    out = io.StringIO()
    gate = threading.Event()
    with tqdm(total=100, desc="loading weights", file=out, mininterval=0, ascii=True) as bar:
        bar.update(3)  # the bar is on screen, its line not ended
        with still_working("loading", every=0.01, stream=out):
            gate.wait(0.1)
        bar.update(3)
    raw = out.getvalue()
    starts = [raw[i - 1] for i in range(1, len(raw)) if raw.startswith("still working", i)]
    assert starts and set(starts) <= {"\r", "\n"}, raw[:300]  # each line starts at the start of a line
    after = raw.rsplit("still working", 1)[1]
    assert "loading weights" in after  # the bar is drawn again under the line


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_start_is_announced_at_once_on_a_terminal_only():
    from eaglekb.io.progress import announce

    terminal, pipe = _Terminal(), io.StringIO()
    assert announce("loading smollm2-135m ...", stream=terminal)
    assert terminal.getvalue() == "loading smollm2-135m ...\n"
    assert not announce("loading smollm2-135m ...", stream=pipe) and pipe.getvalue() == ""
    assert not announce("loading", stream=_Terminal(), enabled=False)
