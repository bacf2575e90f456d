"""Shared plumbing for runbook tasks: error handling, output, recording.

A task is thin: parse its options, call one library function inside
``cli_errors()``, then ``emit`` the result (human text, plus one JSON document as
the last line of stdout with ``--json``) and, for measured results, ``finish``
(record a baseline with ``--record NAME`` or write local history and compare).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Iterator

from invoke import Exit

from eaglekb.io.errors import BadInput, EaglekbError
from eaglekb.kb import baselines


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn library errors into one line on stderr and a non-zero exit (no traceback)."""
    try:
        yield
    except EaglekbError as exc:
        raise Exit(f"error: {exc.line()}", code=exc.exit_code) from None
    except KeyboardInterrupt:
        raise Exit("error: interrupted; nothing was recorded", code=130) from None


def emit(document: dict[str, Any], text: str | None, json_out: bool) -> None:
    """Print the human text (unless --json), then the JSON document as the last stdout line."""
    if text and not json_out:
        print(text)
    if json_out:
        print(json.dumps(document, sort_keys=True, default=str))


def parse_floats(values: Any, option: str) -> list[float]:
    """Parse a repeatable numeric option (list or comma-separated string)."""
    if values is None:
        return []
    if isinstance(values, (str, int, float)):
        values = [values]
    out: list[float] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(float(part))
            except ValueError:
                raise BadInput(
                    "not a number", where=option, expected="a number", found=repr(part)
                ) from None
    return out


def parse_int(value: Any, option: str) -> int | None:
    """Parse a whole-number option given as text (None or empty: not given)."""
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise BadInput("not a whole number", where=option, expected="an integer", found=repr(value)) from None


def command_line() -> str:
    """The exact command as typed (for provenance)."""
    import shlex

    argv = list(sys.argv)
    if argv:
        argv[0] = "invoke" if argv[0].endswith(("invoke", "inv", "invoke/__main__.py")) else argv[0]
    return " ".join(shlex.quote(a) for a in argv)


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
    for the task's JSON document.
    """
    name = record or compare or "run"
    result = baselines.build(kind=kind, name=name, command=command_line(), **fields)
    out: dict[str, Any] = {"baseline_id": result.id}
    if record:
        out["recorded"] = str(baselines.write(result))
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


def finish_text(doc: dict[str, Any]) -> str:
    """The lines ``finish`` adds to a task's human output: where it recorded, whether it reproduced."""
    lines = []
    if "recorded" in doc:
        lines.append(f"recorded {doc['baseline_id']} -> {doc['recorded']}")
    if "comparison_text" in doc:
        lines.append(doc["comparison_text"])
    return ("\n" + "\n".join(lines)) if lines else ""
