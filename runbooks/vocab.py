"""`invoke vocab.build` and `invoke vocab.compare A B`: draft-vocab mappings (d2t/t2d)."""

from __future__ import annotations

from runbooks._common import claim, cli_errors, emit, finish, finish_text, no_effect, parse_int, task
from runbooks._common import given as given_opt




@task(
    iterable=["corpus", "dataset", "heldout"],
    help={
        "out": "where to write the mapping (.safetensors: d2t, t2d, counts + metadata)",
        "draft_vocab_size": "N, the number of target tokens the drafter predicts (e.g. 4096, 32000)",
        "counts": "a token-count file (safetensors 'counts') to build from",
        "dataset": "a datagen dataset folder (shards with input_ids + loss_mask) to count; repeatable (summed)",
        "holdout": "K: hold out 1 in K prompts of each --dataset (by prompt id; greedy and sampled responses of a "
                   "prompt stay together), count the rest, and report the mapping's coverage on them (default 0: none)",
        "heldout": "held-out data to report coverage on: a dataset folder (with --holdout K: only its held-out "
                   "1 in K prompts) or a count file; repeatable",
        "corpus": "count real prompt text instead: a corpus name, repeatable (wiki, chitchat, gsm8k, gpqa, aime, "
                  "py-functions ...)",
        "per_source": "prompts per corpus when counting corpora (default: all of the train split)",
        "seed": "shuffle seed for the --per-source sample (default 0)",
        "target": "model whose tokenizer and chat template render the corpora (default smollm2-135m)",
        "save_counts": "also write the token counts to this file",
        "json": "print one JSON document as the last line",
        "record": "write baselines/vocab/NAME.json",
        "compare": "compare with baselines/vocab/NAME.json",
    },
)
def build(c, out, draft_vocab_size, counts=None, dataset=None, corpus=None, per_source=None,
          target="smollm2-135m", seed=0, save_counts=None, json=False, record=None, compare=None, holdout=0,
          heldout=None):
    """Build a d2t/t2d mapping from token counts (SpecForge/speculators rule: top N, ties by id, sorted)."""
    with cli_errors():
        from eaglekb.data import vocab
        from eaglekb.formats.mapping import build_mapping, render_build, save_mapping
        from eaglekb.io.errors import BadInput

        n = parse_int(draft_vocab_size, "--draft-vocab-size")
        given = [x for x in (counts, dataset, corpus) if x]
        if len(given) != 1:
            raise BadInput("say what to count", where="vocab.build", expected="exactly one of --counts, "
                           "--dataset, --corpus", found=f"{len(given)} given")
        _check_outputs_and_options(out, save_counts, counts, dataset, corpus, heldout,
                                   dict(target=target, per_source=per_source, seed=seed, holdout=holdout))
        config = {"draft_vocab_size": n}
        target_cfg = None
        if counts:
            tc = vocab.load_counts(counts)
            config["counts"] = str(counts)
        elif dataset:
            k = parse_int(holdout, "--holdout") or 0
            tc = vocab.counts_from_datasets(dataset, holdout=k, part="train")
            config["dataset"] = str(dataset[0]) if len(dataset) == 1 else [str(d) for d in dataset]
            config["holdout_every"] = k or None
            from eaglekb.formats.shards import open_dataset

            target_cfg = open_dataset(dataset[0]).target
        else:
            from transformers import AutoTokenizer

            from eaglekb.data import corpora
            from eaglekb.models import sources

            limit = parse_int(per_source, "--per-source") if per_source else 0  # 0: all
            prompts = corpora.mix(corpus, per_source=limit, seed=parse_int(seed, "--seed"))
            folder = sources.resolve(target)
            tok = AutoTokenizer.from_pretrained(str(folder))
            from eaglekb.io.files import read_json

            target_cfg = read_json(folder / "config.json", what="target config.json")
            tc = vocab.counts_from_prompts(prompts, tok, progress=True)
            config.update(corpora=list(corpus), per_source=per_source and limit, target=target,
                          counted=tc.meta["what"], prompts_count=len(prompts), seed=int(seed),
                          manifest_sha256=prompts.manifest["sha256"],
                          note="prompt text stands in for training targets (assistant tokens) where no "
                               "generated dataset exists; build from --dataset for the real thing")
        if save_counts:
            vocab.save_counts(save_counts, tc)
        mapping = build_mapping(tc, n)
        held = _heldout(vocab, mapping, dataset, heldout, parse_int(holdout, "--holdout") or 0, config)
        path = save_mapping(out, mapping)
        doc = {"out": str(path), **mapping.meta, **held}
        metrics = {"draft_vocab_tokens": n, "target_vocab_tokens": mapping.vocab_size,
                   "counted_tokens": tc.total, "seen_count": tc.seen,
                   "padded_count": mapping.meta["padded_tokens"],
                   "coverage_pct": round(100 * mapping.meta["coverage_frac"], 4), **held}
        if target_cfg:  # what this draft vocabulary costs a drafter of the target (bf16, SGLang layout)
            size = vocab.drafter_bytes(target_cfg, n)
            metrics.update(drafter_params_count=size["params"], drafter_lm_head_params_count=size["lm_head_params"],
                           drafter_bf16_bytes=size["bytes"])
            doc["drafter_bf16_bytes"] = size["bytes"]
        doc.update(finish(kind="vocab", record=record, compare=compare, config=config, metrics=metrics,
                          noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.0},
                          summary=f"top {n} of {mapping.vocab_size} tokens cover "
                                  f"{metrics['coverage_pct']:.2f}% of {tc.total:,} counted tokens"))
    text = render_build(mapping, path)
    if doc.get("drafter_bf16_bytes"):
        text += f"\ndrafter: {doc['drafter_bf16_bytes'] / 2**20:.1f} MiB in bf16 with this draft vocabulary (lm_head {n} rows)"
    if held:
        text += (f"\nheld-out: top {n} cover {held['heldout_coverage_pct']:.2f}% of {held['heldout_tokens_count']:,} "
                 f"loss tokens ({held['heldout_distinct_count']:,} distinct) of held-out data")
    emit(doc, text + finish_text(doc), json)


