"""Training data for EAGLE-3 drafters: self-distilled responses and the target's features.

Owns the datagen run, from a prompt set to a dataset folder:

1. *Regenerate* each prompt's response with the target itself (self-distillation: the
   drafter learns the target's own outputs), chat template applied, batched, greedy or
   sampled; locally (``eaglekb.data.generation``) or, for targets that do not fit one
   GPU, through a running SGLang server, resumable through a JSON-lines progress file.
2. *Featurise* (``eaglekb.data.features``): one teacher-forced target pass per batch
   stores, per token, the token id, the loss mask (assistant tokens only), the target's
   auxiliary hidden states at the capture points, its final (post-norm) hidden state and
   the argmax of its logits. The final hidden state, times the target's lm_head (saved
   once per dataset), gives the target's exact distribution over *any* draft vocabulary
   at training time, so one dataset serves every mapping; top-k logits would tie the
   data to one vocabulary and truncate the distribution. It costs ``H*2`` bytes per
   token against ``3*H*2`` for the aux states. ``store_final_hidden=False`` keeps only
   the argmax (hard labels); ``features="online"`` keeps token ids and masks only.
3. *Store* packed sequences in shards (``eaglekb.formats.shards``) plus the manifest
   (corpus manifests, target, capture points, counts, bytes per token, throughput). A
   rerun skips shards already written, so an interrupted run resumes; a rerun with
   another config is refused (``DatagenConfig``'s identity hash; another --slice: ``check_slice``); what a
   run refused before its first shard left is taken up by the rerun (``is_datagen_folder``).

Also: the storage report a recorded run keeps, and its text rendering.

Knows nothing about drafters, vocab mappings, training or the task runner.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglekb.data.chat import chat_prefix_ids, conversation_ids
from eaglekb.data.features import featurise, pack, save_target_head
from eaglekb.data.generation import (EngineGenerator, generate_responses, load_target, progress_bar,
                                     regenerate_via_server)
from eaglekb.data.prompts import source_key, source_of
from eaglekb.formats.shards import (FORMAT, FORMAT_VERSION, HEAD_FILE, MANIFEST, SHARD_GLOB, read_manifest,
                                    shard_name, write_shard)
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.io.files import atomic_write_json
from eaglekb.models.server import SGLangClient

#: Noise of a recorded datagen run: throughput within 25%, bytes per token within 64 bytes.
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.25,
         "tolerance_abs": {"bytes_per_token_bytes": 64.0}}
RESPONSES = "responses.jsonl"
MODES = ("greedy", "sampled")
FEATURES = ("stored", "online")
GENERATORS = ("hf", "engine")


@dataclass
class DatagenConfig:
    """Everything that decides the content of a dataset (its hash guards resumes)."""

    max_new_tokens: int = 256  # response budget per prompt
    max_len: int = 1024  # prompt + response tokens kept per sequence
    batch_size: int = 8  # prompts per generate / feature batch
    mode: str = "greedy"  # greedy or sampled regeneration
    temperature: float = 0.7  # sampled mode only
    top_p: float = 0.95  # sampled mode only
    seed: int = 0  # sampled mode: torch seed per shard is seed + shard index
    shard_size: int = 256  # sequences per shard
    features: str = "stored"  # stored: hidden states in shards; online: ids and masks only
    store_final_hidden: bool = True  # keep the target's final hidden (soft targets)
    dtype: str = "bfloat16"  # storage dtype of hidden states
    source: str = "local"  # local (transformers generate) or sglang (server responses)
    generator: str = "hf"  # local generation: hf (transformers generate) or engine (continuous batching, graphs)
    sample_temperatures: tuple = ()  # engine: extra sampled responses per prompt, one per temperature

    def check(self) -> None:
        if self.mode not in MODES:
            raise BadInput("unknown generation mode", where="mode", expected=" or ".join(MODES), found=repr(self.mode))
        if self.features not in FEATURES:
            raise BadInput("unknown features mode", where="features", expected=" or ".join(FEATURES),
                           found=repr(self.features))
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise BadInput("unsupported storage dtype", where="dtype", expected="bfloat16, float16 or float32",
                           found=repr(self.dtype))
        for name in ("max_new_tokens", "max_len", "batch_size", "shard_size"):
            if int(getattr(self, name)) < 1:
                raise BadInput("must be positive", where=name, expected=">= 1", found=str(getattr(self, name)))
        if self.mode == "sampled" and not 0 < self.temperature <= 2:
            raise BadInput("sampled mode needs a temperature in (0, 2]", where="--temperature", expected="0 < t <= 2",
                           found=str(self.temperature))
        if self.generator not in GENERATORS:
            raise BadInput("unknown generator", where="--generator", expected=" or ".join(GENERATORS),
                           found=repr(self.generator))
        self.sample_temperatures = tuple(float(x) for x in self.sample_temperatures)
        bad = [x for x in self.sample_temperatures if not 0 < x <= 2]
        if bad:
            raise BadInput("sample temperature out of range", where="--samples", expected="0 < t <= 2",
                           found=str(bad[0]))
        if self.sample_temperatures and self.generator != "engine":
            raise BadInput("extra sampled responses need the engine generator", where="--samples",
                           expected="--generator engine", found=f"--generator {self.generator}")

    def temperatures(self) -> list[float]:
        """The responses each prompt gets: the main one (0 = greedy) and the extra samples."""
        return [self.temperature if self.mode == "sampled" else 0.0, *self.sample_temperatures]


def sequence_id(prompt_id: str, k: int, temperature: float) -> str:
    """``id`` for a prompt's main response, ``id@t0.8#k`` for its k-th extra sample."""
    return prompt_id if k == 0 else f"{prompt_id}@t{temperature:g}#{k}"


