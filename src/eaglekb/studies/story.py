"""The investigation's Phase 0 / Phase 1 story, reproduced on one small target, and recorded.

What one run measures (greedy throughout, one target, one seed):

* datagen for domain A (wiki + chitchat train splits) and domain B (gsm8k + gpqa train splits);
* mapping A built from A's data and mapping B from B's data (same draft vocab size), compared: position
  matches versus set overlap and coverage (the investigation's d2t lesson);
* drafter A trained from scratch on A with mapping A;
* Phase 0: drafter A probed as-is on the B domain (gsm8k-eval prompts, never trained on);
* Phase 1, at EQUAL data and step budgets on B's data, three arms: ``noremap`` (fine-tune A with mapping B
  and no lm_head remap: the investigation's mistake), ``remap`` (fine-tune A after moving lm_head rows by
  target id) and ``scratch`` (mapping B, from scratch); optionally the same three on a small slice of B
  (``b_small`` sequences, same step count);
* per drafter: first-step loss, loss and accuracy curves, final per-step accuracy, simulated accept length,
  and an online probe on gsm8k-eval (accept length, measured cycle time, break-even and the verdict).

Three steps, each a runbook task (``runbooks/story.py``) over the functions here:

1. ``write_prompts``: the A / B / eval prompts as one JSON-lines file (needs the corpus packages; the GPU
   machine does not have them, so this runs where they are installed);
2. ``run``: everything above, writing ``story.json`` after every stage (a killed run keeps what it finished)
   and, at the end, as many of the main drafters as fit ``export_max_mib`` as ``drafters.tar.partNN`` (16 MiB
   pieces; one device call returns 64 MiB in all, story.json included);
3. ``record``: baselines from a run's output folder, with the provenance of the machine that ran it.

``run(tiny=True)`` runs the whole pipeline on CPU with a tiny random Llama and a character tokenizer, no
model or corpus needed, in well under a minute: the numbers are meaningless, the plumbing is the point.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Callable

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile

A_CORPORA = ("wiki", "chitchat")
B_CORPORA = ("gsm8k", "gpqa")
EVAL_SET = "gsm8k-eval"
ARMS = ("noremap", "remap", "scratch")
#: The drafters a full run exports, most useful first: the remapped arm, A, no remap, scratch.
MAIN_RUNS = ("b-remap", "a-scratch", "b-noremap", "b-scratch")
STORY_FILE = "story.json"
DRAFTERS_TAR = "drafters.tar"
EXPORT_FILE = "drafters-export.json"
PART_BYTES = 16 << 20
#: Mappings built from generated data move between identical runs: greedy generation in bf16 batches is not
#: bit-stable. Two H200 runs shared 3,835 and 3,839 tokens, and A covered 90.19% and 90.06% of B's tokens.
MAPPING_NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.01}


@dataclasses.dataclass
class StoryConfig:
    """One story run. The defaults are the recorded H200 run (about 6 minutes there)."""

    model: str | None = None
    prompts: str | None = None
    work: str = "/tmp/eaglekb-story"
    tiny: bool = False
    device: str = "auto"
    threads: int = 0
    a_max_new_tokens: int = 192
    b_max_new_tokens: int = 256
    max_len: int = 768
    gen_batch: int = 768
    shard_size: int = 256
    draft_vocab_size: int = 8192
    intermediate_size: int = 1536
    ttt_steps: int = 7
    batch_size: int = 32
    a_epochs: float = 6.0
    lr: float = 1e-3
    b_epochs: float = 4.0
    b_lr: float = 1e-3
    b_small: int = 256
    eval_points: int = 8
    val_fraction: float = 0.03
    probe_prompts: int = 8
    probe_new_tokens: int = 96
    probe_steps: int = 3
    soft_limit_s: float = 480.0
    export_drafters: bool = True
    #: what the exported drafters may take in the output folder: one device call brings back 64 MiB in all,
    #: and story.json must fit beside them (four smollm2 drafters are 75 MiB; three are 56.5)
    export_max_mib: float = 60.0
    seed: int = 0


#: Budgets of the tiny CPU mode (replace the defaults that were left unchanged).
TINY = dict(a_max_new_tokens=12, b_max_new_tokens=12, max_len=96, gen_batch=8, shard_size=4, draft_vocab_size=24,
            intermediate_size=0, ttt_steps=3, batch_size=4, a_epochs=2.0, b_epochs=2.0, b_small=4,
            eval_points=2, probe_prompts=2, probe_new_tokens=12, val_fraction=0.1)


def _env() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "gpu": gpu, "host": platform.node(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ----------------------------------------------------------------------------- prompts


def write_prompts(out: str | Path, *, a_per_source: int = 1152, b_per_source: int = 1200,
                  max_prompt_chars: int = 1500, eval_count: int = 16, seed: int = 0) -> dict[str, Any]:
    """Write the A, B and eval prompts (one JSON line each, with its ``set``) and a manifest beside them."""
    from eaglekb.data import corpora
    from eaglekb.data import datagen

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    a = datagen.prompt_set(list(A_CORPORA), per_source=a_per_source, seed=seed)
    b = datagen.prompt_set(list(B_CORPORA), per_source=b_per_source, seed=seed)
    ev = corpora.load(EVAL_SET, split="eval", limit=eval_count)
    for ps in (a, b):  # a long prompt left-pads its whole generate batch: drop the few very long ones
        keep = [p for p in ps.prompts if len(p.text) <= max_prompt_chars]
        ps.manifest.update(dropped_long_count=len(ps.prompts) - len(keep), max_prompt_chars=max_prompt_chars,
                           count=len(keep), sha256=corpora.prompts_hash(keep))
        ps.prompts = keep
    for train in (a, b):  # prompt_set checked both eval sets; the two domains must not share prompts either
        corpora.check_disjoint(train, ev)
    corpora.check_disjoint(a, b)
    tmp = out.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for name, ps in (("A", a), ("B", b), ("eval", ev)):
            for p in ps.prompts:
                fh.write(json.dumps({"set": name, "id": p.id, "messages": list(p.messages)}, ensure_ascii=False)
                         + "\n")
    os.replace(tmp, out)
    man = {"A": a.manifest, "B": b.manifest, "eval": ev.manifest}
    out.with_suffix(".manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    return {"file": str(out), "bytes": out.stat().st_size, "A": len(a), "B": len(b), "eval": len(ev)}


def read_prompts(path: Path) -> dict:
    """{"A": PromptSet, "B": PromptSet, "eval": PromptSet} from a prompts file and its manifest."""
    from eaglekb.data.corpora import Prompt, PromptSet, prompts_hash

    if not path.is_file():
        raise MissingFile("no prompts file", where=str(path), expected="the file `invoke story.prompts` writes",
                          found="nothing")
    rows: dict[str, list] = {"A": [], "B": [], "eval": []}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            rows[r["set"]].append(Prompt(id=r["id"], source=r["id"].split(":")[0],
                                         messages=tuple({"role": m["role"], "content": m["content"]}
                                                        for m in r["messages"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput("not a story prompt line", where=f"{path}:{n}",
                           expected='{"set": "A"|"B"|"eval", "id": ..., "messages": [...]}',
                           found=f"{type(exc).__name__}: {exc}") from None
    empty = [k for k, v in rows.items() if not v]
    if empty:
        raise BadInput("a prompt set is empty", where=str(path), expected="prompts in sets A, B and eval",
                       found=f"none in {', '.join(empty)}")
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


def tiny_chat_tokenizer(chars: str = TINY_CHARS):
    """A character-level fast tokenizer with ChatML specials (ids 0-2, then ``chars``) and a chat template."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tk.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|im_end|>")
    tok.chat_template = TINY_CHATML
    return tok


