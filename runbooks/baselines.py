"""`invoke baselines.*`: validate (and later diff) the recorded baselines."""

from __future__ import annotations

from invoke import Exit, task

from eaglekb import baselines
from runbooks._common import cli_errors, emit


@task(help={"json": "print one JSON document as the last line",
            "fix": "rewrite valid files in canonical format"})
def check(c, json=False, fix=False):
    """Validate every baselines/KIND/NAME.json against schema v1 and the canonical format."""
    with cli_errors():
        if fix:
            for path in baselines.iter_files():
                try:
                    baselines.write(baselines.load(path))
                except Exception:
                    pass  # invalid files are reported below
        ok, problems = baselines.check_all()
    text = "\n".join([*problems, f"{len(ok)} baselines valid, {len(problems)} problems"])
    emit({"valid": ok, "problems": problems}, text, json)
    if problems:
        raise Exit(code=1)


@task(help={"json": "print the JSON Schema as one line"})
def schema(c, json=False):
    """Print the JSON Schema of a baseline file."""
    import json as _json

    doc = baselines.json_schema()
    emit(doc, _json.dumps(doc, indent=2, sort_keys=True), json)
