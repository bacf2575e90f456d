"""The command of a result as a user types it, for provenance.

Owns: turning a process's argv into the command a reader can run again (``typed_command``):
``invoke`` rather than the path of invoke's ``__main__.py`` inside site-packages, paths under the
repository written relative to its root, and the cache folder of an embedded model written as the
model's name (``smollm2-135m``, not ``/tmp/eaglekb-cache/models/smollm2-135m``); and saying which
arguments of a command another machine cannot resolve (``unportable_paths``: absolute paths
outside the repository, /tmp paths); and the reproduce form of a recorded command
(``reproduce_command``: ``--record NAME`` becomes ``--compare NAME``, ``--force`` is dropped, so
the command reruns the result and compares with it, overwriting nothing). Knows nothing about
baselines files or the task runner.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Sequence

from eaglekb.models import sources

#: Folders whose content is gone after a reboot or on another machine.
TEMP_ROOTS = tuple(dict.fromkeys(("/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir())))


def _program(arg0: str) -> str:
    """``invoke`` for invoke's own entry points (the console script, ``python -m invoke``)."""
    posix = arg0.replace("\\", "/")
    if Path(posix).name in ("invoke", "inv") or posix.endswith("invoke/__main__.py"):
        return "invoke"
    return arg0


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _embedded_name(path: Path) -> str | None:
    """The embedded model whose cache folder PATH is, or None."""
    for name in sources.SOURCES:
        try:
            if path == sources.model_dir(name).resolve():
                return name
        except OSError:
            continue
    return None


def _typed_value(value: str, root: Path, cwd: Path) -> str:
    if not value or value.startswith("-") or "://" in value:
        return value
    raw = Path(value).expanduser()
    if not raw.is_absolute():
        if cwd == root or not (cwd / raw).exists():
            return value
        raw = cwd / raw  # typed relative to a sub-folder: write it relative to the root
    try:
        path = raw.resolve()
    except OSError:
        return value
    name = _embedded_name(path)
    if name:
        return name
    if _under(path, root):
        rel = os.path.relpath(path, root)
        return rel + ("/" if value.endswith("/") and rel != "." else "")
    return value


def typed_command(argv: Sequence[str], *, root: Path, cwd: Path | None = None) -> str:
    """The command as a user types it: ``invoke TASK --opts`` with repo-relative paths and model names."""
    args = list(argv)
    if not args:
        return "invoke"
    root = Path(root).resolve()
    cwd = Path(cwd or Path.cwd()).resolve()
    out = [_program(args[0])]
    for arg in args[1:]:
        if arg.startswith("--") and "=" in arg:
            option, _, value = arg.partition("=")
            out.append(f"{option}={_typed_value(value, root, cwd)}")
        else:
            out.append(_typed_value(arg, root, cwd))
    return shlex.join(out)


def unportable_paths(command: str) -> list[str]:
    """Arguments of COMMAND that name a path another machine cannot resolve, each with the reason."""
    try:
        args = shlex.split(command)
    except ValueError:
        return [f"{command!r}: not a shell command (unbalanced quotes)"]
    found = []
    for arg in args[1:]:
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if not value.startswith(("/", "~")):
            continue
        # A home path is judged as typed, not by where this machine's HOME happens to be (under /tmp on a
        # fresh CI machine it would read as a temporary path): it is outside the repository either way.
        path = value
        if path.startswith("~"):
            found.append(f"{value}: an absolute path outside the repository (a home folder)")
        elif any(path == t or path.startswith(t.rstrip("/") + "/") for t in TEMP_ROOTS):
            found.append(f"{value}: a temporary path (gone after a reboot, absent on another machine)")
        else:
            found.append(f"{value}: an absolute path outside the repository")
    return found


#: Recording tasks that take no ``--compare``: models.prepare compares itself with the recorded baseline of the
#: same config on its own; plan.anchors records a published figure as it was reported, so a rerun writes the
#: same. tests/measure/test_command.py checks this against the task signatures.
NO_COMPARE = ("models.prepare", "plan.anchors")
#: Options a reproduce command never carries: they write or replace a baseline or an existing output.
WRITING_OPTIONS = ("--record", "--force")


def _task_name(args: list[str]) -> str:
    return args[1] if len(args) > 1 else ""


def reproduce_command(command: str) -> str:
    """COMMAND as a rerun that compares with what it recorded and overwrites nothing: ``--record NAME``
    becomes ``--compare NAME`` (for a task without ``--compare``, ``NO_COMPARE``, it is dropped: the run
    finds the baseline of its config), ``--force`` is dropped. A command that is not an ``invoke`` call
    (or not one shell command) is returned as it is: nothing in it is known to record."""
    try:
        args = shlex.split(command)
    except ValueError:
        return command
    if not args or args[0] != "invoke":
        return command
    out, record, skip = [], None, False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        option, eq, value = arg.partition("=")
        if option == "--record":
            record, skip = (value, False) if eq else (args[i + 1] if i + 1 < len(args) else None, True)
            continue
        if arg == "--force":
            continue
        out.append(arg)
    if record and "--compare" not in out and not any(a.startswith("--compare=") for a in out) \
            and _task_name(args) not in NO_COMPARE:
        out += ["--compare", record]
    return shlex.join(out)


def writes_baselines(command: str) -> list[str]:
    """The options of COMMAND that record or replace something (empty for a reproduce command)."""
    try:
        args = shlex.split(command)
    except ValueError:
        return []  # not one shell command: no option of it can be read
    return [a for a in args if a.partition("=")[0] in WRITING_OPTIONS]
