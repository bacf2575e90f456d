"""Recorded commands, checked without running them: would this command run on a fresh checkout?

A baseline's ``provenance.command``, a finding's ``reproduce`` commands and the steps of a recipe
are meant to be typed by a reader. ``check`` takes one such command and, as cheaply as ``--help``
(no model is loaded, no task body runs), says what would stop it:

* it is not ``invoke TASK [--options] [TASK ...]`` (pseudo-code, a script path, a shell pipeline);
* invoke's own parser, given the real task signatures (``tasks.ns``), refuses it: an unknown task
  or option, a flag without its value, a missing positional argument;
* an option's value fails the task's own option parser (``_common.parse_options``: numbers,
  ranges, choices, baseline names);
* a path cannot be resolved on another machine: absolute, under /tmp, outside the repository;
  or an input the checkout neither holds nor any known step writes (``Producers``: the outputs of
  the recorded and documented commands and the tasks' default outputs; a model may also be an
  embedded name or a Hugging Face repo id).
"""

from __future__ import annotations

import inspect
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from invoke import Collection
from invoke.exceptions import ParseError
from invoke.parser import Parser

from eaglekb.io.errors import EaglekbError
from eaglekb.measure.command import unportable_paths
from eaglekb.models import sources

#: Options whose value is a path the task writes (never required to exist beforehand).
OUTPUT_OPTIONS = frozenset({"out", "work", "drafters", "site_dir", "save_counts"})
#: Output options whose name means something else in other tasks (sglang.install --target is the folder it fills).
TASK_OUTPUTS = {"sglang.install": frozenset({"target"})}
#: Options whose value is a model: an embedded name, a folder, or a Hugging Face repo id.
MODEL_OPTIONS = frozenset({"target", "model"})
#: Options that are names or revisions, never paths.
NAME_OPTIONS = frozenset({"record", "compare", "prefix", "commit", "version", "alias", "branch", "rev_a", "rev_b",
                          "addr", "server", "server_model", "names", "command",
                          "slice", "plan", "plan_variant", "shape_from"})  # K/N or a baseline id (plan/NAME), not a path
_PATHLIKE = re.compile(r"(/|\.(jsonl?|safetensors|txt|pt|npy|bin|gguf|md|ya?ml)$)")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class Parsed:
    """One task call of a command: the task's full name and its option values as invoke parsed them."""

    task: str
    values: dict[str, Any]
    typed: set[str] = field(default_factory=set)  # the option names the command gives (not defaults)


def parse(command: str, ns: Collection) -> list[Parsed]:
    """The task calls of ``invoke ...``, parsed by invoke against NS; ValueError with the reason otherwise."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"not a shell command: {exc}") from None
    if not argv or argv[0] != "invoke":
        raise ValueError(f"does not start with `invoke` (found {argv[0] if argv else 'nothing'!r})")
    if len(argv) == 1 or argv[1].startswith("-"):
        raise ValueError("names no task")
    try:
        contexts = Parser(contexts=ns.to_contexts()).parse_argv(argv[1:])
    except ParseError as exc:
        raise ValueError(f"invoke cannot parse it: {exc}") from None
    out = []
    for ctx in contexts:
        typed = {a.name for a in ctx.args.values() if a.got_value}
        out.append(Parsed(task=ctx.name, values=dict(ctx.as_kwargs), typed=typed))
    return out


def _resolve_options(call: Parsed, ns: Collection) -> str | None:
    """The task's own option parsing (types, ranges, choices), as its ``__call__`` would do it first."""
    from runbooks._common import parse_options

    task = ns[call.task]
    values = dict(call.values)
    if getattr(task, "adds_force", False):
        values.pop("force", None)
    try:
        parse_options(task.body, values, getattr(task, "options", None))
    except EaglekbError as exc:
        return exc.line()
    return None