def make_tiny(work: Path) -> tuple[Path, Path]:
    """A tiny random Llama (char tokenizer, ChatML) and a prompts file: the whole pipeline on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = work / "tiny-target"
    if not (folder / "config.json").is_file():
        tok = tiny_chat_tokenizer()
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


# ----------------------------------------------------------------------------- the run


class _Story:
    """story.json, rewritten atomically after each stage."""

    def __init__(self, out: Path, cfg: StoryConfig, environment: dict, prov: dict, t0: float):
        self.path = out / STORY_FILE
        self.t0 = t0
        self.bar = None  # a stage progress bar, when the caller wants one
        self.doc: dict[str, Any] = {
            "kind": "story", "config": dataclasses.asdict(cfg), "env": environment, "provenance": prov,
            "stages": {}, "datagen": {}, "mappings": {}, "runs": {}, "arms": {}, "verdicts": {}, "skipped": [],
            "complete": False}

    def stage(self, name: str, seconds: float) -> None:
        self.doc["stages"][f"{name}_s"] = round(seconds, 2)
        self.save()
        if self.bar is not None:
            self.bar.update(1)

    def save(self) -> None:
        self.doc["total_s"] = round(time.perf_counter() - self.t0, 2)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path)


def subset_view(src: Path, dst: Path, shards: int) -> Path:
    """A dataset folder holding only the first ``shards`` shards of ``src`` (links, no copies)."""
    from eaglekb.data import datagen

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


def run(cfg: StoryConfig, out: str | Path, *, command: str | None = None,
        log: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, Any]:
    """The whole story on one machine; returns the story document also written to ``out/story.json``.

    ``log`` gets one timestamped line per event; ``progress`` adds a bar over the run's stages (log lines
    then go through the bar's writer so they do not break it).
    """
    import torch
    from tqdm.auto import tqdm

    from eaglekb.data import datagen
    from eaglekb.measure import provenance
    from eaglekb.training import loop as training
    from eaglekb.data import vocab

    t_start = time.perf_counter()
    bar = None

    def say(msg: str) -> None:
        if log:
            line = f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t_start:6.1f}s] {msg}"
            tqdm.write(line) if bar is not None else log(line)

    if cfg.tiny:
        defaults = StoryConfig()
        for k, v in TINY.items():
            if getattr(cfg, k) == getattr(defaults, k):
                setattr(cfg, k, v)
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.tiny:
        model, prompts_file = make_tiny(work)
        cfg.model, cfg.prompts = str(model), str(prompts_file)
    if not (cfg.model and cfg.prompts):
        raise BadInput("missing option", where="--model/--prompts", expected="a target folder and a prompts file "
                       "(or --tiny)", found=f"model={cfg.model!r}, prompts={cfg.prompts!r}")
    sets = read_prompts(Path(cfg.prompts))
    dev = "cuda" if torch.cuda.is_available() and not cfg.tiny and cfg.device != "cpu" else "cpu"
    gpu = dev == "cuda"
    dtype = "bfloat16" if gpu else "float32"
    environment = _env()
    story = _Story(out, cfg, environment, provenance.capture(command=command), t_start)
    if progress:  # load, datagen x2, mappings, A and its probe, 3 arms + probes, small arms, export
        bar = story.bar = tqdm(total=12 + (3 if cfg.b_small else 0) + (1 if cfg.export_drafters else 0),
                               desc="story stages", unit="stage")
    say(f"torch {environment['torch']}, device {dev} ({environment['gpu']}); work {work}, out {out}")
    say(f"prompts: A {len(sets['A'])}, B {len(sets['B'])}, eval {len(sets['eval'])}")
    eval_file = work / "eval-prompts.jsonl"
    with open(eval_file, "w", encoding="utf-8") as fh:
        for p in sets["eval"].prompts[: cfg.probe_prompts]:
            fh.write(json.dumps({"messages": list(p.messages)}, ensure_ascii=False) + "\n")
    story.doc["prompts"] = {k: v.manifest for k, v in sets.items()}

    # 1. datagen A and B (greedy)
    t0 = time.perf_counter()
    target = datagen.load_target(cfg.model, device=dev, dtype=dtype)
    story.stage("load_target", time.perf_counter() - t0)
    data = {}
    for dom, new in (("a", cfg.a_max_new_tokens), ("b", cfg.b_max_new_tokens)):
        dcfg = datagen.DatagenConfig(max_new_tokens=new, max_len=cfg.max_len, batch_size=cfg.gen_batch,
                                     shard_size=cfg.shard_size, mode="greedy", dtype=dtype)
        t0 = time.perf_counter()
        data[dom] = work / f"data-{dom}"
        man = datagen.run(target, sets[dom.upper()], data[dom], dcfg, progress=False)
        dt = time.perf_counter() - t0
        rep = {k: v for k, v in datagen.storage_report(man).items() if v is not None}
        story.doc["datagen"][dom] = {
            "config": {**dcfg.__dict__, "model": str(cfg.model), "device": dev, "gpu": environment["gpu"],
                       "prompts": sets[dom.upper()].manifest},
            "metrics": {**rep, "stage_wall_s": round(dt, 2)}, "env": environment,
            "summary": f"domain {dom.upper()}: {rep['sequences_count']} sequences, {rep['tokens_count']} tokens, "
                       f"generate {rep.get('generate_tok_s')} tok/s on {environment['gpu'] or dev}"}
        say(f"datagen {dom.upper()}: {dt:.1f} s, {rep['sequences_count']} seqs, {rep['tokens_count']} tokens, "
            f"{rep['loss_tokens_count']} loss tokens, generate {rep.get('generate_tok_s')} tok/s")
        story.stage(f"datagen_{dom}", dt)
    del target
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()

    # 2. mappings A and B, compared
    t0 = time.perf_counter()
    maps, counts = {}, {}
    for dom in ("a", "b"):
        ds = datagen.open_dataset(data[dom])
        v = ds.target["vocab_size"]
        c = torch.zeros(v, dtype=torch.int64)
        for ids, mask in ds.token_ids_and_masks():
            c += vocab.counts_from_token_ids(ids, mask, v)
        counts[dom] = vocab.TokenCounts(c, {"what": "loss-masked tokens", "dataset": str(data[dom])})
        maps[dom] = vocab.build_mapping(counts[dom], min(cfg.draft_vocab_size, v))
        vocab.save_mapping(work / f"mapping-{dom}.safetensors", maps[dom])
    cmp_doc = vocab.compare_mappings(maps["a"], maps["b"])
    cm = vocab.comparison_metrics(cmp_doc)
    for dom in ("a", "b"):
        cm[f"coverage_of_{dom}_data"] = {f"mapping_{m}_pct": round(100 * vocab.coverage(maps[m], counts[dom]), 4)
                                         for m in ("a", "b")}
    story.doc["mappings"] = {"draft_vocab_size": maps["a"].draft_vocab_size, "metrics": cm,
                             "explanation": cmp_doc["explanation"], "env": environment,
                             "config": {"a": "loss-masked tokens of domain A's data",
                                        "b": "loss-masked tokens of domain B's data",
                                        "draft_vocab_size": maps["a"].draft_vocab_size, "model": str(cfg.model)}}
    say(f"mappings: {cmp_doc['explanation']}; coverage of B data: A {cm['coverage_of_b_data']['mapping_a_pct']}%, "
        f"B {cm['coverage_of_b_data']['mapping_b_pct']}%")
    story.stage("mappings", time.perf_counter() - t0)

    # 3. training and probes
    inter = cfg.intermediate_size or None

    def train(name: str, data_dir: Path, mapping: Path, *, init: Path | None = None, remap: bool = True,
              steps: int, lr: float, eval_every: int) -> dict:
        run_dir = work / f"run-{name}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        tcfg = training.TrainConfig(
            data=str(data_dir), out=str(run_dir), init=str(init) if init else None, remap=remap,
            mapping=str(mapping), draft_vocab_size=cfg.draft_vocab_size, intermediate_size=inter,
            ttt_steps=cfg.ttt_steps, batch_size=cfg.batch_size, max_len=cfg.max_len, steps=steps,
            lr=lr, warmup_frac=0.03, min_lr_frac=0.05, val_fraction=cfg.val_fraction,
            max_val_sequences=128, eval_every=eval_every, save_every=0, log_every=1, seed=cfg.seed, device=dev)
        every = max(1, steps // 10)

        def tlog(msg: str) -> None:  # log_every=1 keeps every step's loss (first-step loss, full curves)
            if msg.startswith("step "):
                n = int(msg.split()[1].split("/")[0])
                if n != 1 and n % every:
                    return
            say(f"[{name}] {msg}")

        t0 = time.perf_counter()
        report = training.train(tcfg, progress=False, log=tlog)
        wall = time.perf_counter() - t0
        f = training.baseline_fields(report)
        h = report["history"]
        first = min(h["train_loss"], key=int)
        f["metrics"]["start"] = {"first_step_loss": h["train_loss"][first],
                                 "first_step_acc0_pct": h["train_acc0"][first]}
        f["metrics"]["throughput"]["stage_wall_s"] = round(wall, 2)
        if isinstance(report["mapping"].get("remap"), dict):
            f["metrics"]["remap"] = {f"{k}_count": v for k, v in report["mapping"]["remap"].items()
                                     if isinstance(v, int) and not isinstance(v, bool)}
        config = {k: v for k, v in report["config"].items() if k != "stop_after"}
        config.update(arm=name, device=report["device"], gpu=environment["gpu"], mapping_report=report["mapping"],
                      notes=report["notes"], data_totals=report["data"]["totals"])
        doc = {"kind": "finetune", "arm": name, "config": config, "metrics": f["metrics"], "series": f["series"],
               "summary": f"{name}: " + f["summary"], "env": environment, "wall_s": round(wall, 2),
               "drafter": str(run_dir / "drafter"), "drafter_files": _file_hashes(run_dir / "drafter")}
        val = report.get("val") or {}
        say(f"[{name}] {wall:.1f} s; first-step loss {h['train_loss'][first]:.3f}; val acc "
            + " ".join(f"{a:.3f}" for a in val.get("acc", [])) + f"; simulated_acc_len {val.get('simulated_acc_len')}")
        return doc

    def probe_doc(drafter: Path, label: str) -> dict | None:
        from eaglekb.measure import probe

        if time.perf_counter() - t_start > cfg.soft_limit_s:
            story.doc["skipped"].append(f"probe {label}: past the soft limit")
            say(f"skipping probe {label}: past the soft limit")
            return None
        pcfg = probe.ProbeConfig(target=str(cfg.model), drafter=str(drafter), prompts=str(eval_file),
                                 num_prompts=cfg.probe_prompts, max_new_tokens=cfg.probe_new_tokens,
                                 steps=cfg.probe_steps, topk=1, device=dev, dtype=dtype, seed=cfg.seed, graphs=gpu)
        t0 = time.perf_counter()
        p = probe.run(pcfg, progress=False)
        gc.collect()  # the probe's engine (CUDA graphs, static caches) before the next training
        if gpu:
            torch.cuda.empty_cache()
        d = dict(p.to_dict(), env=environment, wall_s=round(time.perf_counter() - t0, 2))
        d["config"]["prompts"] = f"{EVAL_SET} (first {cfg.probe_prompts}, from {Path(cfg.prompts).name})"
        d["prompts_manifest"] = dict(sets["eval"].manifest, count=cfg.probe_prompts, file=Path(cfg.prompts).name)
        say(f"[probe {label}] {p.summary} ({d['wall_s']} s)")
        return d

    def emit(doc: dict, probe_d: dict | None) -> None:
        name = doc["arm"]
        if probe_d is not None:
            doc["probe"] = probe_d
        story.doc["runs"][name] = doc
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
        story.doc["arms"][name] = row
        story.save()

    def steps_for(data_dir: Path, epochs: float) -> int:
        n = len(datagen.open_dataset(data_dir))
        return max(1, int(round(epochs * n * (1 - cfg.val_fraction) / cfg.batch_size)))

    # drafter A from scratch on A; probed as-is on the B domain (Phase 0)
    t0 = time.perf_counter()
    a_steps = steps_for(data["a"], cfg.a_epochs)
    a_doc = train("a-scratch", data["a"], work / "mapping-a.safetensors", steps=a_steps, lr=cfg.lr,
                  eval_every=max(1, a_steps // cfg.eval_points))
    a_drafter = Path(a_doc["drafter"])
    story.stage("train_a", time.perf_counter() - t0)
    t0 = time.perf_counter()
    emit(a_doc, probe_doc(a_drafter, "A as-is on B (Phase 0)"))
    story.stage("probe_a", time.perf_counter() - t0)

    # Phase 1 arms at equal data and step budgets on B
    b_steps = steps_for(data["b"], cfg.b_epochs)
    story.doc["phase1_budget"] = {"b_sequences_count": len(datagen.open_dataset(data["b"])),
                                  "optimizer_steps": b_steps, "batch_size": cfg.batch_size, "lr": cfg.b_lr}
    budgets = [("", data["b"])]
    if cfg.b_small:
        n_shards = max(1, cfg.b_small // cfg.shard_size)
        budgets.append(("-small", subset_view(data["b"], work / "data-b-small", n_shards)))
    for suffix, ddir in budgets:
        for arm in ARMS:
            name = f"b-{arm}{suffix}"
            if suffix and time.perf_counter() - t_start > cfg.soft_limit_s:
                story.doc["skipped"].append(f"train {name}: past the soft limit")
                say(f"skipping {name}: past the soft limit")
                continue
            t0 = time.perf_counter()
            doc = train(name, ddir, work / "mapping-b.safetensors", init=a_drafter if arm != "scratch" else None,
                        remap=arm != "noremap", steps=b_steps, lr=cfg.b_lr,
                        eval_every=max(1, b_steps // cfg.eval_points))
            story.stage(f"train_{name}", time.perf_counter() - t0)
            t0 = time.perf_counter()
            emit(doc, None if suffix else probe_doc(Path(doc["drafter"]), name))
            if not suffix:
                story.stage(f"probe_{name}", time.perf_counter() - t0)

    # 4. verdicts: each drafter against break-even at the median measured cycle time and plain-decode rate
    rows = {k: v for k, v in story.doc["arms"].items() if "online_accept_len" in v}
    if rows:
        cyc = median(r["cycle_ms"] for r in rows.values())
        base = median(r["baseline_tok_s"] for r in rows.values())
        story.doc["verdict_basis"] = {"cycle_ms": round(cyc, 4), "baseline_tok_s": round(base, 2),
                                      "steps": cfg.probe_steps, "topk": 1,
                                      "what": "median of the probes' measured cycle time and plain-decode rate"}
        story.doc["verdicts"] = verdicts(rows, cyc, base, cfg.probe_steps)
        for k, v in story.doc["verdicts"].items():
            say(f"verdict {k}: accept_len {v['accept_len']:.2f} vs break-even {v['breakeven_len']:.2f} "
                f"({v['margin_x']:.2f}x): {'viable' if v['viable'] else 'NOT viable'}")
    story.save()

    # 5. the main drafters, for probing and benchmarking elsewhere
    if cfg.export_drafters:
        t0 = time.perf_counter()
        folders = {k: Path(story.doc["runs"][k]["drafter"]) for k in MAIN_RUNS if k in story.doc["runs"]}
        keep = fit_budget({k: _folder_bytes(f) for k, f in folders.items()}, int(cfg.export_max_mib * (1 << 20)))
        left = [k for k in folders if k not in keep]
        if left:
            story.doc["skipped"].append(f"export {', '.join(left)}: over --export-max-mib {cfg.export_max_mib} "
                                        "(invoke story.export brings them in another call)")
        story.doc["drafters_export"] = export_drafters({k: folders[k] for k in keep}, out)
        story.stage("export_drafters", time.perf_counter() - t0)
    story.doc["complete"] = True
    story.save()
    if bar is not None:
        bar.close()
        bar = None
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    say(f"done in {time.perf_counter() - t_start:.1f} s; {len(sizes)} files under {out}: {sizes}")
    return story.doc


def verdicts(rows: dict[str, dict], cycle_ms: float, baseline_tok_s: float, steps: int) -> dict[str, dict]:
    """Each drafter's accept length against break-even at one cycle time and plain-decode rate."""
    from eaglekb.measure import viability

    out = {}
    for k, r in rows.items():
        pr = viability.plan(baseline_tok_s=baseline_tok_s, cycle_ms=cycle_ms,
                            accept_len=max(r["online_accept_len"], 1.0), steps=steps, topk=1)
        out[k] = {"accept_len": round(r["online_accept_len"], 4), "breakeven_len": round(pr.breakeven_len, 4),
                  "margin_x": round(r["online_accept_len"] / pr.breakeven_len, 4), "viable": bool(pr.viable),
                  "predicted_speedup_x": round(pr.speedup_x, 4), "own_cycle_viable": bool(r.get("viable"))}
    return out


