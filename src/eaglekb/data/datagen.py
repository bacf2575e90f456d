"""Training data for EAGLE-3 drafters: self-distilled responses and the target's features.

Owns: turning a prompt set into drafter training data.

1. *Regenerate* each prompt's response with the target itself (self-distillation: the
   drafter learns the target's own outputs), chat template applied, batched, greedy or
   sampled; locally through transformers ``generate`` or, for targets that do not fit
   one GPU, through a running SGLang server's OpenAI-compatible API (``ServerClient``,
   resumable through a JSON-lines progress file).
2. *Featurise*: one teacher-forced target pass per batch stores, per token, the token
   id, the loss mask (assistant tokens only), the target's auxiliary hidden states at
   the capture points (bf16), the target's final (post-norm) hidden state and the
   argmax of the target's logits. The final hidden state, times the target's lm_head
   (saved once per dataset in ``target_head.safetensors``), gives the target's exact
   distribution over *any* draft vocabulary at training time, so one dataset serves
   every mapping; top-k logits would tie the data to one vocabulary and truncate the
   distribution. It costs ``H*2`` bytes per token against ``3*H*2`` for the aux states.
   ``store_final_hidden=False`` keeps only the argmax (hard labels).
3. *Store* packed sequences in safetensors shards (written atomically: temp file, then
   rename) plus ``manifest.json`` (corpus manifests, target, capture points, counts,
   bytes per token, throughput). A rerun skips shards already written, so an
   interrupted run resumes; a rerun with another config is refused.

``features="online"`` stores token ids and masks only; training then runs the target
per batch (``OnlineFeatures``) when storage does not fit.

Knows nothing about drafters, vocab mappings, training or the task runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError, Unavailable
from eaglekb.models.sources import sha256_files

FORMAT = "eaglekb-eagle3-data"
FORMAT_VERSION = 1
#: Noise of a recorded datagen run: throughput within 25%, bytes per token within 64 bytes.
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.25,
         "tolerance_abs": {"bytes_per_token_bytes": 64.0}}
MANIFEST = "manifest.json"
HEAD_FILE = "target_head.safetensors"
RESPONSES = "responses.jsonl"
MODES = ("greedy", "sampled")
FEATURES = ("stored", "online")


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
        if self.mode == "sampled" and not self.temperature > 0:
            raise BadInput("sampled mode needs a positive temperature", where="temperature", expected="> 0",
                           found=str(self.temperature))


# ----------------------------------------------------------------------------- small helpers


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_shard_tensor(file: Path, name: str):
    """One whole tensor of a shard; a truncated or corrupt shard is one IntegrityError line."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as fh:
            return fh.get_tensor(name)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types on corrupt data
        raise IntegrityError("unreadable shard (truncated or corrupt)", where=str(file),
                             found=str(exc).splitlines()[0][:120]) from None


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


# ----------------------------------------------------------------------------- chat template


def chat_prefix_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of the prompt with the chat template and the assistant header applied."""
    if tokenizer is None:
        raise MissingFile("the target has no tokenizer", where="target folder",
                          expected="tokenizer files beside the weights", found="none")
    if not getattr(tokenizer, "chat_template", None):
        raise Incompatible("the target's tokenizer has no chat template", where="tokenizer",
                           expected="a chat_template (self-distillation needs the chat format)", found="none")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_ids(tokenizer, messages: Sequence[dict], response: str) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a conversation whose last turn is the assistant's ``response``.

    The mask is 1 on the tokens after the assistant header (the response and its end
    marker), 0 on the prompt. Refuses a template whose prompt part is not a prefix of
    the full conversation (the mask would be wrong).
    """
    prefix = chat_prefix_ids(tokenizer, messages)
    full_msgs = [*messages, {"role": "assistant", "content": response}]
    text = tokenizer.apply_chat_template(full_msgs, tokenize=False, add_generation_prompt=False)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if ids[: len(prefix)] != prefix:
        raise Incompatible("chat template: the prompt is not a prefix of the conversation", where="tokenizer",
                           expected="prompt tokens then response tokens", found="a different tokenisation",
                           fix="use a template that renders the assistant turn after the generation prompt")
    return ids, [0] * len(prefix) + [1] * (len(ids) - len(prefix))


