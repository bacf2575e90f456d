"""Expensive builds started when the test run begins, run one at a time beside the other tests.

A strict site build is a minute or more on a two-core machine and almost all of it runs in a child process
(mkdocs, mike), so the builds the selected tests need are started in one background thread as soon as the run
begins (the session fixture ``_background_jobs`` in tests/conftest.py): while the tests before them run on one
core, the builds run on the other. A test asks for its build with ``take(key, fn)``: the job's result (or the
exception it raised) when it was started, or ``fn()`` run now when it was not started yet or not asked for.
Every job is what the test did itself before, done earlier: the same copies, the same commands, the same results.

A job sees the environment of the moment the run began (``environ``): tests change os.environ (monkeypatch)
while a build runs beside them, and their settings are none of the build's business.
At the end of the run, jobs not started are dropped and the process group of a running one's child is killed.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

_JOBS: dict[str, Future] = {}
_QUEUE: "queue.Queue[tuple[str, Callable[[], Any], Future] | None]" = queue.Queue()
_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
_LOCAL = threading.local()
_STATE: dict[str, Any] = {"thread": None, "env": None, "stopping": False, "busy": False}


def environ() -> dict[str, str]:
    """os.environ, or in a background job the environment of the moment the run began."""
    env = getattr(_LOCAL, "env", None)
    return dict(env if env is not None else os.environ)


def _worker() -> None:
    _LOCAL.env = _STATE["env"]
    while True:
        job = _QUEUE.get()
        if job is None:
            return
        _key, fn, fut = job
        with _LOCK:
            if not fut.set_running_or_notify_cancel():  # taken by the test (run there) or dropped at the end
                continue
            _STATE["busy"] = True
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test that takes it (skips included)
            fut.set_exception(exc)
        finally:
            _STATE["busy"] = False


def start(jobs: list[tuple[str, Callable[[], Any]]]) -> None:
    """Queue JOBS (key, function), in order, on the background thread (started on the first call)."""
    if not jobs:
        return
    if _STATE["thread"] is None:
        _STATE["env"] = dict(os.environ)
        _STATE["thread"] = threading.Thread(target=_worker, name="eaglekb-test-builds", daemon=True)
        _STATE["thread"].start()
    for key, fn in jobs:
        if key not in _JOBS:
            _JOBS[key] = Future()
            _QUEUE.put((key, fn, _JOBS[key]))


def take(key: str, fn: Callable[[], Any]) -> Any:
    """The result of job KEY (waiting for it, or raising what it raised); ``fn()`` when there is no job KEY, or
    when it is still queued behind another job the thread runs (then it runs here, beside that one)."""
    fut = _JOBS.get(key)
    while fut is not None and not (fut.running() or fut.done()):
        with _LOCK:
            if _STATE["busy"] and fut.cancel():
                fut = None
                break
        time.sleep(0.05)  # the thread is about to take the next job: this one, or one before it
    if fut is None:
        return fn()
    return fut.result()


def run(args: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, **kw)`` (KW may name other stdout and stderr; the
    environment is ``environ()`` unless KW names one), whose child ``stop`` kills when the run ends before a
    background job's process does."""
    background = getattr(_LOCAL, "env", None) is not None
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": environ(), **kw}
    with _LOCK:
        if background and _STATE["stopping"]:
            raise RuntimeError("the test run ended: background builds stopped")
        # A background job's process leads a process group of its own, so that stopping it stops what it started
        # (mike's mkdocs, the notebook's kernel) too.
        proc = subprocess.Popen(args, start_new_session=background, **kw)
        if background:
            _LIVE.add(proc)
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            _kill(proc, group=background)
            proc.wait()
            raise
        finally:
            with _LOCK:
                _LIVE.discard(proc)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _kill(proc: subprocess.Popen, *, group: bool) -> None:
    """Kill PROC (a child of this process), and with GROUP the process group it leads."""
    if proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass


def stop() -> None:
    """Drop the jobs not started, kill the child process of a running one (no job starts another), wait for the
    thread."""
    thread = _STATE["thread"]
    if thread is None:
        return
    for fut in _JOBS.values():
        fut.cancel()
    _QUEUE.put(None)
    with _LOCK:
        _STATE["stopping"] = True
        for proc in _LIVE:
            _kill(proc, group=True)
    thread.join(timeout=60)
    _STATE.update(thread=None, stopping=False)
    _JOBS.clear()
