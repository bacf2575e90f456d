"""`invoke recipe FILE`: a training pipeline (datagen, vocab, finetune, probe, bench) from one recipe file.

The recipe format and its run live in ``eaglekb.studies.recipe``; this runbook tells it which options each
task has (read from the real task definitions, so a recipe can never name an option a task lacks) and turns
the outcome into an exit code: the failing step's own.
"""

from __future__ import annotations

import inspect
from typing import Any

from invoke import Exit

from runbooks._common import cli_errors, emit, task
from runbooks._options import BASELINE_NAME

#: Tasks whose shared recipe values would change what they do: vocab.build's --target only renders --corpus
#: text (with --dataset it is refused as having no effect) and sglang.install's --target is the folder it installs
#: into, so a recipe's target is given to neither.
NOT_SHARED = {"vocab.build": {"target"}, "sglang.install": {"target"}}
#: Each task's option that continues from the newest checkpoint in its --out folder (used with --resume).
RESUME_OPTIONS = {"finetune": "resume"}


def _kind(name: str, default: Any, task_: Any) -> str:
    if name in (getattr(task_, "iterable", None) or []):
        return "list"
    if isinstance(default, bool):
        return "negatable" if default else "flag"
    return "value"


def task_options(ns: Any) -> dict:
    """Every task of the namespace (the recipe task aside) as ``TaskOptions``: its options from its signature."""
    from eaglekb.studies.recipe import SHARED, TaskOptions

    out = {}
    for full in ns.task_names:
        t = ns[full]
        if t.body.__module__ == __name__:
            continue
        params = list(inspect.signature(t.body).parameters.values())[1:]
        opts = {p.name: _kind(p.name, p.default, t) for p in params}
        if getattr(t, "adds_force", False):
            opts["force"] = "flag"
        name = t.command().removeprefix("invoke ")
        spec = TaskOptions(command=t.command(), options=opts, required=tuple(t.positional),
                           shared=frozenset(set(SHARED) & set(opts)) - NOT_SHARED.get(name, set()),
                           resume=RESUME_OPTIONS.get(name))
        out[full] = out.get(name) or spec
        out[name] = out[full]
    return out


def _newest_checkpoint(folder):
    from eaglekb.training.checkpoints import list_checkpoints

    found = list_checkpoints(folder)
    return found[-1] if found else None


@task(
    default=True,
    iterable=["set"],
    help={
        "file": "the recipe (a .yaml under recipes/)",
        "set": "STEP.OPTION=VALUE (or KEY=VALUE: name, target, device, nproc): override one value, repeatable",
        "dry_run": "print every step's exact command and run nothing",
        "only": "run only these steps: STEP[,STEP]",
        "from_": "run from this step to the end",
        "run_dir": "the run folder (default .eaglekb/runs/<name>)",
        "resume": "skip the steps finished with the same command; finetune continues from its newest checkpoint",
        "record_prefix": "record every step that records as PREFIX-STEP (probe@humaneval -> PREFIX-probe-humaneval), "
                         "unless the step names its own record",
        "json": "print one JSON document as the last line",
    },
)
def recipe(c, file, set=None, dry_run=False, only=None, from_=None, run_dir=None, resume=False,
           record_prefix=None, json=False):
    """Run a recipe's steps in order, each as its own `invoke` command; state in the run folder."""
    with cli_errors():
        import tasks

        from eaglekb.studies.recipe import run_recipe

        doc = run_recipe(file, task_options(tasks.ns), root=tasks.ROOT, sets=list(set or []), run_dir=run_dir,
                         only=only, start=from_, resume=bool(resume), dry_run=bool(dry_run),
                         record_prefix=record_prefix, check_name=BASELINE_NAME, newest_checkpoint=_newest_checkpoint,
                         log=lambda line: print(line, flush=True))  # before the step's own output
    text = doc.pop("text")
    if doc["exit_code"]:
        emit(doc, None, json)
        raise Exit(f"error: step {doc['failed']} failed with exit code {doc['exit_code']}; in {file}; "
                   "fix: see its output above, then rerun with --resume", code=doc["exit_code"])
    emit(doc, text, json)
