"""Train eaglekb's default EAGLE-3 drafter for smollm2-135m on one GPU (about 8 minutes on an H200).

Three steps, each a plain Python entry (the GPU machine has torch, transformers,
safetensors, numpy and tqdm, but not invoke, pydantic or the corpus packages):

1. On the CPU machine, write the training prompts (wiki + chitchat + gsm8k train
   splits; the evaluation sets HumanEval and the GSM8K eval slice are checked out):

       python scripts/gpu_train_default.py prompts --per-source 3000 --out .carry/prompts.jsonl

2. On the GPU machine, regenerate responses with the target (greedy, self-distillation),
   store the features, build the mapping from the data and train:

       PYTHONPATH=src python scripts/gpu_train_default.py train \
           --model .carry/smollm2-135m --prompts .carry/prompts.jsonl --out $OUT/default

   It writes under --out: drafter/ (SGLang format, bf16, <= 25 MB), metrics.json (the
   training report with curves), summary.json (datagen storage cost and throughput,
   training throughput, vocab coverage per draft-vocab size, the size budget),
   data-manifest.json, and prints progress with flush.

3. Back on the CPU machine, record the baselines from summary.json:

       python scripts/gpu_train_default.py record --summary OUT/default/summary.json \
           --name smollm2-135m-default-h200

Size budget (smollm2-135m: hidden 576, 9 heads of 64, 3 KV heads, vocab 49152), bf16:
fc 576x1728 + q 1152x576 + k,v 1152x192 each + o 576x576 + 4 norms = 2,435,328 params
= 4.87 MB; MLP 3*576*I; lm_head Vd*576; d2t 8*Vd bytes; t2d 49,152 bytes. With
I = 1536 (the target's) and Vd = 12288: 4.87 + 5.31 + 14.16 + 0.10 + 0.05 = 24.48 MB.
Vd = 16384 would leave I <= 311; Vd = 8192 gives 19.7 MB. The summary reports the
measured token coverage of each size, the accuracy ceiling the choice sets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

BUDGET_BYTES = 25_000_000
VOCAB_CANDIDATES = (4096, 8192, 12288, 16384, 24576, 32768)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def drafter_bytes(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, draft_vocab: int,
                  vocab: int, target_hidden: int | None = None) -> int:
    """bf16 checkpoint bytes of an EAGLE-3 drafter (no embeddings): the arithmetic above."""
    th = target_hidden or hidden
    params = (3 * th * hidden + 2 * hidden * heads * head_dim + 2 * 2 * hidden * kv_heads * head_dim
              + heads * head_dim * hidden + 4 * hidden + 3 * hidden * inter + draft_vocab * hidden)
    return 2 * params + 8 * draft_vocab + vocab


# ----------------------------------------------------------------------------- prompts (CPU machine)


def cmd_prompts(args) -> int:
    from eaglekb.data import datagen

    ps = datagen.prompt_set(args.corpus, per_source=args.per_source, seed=args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for p in ps.prompts:
            fh.write(json.dumps({"id": p.id, "messages": list(p.messages)}, ensure_ascii=False) + "\n")
    out.with_suffix(".manifest.json").write_text(json.dumps(ps.manifest, indent=2, sort_keys=True) + "\n")
    say(f"wrote {len(ps)} prompts to {out} (+ {out.with_suffix('.manifest.json').name})")
    return 0


def read_prompts(path: Path):
    from eaglekb.data.corpora import Prompt, PromptSet

    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            items.append(Prompt(id=row["id"], source=row["id"].split(":")[0],
                                messages=tuple({"role": m["role"], "content": m["content"]} for m in row["messages"])))
    man_path = path.with_suffix(".manifest.json")
    manifest = json.loads(man_path.read_text()) if man_path.is_file() else {"source": str(path)}
    manifest["file"] = path.name
    return PromptSet(path.stem, items, manifest=manifest)


# ----------------------------------------------------------------------------- train (GPU machine)


def cmd_train(args) -> int:
    import torch

    from eaglekb.data import datagen
    from eaglekb.training import loop as training
    from eaglekb.data import vocab

    t_all = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    say(f"torch {torch.__version__}, device {dev}"
        + (f" ({torch.cuda.get_device_name(0)})" if dev == "cuda" else ""))
    prompts = read_prompts(Path(args.prompts))
    if args.limit:
        prompts.prompts = prompts.prompts[: args.limit]
    say(f"{len(prompts)} prompts from {args.prompts}")

    # 1. datagen -------------------------------------------------------------
    data = out / "data"
    t0 = time.perf_counter()
    target = datagen.load_target(args.model, device=dev, dtype="bfloat16" if dev == "cuda" else "float32")
    say(f"target loaded in {time.perf_counter() - t0:.1f} s: {target.num_layers} layers, hidden "
        f"{target.hidden_size}, capture points {target.capture_points}")
    cfg = datagen.DatagenConfig(max_new_tokens=args.max_new_tokens, max_len=args.max_len,
                                batch_size=args.gen_batch, shard_size=args.shard_size, mode="greedy")
    t0 = time.perf_counter()
    manifest = datagen.run(target, prompts, data, cfg, progress=False)
    manifest["target_path"] = str(args.model)
    dg_s = time.perf_counter() - t0
    storage = datagen.storage_report(manifest)
    say(f"datagen {dg_s:.1f} s: {storage['tokens_count']} tokens, {storage['bytes_per_token_bytes']} bytes/token "
        f"({storage['hidden_state_bytes_per_token_bytes']} hidden), generate {storage['generate_tok_s']} tok/s, "
        f"features {storage['features_tok_s']} tok/s")
    (out / "data-manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tcfg = target.model.config
    del target
    if dev == "cuda":
        torch.cuda.empty_cache()

    # 2. vocab coverage per draft-vocab size --------------------------------------
    ds = datagen.open_dataset(data)
    counts = torch.zeros(ds.target["vocab_size"], dtype=torch.int64)
    for ids, mask in ds.token_ids_and_masks():
        counts += vocab.counts_from_token_ids(ids, mask, ds.target["vocab_size"])
    tc = vocab.TokenCounts(counts, {"what": "loss-masked tokens", "dataset": str(data)})
    heads = int(tcfg.num_attention_heads)
    hd = int(getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads)
    coverage = {}
    for n in [c for c in VOCAB_CANDIDATES if c <= tc.vocab_size]:
        m = vocab.build_mapping(tc, n)
        nbytes = drafter_bytes(int(tcfg.hidden_size), heads, int(tcfg.num_key_value_heads), hd,
                               args.intermediate_size, n, int(tcfg.vocab_size))
        coverage[str(n)] = {"coverage_pct": round(100 * m.meta["coverage_frac"], 3), "drafter_bf16_bytes": nbytes}
    say("draft vocab coverage of the data's assistant tokens: "
        + ", ".join(f"{n}: {c['coverage_pct']}%" for n, c in coverage.items()))
    size = drafter_bytes(int(tcfg.hidden_size), heads, int(tcfg.num_key_value_heads), hd, args.intermediate_size,
                         args.draft_vocab_size, int(tcfg.vocab_size))
    if size > BUDGET_BYTES:
        say(f"error: drafter would be {size} bytes > budget {BUDGET_BYTES}; lower --draft-vocab-size or "
            f"--intermediate-size")
        return 2

    # 3. train --------------------------------------------------------------------
    run_dir = out / "run"
    tr = training.TrainConfig(
        data=str(data), out=str(run_dir), mapping=args.mapping, draft_vocab_size=args.draft_vocab_size,
        intermediate_size=args.intermediate_size, ttt_steps=args.ttt_steps, batch_size=args.batch_size,
        max_len=args.max_len, steps=args.steps, epochs=args.epochs, lr=args.lr, warmup_frac=0.03,
        min_lr_frac=0.05, val_fraction=0.03, max_val_sequences=128, eval_every=args.eval_every,
        save_every=args.save_every, log_every=args.log_every, seed=args.seed, device=dev,
        resume=bool(training._checkpoints(run_dir)))
    t0 = time.perf_counter()
    report = training.train(tr, progress=False, log=say)
    train_s = time.perf_counter() - t0
    fields = training.baseline_fields(report)
    drafter_dir = run_dir / "drafter"
    on_disk = sum(p.stat().st_size for p in drafter_dir.iterdir())
    say(training.render_text(report))
    say(f"drafter on disk: {on_disk} bytes ({on_disk / 1e6:.2f} MB) in {drafter_dir}")
    summary = {
        "model": str(args.model), "device": dev,
        "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None,
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "args": {k: v for k, v in vars(args).items() if k not in ("func", "cmd")},
        "datagen": {"config": cfg.__dict__, "metrics": storage, "wall_s": round(dg_s, 2),
                    "prompts": manifest.get("prompts"), "totals": manifest["totals"]},
        "vocab_coverage": coverage,
        "size": {"budget_bytes": BUDGET_BYTES, "computed_bytes": size, "on_disk_bytes": on_disk},
        "train": {"metrics": fields["metrics"], "series": fields["series"], "summary": fields["summary"],
                  "wall_s": round(train_s, 2), "config": report["config"], "mapping": report["mapping"]},
        "total_s": round(time.perf_counter() - t_all, 2),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    say(f"done in {summary['total_s']} s; summary {out / 'summary.json'}")
    return 0


# ----------------------------------------------------------------------------- record (CPU machine)


def cmd_record(args) -> int:
    from eaglekb.kb import baselines

    from eaglekb.training import loop as training

    s = json.loads(Path(args.summary).read_text())
    report_path = Path(args.report) if args.report else Path(args.summary).parent / "run" / "metrics.json"
    if report_path.is_file():  # recompute the baseline fields from the training report
        fields = training.baseline_fields(json.loads(report_path.read_text()))
        s["train"].update(metrics=fields["metrics"], series=fields["series"], summary=fields["summary"])
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in s["args"].items()
                     if k not in ("func", "cmd") and v is not None)
    command = f"python scripts/gpu_train_default.py train {flags}"
    dg = {k: v for k, v in s["datagen"]["metrics"].items() if v is not None}
    cov = {f"v{n}": {"coverage_pct": c["coverage_pct"], "drafter_bf16_bytes": c["drafter_bf16_bytes"]}
           for n, c in s["vocab_coverage"].items()}
    written = []
    for kind, name, config, metrics, series, summary in (
        ("datagen", args.name, {**s["datagen"]["config"], "model": s["model"], "device": s["device"], "gpu": s["gpu"],
                                "prompts": s["datagen"].get("prompts")},
         {**dg, "vocab_coverage": cov}, {}, f"{dg['bytes_per_token_bytes']} bytes/token on disk, "
         f"generate {dg.get('generate_tok_s')} tok/s on {s['gpu'] or s['device']}"),
        ("finetune", args.name, {**s["train"]["config"], "gpu": s["gpu"], "versions": s.get("versions"),
                                 "mapping": s["train"].get("mapping")},
         {**s["train"]["metrics"], "size": {"on_disk_bytes": s["size"]["on_disk_bytes"],
                                            "budget_bytes": s["size"]["budget_bytes"]}},
         s["train"]["series"], s["train"]["summary"]),
    ):
        b = baselines.build(kind=kind, name=name, command=command, config=config, metrics=metrics, series=series,
                            noise={"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.3}, summary=summary)
        written.append(str(baselines.write(b)))
    say("recorded " + ", ".join(written))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="CPU machine: write the training prompts (JSON lines + manifest)")
    p.add_argument("--out", required=True, help="prompts file to write (.jsonl)")
    p.add_argument("--per-source", type=int, default=3000, help="prompts per corpus (gsm8k train has 1,119)")
    p.add_argument("--corpus", action="append", help="corpus name, repeatable (default wiki, chitchat, gsm8k)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.set_defaults(func=cmd_prompts)
    t = sub.add_parser("train", help="GPU machine: datagen + training of the default drafter")
    t.add_argument("--model", required=True, help="smollm2-135m transformers folder (invoke models.prepare)")
    t.add_argument("--prompts", required=True, help="prompts file from the prompts step")
    t.add_argument("--out", required=True, help="output folder")
    t.add_argument("--mapping", default=None, help="a mapping file or drafter folder (default: built from the data)")
    t.add_argument("--limit", type=int, default=0, help="use only the first N prompts (0: all)")
    t.add_argument("--max-new-tokens", type=int, default=256, help="response budget per prompt")
    t.add_argument("--max-len", type=int, default=768, help="tokens kept per sequence")
    t.add_argument("--gen-batch", type=int, default=768, help="prompts per generate batch")
    t.add_argument("--shard-size", type=int, default=1536, help="sequences per shard")
    t.add_argument("--draft-vocab-size", type=int, default=12288, help="draft vocab (size budget: see docstring)")
    t.add_argument("--intermediate-size", type=int, default=1536, help="drafter MLP width")
    t.add_argument("--ttt-steps", type=int, default=7, help="TTT unroll")
    t.add_argument("--batch-size", type=int, default=32, help="sequences per optimiser step")
    t.add_argument("--steps", type=int, default=None, help="optimiser steps (default: --epochs)")
    t.add_argument("--epochs", type=float, default=6.0, help="passes over the data when --steps is absent")
    t.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    t.add_argument("--eval-every", type=int, default=300, help="validate every N steps")
    t.add_argument("--save-every", type=int, default=300, help="checkpoint every N steps (a rerun resumes)")
    t.add_argument("--log-every", type=int, default=100, help="log every N steps")
    t.add_argument("--seed", type=int, default=0, help="seed")
    t.set_defaults(func=cmd_train)
    r = sub.add_parser("record", help="CPU machine: record datagen/ and finetune/ baselines from summary.json")
    r.add_argument("--summary", required=True, help="summary.json written by train")
    r.add_argument("--name", default="smollm2-135m-default-h200", help="baseline name")
    r.add_argument("--report", default=None, help="training metrics.json (default: beside summary.json, run/)")
    r.set_defaults(func=cmd_record)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
