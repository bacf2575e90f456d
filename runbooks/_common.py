"""Shared plumbing for runbook tasks: the command-line boundary, option parsing, output, recording.

A task is thin: parse its options, call one library function, then ``emit`` the result (human text,
plus one JSON document as the last line of stdout with ``--json``) and, for measured results,
``finish`` (record a baseline with ``--record NAME`` or write local history and compare).

Every task is declared with ``task`` from this module (not invoke's): its ``Task`` class is the one
boundary between the user and the project.

* Options are parsed here, typed and ranged, before the task body runs: invoke hands every
  number over as text (its own ``int()`` would end in a traceback), and ``parse_options`` turns it
  into a value with one shared parser per option name (``OPTIONS``; a task may override one with
  ``@task(options={...})``), or, for a name not listed, by the type of the option's default (a
  whole number or a number, not negative: an option that may be negative must be listed). An
  error names the option as the user typed it (``--num-prompts``).
* Every exception ends as one line on stderr and exit 2 (``cli_errors``): the project's own errors
  (``eaglekb.io.errors``) as they are; a file system error with the file and a fix; anything else
  is a bug in eaglekb, said so in one line, with its traceback only under ``EAGLEKB_DEBUG=1``. Python
  warnings raised during a task are held back: one ``warning:`` line each after a task that succeeded,
  none after one that failed (its one error line says what went wrong).
* SIGTERM and SIGHUP end a task the way Ctrl-C does (``stop_signals_as_interrupts``): every ``finally`` runs
  (temp files removed, output locks released), then one ``error: stopped by SIGTERM`` line, exit 128+N; a
  run with ``--record NAME`` holds that baseline's lock from the start (a second one is refused at once).
* ``invoke TASK --help`` never runs the task, also where invoke would take ``--help`` as the value of
  a positional argument; invoke's own parse errors (unknown option, missing value) exit 2 with one line
  (``parse_errors_exit_2``, installed by tasks.py).
* A task with ``--record NAME`` gets ``--force`` (unless it has its own): recording over an existing
  baseline is refused unless ``--force``, a cited record (source "recorded") is never replaced by a
  run, and both are checked before any work starts; ``--compare NAME`` must exist before it starts.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import inspect
import json
import os
import signal
import sys
import threading
import warnings
from typing import Any, Callable, Iterator

from invoke import Exit, Task
from invoke import task as _invoke_task
from invoke.parser import Argument

from eaglekb.io.errors import BadInput, EaglekbError, MissingFile, one_line
from eaglekb.kb import baselines
from runbooks import _help
from runbooks._options import (  # noqa: F401  (the parsers are part of this module's interface)
    BASELINE_NAME,
    OPTIONS,
    Opt,
    _found,
    env_pairs,
    one_of,
    parse_floats,
    parse_int,
    parse_options,
    real,
    text,
    whole,
)

DEBUG_ENV = "EAGLEKB_DEBUG"
HELP_WORDS = ("--help", "-h")
_FORCE: contextvars.ContextVar[bool] = contextvars.ContextVar("eaglekb_force", default=False)
_GIVEN: contextvars.ContextVar[frozenset] = contextvars.ContextVar("eaglekb_given", default=frozenset())
_STACK: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar("eaglekb_stack", default=None)
_FORCE_HELP = ("with --record: replace an existing baseline of that name (a cited record is never replaced); "
               "replace an existing output this task wrote before (never a file git tracks)")

# --------------------------------------------------------------------------- the boundary

_OS_FIX = {
    errno.ENOSPC: "free some space or choose another output folder",
    errno.EDQUOT: "free some space or choose another output folder",
    errno.EROFS: "choose a writable output folder",
    errno.EACCES: "give a path you may read (an input) or write (an output), or fix its permissions",
    errno.EPERM: "give a path you may read (an input) or write (an output), or fix its permissions",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "check the path: a part of it is a file, not a folder",
    errno.EISDIR: "give a file, not a folder",
    errno.EPIPE: "the reader of the output closed it early (e.g. `| head`)",
}


def error_line(exc: BaseException) -> str:
    """The one line (without ``error:``) that the boundary prints for ``exc``."""
    if isinstance(exc, EaglekbError):
        return exc.line()
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None) or None
        what = (exc.strerror or str(exc) or type(exc).__name__).lower()[:200]
        found = f"{type(exc).__name__} (errno {exc.errno})" if exc.errno else type(exc).__name__
        return EaglekbError(f"file system error: {what}", where=where, found=found,
                            fix=_OS_FIX.get(exc.errno, "check the path and the files given to this command")).line()
    if isinstance(exc, UnicodeDecodeError):
        return EaglekbError("input is not UTF-8 text", expected="UTF-8 text (JSON, prompts)",
                            found=f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}",
                            fix="check the text files given to this command").line()
    if isinstance(exc, MemoryError):
        return EaglekbError("out of memory", fix="use smaller sizes (batch, length, count) or a larger machine").line()
    if isinstance(exc, RecursionError):
        return EaglekbError("input nested too deeply", expected="JSON nested at most a few hundred levels").line()
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return EaglekbError(f"internal error: {type(exc).__name__}" + (f": {text}" if text else ""),
                        where="eaglekb (this is a bug in eaglekb, not in your input)",
                        fix=f"rerun with {DEBUG_ENV}=1 to see the traceback, and report it").line()


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Every exception as one line on stderr and exit 2 (130 on Ctrl-C); invoke's own ``Exit`` passes.

    A bug in eaglekb (an exception that is not an input, file or resource error) shows its traceback
    only with ``EAGLEKB_DEBUG=1``.
    """
    try:
        yield
    except Exit:
        raise
    except Stopped as exc:
        _close_bars()
        raise Exit(f"error: stopped by {signal.Signals(exc.signum).name}; nothing was recorded",
                   code=128 + exc.signum) from None
    except KeyboardInterrupt:
        _close_bars()
        raise Exit("error: interrupted; nothing was recorded", code=130) from None
    except Exception as exc:
        if os.environ.get(DEBUG_ENV) == "1" and not isinstance(exc, EaglekbError):
            raise
        _close_bars()
        code = exc.exit_code if isinstance(exc, EaglekbError) else 2
        raise Exit(f"error: {error_line(exc)}", code=code) from None