def _check_outputs_and_options(out, save_counts, counts, dataset, corpus, heldout, values: dict) -> None:
    """Before any counting: options that only shape another source refused, and the outputs claimed
    (never an input, never a tracked file, an existing one only with --force)."""
    for option, needs in (("target", corpus), ("per_source", corpus), ("seed", corpus),
                          ("holdout", dataset or heldout)):
        if given_opt(option) and not needs:
            flag = "--" + option.replace("_", "-")
            what = "--dataset or --heldout folders" if option == "holdout" else "--corpus"
            raise no_effect(flag, values[option], f"{what} (it says how to count that)",
                            fix=f"drop {flag}, or count with {what}")
    inputs = [counts, *(dataset or []), *(heldout or [])]
    claim(out, "--out", inputs=inputs, what="mapping file")
    if save_counts:
        claim(save_counts, "--save-counts", inputs=inputs + [out], what="counts file")


def _heldout(vocab, mapping, dataset, heldout, k, config) -> dict:
    """Coverage of ``mapping`` on held-out data: --heldout, or the held-out prompts of --dataset with --holdout."""
    from eaglekb.formats.mapping_compare import coverage
    from eaglekb.io.errors import BadInput, Incompatible

    specs = list(heldout or ([] if not k else dataset or []))
    if k and not specs:
        raise BadInput("--holdout needs data to split", where="--holdout", expected="--dataset or --heldout folders",
                       found="neither")
    if not specs:
        return {}
    ref = vocab.heldout_counts(specs, holdout=k)
    if ref.vocab_size != mapping.vocab_size:
        raise Incompatible("held-out data is for another target vocabulary", where=f"--heldout {specs[0]}",
                           expected=f"target vocab {mapping.vocab_size} (the mapping's)",
                           found=f"target vocab {ref.vocab_size}")
    config["heldout"] = [str(s) for s in specs]
    return {"heldout_coverage_pct": round(100 * coverage(mapping, ref), 4), "heldout_tokens_count": ref.total,
            "heldout_distinct_count": ref.seen}


@task(
    help={
        "a": "mapping A: a mapping .safetensors, a drafter folder, SpecForge vocab_mapping.pt, or a d2t.npy folder",
        "b": "mapping B (same kinds)",
        "counts": "a reference token distribution (count file or mapping file with counts) for coverage",
        "json": "print one JSON document as the last line",
        "record": "write baselines/vocab/NAME.json",
        "compare": "compare with baselines/vocab/NAME.json",
    },
)
def compare(c, a, b, counts=None, json=False, record=None, compare=None):
    """Position matches, set overlap, Jaccard, coverage, and why positions disagree."""
    with cli_errors():
        from eaglekb.data import vocab
        from eaglekb.formats import mapping_compare
        from eaglekb.formats.mapping import load_mapping

        ma, mb = load_mapping(a), load_mapping(b)
        ref = vocab.load_counts(counts) if counts else None
        doc = mapping_compare.compare_mappings(ma, mb, ref)
        config = {"a": str(a), "b": str(b), "counts": str(counts) if counts else None,
                  "a_meta": _brief(ma), "b_meta": _brief(mb)}
        doc.update(finish(kind="vocab", record=record, compare=compare, config=config,
                          metrics=mapping_compare.comparison_metrics(doc),
                          noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.0},
                          summary=f"{doc['position_matches']} of {max(ma.draft_vocab_size, mb.draft_vocab_size)} "
                                  f"positions match, set overlap {doc['set_overlap']} "
                                  f"(Jaccard {doc['jaccard']:.3f})"))
    emit(doc, mapping_compare.render_comparison(doc) + finish_text(doc), json)


def _brief(mapping):
    meta = dict(mapping.meta)
    if mapping.counts is not None:
        cm = mapping.counts.meta
        meta["counted"] = cm.get("what")
        man = cm.get("manifest") or {}
        meta["manifest"] = {k: man.get(k) for k in ("count", "sha256", "seed") if k in man} | (
            {"sources": [m.get("source") for m in man.get("mix", [])]} if "mix" in man else {})
    return meta
