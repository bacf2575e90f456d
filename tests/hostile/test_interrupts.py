"""Interrupted writes, two runs at once, inputs this user may not read (issue 44: nothing half-written).

Signals go to a child process that writes through the project's own plumbing (``runbooks._common``'s
boundary and ``eaglekb.io.files``) and sends itself the signal in the middle of a write: no timing involved.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from helpers.hostile import ROOT, run_cli

#: The child: OLD is at the output; a write of NEW is interrupted by SIGNAL half-way, inside a task's boundary.
_CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from invoke import Exit
    from runbooks._common import cli_errors, stop_signals_as_interrupts
    from eaglekb.io.files import atomic_write_with, output_lock

    out, sig = Path(sys.argv[1]), getattr(signal, sys.argv[2])
    # Ctrl-C as in a terminal: a process started as a background job inherits SIGINT ignored, and Python then
    # installs no handler of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def write(fh):
        fh.write(b"half of the new ")
        fh.flush()
        os.kill(os.getpid(), sig)
        for _ in range(10**6):  # the handler runs at the next bytecode: never reaches the end
            pass
        fh.write(b"file")

    try:
        with cli_errors(), stop_signals_as_interrupts(), output_lock(out, where="--out"):
            atomic_write_with(out, write)
    except Exit as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.code)
""")


def _child(out: Path, sig: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", _CHILD, str(out), sig], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


@pytest.mark.parametrize("sig, code, said", [("SIGTERM", 143, "stopped by SIGTERM"), ("SIGHUP", 129, "stopped by SIGHUP"),
                                             ("SIGINT", 130, "interrupted")])
def test_a_signal_mid_write_leaves_the_old_file_no_temp_file_and_no_lock(tmp_path, sig, code, said):
    out = tmp_path / "out" / "mapping.json"
    out.parent.mkdir()
    out.write_text("the old file\n")
    res = _child(out, sig)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == code, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert out.read_text() == "the old file\n"  # never half of the new one
    assert sorted(p.name for p in out.parent.iterdir()) == ["mapping.json"]  # no .tmp, no .lock left


def test_a_stop_signal_raises_only_inside_the_block_and_a_second_one_is_the_default():
    from runbooks._common import STOP_SIGNALS, Stopped, stop_signals_as_interrupts

    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with pytest.raises(Stopped) as info, stop_signals_as_interrupts():
        signal.raise_signal(signal.SIGTERM)
    assert info.value.signum == signal.SIGTERM and isinstance(info.value, KeyboardInterrupt)
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_the_error_line_never_lands_in_a_live_progress_bar(capsys):
    from invoke import Exit
    from tqdm import tqdm

    from runbooks._common import cli_errors

    bar = tqdm(total=10, desc="work")
    bar.update(3)
    with pytest.raises(Exit):
        with cli_errors():
            raise KeyboardInterrupt
    assert bar.disable or bar not in getattr(tqdm, "_instances", ())  # closed: its line ended before the error's
    assert capsys.readouterr().err.endswith("\n")


def test_a_killed_runs_half_written_checkpoint_is_swept_and_an_interrupted_one_removed(tmp_path, monkeypatch):
    from eaglekb.training import checkpoints

    root = tmp_path / "run" / "checkpoints"
    dead = root / ".tmp-step-0000005-999999999"  # a pid no process has: a run killed with SIGKILL
    (dead / "trainer").mkdir(parents=True)

    def interrupted(drafter, folder):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "save_drafter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_checkpoint(tmp_path / "run", 10, None, None, {}, {}, keep=2)
    assert list(root.iterdir()) == []  # neither the dead run's half checkpoint nor this one's


def test_outputs_get_the_mode_a_plain_open_gives(tmp_path):
    from eaglekb.io.files import atomic_write_text

    mask = os.umask(0o022)
    os.umask(mask)
    path = atomic_write_text(tmp_path / "a.json", "{}\n")
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # mkstemp's 0600 would lock out every other user


def test_two_runs_recording_one_baseline_name_at_once_the_second_is_refused_before_its_work(ws):
    from eaglekb.io.files import output_lock
    from eaglekb.kb import baselines

    out = ws.out / "held.safetensors"
    with output_lock(baselines.path_for("vocab/held-name"), where="the other run"):
        res = run_cli(["vocab.build", str(out), "40", "--counts", str(ws.inputs / "counts.safetensors"),
                       "--record", "held-name"])
    assert res.code == 2 and len(res.err_lines) == 1, res.err
    assert "another run is writing this output" in res.err and "--record held-name" in res.err
    assert not out.exists()  # refused before the work, not after it
    assert not baselines.path_for("vocab/held-name").exists()


_UNREADABLE = textwrap.dedent("""
    import sys
    from runbooks._common import error_line
    from eaglekb.io.files import read_json, read_safetensors
    for path, read in ((sys.argv[1], read_safetensors), (sys.argv[2], read_json)):
        try:
            read(path)
        except Exception as exc:
            print(error_line(exc))
""")


def _as_user(code: str, *args: str, user: int | None, cwd: Path) -> subprocess.CompletedProcess | None:
    """``python -c CODE ARGS`` as ``user`` (None: as we are); None when that user cannot run it here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    try:
        drop = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                              cwd=cwd, timeout=60, check=False, **drop)
    except OSError:  # the interpreter or the checkout is not this user's to reach
        return None


def test_inputs_this_user_may_not_read_are_one_line_each():
    """Run as an unprivileged user (root reads everything): skipped where none can be switched to."""
    user = 65534 if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="eaglekb-unreadable-"))
    try:
        folder.chmod(0o755)
        probe = _as_user("import runbooks._common, eaglekb.io.files, safetensors", user=user, cwd=folder)
        if probe is None or probe.returncode != 0:
            pytest.skip("no unprivileged user can run this interpreter and checkout here")
        st, js = folder / "w.safetensors", folder / "c.json"
        st.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        js.write_text("{}\n")
        st.chmod(0)
        js.chmod(0)
        res = _as_user(_UNREADABLE, str(st), str(js), user=user, cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = res.stdout.splitlines()
    assert "Traceback" not in res.stderr and len(lines) == 2, res.stdout + res.stderr
    assert "cannot be read" in lines[0] and str(st) in lines[0] and "No such file" not in lines[0]
    assert "permission denied" in lines[1] and str(js) in lines[1] and "you may read" in lines[1]
