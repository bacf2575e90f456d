"""`invoke datagen`: self-distilled training data (token ids, loss masks, target hidden states)."""

from __future__ import annotations

from runbooks._common import Opt, claim, cli_errors, emit, finish, refuse_ignored, task

@task(
    default=True,
    iterable=["corpus"],
    options={"slice": Opt(str, label="K/N")},  # checked by eaglekb.data.prompts.parse_slice, the one parser
    help={
        "target": "model: an embedded name (smollm2-135m), a local folder or a HF repo id",
        "corpus": "prompt source, repeatable (wiki, chitchat, gsm8k, gpqa, aime, wiki-instruct, chitchat-multi, "
                  "gsm8k-instruct, gsm8k-code, py-functions; NAME:K = K variants per item, 0 = all); default "
                  "wiki+chitchat+gsm8k",
        "per_source": "prompts taken from each corpus (train split, shuffled with --seed; 0 = all); a cap: a corpus "
                      "with fewer gives all it has, said in one note line and recorded",
        "slice": "slice K of N (1-based) of every corpus's prompts, dealt out by item (stable hash), so N "
                 "sessions generate disjoint parts of the same mix; each slice needs its own --out",
        "prompts_file": "prompts from a file instead (JSON lines with prompt/messages, or one per line)",
        "out": "dataset folder (default .eaglekb/datasets/<target>-<n>-<mode>); a rerun resumes it",
        "mode": "greedy or sampled regeneration",
        "temperature": "sampled mode: temperature",
        "top_p": "sampled mode: nucleus top-p",
        "max_new_tokens": "response budget per prompt",
        "max_len": "prompt + response tokens kept per sequence",
        "batch_size": "prompts per generate/featurise batch",
        "shard_size": "sequences per safetensors shard",
        "features": "stored (hidden states in shards) or online (ids and masks only; training runs the target)",
        "no_final_hidden": "store only the target argmax (hard labels), not its final hidden state",
        "dtype": "storage dtype of hidden states (bfloat16, float16, float32)",
        "device": "cpu or cuda",
        "device_map": "spread a large target over GPUs (transformers device_map, e.g. auto)",
        "server": "regenerate through a running SGLang server (OpenAI API), e.g. http://127.0.0.1:30000",
        "server_model": "model name sent to the server",
        "seed": "prompt shuffling and sampling seed",
        "threads": "torch CPU threads (default: torch's choice; 1 is fastest on a loaded shared machine)",
        "generator": "local generation: auto (engine on CUDA, hf on CPU), hf (transformers generate) or engine "
                     "(continuous batching over a static cache, CUDA graphs; --batch-size is its rows)",
        "samples": "engine: extra sampled responses per prompt, one per temperature, e.g. 0.6,0.8,1.0",
        "nproc": "processes, one per GPU, each on a disjoint share of the prompts; one merged dataset",
        "time_budget_s": "start no new shard after this many seconds (a rerun resumes the rest); the record says so",
        "json": "print one JSON document as the last line",
        "record": "write baselines/datagen/NAME.json",
        "compare": "compare with baselines/datagen/NAME.json",
    },
)
def datagen(c, target="smollm2-135m", corpus=None, per_source=20, prompts_file=None, out=None, mode="greedy",
            temperature=0.7, top_p=0.95, max_new_tokens=256, max_len=1024, batch_size=8, shard_size=256,
            features="stored", no_final_hidden=False, dtype="bfloat16", device="cpu", device_map=None,
            server=None, server_model="default", seed=0, json=False, record=None, compare=None, threads=None,
            generator="auto", samples=None, nproc=1, time_budget_s=None, slice=None):
    """Regenerate responses with the target and store what EAGLE-3 training reads (resumable)."""
    with cli_errors():
        import sys
        from pathlib import Path

        if threads:
            import torch

            torch.set_num_threads(int(threads))

        from eaglekb.data import datagen as dg
        from eaglekb.data.launch import generate_dataset
        from eaglekb.data.prompts import DEFAULT_CORPORA, training_prompts
        from eaglekb.models import sources

        from runbooks._common import parse_floats

        refuse_ignored([
            ("temperature", mode == "greedy", "--mode sampled (greedy decoding does not sample)"),
            ("top_p", mode == "greedy", "--mode sampled (greedy decoding does not sample)"),
            ("per_source", bool(prompts_file), "no --prompts-file (it takes every prompt of the file)"),
            ("corpus", bool(prompts_file), "no --prompts-file (the prompts come from the file)"),
            ("seed", bool(prompts_file) and mode == "greedy" and not samples,
             "corpora to shuffle or responses to sample (a prompts file in greedy mode uses neither)"),
            ("no_final_hidden", features == "online", "--features stored (online features store no hidden state)"),
            ("generator", bool(server), "no --server (the server generates the responses)"),
            ("samples", bool(server), "no --server (the server generates the responses)"),
            ("server_model", not server, "--server URL"),
        ], locals())
        path = sources.resolve(str(target))
        prompts = training_prompts(corpus, per_source=int(per_source), prompts_file=prompts_file, seed=int(seed),
                                   slice_spec=slice)
        for note in prompts.manifest.get("notes") or []:
            print(f"note: {note}", file=sys.stderr)
        part = prompts.manifest.get("slice")
        cfg = dg.DatagenConfig(max_new_tokens=int(max_new_tokens), max_len=int(max_len), batch_size=int(batch_size),
                               mode=mode, temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                               shard_size=int(shard_size), features=features, store_final_hidden=not no_final_hidden,
                               dtype=dtype, sample_temperatures=tuple(parse_floats(samples, "--samples")),
                               generator=("engine" if str(device).startswith("cuda") else "hf")
                               if generator == "auto" else generator)
        name = Path(str(target)).name
        default = f"{name}-{len(prompts)}-{mode}" + (f"-slice{part.replace('/', 'of')}" if part else "")
        out = claim(out or Path(".eaglekb/datasets") / default, "--out", folder=True,
                    ours=dg.is_datagen_folder, reuse=True, what="dataset folder",
                    inputs=[prompts_file, path if Path(str(path)).is_dir() else None])
        dg.check_slice(out, part)  # before the target loads: a folder of another slice is refused at once
        manifest = generate_dataset(path, prompts, out, cfg, nproc=int(nproc), device=device, device_map=device_map,
                                    server=server, server_model=server_model, progress=not json,
                                    time_budget_s=float(time_budget_s) if time_budget_s else None)
        doc = {"out": str(out), "totals": manifest["totals"], "last_run": manifest.get("last_run"),
               "prompts": manifest.get("prompts")}
        metrics = {k: v for k, v in dg.storage_report(manifest).items() if v not in (None, {})}
        config = {"target": str(target), "corpus": list(corpus or DEFAULT_CORPORA) if not prompts_file else None,
                  "prompts_file": prompts_file, "per_source": int(per_source), "device": device,
                  "prompts_sha256": prompts.manifest.get("sha256"), "threads": threads, "nproc": int(nproc),
                  "time_budget_s": time_budget_s, "stopped_by_budget": (manifest.get("last_run") or {}).get(
                      "stopped_by_budget"),
                  "prompts_manifest": prompts.manifest, **cfg.__dict__,
                  **({"slice": part} if part else {})}  # unsliced: the config of earlier records, unchanged
        doc.update(finish(kind="datagen", record=record, compare=compare, config=config, metrics=metrics,
                          noise=dg.NOISE, summary=f"{metrics['bytes_per_token_bytes']} bytes/token on disk "
                          f"({metrics['hidden_state_bytes_per_token_bytes']} of them hidden states), "
                          f"{metrics['tokens_count']} tokens"))
    text = dg.render_text(manifest, out)
    if "recorded" in doc:
        text += f"\nrecorded {doc['baseline_id']} -> {doc['recorded']}"
    if "comparison_text" in doc:
        text += "\n" + doc["comparison_text"]
    emit(doc, text, json)


@task(help={"a": "dataset folder", "b": "another dataset folder (e.g. the same prompts made on more GPUs)",
            "json": "print one JSON document as the last line"})
def compare(c, a, b, json=False):
    """Sequence by sequence, by id: how many are identical in two datasets (determinism, sharding checks)."""
    with cli_errors():
        from eaglekb.formats.shards import compare_datasets

        doc = compare_datasets(a, b)
    text = (f"{doc['common_count']} sequences in both: {doc['equal_count']} identical, {doc['different_count']} "
            f"different; {doc['only_a_count']} only in {a}, {doc['only_b_count']} only in {b}")
    emit(doc, text, json)