# ----------------------------------------------------------------------------- targets


def load_target(path: str | Path, *, device: str = "cpu", dtype: str = "bfloat16",
                device_map: str | None = None, capture_points: Sequence[int] | None = None):
    """An ``eaglekb.models.target.Target``; ``device_map`` (e.g. "auto") spreads a large target over GPUs."""
    from eaglekb.models.target import Target

    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingFile("target folder has no config.json", where=str(path),
                          fix="run invoke models.prepare or give a transformers checkpoint folder")
    if device_map is None:
        return Target.load(path, dtype=dtype, device=device, capture_points=capture_points)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), device_map=device_map)
    except ImportError as exc:
        raise Unavailable("device_map needs the accelerate package", where="device_map",
                          found=str(exc).splitlines()[0], fix="python -m pip install accelerate") from None
    return Target(model, AutoTokenizer.from_pretrained(str(path)), capture_points)


def save_target_head(target, out: Path, dtype: str) -> dict:
    """Write the target's input embeddings and lm_head once per dataset (frozen in training)."""
    import torch
    from safetensors.torch import save_file

    embed = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    tensors = {"embed_tokens.weight": embed.detach().to(getattr(torch, dtype)).cpu().contiguous()}
    if not tied:
        tensors["lm_head.weight"] = head.detach().to(getattr(torch, dtype)).cpu().contiguous()
    tmp = out / f".{HEAD_FILE}.tmp-{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"tied": str(tied).lower()})
    os.replace(tmp, out / HEAD_FILE)
    return {"file": HEAD_FILE, "tied": tied, "bytes": (out / HEAD_FILE).stat().st_size}


# ----------------------------------------------------------------------------- regeneration (local)


def generate_responses(target, prefixes: list[list[int]], cfg: DatagenConfig, *, seed: int) -> list[list[int]]:
    """Batched ``generate`` over left-padded prompts; each response ends at its first EOS (kept)."""
    import torch
    from transformers import GenerationConfig

    tok = target.tokenizer
    model = target.model
    eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    if eos is None:
        eos = tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids))
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gen = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens, do_sample=cfg.mode == "sampled",
        temperature=cfg.temperature if cfg.mode == "sampled" else None,
        top_p=cfg.top_p if cfg.mode == "sampled" else None, top_k=None,
        pad_token_id=int(pad), eos_token_id=sorted(eos_ids),
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                             generation_config=gen)
    responses = []
    for row in out[:, width:].tolist():
        resp = []
        for t in row:
            resp.append(int(t))
            if t in eos_ids:
                break
        responses.append(resp)
    return responses


# ----------------------------------------------------------------------------- regeneration (SGLang server)