def config_hash(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def target_summary(model_config) -> dict:
    """The target facts a drafter is sized from (recorded in the manifest)."""
    get = (lambda k, d=None: model_config.get(k, d)) if isinstance(model_config, dict) \
        else (lambda k, d=None: getattr(model_config, k, d))
    rope = get("rope_parameters") or {}
    theta = get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    hidden = int(get("hidden_size"))
    heads = int(get("num_attention_heads"))
    return {
        "model_type": get("model_type"),
        "hidden_size": hidden,
        "intermediate_size": int(get("intermediate_size")),
        "num_hidden_layers": int(get("num_hidden_layers")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("num_key_value_heads") or heads),
        "head_dim": int(get("head_dim") or hidden // heads),
        "vocab_size": int(get("vocab_size")),
        "rms_norm_eps": float(get("rms_norm_eps") or 1e-6),
        "rope_theta": float(theta),
        "max_position_embeddings": int(get("max_position_embeddings") or 2048),
        "tie_word_embeddings": bool(get("tie_word_embeddings", False)),
    }


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first (dotted path, old, new) where two nested dicts differ, as JSON (a tuple equals its list)."""
    a, b = (json.loads(json.dumps(x, sort_keys=True, default=str)) for x in (a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return path, a, b


def _identity(target, prompts_manifest: dict, cfg: DatagenConfig) -> dict:
    return {
        "target": target_summary(target.model.config),  # path not included: the same model elsewhere resumes
        "capture_points": list(target.capture_points),
        "prompts_sha256": prompts_manifest.get("sha256"),
        "config": asdict(cfg),
        **({"slice": prompts_manifest["slice"]} if prompts_manifest.get("slice") else {}),  # unsliced: as before
    }


def check_slice(out: str | Path, part: str | None) -> None:
    """A dataset folder holds one slice of a mix (``--slice K/N``) or the whole mix; another there would mix data."""
    existing = read_manifest(Path(out))
    held = (existing or {}).get("identity", {}).get("slice")
    if existing is not None and existing.get("shards") and held != part:
        raise Incompatible("output folder holds another slice of the prompts", where=str(Path(out) / MANIFEST),
                           expected=f"--slice {held}" if held else "no --slice (it holds the whole mix)",
                           found=f"--slice {part}" if part else "no --slice", fix="give each slice its own --out")


def _prepare_out(out: Path, identity: dict) -> dict:
    """The manifest to continue from: the existing one if it is the same config, else a fresh one (also over
    a manifest of no shards: a run refused before its first shard leaves one, and it holds no data)."""
    out.mkdir(parents=True, exist_ok=True)
    existing = read_manifest(out)
    ident_hash = config_hash(identity)
    if existing is not None and (existing.get("shards") or any(out.glob(SHARD_GLOB))):
        check_slice(out, identity.get("slice"))
        if existing.get("identity_hash") != ident_hash:
            where, old, new = first_difference(existing.get("identity", {}), identity)
            raise Incompatible("output folder holds a dataset of another config", where=str(out / MANIFEST),
                               expected=f"identity {ident_hash}",
                               found=f"{existing.get('identity_hash')} ({where}: {json.dumps(old)} before, "
                                     f"{json.dumps(new)} now)",
                               fix="use another --out (nothing was overwritten)")
        return existing
    if any(out.glob(SHARD_GLOB)):
        raise Incompatible("output folder holds shards but no manifest", where=str(out),
                           fix="use an empty --out (nothing was overwritten)")
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "identity": identity,
            "identity_hash": ident_hash, "shards": {}}


def is_datagen_folder(out: str | Path) -> bool:
    """A folder datagen wrote, which a rerun continues: a manifest, or what a run writes before its first shard
    (the target head, a server's responses), so a run refused before then does not block its corrected rerun."""
    return any((Path(out) / name).is_file() for name in (MANIFEST, HEAD_FILE, RESPONSES))


def write_manifest(out: Path, manifest: dict, cfg: DatagenConfig) -> None:
    """Recompute the totals (counts, bytes per token) and write the manifest atomically."""
    shards = manifest["shards"]
    tokens = sum(e["tokens"] for e in shards.values())
    shard_bytes = sum(e["bytes"] for e in shards.values())
    t = manifest["identity"]["target"]
    item = {"bfloat16": 2, "float16": 2, "float32": 4}[cfg.dtype]
    per = t["hidden_size"] * item
    hidden_per_token = (3 * per + (per if cfg.store_final_hidden else 0)) if cfg.features == "stored" else 0
    manifest["totals"] = {
        "shards": len(shards), "sequences": sum(e["sequences"] for e in shards.values()), "tokens": tokens,
        "loss_tokens": sum(e["loss_tokens"] for e in shards.values()), "shard_bytes": shard_bytes,
        "bytes_per_token": round(shard_bytes / tokens, 2) if tokens else None,
        "hidden_bytes_per_token": hidden_per_token, "by_source": _sum_sources(shards.values()),
    }
    atomic_write_json(Path(out) / MANIFEST, manifest)


def _sum_sources(entries) -> dict[str, dict]:
    total: dict[str, dict] = {}
    for e in entries:
        for src, d in (e.get("by_source") or {}).items():
            acc = total.setdefault(src, {"sequences": 0, "tokens": 0, "loss_tokens": 0})
            for k in acc:
                acc[k] += d[k]
    return dict(sorted(total.items()))


# ----------------------------------------------------------------------------- the run, in steps


@dataclass
class _Tally:
    """Counts and timings of one run (the manifest's ``last_run``)."""

    written: int = 0
    skipped: int = 0
    too_long: int = 0
    gen_s: float = 0.0
    feat_s: float = 0.0
    gen_tokens: int = 0
    feat_tokens: int = 0
    stopped_by_budget: bool = False

    def last_run(self, wall: float) -> dict:
        return {
            "shards_written_count": self.written, "shards_skipped_count": self.skipped,
            "too_long_count": self.too_long, "wall_s": round(wall, 3), "generate_s": round(self.gen_s, 3),
            "features_s": round(self.feat_s, 3), "generated_tokens": self.gen_tokens,
            "featurised_tokens": self.feat_tokens,
            "generate_tok_s": round(self.gen_tokens / self.gen_s, 2) if self.gen_s else None,
            "features_tok_s": round(self.feat_tokens / self.feat_s, 2) if self.feat_s else None,
            "stopped_by_budget": self.stopped_by_budget,
        }


def _checked_prompts(prompt_set, responses: dict[str, dict] | None) -> list:
    prompts = list(prompt_set.prompts)
    if not prompts:
        raise BadInput("empty prompt set", where=getattr(prompt_set, "name", "prompts"), expected=">= 1 prompt",
                       found="0")
    missing = [p.id for p in prompts if p.id not in responses] if responses is not None else []
    if missing:
        raise BadInput("server responses missing for some prompts", where="responses",
                       expected=f"{len(prompts)} responses", found=f"none for {missing[0]} (+{len(missing) - 1})",
                       fix="rerun the server regeneration; it resumes")
    return prompts


def _start(target, prompt_set, out: Path, cfg: DatagenConfig) -> dict:
    """The manifest to fill (fresh or resumed), with the target head written once for stored features."""
    manifest = _prepare_out(out, _identity(target, prompt_set.manifest, cfg))
    manifest["prompts"] = prompt_set.manifest
    if cfg.features == "stored" and not (out / HEAD_FILE).is_file():
        manifest["target_head"] = save_target_head(target, out, cfg.dtype)
    elif cfg.features == "stored":
        manifest.setdefault("target_head", {"file": HEAD_FILE})
    return manifest


def _already_written(manifest: dict, out: Path, name: str) -> bool:
    entry = manifest["shards"].get(name)
    return entry is not None and (out / name).is_file() and (out / name).stat().st_size == entry.get("bytes")


def _generate_batch(target, batch: list, cfg: DatagenConfig, seed: int, tally: _Tally) -> list[tuple]:
    """(tokens, mask, prompt id) of a batch regenerated locally; prompts too long for max_len are counted."""
    prefixes = [chat_prefix_ids(target.tokenizer, p.messages) for p in batch]
    ok = [i for i, pre in enumerate(prefixes) if len(pre) < cfg.max_len - 1]
    tally.too_long += len(batch) - len(ok)
    if not ok:
        return []
    t0 = time.perf_counter()
    resp = generate_responses(target, [prefixes[i] for i in ok], cfg, seed=seed)
    tally.gen_s += time.perf_counter() - t0
    tally.gen_tokens += sum(len(r) for r in resp)
    return [((prefixes[i] + r)[: cfg.max_len], ([0] * len(prefixes[i]) + [1] * len(r))[: cfg.max_len], batch[i].id)
            for i, r in zip(ok, resp)]


def _generate_engine(target, chunk: list, cfg: DatagenConfig, engine: EngineGenerator, tally: _Tally) -> list[tuple]:
    """(tokens, mask, sequence id) of a whole shard through the engine: every prompt x every temperature."""
    temps = cfg.temperatures()
    jobs = []
    for p in chunk:
        pre = chat_prefix_ids(target.tokenizer, p.messages)
        if len(pre) >= cfg.max_len - 1:
            tally.too_long += 1
            continue
        jobs += [(pre, t, sequence_id(p.id, k, t)) for k, t in enumerate(temps)]
    if not jobs:
        return []
    t0 = time.perf_counter()
    resp = engine([j[0] for j in jobs], [j[1] for j in jobs], cfg.max_new_tokens)
    tally.gen_s += time.perf_counter() - t0
    tally.gen_tokens += sum(len(r) for r in resp)
    return [((pre + r)[: cfg.max_len], ([0] * len(pre) + [1] * len(r))[: cfg.max_len], sid)
            for (pre, _, sid), r in zip(jobs, resp)]


def _tokenise_responses(target, batch: list, responses: dict[str, dict], cfg: DatagenConfig,
                        tally: _Tally) -> list[tuple]:
    """(tokens, mask, prompt id) of a batch answered by a server, through the chat template."""
    out = []
    for p in batch:
        full, mask = conversation_ids(target.tokenizer, p.messages, responses[p.id]["response"])
        if sum(mask[: cfg.max_len]) == 0:
            tally.too_long += 1
            continue
        out.append((full[: cfg.max_len], mask[: cfg.max_len], p.id))
    return out


def _features(target, rows: list[tuple], cfg: DatagenConfig, tally: _Tally) -> list[dict]:
    """Featurised batches of a shard's sequences (timed)."""
    import torch

    seqs, masks = [r[0] for r in rows], [r[1] for r in rows]
    with_hidden = cfg.features == "stored"
    parts = []
    t0 = time.perf_counter()
    for b in range(0, len(seqs), cfg.batch_size):
        parts.append(featurise(target, seqs[b:b + cfg.batch_size], masks[b:b + cfg.batch_size], dtype=cfg.dtype,
                               store_final_hidden=cfg.store_final_hidden, with_hidden=with_hidden))
    if with_hidden and target.device.type == "cuda":
        torch.cuda.synchronize()
    tally.feat_s += time.perf_counter() - t0
    tally.feat_tokens += sum(len(x) for x in seqs)
    return parts


def _rows(target, chunk: list, s: int, cfg: DatagenConfig, responses: dict[str, dict] | None, tally: _Tally,
          bar, engine: EngineGenerator | None) -> list[tuple]:
    if engine is not None:
        rows = _generate_engine(target, chunk, cfg, engine, tally)
        bar.update(len(chunk))
        return rows
    rows: list[tuple] = []
    for b in range(0, len(chunk), cfg.batch_size):
        batch = chunk[b:b + cfg.batch_size]
        if responses is None:
            rows += _generate_batch(target, batch, cfg, cfg.seed + s * 100003 + b, tally)
        else:
            rows += _tokenise_responses(target, batch, responses, cfg, tally)
        bar.update(len(batch))
    return rows


def _by_source(rows: list[tuple]) -> dict[str, dict]:
    """Sequences, tokens and loss tokens per prompt source (the domains of the mix; ``source_of`` each id)."""
    out: dict[str, dict] = {}
    for seq, mask, sid in rows:
        d = out.setdefault(source_of(sid), {"sequences": 0, "tokens": 0, "loss_tokens": 0})
        d["sequences"] += 1
        d["tokens"] += len(seq)
        d["loss_tokens"] += int(sum(mask))
    return out


def _shard(target, chunk: list, s: int, cfg: DatagenConfig, responses: dict[str, dict] | None, tally: _Tally,
           bar, engine: EngineGenerator | None = None) -> tuple[dict, dict, list[str]] | None:
    """One shard's tensors, metadata and sequence ids (None when no sequence fits max_len)."""
    rows = _rows(target, chunk, s, cfg, responses, tally, bar, engine)
    parts = _features(target, rows, cfg, tally)
    if not rows:
        return None
    meta = {"prompt_ids_sha256": hashlib.sha256("\n".join(r[2] for r in rows).encode()).hexdigest(),
            "by_source": _by_source(rows)}
    return pack(parts, [len(r[0]) for r in rows]), meta, [r[2] for r in rows]


def run(target, prompt_set, out: str | Path, cfg: DatagenConfig, *, progress: bool = True,
        responses: dict[str, dict] | None = None, stop_after_shards: int | None = None,
        time_budget_s: float | None = None) -> dict:
    """Regenerate and featurise ``prompt_set`` into ``out``; resumable; returns the manifest.

    ``responses`` (from ``regenerate_via_server``) replaces local generation: each
    prompt's conversation is re-tokenised with the chat template.
    """
    cfg.check()
    out = Path(out)
    prompts = _checked_prompts(prompt_set, responses)
    if responses is not None:
        cfg.source = "sglang"
    manifest = _start(target, prompt_set, out, cfg)
    engine = None
    if cfg.generator == "engine" and responses is None:
        engine = EngineGenerator(target, rows=cfg.batch_size, max_len=cfg.max_len, seed=cfg.seed)
    tally = _Tally()
    t_start = time.perf_counter()
    bar = progress_bar(len(prompts), f"datagen -> {out.name}", progress)
    for s in range((len(prompts) + cfg.shard_size - 1) // cfg.shard_size):
        name, chunk = shard_name(s), prompts[s * cfg.shard_size:(s + 1) * cfg.shard_size]
        if _already_written(manifest, out, name):
            tally.skipped += 1
            bar.update(len(chunk))
            continue
        shard = _shard(target, chunk, s, cfg, responses, tally, bar, engine)
        if shard is None:
            continue
        tensors, meta, ids = shard
        manifest["shards"][name] = write_shard(out / name, tensors, meta, sequence_ids=ids)
        tally.written += 1
        write_manifest(out, manifest, cfg)
        if stop_after_shards is not None and tally.written >= stop_after_shards:
            break
        if time_budget_s is not None and time.perf_counter() - t_start >= time_budget_s:
            tally.stopped_by_budget = True  # no new shard after the budget; a rerun resumes the rest
            break
    bar.close()
    manifest["last_run"] = tally.last_run(time.perf_counter() - t_start)
    if engine is not None:
        d = engine.decoder
        manifest["last_run"]["engine"] = {"rows": d.rows, "compiled": d.compiled, "compile_error": d.compile_error,
                                          "row_utilisation_frac": round(d.stats.utilisation, 4),
                                          "capture_s": round(d.stats.capture_s, 3), "prefills": d.stats.prefills}
    write_manifest(out, manifest, cfg)
    if not manifest["shards"]:
        raise BadInput("no sequence fits --max-len", where="--max-len", expected="prompts shorter than --max-len",
                       found=f"{tally.too_long} prompts too long")
    return manifest


# ----------------------------------------------------------------------------- one call for the runbook


def build(target_path: str | Path, prompts, out: str | Path, cfg: DatagenConfig, *, device: str = "cpu",
          model_dtype: str | None = None, device_map: str | None = None, server: str | None = None,
          server_model: str = "default", progress: bool = True, time_budget_s: float | None = None) -> dict:
    """Load the target, regenerate (locally or through ``server``), featurise; returns the manifest."""
    cfg.check()
    out = Path(out)
    dtype = model_dtype or ("bfloat16" if device.startswith("cuda") or device_map else "float32")
    target = load_target(target_path, device=device, dtype=dtype, device_map=device_map)
    responses = None
    if server:
        client = SGLangClient(server, model=server_model, option="--server")
        out.mkdir(parents=True, exist_ok=True)
        responses = regenerate_via_server(prompts.prompts, client, cfg, out / RESPONSES, progress=progress)
    manifest = run(target, prompts, out, cfg, progress=progress, responses=responses, time_budget_s=time_budget_s)
    manifest["target_path"] = str(target_path)
    write_manifest(out, manifest, cfg)
    return manifest


def storage_report(manifest: dict) -> dict:
    """The numbers a recorded datagen run keeps (units in the names)."""
    tot, last, ident = manifest["totals"], manifest.get("last_run", {}), manifest["identity"]
    return {
        "sequences_count": tot["sequences"], "tokens_count": tot["tokens"], "loss_tokens_count": tot["loss_tokens"],
        "shard_bytes": tot["shard_bytes"], "bytes_per_token_bytes": tot["bytes_per_token"],
        "hidden_state_bytes_per_token_bytes": tot["hidden_bytes_per_token"],
        "target_hidden_size_count": ident["target"]["hidden_size"],
        "generate_tok_s": last.get("generate_tok_s"), "features_tok_s": last.get("features_tok_s"),
        "wall_s": last.get("wall_s"), "processes_count": last.get("processes_count", 1),
        "responses_per_prompt_count": len(ident["config"].get("sample_temperatures") or ()) + 1,
        "by_source": {source_key(src): {"sequences_count": d["sequences"], "tokens_count": d["tokens"],
                                         "loss_tokens_count": d["loss_tokens"]}
                      for src, d in (tot.get("by_source") or {}).items()},
    }


def render_text(manifest: dict, out: str | Path) -> str:
    tot, last = manifest["totals"], manifest.get("last_run", {})
    return "\n".join([
        f"dataset {out}: {tot['sequences']} sequences, {tot['tokens']} tokens ({tot['loss_tokens']} loss tokens) "
        f"in {tot['shards']} shards",
        f"storage: {tot['bytes_per_token']} bytes/token on disk; hidden states {tot['hidden_bytes_per_token']} "
        f"bytes/token; {tot['shard_bytes'] / 1e6:.1f} MB",
        f"this run: wrote {last.get('shards_written_count')} shards, skipped {last.get('shards_skipped_count')}; "
        f"generate {last.get('generate_tok_s')} tok/s, features {last.get('features_tok_s')} tok/s, "
        f"{last.get('wall_s')} s",
    ])