def _close_bars() -> None:
    """End every live progress bar on its own line, so that the error line that follows is a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        with contextlib.suppress(Exception):
            bar.close()


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a task: raised like Ctrl-C, so every ``finally`` runs (temp files removed,
    output locks released, a folder being replaced left whole) before the one error line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: Signals that end a task the way Ctrl-C does (the default would end the process with no cleanup at all).
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def stop_signals_as_interrupts() -> Iterator[None]:
    """While the block runs (main thread only), SIGTERM and SIGHUP raise ``Stopped``; a second one ends the
    process at once (the default), so a cleanup that hangs can still be stopped. Handlers restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise Stopped(signum)

    before = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def parse_errors_exit_2() -> None:
    """invoke's own command-line errors (an unknown option, an option without its value, a missing argument,
    a core option such as ``-f FILE`` taken from a value like ``-inf``) as one ``error:`` line and exit 2, like
    every other refusal (invoke would exit 1, or print a traceback). Called by tasks.py."""
    from invoke.exceptions import ParseError, UnknownFileType
    from invoke.program import Program

    _help.install(Program)  # task help with kinds and defaults
    if getattr(Program.parse_tasks, "eaglekb", False):
        return

    def one_line_exit(method: Callable) -> Callable:
        def wrapped(self: Program) -> None:
            try:
                method(self)
            except (ParseError, UnknownFileType, OSError) as exc:
                fix = _help.suggestion(exc, self) if isinstance(exc, ParseError) else "invoke --help TASK"
                said = _help.missing_value(str(exc), list(getattr(self, "argv", None) or []))
                if ": invoke read " in said:
                    fix = "a value starting with - is read as options: write it as --OPTION=VALUE"
                raise Exit(f"error: {one_line(said)}; fix: {fix}", code=2) from None

        wrapped.eaglekb = True  # type: ignore[attr-defined]
        return wrapped

    Program.parse_tasks = one_line_exit(Program.parse_tasks)  # type: ignore[method-assign]
    Program.update_config = one_line_exit(Program.update_config)  # type: ignore[method-assign]