# ----------------------------------------------------------------------------- drafters in 16 MiB pieces


def _files(folder: Path) -> dict[str, Path]:
    """The plain files under ``folder``, by relative POSIX path, sorted."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _file_hashes(folder: Path) -> dict[str, str]:
    from eaglekb.models.sources import sha256_files

    return {rel: sha256_files([p]) for rel, p in _files(folder).items()}


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder).values())


def fit_budget(sizes: dict[str, int], budget: int, overhead: int = 64 << 10) -> list[str]:
    """The names, in order, whose sizes (plus tar overhead each) fit the budget; later ones are skipped."""
    keep, used = [], 0
    for name, size in sizes.items():
        if used + size + overhead <= budget:
            keep.append(name)
            used += size + overhead
    return keep


def export_drafters(folders: dict[str, Path], out: Path, part_bytes: int = PART_BYTES) -> dict[str, Any]:
    """One uncompressed tar of the drafter folders (``NAME/file``), cut into ``part_bytes`` pieces."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, folder in folders.items():
            for rel, p in _files(folder).items():
                tar.add(p, arcname=f"{name}/{rel}", recursive=False)
    data = buf.getvalue()
    parts = []
    for i in range(0, len(data), part_bytes):
        path = out / f"{DRAFTERS_TAR}.part{i // part_bytes:02d}"
        path.write_bytes(data[i:i + part_bytes])
        parts.append(path.name)
    return {"parts": parts, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "drafters": {name: _file_hashes(folder) for name, folder in folders.items()}}