class ServerClient:
    """A running SGLang (or any OpenAI-compatible) server's ``/v1/chat/completions``."""

    def __init__(self, base_url: str, model: str = "default", *, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout

    def build_request(self, messages: Sequence[dict], cfg: DatagenConfig, *, seed: int | None = None) -> dict:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": cfg.max_new_tokens}
        if cfg.mode == "greedy":
            body["temperature"] = 0.0
        else:
            body.update(temperature=cfg.temperature, top_p=cfg.top_p)
            if seed is not None:
                body["seed"] = int(seed)
        return body

    @staticmethod
    def parse_response(doc: Any, where: str = "response") -> tuple[str, str | None]:
        """(assistant text, finish_reason) of a chat-completions response; one line on a bad shape."""
        try:
            choice = doc["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise SchemaError("not a chat-completions response", where=where,
                              expected='{"choices": [{"message": {"content": ...}}]}',
                              found=json.dumps(doc)[:120] if not isinstance(doc, str) else doc[:120]) from None
        if not isinstance(content, str):
            raise SchemaError("response content is not text", where=where, expected="a string",
                              found=type(content).__name__)
        return content, choice.get("finish_reason")

    def complete(self, messages: Sequence[dict], cfg: DatagenConfig, *,
                 seed: int | None = None) -> tuple[str, str | None]:
        import urllib.error
        import urllib.request

        url = f"{self.base_url}/v1/chat/completions"
        data = json.dumps(self.build_request(messages, cfg, seed=seed)).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()[:200].decode(errors="replace").replace("\n", " ")
            raise Unavailable("server answered with an error", where=url, expected="HTTP 200",
                              found=f"HTTP {exc.code}: {body}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unavailable("server unreachable", where=url, found=str(reason),
                              fix="start it (python -m sglang.launch_server ...) or fix --server") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise SchemaError("server response is not JSON", where=url,
                              found=raw[:80].decode(errors="replace")) from None
        return self.parse_response(doc, url)


def read_progress(path: Path) -> dict[str, dict]:
    """Responses already received (by prompt id); a torn last line from an interruption is dropped."""
    done: dict[str, dict] = {}
    if not path.is_file():
        return done
    raw = path.read_bytes()
    keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
    if len(keep) != len(raw):
        with open(path, "r+b") as fh:  # drop the torn line so appends stay well-formed
            fh.truncate(len(keep))
    for n, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            done[str(row["id"])] = row
        except (ValueError, KeyError, TypeError):
            raise IntegrityError("progress file line is not a response record", where=f"{path}:{n}",
                                 expected='{"id": ..., "response": ...}', found=line[:80]) from None
    return done


def regenerate_via_server(prompts, client: ServerClient, cfg: DatagenConfig, progress_file: Path, *,
                          progress: bool = True, on_response=None) -> dict[str, dict]:
    """Ask the server for each prompt not yet in ``progress_file``; append each answer as one line.

    Resumable: a rerun reads the file and skips the ids it holds. Returns all records by id.
    """
    progress_file = Path(progress_file)
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    done = read_progress(progress_file)
    todo = [p for p in prompts if p.id not in done]
    bar = _bar(len(todo), "regenerate (server)", progress)
    with open(progress_file, "a", encoding="utf-8") as fh:
        for i, p in enumerate(todo):
            seed = cfg.seed + int(hashlib.sha256(p.id.encode()).hexdigest()[:8], 16) if cfg.mode == "sampled" else None
            text, finish = client.complete(p.messages, cfg, seed=seed)
            row = {"id": p.id, "messages": list(p.messages), "response": text, "finish_reason": finish}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()
            done[p.id] = row
            bar.update(1)
            if on_response is not None:
                on_response(i, row)
    bar.close()
    return done


# ----------------------------------------------------------------------------- features


def featurise(target, seqs: list[list[int]], masks: list[list[int]], *, dtype: str = "bfloat16",
              store_final_hidden: bool = True, with_hidden: bool = True) -> dict:
    """One teacher-forced target pass over right-padded sequences; returns packed per-token tensors."""
    import torch

    n = len(seqs)
    width = max(len(s) for s in seqs)
    ids = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    keep = attn.bool()
    out = {
        "input_ids": ids[keep].to(torch.int32),
        "loss_mask": torch.cat([torch.tensor(m, dtype=torch.uint8) for m in masks]),
    }
    if with_hidden:
        st = getattr(torch, dtype)
        res = target.forward(ids.to(target.device), attention_mask=attn.to(target.device))
        k = keep.to(res.aux_hidden.device)
        out["aux_hidden"] = res.aux_hidden[k].to(st).cpu()
        out["target_argmax"] = res.logits.argmax(-1)[k].to(torch.int32).cpu()
        if store_final_hidden:
            out["final_hidden"] = res.final_hidden[k].to(st).cpu()
    return out


def _pack(parts: list[dict], lengths: list[int]) -> dict:
    import torch

    tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    tensors["offsets"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    return tensors


def write_shard(path: Path, tensors: dict, meta: dict) -> dict:
    """Atomically write one shard; returns its manifest entry."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
              metadata={k: json.dumps(v) for k, v in meta.items()})
    os.replace(tmp, path)
    return {
        "sequences": int(tensors["offsets"].numel() - 1),
        "tokens": int(tensors["input_ids"].numel()),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "bytes": path.stat().st_size,
        "sha256": sha256_files([path]),
        **meta,
    }


# ----------------------------------------------------------------------------- the run


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="seq", dynamic_ncols=True, mininterval=2.0)


def _identity(target, prompts_manifest: dict, cfg: DatagenConfig, extra: dict) -> dict:
    return {
        "target": target_summary(target.model.config),  # path not included: the same model elsewhere resumes
        "capture_points": list(target.capture_points),
        "prompts_sha256": prompts_manifest.get("sha256"),
        "config": asdict(cfg),
        **extra,
    }


def _read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise IntegrityError("dataset manifest is not valid JSON", where=str(path), found=str(exc)) from None
    if doc.get("format") != FORMAT:
        raise SchemaError("not an eaglekb dataset manifest", where=str(path), expected=FORMAT,
                          found=repr(doc.get("format")))
    return doc


def _prepare_out(out: Path, identity: dict) -> dict:
    """The manifest to continue from: a fresh one, or the existing one if it is the same config."""
    out.mkdir(parents=True, exist_ok=True)
    existing = _read_manifest(out)
    ident_hash = config_hash(identity)
    if existing is not None:
        if existing.get("identity_hash") != ident_hash:
            where, old, new = first_difference(existing.get("identity", {}), identity)
            diff = f"{where}: {old!r} != {new!r}"
            raise Incompatible("output folder holds a dataset of another config", where=str(out / MANIFEST),
                               expected=f"identity {ident_hash}", found=f"{existing.get('identity_hash')} ({diff})",
                               fix="use another --out (nothing was overwritten)")
        return existing
    if any(out.glob("shard-*.safetensors")):
        raise Incompatible("output folder holds shards but no manifest", where=str(out),
                           fix="use an empty --out (nothing was overwritten)")
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "identity": identity,
            "identity_hash": ident_hash, "shards": {}}


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first (dotted path, old, new) where two nested config dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return path, a, b


def run(target, prompt_set, out: str | Path, cfg: DatagenConfig, *, progress: bool = True,
        responses: dict[str, dict] | None = None, stop_after_shards: int | None = None) -> dict:
    """Regenerate and featurise ``prompt_set`` into ``out``; resumable; returns the manifest.

    ``responses`` (from ``regenerate_via_server``) replaces local generation: each
    prompt's conversation is re-tokenised with the chat template.
    """
    import torch

    cfg.check()
    out = Path(out)
    prompts = list(prompt_set.prompts)
    if not prompts:
        raise BadInput("empty prompt set", where=getattr(prompt_set, "name", "prompts"), expected=">= 1 prompt",
                       found="0")
    if responses is not None:
        cfg.source = "sglang"
        missing = [p.id for p in prompts if p.id not in responses]
        if missing:
            raise BadInput("server responses missing for some prompts", where="responses",
                           expected=f"{len(prompts)} responses", found=f"none for {missing[0]} (+{len(missing) - 1})",
                           fix="rerun the server regeneration; it resumes")
    identity = _identity(target, prompt_set.manifest, cfg, {})
    manifest = _prepare_out(out, identity)
    manifest["prompts"] = prompt_set.manifest
    with_hidden = cfg.features == "stored"
    if with_hidden and not (out / HEAD_FILE).is_file():
        manifest["target_head"] = save_target_head(target, out, cfg.dtype)
    elif with_hidden:
        manifest.setdefault("target_head", {"file": HEAD_FILE})
    n_shards = (len(prompts) + cfg.shard_size - 1) // cfg.shard_size
    skipped = too_long = 0
    gen_s = feat_s = 0.0
    gen_tokens = feat_tokens = 0
    written = 0
    t_start = time.perf_counter()
    bar = _bar(len(prompts), f"datagen -> {out.name}", progress)
    for s in range(n_shards):
        name = f"shard-{s:05d}.safetensors"
        chunk = prompts[s * cfg.shard_size:(s + 1) * cfg.shard_size]
        entry = manifest["shards"].get(name)
        if entry is not None and (out / name).is_file() and (out / name).stat().st_size == entry.get("bytes"):
            skipped += 1
            bar.update(len(chunk))
            continue
        seqs: list[list[int]] = []
        masks: list[list[int]] = []
        ids_kept: list[str] = []
        for b in range(0, len(chunk), cfg.batch_size):
            batch = chunk[b:b + cfg.batch_size]
            if responses is None:
                prefixes = [chat_prefix_ids(target.tokenizer, p.messages) for p in batch]
                ok = [i for i, pre in enumerate(prefixes) if len(pre) < cfg.max_len - 1]
                too_long += len(batch) - len(ok)
                if ok:
                    t0 = time.perf_counter()
                    resp = generate_responses(target, [prefixes[i] for i in ok], cfg,
                                              seed=cfg.seed + s * 100003 + b)
                    gen_s += time.perf_counter() - t0
                    gen_tokens += sum(len(r) for r in resp)
                    for i, r in zip(ok, resp):
                        full = (prefixes[i] + r)[: cfg.max_len]
                        seqs.append(full)
                        masks.append(([0] * len(prefixes[i]) + [1] * len(r))[: cfg.max_len])
                        ids_kept.append(batch[i].id)
            else:
                for p in batch:
                    full, mask = conversation_ids(target.tokenizer, p.messages, responses[p.id]["response"])
                    if sum(mask[: cfg.max_len]) == 0:
                        too_long += 1
                        continue
                    seqs.append(full[: cfg.max_len])
                    masks.append(mask[: cfg.max_len])
                    ids_kept.append(p.id)
            bar.update(len(batch))
        parts = []
        t0 = time.perf_counter()
        for b in range(0, len(seqs), cfg.batch_size):
            parts.append(featurise(target, seqs[b:b + cfg.batch_size], masks[b:b + cfg.batch_size],
                                   dtype=cfg.dtype, store_final_hidden=cfg.store_final_hidden,
                                   with_hidden=with_hidden))
        if with_hidden and target.device.type == "cuda":
            torch.cuda.synchronize()
        feat_s += time.perf_counter() - t0
        feat_tokens += sum(len(x) for x in seqs)
        if not seqs:
            continue
        tensors = _pack(parts, [len(x) for x in seqs])
        meta = {"prompt_ids_sha256": hashlib.sha256("\n".join(ids_kept).encode()).hexdigest()}
        manifest["shards"][name] = write_shard(out / name, tensors, meta)
        written += 1
        _write_manifest(out, manifest, cfg)
        if stop_after_shards is not None and written >= stop_after_shards:
            break
    bar.close()
    wall = time.perf_counter() - t_start
    manifest["last_run"] = {
        "shards_written_count": written, "shards_skipped_count": skipped, "too_long_count": too_long,
        "wall_s": round(wall, 3), "generate_s": round(gen_s, 3), "features_s": round(feat_s, 3),
        "generated_tokens": gen_tokens, "featurised_tokens": feat_tokens,
        "generate_tok_s": round(gen_tokens / gen_s, 2) if gen_s else None,
        "features_tok_s": round(feat_tokens / feat_s, 2) if feat_s else None,
    }
    _write_manifest(out, manifest, cfg)
    if not manifest["shards"]:
        raise BadInput("no sequence fits max_len", where="max_len", expected="prompts shorter than max_len",
                       found=f"{too_long} prompts too long")
    return manifest


def _write_manifest(out: Path, manifest: dict, cfg: DatagenConfig) -> None:
    shards = manifest["shards"]
    tokens = sum(e["tokens"] for e in shards.values())
    shard_bytes = sum(e["bytes"] for e in shards.values())
    t = manifest["identity"]["target"]
    item = {"bfloat16": 2, "float16": 2, "float32": 4}[cfg.dtype]
    hidden_per_token = 0
    if cfg.features == "stored":
        hidden_per_token = 3 * t["hidden_size"] * item + (t["hidden_size"] * item if cfg.store_final_hidden else 0)
    manifest["totals"] = {
        "shards": len(shards),
        "sequences": sum(e["sequences"] for e in shards.values()),
        "tokens": tokens,
        "loss_tokens": sum(e["loss_tokens"] for e in shards.values()),
        "shard_bytes": shard_bytes,
        "bytes_per_token": round(shard_bytes / tokens, 2) if tokens else None,
        "hidden_bytes_per_token": hidden_per_token,
    }
    _atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- reading


@dataclass
class Dataset:
    """A datagen folder opened for training: its manifest, shard index and lazy per-sequence reads."""

    path: Path
    manifest: dict
    shard_files: list[Path]
    offsets: list[list[int]]  # per shard: sequence start offsets (len = sequences + 1)
    index: list[tuple[int, int]] = field(default_factory=list)  # global sequence -> (shard, local)
    _handles: dict = field(default_factory=dict, repr=False)  # open shard readers (memory-mapped)

    @property
    def target(self) -> dict:
        return self.manifest["identity"]["target"]

    @property
    def capture_points(self) -> list[int]:
        return list(self.manifest["identity"]["capture_points"])

    @property
    def features(self) -> str:
        return self.manifest["identity"]["config"]["features"]

    @property
    def has_final_hidden(self) -> bool:
        cfg = self.manifest["identity"]["config"]
        return cfg["features"] == "stored" and bool(cfg["store_final_hidden"])

    def __len__(self) -> int:
        return len(self.index)

    def length(self, i: int) -> int:
        s, j = self.index[i]
        return self.offsets[s][j + 1] - self.offsets[s][j]

    def get(self, i: int, max_len: int | None = None) -> dict:
        """One sequence's tensors (``input_ids``, ``loss_mask``, and the stored features)."""
        from safetensors import safe_open

        s, j = self.index[i]
        a, b = self.offsets[s][j], self.offsets[s][j + 1]
        if max_len is not None:
            b = min(b, a + max_len)
        file = self.shard_files[s]
        try:
            fh = self._handles.get(s)
            if fh is None:
                fh = self._handles[s] = safe_open(str(file), framework="pt")
            return {k: fh.get_slice(k)[a:b] for k in fh.keys() if k != "offsets"}
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types on corrupt data
            raise IntegrityError("unreadable shard (truncated or corrupt)", where=str(file),
                                 found=str(exc).splitlines()[0][:120]) from None

    def token_ids_and_masks(self) -> Iterator[tuple[Any, Any]]:
        """(input_ids, loss_mask) per shard, for vocab statistics."""
        for file in self.shard_files:
            yield read_shard_tensor(file, "input_ids"), read_shard_tensor(file, "loss_mask")

    def target_head(self) -> tuple[Any, Any]:
        """(embed_tokens, lm_head) of the target, as stored with the data."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        file = self.path / HEAD_FILE
        if not file.is_file():
            raise MissingFile("dataset has no target head file", where=str(file),
                              fix="rerun invoke datagen with stored features")
        try:
            t = load_file(str(file))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise IntegrityError("unreadable target head file", where=str(file),
                                 found=str(exc).splitlines()[0][:120]) from None
        return t["embed_tokens.weight"], t.get("lm_head.weight", t["embed_tokens.weight"])


def open_dataset(path: str | Path, *, verify: str = "size") -> Dataset:
    """Open a datagen folder; ``verify``: "size" (cheap: sizes and headers) or "sha256" (full hash)."""

    path = Path(path)
    if not path.is_dir():
        raise MissingFile("dataset folder not found", where=str(path), fix="run invoke datagen first")
    manifest = _read_manifest(path)
    if manifest is None:
        raise MissingFile("dataset folder has no manifest.json", where=str(path), fix="run invoke datagen first")
    files, offsets, index = [], [], []
    for name in sorted(manifest.get("shards", {})):
        entry = manifest["shards"][name]
        file = path / name
        if not file.is_file():
            raise MissingFile("shard listed in the manifest is missing", where=str(file))
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise IntegrityError("shard size differs from the manifest (truncated or replaced)", where=str(file),
                                 expected=f"{entry['bytes']} bytes", found=f"{size} bytes")
        if verify == "sha256" and sha256_files([file]) != entry["sha256"]:
            raise IntegrityError("shard hash differs from the manifest", where=str(file),
                                 expected=entry["sha256"][:16], found="another hash")
        off = read_shard_tensor(file, "offsets").tolist()
        s = len(files)
        files.append(file)
        offsets.append(off)
        index.extend((s, j) for j in range(len(off) - 1))
    return Dataset(path, manifest, files, offsets, index)


# ----------------------------------------------------------------------------- online features


class OnlineFeatures:
    """Computes what a stored dataset would hold, per batch, with the target in memory."""

    def __init__(self, target, store_final_hidden: bool = True):
        self.target = target
        self.store_final_hidden = store_final_hidden

    def __call__(self, input_ids, valid) -> dict:
        dev = self.target.device
        res = self.target.forward(input_ids.to(dev), attention_mask=valid.long().to(dev))
        out = {"aux_hidden": res.aux_hidden, "target_argmax": res.logits.argmax(-1)}
        if self.store_final_hidden:
            out["final_hidden"] = res.final_hidden
        return {k: v.to(input_ids.device) for k, v in out.items()}


def storage_report(manifest: dict) -> dict:
    """The numbers a datagen baseline records (units in the names)."""
    tot = manifest["totals"]
    last = manifest.get("last_run", {})
    ident = manifest["identity"]
    return {
        "sequences_count": tot["sequences"],
        "tokens_count": tot["tokens"],
        "loss_tokens_count": tot["loss_tokens"],
        "shard_bytes": tot["shard_bytes"],
        "bytes_per_token_bytes": tot["bytes_per_token"],
        "hidden_state_bytes_per_token_bytes": tot["hidden_bytes_per_token"],
        "target_hidden_size_count": ident["target"]["hidden_size"],
        "generate_tok_s": last.get("generate_tok_s"),
        "features_tok_s": last.get("features_tok_s"),
        "wall_s": last.get("wall_s"),
    }


# ----------------------------------------------------------------------------- one call for the runbook


def prompt_set(corpus: Sequence[str] | None = None, *, per_source: int = 20, prompts_file: str | None = None,
               seed: int = 0):
    """The training prompt set: a corpus mix (train splits) or a prompts file, checked against the eval sets."""
    from eaglekb.data import corpora

    if prompts_file:
        ps = corpora.read_prompts_file(prompts_file)
    else:
        names = list(corpus or DEFAULT_CORPORA)
        bad = [n for n in names if n in corpora.EVAL_SETS or (n in corpora.SOURCES and corpora.SOURCES[n].eval_only)]
        if bad:
            raise BadInput("evaluation set asked for as training data", where="--corpus",
                           expected=", ".join(n for n in corpora.SOURCES if not corpora.SOURCES[n].eval_only),
                           found=bad[0], fix="evaluation prompts never go into training")
        ps = corpora.mix(names, per_source=per_source, seed=seed)
    for name in corpora.EVAL_SETS:
        corpora.check_disjoint(ps, corpora.load(name, split="eval"))
    ps.manifest["eval_sets_excluded"] = list(corpora.EVAL_SETS)
    return ps


DEFAULT_CORPORA = ("wiki", "chitchat", "gsm8k")


def build(target_path: str | Path, prompts, out: str | Path, cfg: DatagenConfig, *, device: str = "cpu",
          model_dtype: str | None = None, device_map: str | None = None, server: str | None = None,
          server_model: str = "default", progress: bool = True) -> dict:
    """Load the target, regenerate (locally or through ``server``), featurise; returns the manifest."""
    cfg.check()
    out = Path(out)
    dtype = model_dtype or ("bfloat16" if device.startswith("cuda") or device_map else "float32")
    target = load_target(target_path, device=device, dtype=dtype, device_map=device_map)
    responses = None
    if server:
        client = ServerClient(server, server_model)
        out.mkdir(parents=True, exist_ok=True)
        responses = regenerate_via_server(prompts.prompts, client, cfg, out / RESPONSES, progress=progress)
    manifest = run(target, prompts, out, cfg, progress=progress, responses=responses)
    manifest["target_path"] = str(target_path)
    _write_manifest(out, manifest, cfg)
    return manifest


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