# --------------------------------------------------------------------------- the task class


def _help_request(values: dict[str, Any]) -> bool:
    """``--help`` taken by invoke as the value of an argument (a positional, or a flag waiting for a value)."""
    return any(v in HELP_WORDS or (isinstance(v, list) and any(x in HELP_WORDS for x in v)) for v in values.values()
               if isinstance(v, (str, list)))


class _Positional(Argument):
    """A positional argument that, given ``--help``, gives it to the other positional arguments too (so that
    invoke's parser does not stop at a missing one and the task prints its help instead)."""

    siblings: list[Argument] = []

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast)
        if value in HELP_WORDS:
            for other in self.siblings:
                if other is not self and other.value is None:
                    Argument.set_value(other, value, cast)


class EaglekbTask(Task):
    """An invoke task behind the boundary: options parsed first, every error one line, ``--force`` added."""

    def __init__(self, body: Callable, *args: Any, options: dict[str, Any] | None = None, **kwargs: Any):
        self.options = dict(options or {})
        self.help_texts = dict(kwargs.get("help") or {})
        params = inspect.signature(body).parameters
        self.adds_force = "record" in params and "force" not in params
        super().__init__(body, *args, **kwargs)
        if self.adds_force:
            self.help_texts["force"] = _FORCE_HELP

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        # -h stays help, on every task; "-" is no short flag (``top_p`` would get ``--``, the end of options)
        opts = super().arg_opts(name, default, set(taken_names) | {"h", "-"})
        if opts.get("kind") in (int, float):
            opts["kind"] = str  # parsed by ``parse_options``: invoke's int() would end in a traceback
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        args = super().get_arguments(ignore_unknown_help)
        positional = [a for a in args if a.positional]
        for arg in positional:  # `TASK --help` fills every positional argument: the parser completes
            arg.__class__ = _Positional
            arg.siblings = positional
        if self.adds_force:
            args.append(Argument(names=("force",), kind=bool, default=False, help=_FORCE_HELP))
        return args

    def command(self) -> str:
        """How the user calls this task (``invoke bench``, ``invoke bench.sglang``)."""
        area = self.body.__module__.rpartition(".")[2]
        name = self.name.replace("_", "-")
        return f"invoke {area}" if self.is_default or name == area else f"invoke {area}.{name}"

    def usage(self) -> str:
        """The task's help (as ``invoke --help TASK`` prints it, kinds and real defaults), without running it."""
        return _help.usage(self)

    def _precheck_record(self, values: dict[str, Any], force: bool) -> None:
        """Refuse --record over an existing baseline (or a cited record) and a missing --compare, up front."""
        kind = self.body.__module__.rpartition(".")[2]
        if kind not in baselines.KINDS:
            return
        if values.get("record"):
            baselines.check_can_record(f"{kind}/{values['record']}", force=force, where="--record")
        if values.get("compare") and not baselines.exists(f"{kind}/{values['compare']}"):
            raise MissingFile("no such baseline to compare with", where="--compare",
                              expected=f"a recorded baselines/{kind}/NAME.json", found=values["compare"],
                              fix="list them with `invoke baselines.check`")

    def _lock_record(self, values: dict[str, Any], stack: contextlib.ExitStack) -> None:
        """Hold the lock of baselines/KIND/NAME.json while a run with --record NAME works: a second run recording
        the same name at the same time is refused at once, not after its work."""
        kind = self.body.__module__.rpartition(".")[2]
        if kind in baselines.KINDS and values.get("record"):
            stack.enter_context(baselines.record_lock(f"{kind}/{values['record']}", where=f"--record {values['record']}"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            result = self._run(*args, **kwargs)  # on failure, the one error line and nothing else
        for message in dict.fromkeys(one_line(str(w.message))[:300] for w in caught):
            print(f"warning: {message}", file=sys.stderr)
        return result

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        with cli_errors():
            names = list(inspect.signature(self.body).parameters)[1:]
            values = dict(zip(names, args[1:]), **kwargs)
            if _help_request(values):
                print(self.usage())
                return None
            missing = [p for p in self.positional if values.get(p) is None or not str(values.get(p)).strip()]
            if missing:
                raise BadInput("missing argument", where=f"{missing[0].upper()} (--{missing[0].replace('_', '-')})",
                               expected=self.help_texts.get(missing[0]) or "a value",
                               found="nothing", fix=f"{self.command()} --help")
            force = bool(values.pop("force", False) if self.adds_force else values.get("force", False))
            parsed = parse_options(self.body, values, self.options)
            self._precheck_record(parsed, force)
            defaults = {p.name: p.default for p in inspect.signature(self.body).parameters.values()}
            token = _FORCE.set(force)
            given_token = _GIVEN.set(frozenset(n for n, v in parsed.items()  # invoke fills a repeatable with []
                                               if v != defaults.get(n) and not (v == [] and defaults.get(n) is None)))
            with contextlib.ExitStack() as stack:  # the outputs' locks (``claim``), released when the task ends
                stack_token = _STACK.set(stack)
                try:
                    stack.enter_context(stop_signals_as_interrupts())
                    self._lock_record(parsed, stack)
                    return super().__call__(args[0], **parsed)
                finally:
                    _FORCE.reset(token)
                    _GIVEN.reset(given_token)
                    _STACK.reset(stack_token)


def task(*args: Any, **kwargs: Any) -> Any:
    """invoke's ``@task``, with the project's boundary (``EaglekbTask``): use it for every task."""
    kwargs.setdefault("klass", EaglekbTask)
    return _invoke_task(*args, **kwargs)


# --------------------------------------------------------------------------- output and recording


def emit(document: dict[str, Any], text: str | None, json_out: bool) -> None:
    """Print the human text (unless --json), then the JSON document as the last stdout line."""
    if text and not json_out:
        print(text)
    if json_out:
        print(json.dumps(document, sort_keys=True, default=str))


def command_line() -> str:
    """The command as a user types it (for provenance): ``invoke TASK --opts``, never the path of
    invoke's ``__main__.py``; paths under the repository relative to its root; an embedded model's
    cache folder as the model's name (``eaglekb.measure.command``)."""
    from eaglekb.measure.command import typed_command

    return typed_command(sys.argv, root=baselines.find_root())


def finish(
    *,
    kind: str,
    record: str | None,
    compare: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Record a result (``--record NAME``) or keep it in local history and compare it.

    Without ``--record`` the run goes to .eaglekb/history/ and is compared with
    ``baselines/KIND/<compare>.json`` when that exists, else with a recorded
    baseline of the same kind whose config is identical. Returns what happened,
    for the task's JSON document. Recording over an existing baseline needs the
    task's ``--force``; a cited record is never replaced by a run.

    The comparison has two parts (``eaglekb.kb.reproduce``): deterministic metrics (accept
    lengths, exactness, counts) within their tolerance, and timings after normalising by the
    calibration the run measured (a probe's or bench's plain decode tok/s), so that a slower
    machine reads "acceptance reproduced; this machine is 1.4x slower", not "NOT reproduced".
    """
    from eaglekb.measure.command import unportable_paths

    name = record or compare or "run"
    command = command_line()
    result = baselines.build(kind=kind, name=name, command=command, **fields)
    out: dict[str, Any] = {"baseline_id": result.id}
    if record:
        out["recorded"] = str(baselines.write(result, force=_FORCE.get()))
        # A path only this machine has makes the recorded command one nobody else can run: say so.
        out["command_warnings"] = unportable_paths(command)
        for warning in out["command_warnings"]:
            print(f"warning: the recorded command names {warning}; rerunning it elsewhere needs a path "
                  "under the repository or an embedded model name", file=sys.stderr)
        return out
    out["history"] = str(baselines.save_history(result))
    reference = None
    if compare:
        reference = baselines.load_id(f"{kind}/{compare}")
    else:
        reference = baselines.find_same_config(kind, result.config)
    if reference is not None:
        cmp = baselines.compare(result, reference)
        out["comparison"] = cmp.model_dump()
        out["comparison_text"] = cmp.text()
    return out


def forced() -> bool:
    """Whether the running task was given ``--force``."""
    return _FORCE.get()


def given(name: str) -> bool:
    """Whether the running task's option NAME (``temperature``) was given a value other than its default."""
    return name in _GIVEN.get()


def no_effect(option: str, value: Any, needs: str, fix: str | None = None) -> BadInput:
    """The refusal of an option that would be accepted and ignored: what it needs to take effect."""
    return BadInput("option would have no effect", where=option, expected=needs,
                    found=f"{option} given" if value is True else _found(value),
                    fix=fix or f"drop {option.split('=')[0]}, or give what it needs")


def refuse_ignored(cases: list[tuple[str, bool, str]], values: dict[str, Any]) -> None:
    """Each (option name, ignored here, what it needs) whose option was given and would be ignored: refused
    in one line (``no_effect``), never accepted and dropped."""
    for name, ignored, needs in cases:
        if ignored and given(name):
            raise no_effect("--" + name.replace("_", "-"), values.get(name), needs)


def shape_from_record(ref: Any, values: dict[str, Any], *, also: tuple[str, ...] = (), **match: Any) -> dict | None:
    """``--shape-from bench/NAME``: a shape typed beside it refused in one line, then that sweep's best point
    (``eaglekb.kb.shapes.best_shape``, checked against ``match``: prompts, drafter, device); None without it."""
    if not ref:
        return None
    refuse_ignored([(name, True, "no --shape-from (the record's best point gives the shape)")
                    for name in ("steps", "topk", "draft_tokens", *also)], values)
    from eaglekb.kb.shapes import best_shape

    return best_shape(str(ref), **match)


def claim(path: Any, option: str, *, lock: bool = True, force: bool | None = None, **guard: Any) -> Any:
    """The one rule for an output the user names (``eaglekb.io.files.guard_output``: never a tracked file,
    never an input, an existing one only with --force and only of the command's own kind), checked before
    any work; with ``lock`` the output is then held until the task ends, so a second run writing it at the
    same time is refused in one line. Returns the path."""
    from pathlib import Path

    from eaglekb.io.files import guard_output, output_lock

    path = Path(str(path))
    where = f"{option} {path}"
    guard_output(path, where=where, force=forced() if force is None else force, **guard)
    stack = _STACK.get()
    if lock and stack is not None:
        stack.enter_context(output_lock(path, where=where))
    return path


def finish_text(doc: dict[str, Any]) -> str:
    """The lines ``finish`` adds to a task's human output: where it recorded, whether it reproduced."""
    lines = []
    if "recorded" in doc:
        lines.append(f"recorded {doc['baseline_id']} -> {doc['recorded']}")
    if "comparison_text" in doc:
        lines.append(doc["comparison_text"])
    elif "history" in doc:
        lines.append(f"no recorded baseline with this config to compare with; kept in {doc['history']}")
    return ("\n" + "\n".join(lines)) if lines else ""



__all__ = ["BASELINE_NAME", "EaglekbTask", "OPTIONS", "Opt", "claim", "cli_errors", "command_line", "emit", "error_line",
           "finish", "finish_text", "forced", "given", "no_effect", "one_line", "one_of", "parse_errors_exit_2", "refuse_ignored", "shape_from_record",
           "parse_floats", "parse_int", "parse_options", "real", "task", "text", "whole"]
