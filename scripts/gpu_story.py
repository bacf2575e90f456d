"""Issue 7 item 1 on one GPU: the Phase 0 / Phase 1 story reproduced on smollm2-135m (about 6 minutes on an H200).

What it measures (all greedy, one target, one seed):

* datagen for domain A (wiki + chitchat train splits) and domain B (gsm8k + gpqa train splits);
* mapping A built from A's data, mapping B from B's data (same draft vocab size), and their comparison
  (position matches versus set overlap and coverage: the investigation's d2t lesson);
* drafter A trained from scratch on A with mapping A;
* Phase 0: drafter A probed as-is on the B domain (gsm8k-eval prompts, never trained on);
* Phase 1, at EQUAL data and step budgets on B's data, three arms:
  ``noremap`` (fine-tune A with mapping B and no lm_head remap: the investigation's mistake),
  ``remap`` (fine-tune A after remapping lm_head rows by target id), ``scratch`` (mapping B, from scratch);
  optionally the same three arms on a small slice of B (``--b-small``), same step count;
* for each drafter: first-step loss, loss/accuracy curves keyed by step, final per-step accuracy (full and
  conditional), simulated accept length, and an online probe on gsm8k-eval (accept length, measured cycle
  time, break-even and the ``plan`` verdict).

Three steps, each a plain Python entry (the GPU machine has torch, transformers, safetensors, numpy, tqdm,
tokenizers; not invoke, pydantic or the corpus packages):

1. CPU machine: the prompts, one JSON-lines file with a ``set`` per line (A, B, eval):

       python3 scripts/gpu_story.py prompts --out .carry/story-prompts.jsonl

2. GPU machine (the model folder from ``scripts/gpu_model.py assemble smollm2-135m ...``):

       python3 scripts/gpu_story.py run --model /tmp/eaglekb-cache/models/smollm2-135m \\
           --prompts .carry/story-prompts.jsonl --out $OUT

   Data and checkpoints go under --work (default /tmp/eaglekb-story, GBs); --out gets at most 8 small JSON
   files: story.json (datagen, mappings, comparison, the verdict table, stage timings, env; rewritten after
   every stage so a killed run still returns what it finished) and finetune-<arm>.json per drafter (config,
   metrics, series, summary, env, and its ``probe``).

3. CPU machine: record baselines from those files with ``scripts/record_device_run.py``
   (kinds finetune, probe via ``--part probe``, datagen via ``--part datagen.a``).

``run --tiny`` runs the whole pipeline on CPU with a tiny random Llama and a character tokenizer (no
model or corpus needed) in well under a minute: the numbers are meaningless, the plumbing is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

A_CORPORA = ("wiki", "chitchat")
B_CORPORA = ("gsm8k", "gpqa")
EVAL_SET = "gsm8k-eval"
ARMS = ("noremap", "remap", "scratch")
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def env() -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "gpu": gpu, "host": platform.node(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ----------------------------------------------------------------------------- prompts (CPU machine)


def cmd_prompts(args) -> int:
    from eaglekb import corpora, datagen

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    a = datagen.prompt_set(list(A_CORPORA), per_source=args.a_per_source, seed=args.seed)
    b = datagen.prompt_set(list(B_CORPORA), per_source=args.b_per_source, seed=args.seed)
    ev = corpora.load(EVAL_SET, split="eval", limit=args.eval_count)
    for ps in (a, b):  # a long prompt left-pads its whole generate batch: drop the few very long ones
        keep = [p for p in ps.prompts if len(p.text) <= args.max_prompt_chars]
        ps.manifest.update(dropped_long_count=len(ps.prompts) - len(keep), max_prompt_chars=args.max_prompt_chars,
                           count=len(keep), sha256=corpora.prompts_hash(keep))
        ps.prompts = keep
    for train in (a, b):  # prompt_set checked both eval sets; the two domains must not share prompts either
        corpora.check_disjoint(train, ev)
    corpora.check_disjoint(a, b)
    with open(out, "w", encoding="utf-8") as fh:
        for name, ps in (("A", a), ("B", b), ("eval", ev)):
            for p in ps.prompts:
                fh.write(json.dumps({"set": name, "id": p.id, "messages": list(p.messages)}, ensure_ascii=False)
                         + "\n")
    man = {"A": a.manifest, "B": b.manifest, "eval": ev.manifest}
    out.with_suffix(".manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    say(f"wrote {len(a)} A + {len(b)} B + {len(ev)} eval prompts to {out} ({out.stat().st_size} bytes)")
    return 0


def read_prompts(path: Path) -> dict:
    """{"A": PromptSet, "B": PromptSet, "eval": PromptSet} from the prompts file and its manifest."""
    from eaglekb.corpora import Prompt, PromptSet, prompts_hash

    rows: dict[str, list] = {"A": [], "B": [], "eval": []}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["set"]].append(Prompt(id=r["id"], source=r["id"].split(":")[0],
                                         messages=tuple({"role": m["role"], "content": m["content"]}
                                                        for m in r["messages"])))
    man_path = path.with_suffix(".manifest.json")
    mans = json.loads(man_path.read_text()) if man_path.is_file() else {}
    out = {}
    for k, items in rows.items():
        m = dict(mans.get(k) or {"source": str(path)}, file=path.name, set=k, count=len(items),
                 sha256=prompts_hash(items))
        out[k] = PromptSet(f"{path.stem}-{k}", items, manifest=m)
    return out


# ----------------------------------------------------------------------------- tiny mode (CPU, no downloads)

TINY_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
               "{% endif %}")
TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!'+-*=\n"
TINY_A = ("tell me about owls.", "hello there, how are you?", "write a poem about rain.", "why is the sky blue?",
          "what is your favourite film?", "say hi to my friend.", "describe paris.", "who wrote hamlet?")
TINY_B = ("what is 12 + 7?", "a farmer has 3 cows and buys 4. how many?", "compute 6 * 8.", "solve x + 2 = 9.",
          "what is 100 - 37?", "if a pen costs 2 and i buy 5, what do i pay?", "is 91 prime?", "add 5, 6 and 7.")
TINY_EVAL = ("what is 9 * 9?", "tom has 4 apples and eats 1. how many are left?", "what is 15 - 6?")


def make_tiny(work: Path) -> tuple[Path, Path]:
    """A tiny random Llama (char tokenizer, ChatML) and a prompts file: the whole pipeline on CPU."""
    import torch
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    folder = work / "tiny-target"
    if not (folder / "config.json").is_file():
        vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
        for ch in TINY_CHARS:
            vocab.setdefault(ch, len(vocab))
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
        tk.add_special_tokens(["<|im_start|>", "<|im_end|>"])
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<|im_start|>",
                                      eos_token="<|im_end|>", pad_token="<|im_end|>")
        tok.chat_template = TINY_CHATML
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=63, pad_token_id=2,
                          bos_token_id=1, initializer_range=0.5)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():  # never stop early (eos 63 is never predicted): every response is full length
            model.lm_head.weight[63].zero_()
            model.lm_head.bias = None
        model.generation_config.eos_token_id = 63
        model.generation_config.pad_token_id = 2
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    prompts = work / "tiny-prompts.jsonl"
    sets = {"A": [f"{t} ({i})" for i in range(2) for t in TINY_A],
            "B": [f"{t} ({i})" for i in range(2) for t in TINY_B],
            "eval": list(TINY_EVAL)}
    with open(prompts, "w", encoding="utf-8") as fh:
        for k, texts in sets.items():
            for i, t in enumerate(texts):
                fh.write(json.dumps({"set": k, "id": f"tiny{k}:{i}",
                                     "messages": [{"role": "user", "content": t}]}) + "\n")
    prompts.with_suffix(".manifest.json").write_text(json.dumps(
        {k: {"source": f"tiny-{k}", "count": len(v)} for k, v in sets.items()}, indent=2) + "\n")
    return folder, prompts


TINY = dict(a_max_new_tokens=12, b_max_new_tokens=12, max_len=96, gen_batch=8, shard_size=4, draft_vocab_size=24,
            intermediate_size=0, ttt_steps=3, batch_size=4, a_epochs=2.0, b_epochs=2.0, b_small=4,
            eval_points=2, probe_prompts=2, probe_new_tokens=12, val_fraction=0.1)


# ----------------------------------------------------------------------------- GPU machine: the run


class Story:
    """story.json, rewritten after each stage (a killed run still returns what it finished)."""

    def __init__(self, out: Path, args, environment: dict):
        self.path = out / "story.json"
        self.doc = {"kind": "story", "issue": 7, "args": {k: v for k, v in vars(args).items() if k != "func"},
                    "env": environment, "stages": {}, "datagen": {}, "mappings": {}, "arms": {}, "verdicts": {},
                    "skipped": [], "complete": False}

    def stage(self, name: str, seconds: float) -> None:
        self.doc["stages"][f"{name}_s"] = round(seconds, 2)
        self.save()

    def save(self) -> None:
        self.doc["total_s"] = round(time.perf_counter() - T0, 2)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path)


def subset_view(src: Path, dst: Path, shards: int) -> Path:
    """A dataset folder holding only the first ``shards`` shards of ``src`` (links, no copies)."""
    from eaglekb import datagen

    man = json.loads((src / datagen.MANIFEST).read_text())
    keep = sorted(man["shards"])[:shards]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in keep + [datagen.HEAD_FILE]:
        if (src / name).is_file():
            os.symlink((src / name).resolve(), dst / name)
    man["shards"] = {k: man["shards"][k] for k in keep}
    man["subset_of"] = {"path": str(src), "shards": len(keep), "identity_hash": man.get("identity_hash")}
    man["identity_hash"] = f"{man.get('identity_hash')}-first{len(keep)}"
    cfg = datagen.DatagenConfig(**{k: v for k, v in man["identity"]["config"].items()
                                   if k in datagen.DatagenConfig.__dataclass_fields__})
    datagen._write_manifest(dst, man, cfg)
    return dst


def cmd_run(args) -> int:
    import torch

    from eaglekb import datagen, training, vocab

    if args.tiny:
        for k, v in TINY.items():
            if getattr(args, k) == DEFAULTS[k]:
                setattr(args, k, v)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        model, prompts_file = make_tiny(work)
        args.model, args.prompts = str(model), str(prompts_file)
    dev = "cuda" if torch.cuda.is_available() and not args.tiny and args.device != "cpu" else "cpu"
    gpu = dev == "cuda"
    environment = env()
    story = Story(out, args, environment)
    say(f"torch {environment['torch']}, device {dev} ({environment['gpu']}); work {work}, out {out}")
    sets = read_prompts(Path(args.prompts))
    say(f"prompts: A {len(sets['A'])}, B {len(sets['B'])}, eval {len(sets['eval'])}")
    eval_file = work / "eval-prompts.jsonl"
    with open(eval_file, "w", encoding="utf-8") as fh:
        for p in sets["eval"].prompts[: args.probe_prompts]:
            fh.write(json.dumps({"messages": list(p.messages)}, ensure_ascii=False) + "\n")
    story.doc["prompts"] = {k: v.manifest for k, v in sets.items()}

    # 1. datagen A and B (greedy) ---------------------------------------------------------------
    t0 = time.perf_counter()
    target = datagen.load_target(args.model, device=dev, dtype="bfloat16" if gpu else "float32")
    story.stage("load_target", time.perf_counter() - t0)
    tcfg = target.model.config
    data = {}
    for dom, new in (("a", args.a_max_new_tokens), ("b", args.b_max_new_tokens)):
        cfg = datagen.DatagenConfig(max_new_tokens=new, max_len=args.max_len, batch_size=args.gen_batch,
                                    shard_size=args.shard_size, mode="greedy",
                                    dtype="bfloat16" if gpu else "float32")
        t0 = time.perf_counter()
        data[dom] = work / f"data-{dom}"
        man = datagen.run(target, sets[dom.upper()], data[dom], cfg, progress=False)
        man["target_path"] = str(args.model)
        dt = time.perf_counter() - t0
        rep = {k: v for k, v in datagen.storage_report(man).items() if v is not None}
        story.doc["datagen"][dom] = {"config": {**cfg.__dict__, "model": str(args.model), "device": dev,
                                                "gpu": environment["gpu"], "prompts": sets[dom.upper()].manifest},
                                     "metrics": {**rep, "stage_wall_s": round(dt, 2)}, "env": environment,
                                     "summary": f"domain {dom.upper()}: {rep['sequences_count']} sequences, "
                                                f"{rep['tokens_count']} tokens, generate {rep.get('generate_tok_s')} "
                                                f"tok/s on {environment['gpu'] or dev}"}
        say(f"datagen {dom.upper()}: {dt:.1f} s, {rep['sequences_count']} seqs, {rep['tokens_count']} tokens, "
            f"{rep['loss_tokens_count']} loss tokens, generate {rep.get('generate_tok_s')} tok/s")
        story.stage(f"datagen_{dom}", dt)
    del target
    if gpu:
        torch.cuda.empty_cache()

    # 2. mappings A and B, compared -----------------------------------------------------------------
    t0 = time.perf_counter()
    maps, counts = {}, {}
    for dom in ("a", "b"):
        ds = datagen.open_dataset(data[dom])
        v = ds.target["vocab_size"]
        c = torch.zeros(v, dtype=torch.int64)
        for ids, mask in ds.token_ids_and_masks():
            c += vocab.counts_from_token_ids(ids, mask, v)
        counts[dom] = vocab.TokenCounts(c, {"what": "loss-masked tokens", "dataset": str(data[dom])})
        maps[dom] = vocab.build_mapping(counts[dom], min(args.draft_vocab_size, v))
        vocab.save_mapping(work / f"mapping-{dom}.safetensors", maps[dom])
    cmp_doc = vocab.compare_mappings(maps["a"], maps["b"])
    cm = vocab.comparison_metrics(cmp_doc)
    cm["coverage_of_b_data"] = {"mapping_a_pct": round(100 * vocab.coverage(maps["a"], counts["b"]), 4),
                                "mapping_b_pct": round(100 * vocab.coverage(maps["b"], counts["b"]), 4)}
    cm["coverage_of_a_data"] = {"mapping_a_pct": round(100 * vocab.coverage(maps["a"], counts["a"]), 4),
                                "mapping_b_pct": round(100 * vocab.coverage(maps["b"], counts["a"]), 4)}
    story.doc["mappings"] = {"draft_vocab_size": maps["a"].draft_vocab_size, "metrics": cm,
                             "explanation": cmp_doc["explanation"]}
    say(f"mappings: {cmp_doc['explanation']}; coverage of B data: A {cm['coverage_of_b_data']['mapping_a_pct']}%, "
        f"B {cm['coverage_of_b_data']['mapping_b_pct']}%")
    story.stage("mappings", time.perf_counter() - t0)

    # 3. training and probes ------------------------------------------------------------------------
    inter = args.intermediate_size or None

    def train(arm: str, data_dir: Path, mapping: Path, *, init: Path | None = None, remap: bool = True,
              steps: int, lr: float, eval_every: int) -> dict:
        run_dir = work / f"run-{arm}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cfg = training.TrainConfig(
            data=str(data_dir), out=str(run_dir), init=str(init) if init else None, remap=remap,
            mapping=str(mapping), draft_vocab_size=args.draft_vocab_size, intermediate_size=inter,
            ttt_steps=args.ttt_steps, batch_size=args.batch_size, max_len=args.max_len, steps=steps,
            lr=lr, warmup_frac=0.03, min_lr_frac=0.05, val_fraction=args.val_fraction,
            max_val_sequences=128, eval_every=eval_every, save_every=0, log_every=1, seed=args.seed, device=dev)
        every = max(1, steps // 10)

        def log(msg: str) -> None:  # log_every=1 gives every step's loss (first-step loss, full curves)
            if msg.startswith("step "):
                n = int(msg.split()[1].split("/")[0])
                if n != 1 and n % every:
                    return
            say(f"[{arm}] {msg}")

        t0 = time.perf_counter()
        report = training.train(cfg, progress=False, log=log)
        wall = time.perf_counter() - t0
        f = training.baseline_fields(report)
        h = report["history"]
        first = min(h["train_loss"], key=int)
        f["metrics"]["start"] = {"first_step_loss": h["train_loss"][first],
                                 "first_step_acc0_pct": h["train_acc0"][first]}
        f["metrics"]["throughput"]["stage_wall_s"] = round(wall, 2)
        if report["mapping"].get("remap") and isinstance(report["mapping"]["remap"], dict):
            f["metrics"]["remap"] = {f"{k}_count": v for k, v in report["mapping"]["remap"].items()
                                     if isinstance(v, int) and not isinstance(v, bool)}
        config = {k: v for k, v in report["config"].items() if k != "stop_after"}
        config.update(arm=arm, device=report["device"], gpu=environment["gpu"], mapping_report=report["mapping"],
                      notes=report["notes"], data_totals=report["data"]["totals"])
        doc = {"kind": "finetune", "arm": arm, "config": config, "metrics": f["metrics"], "series": f["series"],
               "summary": f"{arm}: " + f["summary"], "env": environment, "wall_s": round(wall, 2),
               "drafter": str(run_dir / "drafter")}
        val = report.get("val") or {}
        say(f"[{arm}] {wall:.1f} s; first-step loss {h['train_loss'][first]:.3f}; val acc "
            + " ".join(f"{a:.3f}" for a in val.get("acc", [])) + f"; simulated_acc_len {val.get('simulated_acc_len')}")
        return doc

    def probe_doc(drafter: Path, label: str) -> dict | None:
        from eaglekb import probe

        if time.perf_counter() - T0 > args.soft_limit_s:
            story.doc["skipped"].append(f"probe {label}: past --soft-limit-s")
            say(f"skipping probe {label}: past the soft limit")
            return None
        pcfg = probe.ProbeConfig(target=str(args.model), drafter=str(drafter), prompts=str(eval_file),
                                 num_prompts=args.probe_prompts, max_new_tokens=args.probe_new_tokens,
                                 steps=args.probe_steps, topk=1, device=dev, dtype="bfloat16" if gpu else "float32",
                                 seed=args.seed, graphs=gpu)
        t0 = time.perf_counter()
        p = probe.run(pcfg, progress=False)
        import gc

        gc.collect()  # the probe's engine (CUDA graphs, static caches) before the next training
        if gpu:
            torch.cuda.empty_cache()
        d = dict(p.to_dict(), env=environment, wall_s=round(time.perf_counter() - t0, 2))
        d["config"]["prompts"] = f"{EVAL_SET} (first {args.probe_prompts}, from {Path(args.prompts).name})"
        d["prompts_manifest"] = dict(sets["eval"].manifest, count=args.probe_prompts, file=Path(args.prompts).name)
        say(f"[probe {label}] {p.summary} ({d['wall_s']} s)")
        return d

    def emit(doc: dict, probe_d: dict | None) -> None:
        arm = doc["arm"]
        if probe_d is not None:
            doc["probe"] = probe_d
        (out / f"finetune-{arm}.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        val = doc["metrics"].get("val", {})
        row = {"first_step_loss": doc["metrics"]["start"]["first_step_loss"],
               "val_acc_step0_pct": val.get("acc", {}).get("step0_pct"),
               "val_simulated_acc_plus_bonus_len": val.get("simulated_acc_plus_bonus_len"),
               "optimizer_steps": doc["metrics"]["run"]["optimizer_steps"]}
        if probe_d is not None:
            pm = probe_d["metrics"]
            row.update(online_accept_len=pm["online"]["accept_len"],
                       offline_simulated_accept_len=pm["offline"]["simulated_accept_len"],
                       cycle_ms=pm["online"]["cycle_ms"], baseline_tok_s=pm["baseline_tok_s"],
                       breakeven_len=pm["breakeven_len"], viable=probe_d["verdict"]["viable"])
        story.doc["arms"][arm] = row
        story.save()

    # drafter A from scratch on A; probed as-is on the B domain (Phase 0)
    def steps_for(data_dir: Path, epochs: float) -> int:
        n = len(datagen.open_dataset(data_dir))
        return max(1, int(round(epochs * n * (1 - args.val_fraction) / args.batch_size)))

    t0 = time.perf_counter()
    a_steps = steps_for(data["a"], args.a_epochs)
    a_doc = train("a-scratch", data["a"], work / "mapping-a.safetensors", steps=a_steps, lr=args.lr,
                  eval_every=max(1, a_steps // args.eval_points))
    a_drafter = Path(a_doc["drafter"])
    story.stage("train_a", time.perf_counter() - t0)
    t0 = time.perf_counter()
    emit(a_doc, probe_doc(a_drafter, "A as-is on B (Phase 0)"))
    story.stage("probe_a", time.perf_counter() - t0)

    # Phase 1 arms at equal data and step budgets on B
    b_steps = steps_for(data["b"], args.b_epochs)
    story.doc["phase1_budget"] = {"b_sequences_count": len(datagen.open_dataset(data["b"])), "optimizer_steps": b_steps,
                                  "batch_size": args.batch_size, "lr": args.b_lr}
    budgets = [("", data["b"])]
    if args.b_small:
        n_shards = max(1, args.b_small // args.shard_size)
        budgets.append(("-small", subset_view(data["b"], work / "data-b-small", n_shards)))
    for suffix, ddir in budgets:
        for arm in ARMS:
            name = f"b-{arm}{suffix}"
            if suffix and time.perf_counter() - T0 > args.soft_limit_s:
                story.doc["skipped"].append(f"train {name}: past --soft-limit-s")
                say(f"skipping {name}: past the soft limit")
                continue
            t0 = time.perf_counter()
            doc = train(name, ddir, work / "mapping-b.safetensors",
                        init=a_drafter if arm != "scratch" else None, remap=arm != "noremap", steps=b_steps,
                        lr=args.b_lr, eval_every=max(1, b_steps // args.eval_points))
            story.stage(f"train_{name}", time.perf_counter() - t0)
            t0 = time.perf_counter()
            emit(doc, None if suffix else probe_doc(Path(doc["drafter"]), name))
            if not suffix:
                story.stage(f"probe_{name}", time.perf_counter() - t0)

    # 4. verdicts: each drafter against break-even, with its own and with the median measured cycle -------
    from statistics import median

    from eaglekb import viability

    rows = {k: v for k, v in story.doc["arms"].items() if "online_accept_len" in v}
    if rows:
        cyc = median(r["cycle_ms"] for r in rows.values())
        base = median(r["baseline_tok_s"] for r in rows.values())
        for k, r in rows.items():
            pr = viability.plan(baseline_tok_s=base, cycle_ms=cyc, accept_len=max(r["online_accept_len"], 1.0),
                                steps=args.probe_steps, topk=1)
            story.doc["verdicts"][k] = {
                "accept_len": round(r["online_accept_len"], 4), "breakeven_len": round(pr.breakeven_len, 4),
                "margin_x": round(r["online_accept_len"] / pr.breakeven_len, 4), "viable": bool(pr.viable),
                "predicted_speedup_x": round(pr.speedup_x, 4), "own_cycle_viable": r["viable"]}
        story.doc["verdict_basis"] = {"cycle_ms": round(cyc, 4), "baseline_tok_s": round(base, 2),
                                      "what": "median of the probes' measured cycle time and plain-decode rate"}
        for k, v in story.doc["verdicts"].items():
            say(f"verdict {k}: accept_len {v['accept_len']:.2f} vs break-even {v['breakeven_len']:.2f} "
                f"({v['margin_x']:.2f}x): {'viable' if v['viable'] else 'NOT viable'}")
    story.doc["complete"] = True
    story.save()
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    say(f"done in {time.perf_counter() - T0:.1f} s; {len(sizes)} files under {out}: {sizes}")
    return 0


DEFAULTS = dict(a_max_new_tokens=192, b_max_new_tokens=256, max_len=768, gen_batch=768, shard_size=256,
                draft_vocab_size=8192, intermediate_size=1536, ttt_steps=7, batch_size=32, a_epochs=6.0,
                b_epochs=4.0, b_small=256, eval_points=8, probe_prompts=8, probe_new_tokens=96, val_fraction=0.03)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="CPU machine: write the A / B / eval prompts (JSON lines + manifest)")
    p.add_argument("--out", required=True, help="prompts file to write (.jsonl), e.g. .carry/story-prompts.jsonl")
    p.add_argument("--a-per-source", type=int, default=1152, help="A: prompts from each of wiki and chitchat")
    p.add_argument("--b-per-source", type=int, default=1200, help="B: prompts from each of gsm8k and gpqa "
                   "(train splits hold 1,119 and 188)")
    p.add_argument("--max-prompt-chars", type=int, default=1500,
                   help="drop training prompts longer than this (10 chitchat, 8 gpqa of the defaults)")
    p.add_argument("--eval-count", type=int, default=16, help="gsm8k-eval prompts kept for the online probes")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.set_defaults(func=cmd_prompts)
    r = sub.add_parser("run", help="GPU machine: datagen, mappings, four trainings (+3 small), probes")
    r.add_argument("--model", help="smollm2-135m transformers folder (scripts/gpu_model.py assemble)")
    r.add_argument("--prompts", help="prompts file from the prompts step")
    r.add_argument("--out", default=os.environ.get("OUT", "story-out"), help="JSON output folder (default $OUT)")
    r.add_argument("--work", default="/tmp/eaglekb-story", help="data, mappings and checkpoints (GBs)")
    r.add_argument("--tiny", action="store_true", help="CPU, tiny random Llama, tiny budgets (plumbing check)")
    r.add_argument("--device", default="auto", help="auto or cpu")
    r.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's choice)")
    d = DEFAULTS
    r.add_argument("--a-max-new-tokens", type=int, default=d["a_max_new_tokens"], help="A response budget")
    r.add_argument("--b-max-new-tokens", type=int, default=d["b_max_new_tokens"], help="B response budget")
    r.add_argument("--max-len", type=int, default=d["max_len"], help="tokens kept per sequence")
    r.add_argument("--gen-batch", type=int, default=d["gen_batch"], help="prompts per generate batch")
    r.add_argument("--shard-size", type=int, default=d["shard_size"], help="sequences per shard")
    r.add_argument("--draft-vocab-size", type=int, default=d["draft_vocab_size"], help="both mappings' size")
    r.add_argument("--intermediate-size", type=int, default=d["intermediate_size"], help="drafter MLP (0: target's)")
    r.add_argument("--ttt-steps", type=int, default=d["ttt_steps"], help="TTT unroll")
    r.add_argument("--batch-size", type=int, default=d["batch_size"], help="sequences per optimiser step")
    r.add_argument("--a-epochs", type=float, default=d["a_epochs"], help="drafter A: passes over A's data")
    r.add_argument("--lr", type=float, default=1e-3, help="drafter A peak learning rate")
    r.add_argument("--b-epochs", type=float, default=d["b_epochs"],
                   help="Phase 1: passes over B's data; sets the step count, equal for every arm")
    r.add_argument("--b-lr", type=float, default=1e-3, help="Phase 1 peak learning rate, equal for every arm")
    r.add_argument("--b-small", type=int, default=d["b_small"],
                   help="also run the three arms on the first N B sequences (whole shards), same steps; 0: off")
    r.add_argument("--eval-points", type=int, default=d["eval_points"], help="validation points per curve")
    r.add_argument("--val-fraction", type=float, default=d["val_fraction"], help="held-out share of each dataset")
    r.add_argument("--probe-prompts", type=int, default=d["probe_prompts"], help="gsm8k-eval prompts per probe")
    r.add_argument("--probe-new-tokens", type=int, default=d["probe_new_tokens"], help="tokens per probe prompt")
    r.add_argument("--probe-steps", type=int, default=3, help="draft steps in the probes (chain, topk 1)")
    r.add_argument("--soft-limit-s", type=float, default=480.0,
                   help="past this many seconds, skip the remaining probes and small-budget arms")
    r.add_argument("--seed", type=int, default=0, help="seed")
    r.set_defaults(func=cmd_run)
    args = ap.parse_args(argv)
    if args.cmd == "run" and not args.tiny and not (args.model and args.prompts):
        ap.error("run needs --model and --prompts (or --tiny)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
