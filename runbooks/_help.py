"""What a person reads before a task runs: each task's help (types and defaults), and invoke's own parse
errors as one line that suggests what was probably meant.

* ``usage(task)``: the help ``invoke --help TASK`` and ``invoke TASK --help`` print for every task behind
  the boundary: each option with its real kind (``INT``, ``NUMBER``, ``auto|on|off``, ``NAME``, ``PATH``,
  ``NAME|PATH`` for an embedded model or built-in prompt set as well as a path, ``TEXT``; invoke itself would
  say ``STRING`` for every value, since the project parses numbers itself) and, for every option that has
  one, its default as the task's signature has it (``[default: 4]``; a hand-typed ``(default 4)`` in the
  help text is dropped), so the help cannot drift from the code. Short flags are letters only.
* ``suggestion(exc, program)``: for "No idea what 'prob' is!" the closest task names (``invoke probe``),
  for an unknown option the task's closest options (``--steps``), else the task's help command.
* ``install(Program)``: invoke's help printer replaced by ``usage`` (and quiet when the reader closes the
  pipe early, as ``invoke --help bench | head`` does).
"""

from __future__ import annotations

import difflib
import inspect
import re
import sys
from typing import Any

from runbooks._options import OPTIONS, Opt

#: Option names whose text value is a path (shown as PATH; every other text value is TEXT).
PATH_NAMES = re.compile(r"(^|_)(out|path|data|drafter|drafters|dataset|mapping|counts|init|work|dir|file|folder|"
                        r"pieces|prompts|a|b|mapping_a|mapping_b|against|val_data|save_counts|site_dir|run_dir|"
                        r"source_counts|online_target|prompts_file|reference_drafter|heldout|python)$")
#: Options that take a name the project knows (an embedded model, a built-in prompt set) or a path, shown as
#: NAME|PATH: one of these names with a name as its default, or any option whose help offers both.
NAME_OR_PATH_NAMES = re.compile(r"^(target|model|prompts)$")
_OFFERS_A_NAME = re.compile(r"\b(embedded|name|builtin)\b(?!>)")  # not a placeholder: <name>
_OFFERS_A_PATH = re.compile(r"\b(folders?|files?|paths?)\b")


def _kind(task: Any, name: str, default: Any) -> str:
    """How a value of option NAME is written: INT, NUMBER, a|b|c, NAME, NAME|PATH, PATH or TEXT ('' for a flag)."""
    kind = _parsed_kind(task, name, default)
    text = task.help_texts.get(name, "")
    if kind in ("PATH", "TEXT") and ((NAME_OR_PATH_NAMES.match(name) and isinstance(default, str) and default)
                                     or (_OFFERS_A_NAME.search(text) and _OFFERS_A_PATH.search(text))):
        return "NAME|PATH"
    return kind


def _parsed_kind(task: Any, name: str, default: Any) -> str:
    parser = task.options.get(name, OPTIONS.get(name))
    if isinstance(default, bool) and parser is None:
        return ""
    if isinstance(parser, Opt):
        if parser.label:
            return parser.label
        if parser.choices:
            return "|".join(parser.choices)
        if parser.kind is int:
            return "INT"
        if parser.kind is float:
            return "NUMBER"
        if parser.pattern is not None:
            return "NAME"
    if parser is None and type(default) in (int, float):
        return "INT" if type(default) is int else "NUMBER"
    return "PATH" if PATH_NAMES.search(name) else "TEXT"


def _shown(default: Any) -> str:
    """A default as the help shows it ('' when there is none to show)."""
    if default is inspect.Parameter.empty or default is None or default is False or default == "":
        return ""
    return "on" if default is True else str(default)


#: A value as help text writes it: no space, comma, semicolon or closing bracket; a colon only inside it
#: (``127.0.0.1:8000``), not the one that ends it (``default 60: why``).
_VALUE = r"(?:[^\s,;:)]|:(?=\S))+"


def _restated(default: Any):
    """A ``re.sub`` replacement that drops a hand-typed mention of DEFAULT and keeps any other text."""
    shown = _shown(default)

    def same(value: str) -> bool:
        value = value.rstrip("/")
        if value in (shown, str(default)):
            return True
        try:
            return not isinstance(default, bool) and float(value) == float(default)
        except (TypeError, ValueError):
            return False

    def replace(match: re.Match) -> str:
        value = match.groupdict().get("value")
        if value is not None and not same(value):
            return match.group(0)
        return match.groupdict().get("keep") or ""

    return replace


_RESTATEMENTS = (
    r"\s*\(default:?\s+(?P<value>%s)\)" % _VALUE,  # "(default 8)"
    r"(?P<keep>\()default:?\s+(?P<value>%s)[:;,]\s+" % _VALUE,  # "(default 60: why)" -> "(why)"
    r"\s*[,;]\s*default:?\s+(?P<value>%s)(?=\)|$)" % _VALUE,  # "(--steps, default 3)"
    r"(?P<keep>\b(?P<value>[\w.:/-]+)) \(default\)",  # "builtin (default), humaneval"
    r"(?P<keep>\b(?P<value>[\w.:/-]+) \()default;\s+",  # "bfloat16 (default; why)" -> "bfloat16 (why)"
)
_FLAG_RESTATEMENTS = (r"\s*\(default\)", r"(?P<keep>\()default;\s+", r"\bon by default[,;]\s+")


