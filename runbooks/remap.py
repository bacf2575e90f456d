"""`invoke remap`: move a drafter's lm_head rows to a new mapping by target token id.

`invoke remap.measure` runs the measured check on real held-out data (see docs/howto/vocab.md).
"""

from __future__ import annotations

from runbooks._common import claim, cli_errors, emit, finish, finish_text, task


def _remap_into(R, drafter, new_map, out, *, inputs: list, **kw) -> dict:
    """Remap into a new folder beside ``out``, then swap it in (``eaglekb.io.files.replace_folder``): an
    existing drafter at ``out`` (replaced only with --force, only if it is an untracked drafter folder) stays
    until the new one is in place, so a kill at any moment leaves one of the two."""
    import shutil

    from eaglekb.formats.drafter import is_drafter_folder
    from eaglekb.io.files import new_sibling, replace_folder

    out = claim(out, "--out", folder=True, ours=is_drafter_folder, what="drafter folder",
                inputs=[i for i in inputs if i is not None])
    staging = new_sibling(out)
    try:
        report = R.remap_drafter(drafter, new_map, staging, force=False, **kw)
        replace_folder(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dict(report, out=str(out))

@task(
    default=True,
    help={
        "drafter": "source drafter folder (SGLang/SpecForge or speculators format)",
        "mapping": "the new mapping: mapping .safetensors, drafter folder, SpecForge .pt, or d2t.npy folder",
        "out": "folder for the remapped drafter (must not exist or be empty, unless --force)",
        "init": "rows for tokens new to the mapping: target-scaled (default with --target), target-fit, "
                "target, mean (default without --target), zeros",
        "target": "the target model (name, folder or repo id) whose lm_head rows initialise new tokens",
        "source_counts": "token counts of the source drafter's training data (count or mapping file): "
                         "reports the mass lost with dropped tokens",
        "force": "replace a non-empty --out that holds a drafter (nothing else is ever deleted), and with "
                 "--record an existing baseline of that name",
        "json": "print one JSON document as the last line",
        "record": "write baselines/remap/NAME.json",
        "compare": "compare with baselines/remap/NAME.json",
    },
)
def remap(c, drafter, mapping, out, init=None, target=None, source_counts=None, force=False, json=False,
          record=None, compare=None):
    """New drafter: each kept token's lm_head row moved to its new position; new rows initialised."""
    with cli_errors():
        from eaglekb.data import vocab
        from eaglekb.formats.mapping import load_mapping
        from eaglekb.training import remap as R

        new_map = load_mapping(mapping)
        counts = vocab.load_counts(source_counts) if source_counts else None
        target_path = None
        if target:
            from eaglekb.models import sources

            target_path = sources.resolve(target)
        report = _remap_into(R, drafter, new_map, out, init=init, target=target_path, source_counts=counts,
                             inputs=[drafter, mapping, source_counts, target_path])
        doc = dict(report)
        if record or compare:
            metrics = {k + "_count": report[k] for k in ("kept", "moved", "stayed", "new", "dropped")}
            for k in ("source_mass_lost_frac", "new_mass_frac"):
                if k in report:
                    metrics[k] = round(report[k], 6)
            config = {"drafter": str(drafter), "mapping": str(mapping), "init": report["init"],
                      "target": target, "source_counts": source_counts}
            doc.update(finish(kind="remap", record=record, compare=compare, config=config, metrics=metrics,
                              noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.0},
                              summary=f"kept {report['kept']}, moved {report['moved']}, new {report['new']}, "
                                      f"dropped {report['dropped']}"))
    emit(doc, R.render_remap(report) + finish_text(doc), json)


@task(
    help={
        "mapping_a": "the source drafter's mapping (built with vocab.build)",
        "mapping_b": "the new mapping",
        "target": "target model (default smollm2-135m)",
        "eval_corpus": "held-out prompts, repeatable (default gsm8k-eval); eval split only",
        "eval_limit": "prompts per eval corpus (default 200)",
        "train_corpus": "prompts the fitted head trains on, repeatable (default wiki, chitchat); train split",
        "train_limit": "prompts per train corpus for the fitted head (default 300)",
        "fit_steps": "Adam steps for the fitted head (default 600; 0 skips it)",
        "out": "also write the source and remapped drafter folders under this folder (an earlier one: --force)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/remap/NAME.json",
        "compare": "compare with baselines/remap/NAME.json",
    },
    iterable=["eval_corpus", "train_corpus"],
)
def measure(c, mapping_a, mapping_b, target="smollm2-135m", eval_corpus=None, eval_limit=200, train_corpus=None,
            train_limit=300, fit_steps=600, out=None, json=False, record=None, compare=None):
    """Measured check: the remap keeps every kept token's prediction; compare inits on held-out data."""
    with cli_errors():
        from eaglekb.measure import remap_check as M

        if out:  # it writes source-a/, mapping-b.safetensors and remapped-b/ there
            claim(out, "--out", folder=True, ours=lambda p: (p / "remapped-b").is_dir(), what="remap check folder",
                  inputs=[mapping_a, mapping_b])
        result = M.measure(mapping_a, mapping_b, target=target, eval_corpora=eval_corpus or ["gsm8k-eval"],
                           eval_limit=int(eval_limit), train_corpora=train_corpus or ["wiki", "chitchat"],
                           train_limit=int(train_limit), fit_steps=int(fit_steps), out=out, progress=not json)
        doc = dict(result)
        doc.update(finish(kind="remap", record=record, compare=compare, config=result["config"],
                          metrics=result["metrics"], noise=result["noise"], summary=result["summary"]))
    emit(doc, M.render(result) + finish_text(doc), json)
