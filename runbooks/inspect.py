"""`invoke inspect PATH [--against PATH2]`: check a drafter checkpoint, or compare two."""

from __future__ import annotations

import sys

from invoke import Exit

from runbooks._common import cli_errors, emit, task


@task(
    default=True,
    help={
        "path": "drafter folder (config.json + *.safetensors), SGLang or speculators format",
        "against": "a second drafter folder: print a side-by-side compatibility report instead",
        "target": "also check against a target model (name, folder or repo id): fc input, vocab, layers",
        "json": "print one JSON document as the last line",
    },
)
def inspect(c, path, against=None, target=None, json=False):
    """Config, tensors, dtypes, mapping sanity, keys SGLang would ignore, aux-layer convention.

    Exits 1 when the checkpoint has findings of severity error (or, with --against,
    when the two are incompatible).
    """
    with cli_errors():
        from eaglekb.formats import compare, inspect as inspection
        from eaglekb.models import sources

        if against:
            report = compare.compare_checkpoints(path, against)
            text = compare.render_comparison(report)
            failed = not report["compatible"]
            reason = report["verdict"]
        else:
            target_dir = sources.resolve(target) if target else None
            if target_dir is not None:  # the target's weights as every load checks them (NaN/inf, pickles)
                from eaglekb.models.checks import check_model_folder

                check_model_folder(target_dir)
            report = inspection.inspect_checkpoint(path, target=target_dir)
            text = inspection.render_inspection(report)
            failed = not report["ok"]
            reason = f"{report['errors']} error finding(s) in {path}"
    emit(report, text, json)
    if failed:
        print(f"error: {reason}", file=sys.stderr)
        raise Exit(code=1)