def with_default(text: str, default: Any) -> str:
    """The help text with the real default, ``[default: X]`` after it for every option that has one; a
    hand-typed mention that says the same (``(default 8)``, ``(SGLang --tp, default 1)``, ``symlink
    (default)``) is dropped, and what it explained stays (``(default 60: why)`` -> ``(why)``)."""
    shown = _shown(default)
    if not shown:
        return text
    for pattern in _RESTATEMENTS + (_FLAG_RESTATEMENTS if default is True else ()):
        text = re.sub(pattern, _restated(default), text)
    return text if f"[default: {shown}]" in text else f"{text} [default: {shown}]".strip()


def usage(task: Any) -> str:
    """The task's help: usage line, docstring, then one line per option (kind, help, real default)."""
    doc = inspect.cleandoc(task.body.__doc__ or "")
    params = list(inspect.signature(task.body).parameters.values())[1:]
    positional = " ".join(p.upper() for p in task.positional)
    shorts = {a.name: [n for n in a.names if len(n) == 1 and n.isalnum()] for a in task.get_arguments()}
    rows = []
    for p in params + ([inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, default=False)]
                       if task.adds_force else []):
        flag = "--" + p.name.strip("_").replace("_", "-")
        kind = _kind(task, p.name, p.default)
        if p.default is True and not kind:
            flag = "--[no-]" + flag[2:]
        spec = flag + (f"={kind}" if kind else "")
        short = shorts.get(p.name) or []
        if short and p.name not in task.positional:
            spec = f"-{short[0]}, {spec}"
        help_text = task.help_texts.get(p.name, "")
        extra = "; repeatable" if p.name in getattr(task, "iterable", []) and "repeatable" not in help_text else ""
        if p.name in task.positional:
            spec = f"{p.name.upper()} ({spec})"
        else:
            help_text = with_default(help_text, p.default)
        rows.append((spec, help_text + extra))
    width = min(max((len(s) for s, _ in rows), default=0), 40)
    lines = [f"Usage: {task.command()} [--options] {positional}".rstrip(), "", doc, "", "Options:"]
    lines += [f"  {spec:<{width}}  {text}" if len(spec) <= width else f"  {spec}\n  {'':<{width}}  {text}"
              for spec, text in rows]
    return "\n".join(lines)


def _typed_name(message: str) -> str | None:
    found = re.search(r"No idea what '(.*)' is!", message)
    return found.group(1) if found else None


def _doubled(name: str) -> bool:
    """``probe.probe``: a collection's default task under its full name (users type ``probe``)."""
    head, _, tail = name.partition(".")
    return head == tail


def _as_typed(task: str | None) -> str | None:
    return task.partition(".")[0] if task and _doubled(task) else task


def missing_value(message: str, argv: list[str] | None = None) -> str:
    """invoke's "Flag <Argument: num_prompts (n)> needed value and was not given one!" as the option typed; a value
    such as ``-inf`` that invoke split into short flags (``-i -n -f``) is named as the user typed it."""
    found = re.search(r"Flag <(?:_Positional|Argument): ([\w-]+)(?: \((\w)\))?[^>]*> needed value", message)
    if not found:
        return message
    text = f"option --{found.group(1).replace('_', '-')} needs a value"
    short = found.group(2)
    typed = [t for t in argv or [] if short and re.fullmatch(r"-[^-\s]{2,}", t) and short in t[1:]]
    return text + (f": invoke read {typed[0]!r} as the short flags {' '.join('-' + c for c in typed[0][1:])}"
                   if typed else "")


def suggestion(exc: Exception, program: Any) -> str:
    """The fix for one of invoke's parse errors: the closest task or option, else the task's help."""
    context = getattr(exc, "context", None)
    name = _typed_name(str(exc))
    task = _as_typed(getattr(context, "name", None))
    if name is not None and re.fullmatch(r"-[0-9.]\S*", name):  # "-10" read as the flags -1 -0
        return ("a value starting with - is read as options: write it as --OPTION=VALUE "
                f"(invoke --help {task or 'TASK'} lists them)")
    if name is not None and name.startswith("-") and context is not None:
        flags = sorted(f for f in context.flags if f.startswith("--"))
        close = difflib.get_close_matches(name.split("=")[0], flags, n=3, cutoff=0.5)
        if close:
            return f"did you mean {' or '.join(close)}? (invoke --help {task} lists its options)"
        return f"invoke --help {task} lists its options"
    if name is not None:
        every = set(program.collection.task_names) | {a for v in program.collection.task_names.values() for a in v}
        names = sorted(n for n in every if not _doubled(n) or n.partition(".")[0] not in every)
        close = [n for n in names if n.startswith(name) and n != name][:3] or \
            difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        shown = " or ".join(f"`invoke {n}`" for n in close)
        return (f"did you mean {shown}? " if close else "") + "(`invoke --list` lists every task)"
    return f"invoke --help {task} lists its options" if task else "`invoke --list` lists every task"


def install(program_class: Any) -> None:
    """Replace invoke's per-task help with ``usage`` for the project's tasks (idempotent)."""
    if getattr(program_class.print_task_help, "eaglekb", False):
        return
    original = program_class.print_task_help

    def print_task_help(self: Any, name: str) -> None:
        task = self.collection[name]
        try:
            if hasattr(task, "help_texts") and hasattr(task, "adds_force"):
                print(usage(task))
            else:
                original(self, name)
            sys.stdout.flush()
        except BrokenPipeError:  # `invoke --help bench | head`: the reader has what it wanted
            _quiet_stdout()

    print_task_help.eaglekb = True  # type: ignore[attr-defined]
    program_class.print_task_help = print_task_help


def _quiet_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