def export_from_work(work: str | Path, names: list[str], out: str | Path) -> dict[str, Any]:
    """Export drafters of a finished run from its work folder (``run-NAME/drafter``), with a manifest.

    For when the run's own export did not fit what one transfer brings back: pick the drafters that fit.
    """
    work, out = Path(work), Path(out)
    folders = {n: work / f"run-{n}" / "drafter" for n in names}
    missing = [n for n, f in folders.items() if not (f / "config.json").is_file()]
    if missing:
        raise MissingFile("no such drafter in the work folder", where=str(work),
                          expected="run-NAME/drafter/config.json for " + ", ".join(names),
                          found=f"missing {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    doc = export_drafters(folders, out)
    tmp = out / (EXPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / EXPORT_FILE)
    return doc


def unpack_drafters(run_dir: str | Path, dest: str | Path, pieces: str | Path | None = None) -> dict[str, Path]:
    """Join ``drafters.tar.partNN``, check every hash, extract to ``dest/NAME``.

    The pieces and their manifest are the run's own export (``story.json``'s ``drafters_export``) or, in
    ``pieces`` (default: the run folder), a later ``export_from_work`` (``drafters-export.json``). Each
    drafter must also match the file hashes the run recorded when it trained it.
    """
    run_dir, dest = Path(run_dir), Path(dest)
    pieces = Path(pieces) if pieces else run_dir
    doc = load(run_dir)
    exp = doc.get("drafters_export")
    if (pieces / EXPORT_FILE).is_file():
        exp = json.loads((pieces / EXPORT_FILE).read_text())
    if not exp:
        raise MissingFile("no exported drafters", where=str(pieces),
                          expected=f"story.json's drafters_export or {EXPORT_FILE}", found="neither")
    for name, hashes in exp["drafters"].items():
        trained = (doc.get("runs", {}).get(name) or {}).get("drafter_files")
        if trained is not None and trained != hashes:
            raise IntegrityError("exported drafter is not the one the run trained", where=name,
                                 expected="the file hashes recorded in story.json", found="different hashes")
    missing = [p for p in exp["parts"] if not (pieces / p).is_file()]
    if missing:
        raise MissingFile("drafter pieces missing", where=str(pieces), expected=", ".join(exp["parts"]),
                          found=f"missing {', '.join(missing)}")
    data = b"".join((pieces / p).read_bytes() for p in exp["parts"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != exp["sha256"]:
        raise IntegrityError("drafter pieces corrupt", where=str(pieces), expected=f"sha256 {exp['sha256']}",
                             found=f"sha256 {digest}")
    staging = dest.parent / f".{dest.name}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            for m in tar.getmembers():  # plain files under NAME/ only: no links, no absolute or parent paths
                parts = Path(m.name).parts
                if not m.isfile() or m.name.startswith("/") or ".." in parts or parts[0] not in exp["drafters"]:
                    raise IntegrityError("unexpected entry in drafters tar", where=m.name,
                                         expected="NAME/file of an exported drafter", found=m.name)
                target = staging / m.name
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        for name, hashes in exp["drafters"].items():
            if _file_hashes(staging / name) != hashes:
                raise IntegrityError("extracted drafter differs from the exported one", where=name,
                                     expected="the sha256 of each file in story.json", found="different hashes")
        dest.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in exp["drafters"]:
            if (dest / name).exists():
                shutil.rmtree(dest / name)
            os.replace(staging / name, dest / name)
            out[name] = dest / name
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ----------------------------------------------------------------------------- recording


def load(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / STORY_FILE
    if not path.is_file():
        raise MissingFile("no story output", where=str(path), expected=f"{STORY_FILE} from `invoke story.run`",
                          found="nothing")
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise BadInput("not JSON", where=str(path), expected="a story document", found=str(exc)) from None
    if not isinstance(doc, dict) or doc.get("kind") != "story":
        raise BadInput("not a story document", where=str(path), expected='"kind": "story"',
                       found=repr(doc.get("kind") if isinstance(doc, dict) else type(doc).__name__))
    return doc


def baselines_from_run(run_dir: str | Path, *, prefix: str, command: str, commit: str | None,
                       root: Path | None = None) -> list:
    """The baselines a story run yields (built and schema-checked, not written).

    ``PREFIX-a`` / ``PREFIX-b`` (datagen), ``PREFIX-mapping-a-vs-b`` (vocab), ``PREFIX-ARM`` (finetune, and probe
    for probed drafters) and ``PREFIX-verdicts`` (plan: every probed drafter at the median measured cycle).
    """
    from eaglekb.kb import baselines
    from eaglekb.data import datagen
    from eaglekb.measure import probe
    from eaglekb.training import loop as training
    from eaglekb.measure.provenance import from_device_env

    doc = load(run_dir)
    prov = from_device_env(doc.get("provenance") or doc["env"], command, commit)
    if prov.get("versions", {}).get("eaglekb") is None:
        from eaglekb import __version__

        prov["versions"] = dict(prov.get("versions", {}), eaglekb=__version__)
    created = doc["env"].get("time")
    common = dict(provenance=prov, created_at=created, root=root)
    out = []
    for dom, d in sorted(doc.get("datagen", {}).items()):
        out.append(baselines.build(kind="datagen", name=f"{prefix}-{dom}", config=d["config"], metrics=d["metrics"],
                                   noise=datagen.NOISE, summary=d["summary"], **common))
    if doc.get("mappings"):
        m = doc["mappings"]
        out.append(baselines.build(kind="vocab", name=f"{prefix}-mapping-a-vs-b", config=m["config"],
                                   metrics=m["metrics"], noise=MAPPING_NOISE,
                                   summary=m["explanation"], **common))
    for name, r in sorted(doc.get("runs", {}).items()):
        config = dict(r["config"], device_run_wall_s=r.get("wall_s"), drafter_files=r.get("drafter_files"))
        out.append(baselines.build(kind="finetune", name=f"{prefix}-{name}", config=config, metrics=r["metrics"],
                                   noise=retrained_noise(training.NOISE, r["metrics"]), summary=r["summary"],
                                   series=r.get("series") or None,
                                   **common))
        if r.get("probe"):
            p = r["probe"]
            pconfig = dict(p["config"], prompts_manifest=p.get("prompts_manifest"), device_run_wall_s=p.get("wall_s"),
                           drafter_arm=name)
            out.append(baselines.build(kind="probe", name=f"{prefix}-{name}", config=pconfig, metrics=p["metrics"],
                                       noise=retrained_noise(probe.noise(p["metrics"]), p["metrics"]),
                                       summary=f"{name}: {p['summary']}", **common))
    if doc.get("verdicts"):
        basis = doc["verdict_basis"]
        metrics = {k.replace("-", "_"): {m: v[m] for m in ("accept_len", "breakeven_len", "margin_x",
                                                          "predicted_speedup_x")}
                   for k, v in doc["verdicts"].items()}
        viable = sorted(k for k, v in doc["verdicts"].items() if v["viable"])
        out.append(baselines.build(
            kind="plan", name=f"{prefix}-verdicts",
            config={"basis": basis, "viable": {k: v["viable"] for k, v in doc["verdicts"].items()},
                    "drafters": sorted(doc["verdicts"])},
            metrics=metrics, noise=_verdict_noise(metrics),
            summary=f"at {basis['cycle_ms']} ms per cycle and {basis['baseline_tok_s']} tok/s plain decode: "
                    + (f"viable: {', '.join(viable)}" if viable else "no drafter is above break-even"),
            **common))
    return out


def retrained_noise(base: dict, metrics: dict) -> dict:
    """The noise of a result about a drafter that a rerun trains again (not the same file probed twice).

    Measured over three H200 runs of the story: a retrained drafter's accept lengths moved by up to 2.4%,
    validation accuracies by up to 1.6 points (1.3 at step 0), and the details behind them more: per-depth and
    conditional acceptance fractions by up to 0.084, accept-length histogram counts by up to 20 of 455. So
    acceptance values get 5%, percentages 2 points, fractions 0.1 and counts 25% + 10; timing tolerances stay
    as ``base`` has them (a slower machine must show up as not reproduced).
    """
    from eaglekb.kb.baselines import flatten

    tol = dict(base.get("tolerance_abs", {}))
    for path, value in flatten(metrics).items():
        if path in tol or path.endswith(("_tok_s", "_ms", "_s", "_x")) or path == "breakeven_len":
            continue
        if path.endswith("_pct"):
            tol[path] = 2.0
        elif path.endswith("_frac"):
            tol[path] = 0.1
        elif path.endswith("_count"):
            tol[path] = 0.25 * abs(float(value)) + 10
    return dict(base, tolerance_rel=max(base.get("tolerance_rel", 0.0), 0.05), tolerance_abs=tol)


def _verdict_noise(metrics: dict) -> dict:
    """As a probe's: accept length within 2% (greedy), timing-derived values within 50%."""
    from eaglekb.kb.baselines import flatten

    tol = {p: abs(float(v)) * 0.5 + 1e-9 for p, v in flatten(metrics).items()
           if p.endswith(("breakeven_len", "_x"))}
    return {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02, "tolerance_abs": tol}
