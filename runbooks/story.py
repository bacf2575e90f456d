"""`invoke story.*`: the investigation's Phase 0 / Phase 1 story on a small target, measured and recorded.

Each task imports ``eaglekb.studies.story`` when it runs: the story loads torch, and listing the tasks must
stay quick.
"""

from __future__ import annotations

from pathlib import Path

from eaglekb.io.errors import BadInput
from eaglekb.kb import baselines
from eaglekb.models import sources
from runbooks._common import BASELINE_NAME, claim, cli_errors, command_line, emit, parse_int, task


@task(help={
    "out": "prompts file to write (.jsonl; a .manifest.json goes beside it; an existing one only with --force)",
    "a_per_source": "domain A: prompts from each of wiki and chitchat (default 1152)",
    "b_per_source": "domain B: prompts from each of gsm8k and gpqa (train splits hold 1,119 and 188)",
    "max_prompt_chars": "drop training prompts longer than this (default 1500)",
    "eval_count": "gsm8k-eval prompts kept for the online probes (default 16)",
    "seed": "shuffle seed",
    "json": "print one JSON document as the last line",
    "force": "replace an existing prompts file (and its manifest) at --out",
})
def prompts(c, out=".eaglekb/story/prompts.jsonl", a_per_source=1152, b_per_source=1200, max_prompt_chars=1500,
            eval_count=16, seed=0, json=False, force=False):
    """Write the A (wiki + chitchat), B (gsm8k + gpqa) and eval prompts of a story run, disjoint by text."""
    with cli_errors():
        from eaglekb.data.prompts import manifest_path
        from eaglekb.studies import story as lib

        claim(out, "--out", what="prompts file")
        claim(manifest_path(out), "--out", what="prompts manifest beside it", lock=False)
        doc = lib.write_prompts(out, a_per_source=parse_int(a_per_source, "--a-per-source"),
                                b_per_source=parse_int(b_per_source, "--b-per-source"),
                                max_prompt_chars=parse_int(max_prompt_chars, "--max-prompt-chars"),
                                eval_count=parse_int(eval_count, "--eval-count"), seed=parse_int(seed, "--seed"))
    emit(doc, f"wrote {doc['A']} A + {doc['B']} B + {doc['eval']} eval prompts to {doc['file']} "
              f"({doc['bytes']} bytes)", json)


@task(help={
    "model": "target transformers folder (e.g. the smollm2-135m cache folder) or an embedded name",
    "prompts": "prompts file from story.prompts",
    "out": "output folder: story.json and drafters.tar.partNN (default .eaglekb/story/out)",
    "work": "datasets, mappings and checkpoints (GBs; default /tmp/eaglekb-story)",
    "tiny": "CPU, tiny random Llama, tiny budgets: checks the plumbing in seconds, numbers mean nothing",
    "device": "auto (CUDA when present) or cpu",
    "threads": "torch CPU threads (0: torch's choice)",
    "b_small": "also run the three Phase 1 arms on the first N B sequences, same steps (0: off)",
    "soft_limit_s": "past this many seconds, skip the remaining probes and small-budget arms",
    "no_export": "do not write the drafters into the output folder",
    "export_max_mib": "room for exported drafters in the output folder, in MiB",
    "json": "print one JSON document (the story's verdicts and stage times) as the last line",
    "force": "replace the story output of an earlier run at --out",
})
def run(c, model=None, prompts=None, out=None, work="/tmp/eaglekb-story", tiny=False, device="auto", threads=0,
        b_small=256, soft_limit_s=480, no_export=False, export_max_mib=60, json=False, force=False):
    """Datagen A and B, mappings, drafter A, three Phase 1 arms at equal budgets, probes, verdicts."""
    with cli_errors():
        from eaglekb.studies import story as lib

        cfg = lib.StoryConfig(model=sources.resolve(model) if model and not tiny else model, prompts=prompts,
                              work=work, tiny=bool(tiny), device=device, threads=parse_int(threads, "--threads"),
                              b_small=parse_int(b_small, "--b-small"), soft_limit_s=float(soft_limit_s),
                              export_drafters=not no_export, export_max_mib=float(export_max_mib))
        inputs = [prompts, model if model and not tiny and Path(str(cfg.model)).is_dir() else None]
        claim(work, "--work", folder=True, reuse=True, ours=lambda p: (p / "eval-prompts.jsonl").is_file(),
              what="story work folder", inputs=inputs)
        out = claim(out or ".eaglekb/story/out", "--out", folder=True,
                    ours=lambda p: (p / lib.STORY_FILE).is_file(), what="story output folder", inputs=inputs + [work])
        doc = lib.run(cfg, out, command=command_line(), log=None if json else print, progress=not json)
    emit({k: doc.get(k) for k in ("arms", "verdicts", "verdict_basis", "stages", "skipped", "complete")}, None, json)


