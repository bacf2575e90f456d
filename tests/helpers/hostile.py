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
import json
import os
import re
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
    # the serving stack: packing and installing wheels, starting, stopping and profiling a server
    ("eaglekb.measure.sglang.stack", "pack"), ("eaglekb.measure.sglang.stack", "install"),
    ("eaglekb.measure.sglang.server", "launch"), ("eaglekb.measure.sglang.server", "stop"),
    ("eaglekb.measure.sglang.bench", "run"), ("eaglekb.measure.sglang.bench", "profile_split"),
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
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:  # an area that has not landed (or was renamed): nothing to stub there
            continue
        if hasattr(mod, attr):
            monkeypatch.setattr(mod, attr, _raiser(f"{module}.{attr}"))
    for name in EXECS:
        monkeypatch.setattr(os, name, _raiser(f"os.{name}"))
    monkeypatch.setattr(Context, "run", _raiser("invoke Context.run"))
    monkeypatch.setattr(SGLangClient, "server_info", _raiser("SGLangClient.server_info"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    yield


_AREAS: dict[str, object] = {}


def _namespace(ns, argv: list[str]):
    """Just the task's own area (``bench`` for ``bench.sglang``) when argv starts with one: invoke copies every
    task's parser context on each call, and 40 tasks made that most of a run's time. Anything else (a typo,
    ``--help`` first, a second task) gets the whole namespace."""
    from invoke import Collection

    area = argv[0].partition(".")[0] if argv else ""
    if area not in ns.collections or any(a.partition(".")[0] in ns.collections and a.partition(".")[0] != area
                                         for a in argv[1:] if not a.startswith("-")):
        return ns
    if area not in _AREAS:
        only = Collection()
        only.add_collection(ns.collections[area], name=area)
        _AREAS[area] = only
    return _AREAS[area]


def run_cli(argv: list[str]) -> Result:
    """``invoke ARGV`` in this process: (exit code, stdout, stderr), or ``reached`` when the work began."""
    import tasks
    from invoke import Program

    import tempfile

    code, reached = 0, None
    # real files (with a fileno, as a terminal has), not StringIO: a task may hand its stdout to a child process
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                Program(namespace=_namespace(tasks.ns, argv), name="invoke", binary="invoke").run(["invoke", *argv])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Reached as exc:
                reached = str(exc)
        out.flush()
        err.flush()
        out.seek(0)
        err.seek(0)
        return Result(code, out.read(), err.read(), reached)


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


def names_what_was_typed(line: str, argv: list[str], task=None) -> bool:
    """Whether a refusal says where the problem is in terms the user knows: an option (typed, or one of the
    task's, such as a missing ``--data``), a positional argument by its name (``PATH (--path)``), a value
    given (or the folder of a path given), a file of the workspace or checkout, or invoke's own parse error
    naming the token it could not read."""
    from eaglekb.io.errors import one_line

    said = line.lower()
    flags = {"--" + o.replace("_", "-") for o in (options(task) if task is not None else {})}
    flags |= {t.partition("=")[0] for t in argv[1:] if t.startswith("--")}
    if any(re.search(re.escape(f) + r"(?![\w-])", line) for f in flags):
        return True
    if "No idea what" in line or "did not receive required positional" in line or "EAGLEKB_ROOT" in line:
        return True
    if re.search(r"\b[A-Z_]+\b \(--", line) or any(f"in {p.upper()}" in line for p in getattr(task, "positional", [])):
        return True
    for token in argv[1:]:
        value = one_line(token.partition("=")[2] if token.startswith("--") else token).strip()
        if value and re.search(r"\bin " + re.escape(value) + r"(;|$| )", line):
            return True
        if len(value) < 2:
            continue
        for candidate in (value, str(Path(value).parent)):
            if len(candidate) >= 2 and (candidate[:60].lower() in said or repr(candidate)[1:40].lower() in said):
                return True
    return bool(re.search(r"(/|\.eaglekb|\.json|\.log)", line))


def one_line_failure(res: Result) -> str | None:
    """Why ``res`` breaks the contract (a failure is one line on stderr, exit 2, and never a bug), or None."""
    if "Traceback" in res.err:
        return "traceback"
    if res.code != 0 and len(res.err_lines) != 1:
        return f"{len(res.err_lines)} stderr lines"
    if "bug in eaglekb" in res.err:
        return "classified as a bug: " + res.err.strip()
    return None


# --------------------------------------------------------------------------- story runs from elsewhere


def drafter_files() -> dict[str, bytes]:
    """The files of a tiny real drafter (config.json, model.safetensors), made once."""
    import tempfile

    from helpers.models import write_drafter

    if not _DRAFTER:
        folder = write_drafter(Path(tempfile.mkdtemp(prefix="hx-drafter-")) / "d")
        _DRAFTER.update({p.name: p.read_bytes() for p in sorted(folder.iterdir())})
    return dict(_DRAFTER)


_DRAFTER: dict[str, bytes] = {}


def story_run(run: Path, name: str, *, complete: bool = True, files: dict[str, bytes] | None = None) -> None:
    """A story run folder whose export holds one drafter NAME with ``files`` (default: a real tiny drafter)."""
    import hashlib
    import tarfile

    files = drafter_files() if files is None else files
    run.mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    (run / "drafters.tar.part00").write_bytes(blob)
    doc = {"kind": "story", "complete": complete, "env": {"time": "2026-01-01T00:00:00Z"}, "stages": {"datagen_s": 1},
           "drafters_export": {"parts": ["drafters.tar.part00"], "sha256": hashlib.sha256(blob).hexdigest(),
                               "drafters": {name: {rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()}}}}
    (run / "story.json").write_text(json.dumps(doc))


def refused(res, *fragments: str) -> str:
    """The one error line of a refused run (exit 2, no traceback, the task body never reached), holding ``fragments``."""
    assert res.reached is None, res
    assert res.code == 2 and one_line_failure(res) is None, res
    line = res.err_lines[0]
    for f in fragments:
        assert f in line, (f, line)
    return line