class Producers:
    """Paths a fresh checkout has or some known step writes: the files git tracks, the output options of
    commands, and the tasks' default outputs."""

    def __init__(self, ns: Collection, commands: Iterable[str] = (), root: Path | None = None):
        self.paths: set[str] = set()
        self.tracked: set[str] = _tracked(root) if root else set()
        for name in ns.task_names:
            body = ns[name].body
            for p in inspect.signature(body).parameters.values():
                if p.name in OUTPUT_OPTIONS and isinstance(p.default, str) and p.default:
                    self.paths.add(_norm(p.default))
        for command in commands:
            self.add(command, ns)

    def add(self, command: str, ns: Collection) -> None:
        try:
            calls = parse(command, ns)
        except ValueError:
            return
        for call in calls:
            for name in (OUTPUT_OPTIONS | TASK_OUTPUTS.get(call.task, frozenset())) & call.typed:
                if isinstance(call.values.get(name), str):
                    self.paths.add(_norm(call.values[name]))

    def writes(self, path: str) -> bool:
        path = _norm(path)
        return any(path == p or path.startswith(p + "/") for p in self.paths)

    def has(self, path: str) -> bool:
        """Whether a fresh checkout holds PATH (a tracked file, or a folder of tracked files)."""
        path = _norm(path)
        return path in self.tracked or any(t.startswith(path + "/") for t in self.tracked)


def _tracked(root: Path) -> set[str]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=False)
    return set(filter(None, proc.stdout.decode(errors="replace").split("\0"))) if proc.returncode == 0 else set()


def _norm(path: str) -> str:
    return str(Path(path)).rstrip("/")


def _check_path(name: str, value: str, root: Path, producers: Producers | None) -> str | None:
    option = "--" + name.replace("_", "-")
    if "://" in value or value.startswith("$"):
        return None  # a URL, or a shell variable the reader sets (e.g. $RUN_DIR in a job script)
    if name in MODEL_OPTIONS and (value in sources.SOURCES or (_REPO_ID.match(value) and not (root / value).exists()
                                                                and not value.startswith("."))):
        return None
    if not (name in MODEL_OPTIONS or _PATHLIKE.search(value)):
        return None
    if value.startswith(("/", "~")):
        return None  # reported by unportable_paths
    resolved = (root / value).resolve()
    if not str(resolved).startswith(str(root.resolve()) + "/") and resolved != root.resolve():
        return f"{option} {value}: outside the repository"
    if name in OUTPUT_OPTIONS or producers is None or resolved.exists() or producers.has(value) \
            or producers.writes(value):
        return None
    if name in MODEL_OPTIONS:
        return f"{option} {value}: not an embedded model ({', '.join(sources.SOURCES)}), folder or repo id"
    return f"{option} {value}: not in the checkout, and no recorded or documented step writes it"


def check(command: str, ns: Collection, root: Path, producers: Producers | None) -> list[str]:
    """Why COMMAND would not run on a fresh checkout of ROOT (empty: it would). With ``producers=None``
    inputs are not looked for (a command meant for another machine's folders: parse, options, portability)."""
    try:
        calls = parse(command, ns)
    except ValueError as exc:
        return [str(exc)]
    problems = list(unportable_paths(command))
    for call in calls:
        bad = _resolve_options(call, ns)
        if bad:
            problems.append(f"{call.task}: {bad}")
        for name in sorted(call.typed - NAME_OPTIONS):
            value = call.values.get(name)
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str):
                    problem = _check_path(name, v, root, producers)
                    if problem:
                        problems.append(problem)
    return problems


# --------------------------------------------------------------------------- where the commands are



def _shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced bash/sh/console blocks of a page, fences paired in order (a block of another
    language is skipped whole, so its closing fence never opens a block)."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```\s*([A-Za-z0-9_+-]*)", line)
        if fence and lang is None:
            lang, body = fence.group(1) or "", []
        elif fence and not fence.group(1):
            if lang in ("", "bash", "sh", "console"):
                blocks.append("\n".join(body) + "\n")
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def documented_commands(docs: Path) -> list[str]:
    """Every ``invoke ...`` line of the fenced shell blocks in DOCS/**/*.md (continuation lines joined)."""
    out = []
    for page in sorted(docs.rglob("*.md")):
        for block in _shell_blocks(page.read_text(encoding="utf-8")):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith("invoke "):
                    out.append(line)
    return out