@task(help={
    "run_dir": "a story.run output folder (story.json, drafters.tar.partNN); the run must have finished",
    "prefix": "baseline name prefix, e.g. story-h200 (names: PREFIX-a, PREFIX-b-remap, PREFIX-verdicts ...)",
    "commit": "the git commit the run was made at (needed when the run was made outside a git checkout)",
    "command": "the exact command of the run (default: the one story.json recorded)",
    "drafters": "also unpack the exported drafters here, hashes checked (e.g. .eaglekb/story/drafters)",
    "pieces": "folder of drafters.tar.partNN + drafters-export.json from story.export (default: RUN_DIR)",
    "check": "compare with the recorded baselines of the same names instead of writing",
    "dry_run": "build and schema-check the baselines and check the drafters' pieces; write nothing",
    "force": "replace baselines of the same names that are already recorded, and drafter folders under --drafters "
             "(only untracked drafter folders: a folder git tracks is never replaced)",
    "json": "print one JSON document as the last line",
}, options={"prefix": BASELINE_NAME})
def record(c, run_dir, prefix, commit=None, command=None, drafters=None, pieces=None, check=False, dry_run=False,
           force=False, json=False):
    """Record a story run's results as baselines (datagen, vocab, finetune, probe, plan).

    Everything is checked before anything is written: the run finished, every baseline validates and
    may be written (a name already recorded needs --force), and the drafters' pieces match their hashes.
    """
    with cli_errors():
        from eaglekb.studies import story as lib

        doc = lib.load(run_dir)
        if doc.get("complete") is not True:
            raise BadInput("the story run did not finish", where=f"{run_dir}/story.json",
                           expected='"complete": true (a run that reached its end)',
                           found=f"stages {', '.join(doc.get('stages') or {}) or 'none'}",
                           fix="rerun invoke story.run; an unfinished run is never recorded")
        specs = lib.baseline_specs(run_dir, prefix=prefix, commit=commit,
                                   command=command or (doc.get("provenance") or {}).get("command")
                                   or "invoke story.run")
        made = [baselines.build(**spec) for spec in specs]
        if drafters:  # every check (pieces, hashes, that each is a drafter, that it may go there) before writing
            lib.check_drafters(run_dir, pieces, drafters, force=bool(force))
        if not (check or dry_run):
            for b in made:
                baselines.check_can_record(b.id, force=bool(force))
        lines, result = _record_story(made, check=check, dry_run=dry_run, force=bool(force))
        if drafters and not dry_run:
            got = lib.unpack_drafters(run_dir, drafters, pieces, force=bool(force))
            result["drafters"] = {k: str(v) for k, v in got.items()}
            lines += [f"drafter {k} -> {v} (hashes match the run)" for k, v in got.items()]
        elif drafters:
            lines.append(f"drafters' pieces match their hashes; not unpacked into {drafters} (--dry-run)")
    emit(result, "\n".join(lines), json)


def _record_story(made, *, check: bool, dry_run: bool, force: bool) -> tuple[list[str], dict]:
    """Compare (--check), list (--dry-run) or write the story's baselines: the report lines and document."""
    lines, result = [], {"baselines": [b.id for b in made]}
    if check:
        result["comparisons"] = {}
        for b in made:
            if not baselines.exists(b.id):
                lines.append(f"{b.id}: not recorded")
                continue
            cmp = baselines.compare(b, baselines.load_id(b.id))
            result["comparisons"][b.id] = cmp.model_dump()
            lines.append(f"{b.id}: {cmp.text()}")
    elif dry_run:
        lines += [f"valid {b.id}; not written (--dry-run)" for b in made]
    else:
        lines += [f"recorded {b.id} -> {baselines.write(b, force=force)}" for b in made]
    return lines, result


@task(help={
    "work": "the run's work folder (holds run-NAME/drafter)",
    "names": "comma-separated drafters to export, e.g. b-remap,a-scratch",
    "out": "output folder (default .eaglekb/story/export)",
    "json": "print one JSON document as the last line",
    "force": "replace an earlier export at --out",
})
def export(c, names, work="/tmp/eaglekb-story", out=None, json=False, force=False):
    """Export chosen drafters of a finished run in 16 MiB pieces, with a hash manifest (for story.record)."""
    with cli_errors():
        from eaglekb.studies import story as lib

        out = claim(out or ".eaglekb/story/export", "--out", folder=True,
                    ours=lambda p: (p / lib.EXPORT_FILE).is_file(), what="export folder", inputs=[work])
        doc = lib.export_from_work(work, [n.strip() for n in str(names).split(",") if n.strip()], out)
    emit(doc, f"exported {', '.join(doc['drafters'])}: {doc['bytes']} bytes in {len(doc['parts'])} pieces to {out}",
         json)
