"""`invoke baselines.*`: validate (and later diff) the recorded baselines."""

from __future__ import annotations

from invoke import Exit

from eaglekb.io.errors import EaglekbError
from eaglekb.kb import baselines, diff_render
from eaglekb.kb import diff as baseline_diff
from eaglekb.kb import identity as _identity
from eaglekb.kb import investigation
from runbooks._common import cli_errors, emit, parse_floats, task


@task(help={"json": "print one JSON document as the last line",
            "fix": "rewrite valid files in canonical format"})
def check(c, json=False, fix=False):
    """Validate every baselines/KIND/NAME.json against the schema (v2: input hashes, reproduce command) and the canonical format.

    Exits 1 when a file has a problem, or when there is no baseline at all (a wrong EAGLEKB_ROOT or
    checkout must not pass as "0 valid").
    """
    with cli_errors():
        if fix:
            for path in baselines.iter_files():
                try:
                    baselines.write(baselines.load(path), force=True)
                except (EaglekbError, OSError):
                    pass  # invalid files are reported below
        ok, problems = baselines.check_all()
        if not ok and not problems:
            problems = [f"{baselines.baselines_dir()}: no baseline files (expected baselines/KIND/NAME.json)"]
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


@task(help={"rev_a": "old revision (default: merge-base of main and HEAD, else HEAD)",
            "rev_b": "new revision (default: WORKTREE, the files on disk now)",
            "threshold": "flag a metric when |change| > PCT percent of the old value, instead of its recorded noise",
            "json": "print one JSON document as the last line",
            "fail_on": "exit 1 on: regression (any flagged regression) | change (any flagged change, "
                       "or a baseline added/removed/renamed) | none (default)",
            "markdown": "print Markdown for a pull-request comment instead of plain text"})
def diff(c, rev_a=None, rev_b=None, threshold=None, json=False, fail_on="none", markdown=False):
    """What changed in baselines/ between two git revisions: metrics against their noise, config, environment."""
    with cli_errors():
        pct = parse_floats(threshold, "--threshold")
        report = baseline_diff.diff(rev_a, rev_b, threshold_rel=pct[0] / 100 if pct else None)
        failed = report.should_fail(fail_on)
    text = diff_render.to_markdown(report) if markdown else diff_render.to_text(report)
    emit(diff_render.to_json(report), text, json)
    if failed:
        raise Exit(f"--fail-on {fail_on}: {report.summary()}", code=1)


@task(help={"json": "print one JSON document as the last line"})
def record_investigation(c, json=False):
    """Record the K2.5 investigation's reported numbers as baselines (source "recorded", each citing its section)."""
    with cli_errors():
        paths = investigation.record()
    ids = [f"{p.parent.name}/{p.stem}" for p in paths]
    emit({"baselines": ids, "files": [str(p) for p in paths]},
         "\n".join(f"recorded {i} -> {p}" for i, p in zip(ids, paths)), json)


@task(help={"json": "print one JSON document as the last line",
            "dry_run": "say what would change, write nothing"})
def identity(c, json=False, dry_run=False):
    """Upgrade baselines recorded before content identity to schema v2: the sha256 of each input from git history
    (or unknown, with the reason), the reproduce command, superseded_by. Repeatable: complete files stay as they are."""
    with cli_errors():
        changed = _identity.backfill(baselines.find_root(), dry_run=dry_run)
    verb = "would upgrade" if dry_run else "upgraded"
    text = "\n".join([*(f"{verb} {bid}: {what}" for bid, what in changed), f"{len(changed)} baselines {verb}"])
    emit({"changed": [bid for bid, _ in changed], "dry_run": dry_run}, text, json)
