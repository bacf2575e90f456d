"""The hostile-input tests' harness: every invoke task run in-process from an argv, its heavy work stubbed.

``run_cli(argv)`` runs ``invoke ARGV`` through invoke's own ``Program`` (the same parser the command
line uses) in this process and returns the exit code, stdout and stderr; an uncaught exception (a
traceback) propagates to the test. ``stub_work`` replaces the functions where each task's heavy work
begins (a benchmark, a training run, a site build, a server call) with one that raises ``Reached``:
a run that gets that far has had every option parsed and checked. ``tree_state`` snapshots a folder
(names, sizes, modification times) to prove that nothing outside the output folder was touched.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("EAGLEKB_HOSTILE_SCALE", "1"))


def examples(n: int) -> settings:
    """The suite's hypothesis settings: ``n`` examples (times $EAGLEKB_HOSTILE_SCALE), deterministic, no
    example database written into the checkout, no deadline (a loaded CI machine is slow)."""
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much])

#: Where each task's work begins: (module, attribute), stubbed by ``stub_work``.
WORK = [
    ("eaglekb.measure.bench", "run"), ("eaglekb.measure.probe", "run"), ("eaglekb.data.launch", "generate_dataset"),
    ("eaglekb.training", "train"), ("eaglekb.training", "launch"), ("eaglekb.studies.story", "run"),
    ("eaglekb.studies.story", "write_prompts"), ("eaglekb.measure.remap_check", "measure"),
    ("eaglekb.models.sources", "prepare"), ("eaglekb.data.corpora", "mix"),
    ("eaglekb.models.random_copy", "random_copy"),
    ("runbooks.docs", "_strict_build"), ("runbooks.docs", "_run_mike"), ("runbooks.docs", "_become"),
]
#: Process replacement: a task that would exec a server must never replace the test process.
EXECS = ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe")


class Reached(BaseException):
    """A task got past its checks to where its work begins (a BaseException: the boundary lets it pass)."""


@dataclass
class Result:
    code: int
    out: str
    err: str
    reached: str | None = None

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def _raiser(name: str):
    def stub(*args, **kwargs):
        raise Reached(name)
    return stub


@contextlib.contextmanager
def stub_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stub every task's heavy work (see ``WORK``), ``os.exec*``, invoke's shell runner, the SGLang client's
    first call, and torch's thread setting (a task asking for 4096 threads must not slow the tests that follow)."""
    import importlib

    import torch
    from invoke.context import Context

    from eaglekb.models.server import SGLangClient

    for module, attr in WORK:
        monkeypatch.setattr(importlib.import_module(module), attr, _raiser(f"{module}.{attr}"))
    for name in EXECS:
        monkeypatch.setattr(os, name, _raiser(f"os.{name}"))
    monkeypatch.setattr(Context, "run", _raiser("invoke Context.run"))
    monkeypatch.setattr(SGLangClient, "server_info", _raiser("SGLangClient.server_info"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    yield


def run_cli(argv: list[str]) -> Result:
    """``invoke ARGV`` in this process: (exit code, stdout, stderr), or ``reached`` when the work began."""
    import tasks
    from invoke import Program

    out, err = io.StringIO(), io.StringIO()
    code, reached = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            Program(namespace=tasks.ns, name="invoke", binary="invoke").run(["invoke", *argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Reached as exc:
            reached = str(exc)
    return Result(code, out.getvalue(), err.getvalue(), reached)


def all_tasks() -> dict[str, object]:
    """Every task by the name the command line uses (``bench``, ``bench.sglang``, ``baselines.check``)."""
    import tasks

    found: dict[str, object] = {}

    def walk(coll, prefix: str) -> None:
        for name, t in coll.tasks.items():
            full = prefix + name
            found[prefix.rstrip(".") if coll.default == name and prefix else full] = t
        for cname, sub in coll.collections.items():
            walk(sub, prefix + cname + ".")

    walk(tasks.ns, "")
    return found


def options(task) -> dict[str, object]:
    """A task's options and their defaults (``inspect.Parameter.empty`` for a positional)."""
    params = list(inspect.signature(task.body).parameters.values())[1:]
    return {p.name: p.default for p in params}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def tree_state(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file and link under ``folder`` (not following links)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        rel_dir = os.path.relpath(dirpath, folder)
        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in skip]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            state[os.path.normpath(os.path.join(rel_dir, name))] = (st.st_size, st.st_mtime_ns)
    return state


def one_line_failure(res: Result) -> str | None:
    """Why ``res`` breaks the contract (a failure is one line on stderr, exit 2, and never a bug), or None."""
    if "Traceback" in res.err:
        return "traceback"
    if res.code != 0 and len(res.err_lines) != 1:
        return f"{len(res.err_lines)} stderr lines"
    if "bug in eaglekb" in res.err:
        return "classified as a bug: " + res.err.strip()
    return None
