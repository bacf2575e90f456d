"""Regeneration: the target writes each prompt's response (self-distillation).

Owns: loading the target for datagen (``load_target``; ``device_map`` spreads a large
one over GPUs), batched local generation over left-padded prompts (``generate_responses``:
greedy or sampled, each response ending at its first end-of-sequence token), the
engine's continuous batching over a static cache, CUDA-graphed (``EngineGenerator``,
``eaglekb.engine.batch``: about 20x transformers ``generate`` on one GPU, and greedy rows
that do not depend on which prompts share a batch or a GPU), and
regeneration through a running SGLang server (``regenerate_via_server``) for targets
that do not fit one GPU: one chat completion per prompt, appended as one JSON line to
a progress file, so an interrupted run resumes (``read_progress``).

The generation settings (``max_new_tokens``, ``mode``, ``temperature``, ``top_p``,
``seed``) come from any object with those fields (a ``DatagenConfig``). Knows nothing
about features, shards, manifests or the task runner; HTTP is ``eaglekb.models.server``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Protocol, Sequence

from eaglekb.engine.batch import BatchDecoder, Request
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import IntegrityError, MissingFile, Unavailable
from eaglekb.models.server import SGLangClient
from eaglekb.models.target import Target


class GenerationSettings(Protocol):
    """What generation reads from a config (``eaglekb.data.datagen.DatagenConfig`` has it)."""

    max_new_tokens: int
    mode: str  # greedy or sampled
    temperature: float
    top_p: float
    seed: int


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar over sequences (disabled: no output)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="seq", dynamic_ncols=True, mininterval=2.0)


def load_target(path: str | Path, *, device: str = "cpu", dtype: str = "bfloat16",
                device_map: str | None = None, capture_points: Sequence[int] | None = None) -> Target:
    """An ``eaglekb.models.target.Target``; ``device_map`` (e.g. "auto") spreads a large target over GPUs."""
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


# ----------------------------------------------------------------------------- local


def _eos_and_pad(target) -> tuple[set[int], int]:
    tok, model = target.tokenizer, target.model
    eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    if eos is None:
        eos = tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids))
    return eos_ids, int(pad)


def _cut_at_eos(row: list[int], eos_ids: set[int]) -> list[int]:
    out = []
    for t in row:
        out.append(int(t))
        if t in eos_ids:
            break
    return out


def generate_responses(target, prefixes: list[list[int]], cfg: GenerationSettings, *, seed: int) -> list[list[int]]:
    """Batched ``generate`` over left-padded prompts; each response ends at its first EOS (kept)."""
    import torch
    from transformers import GenerationConfig

    eos_ids, pad = _eos_and_pad(target)
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    sampled = cfg.mode == "sampled"
    gen = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens, do_sample=sampled, temperature=cfg.temperature if sampled else None,
        top_p=cfg.top_p if sampled else None, top_k=None, pad_token_id=pad, eos_token_id=sorted(eos_ids),
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    generation_config=gen)
    return [_cut_at_eos(row, eos_ids) for row in out[:, width:].tolist()]


class EngineGenerator:
    """Responses through the engine's ``BatchDecoder`` (one per run: its cache and graphs are reused)."""

    def __init__(self, target, *, rows: int, max_len: int, seed: int = 0):
        eos_ids, _ = _eos_and_pad(target)
        engine_target = TargetModel(target.model, list(target.capture_points), max_len)
        self.decoder = BatchDecoder(engine_target, rows, max_len, stop_ids=sorted(eos_ids),
                                    graphs=engine_target.device.type == "cuda", seed=seed)

    def __call__(self, prefixes: list[list[int]], temperatures: list[float], max_new_tokens: int) -> list[list[int]]:
        """One response per (prefix, temperature): 0 is greedy; each ends at its first EOS (kept)."""
        room = self.decoder.max_len - 2
        reqs = [Request(p, t, max(1, min(max_new_tokens, room - len(p) + 1))) for p, t in zip(prefixes, temperatures)]
        return self.decoder.generate(reqs)


# ----------------------------------------------------------------------------- through a server


def chat_options(cfg: GenerationSettings, prompt_id: str) -> dict:
    """``SGLangClient.chat`` options: greedy (temperature 0), or sampled with a seed per prompt id."""
    if cfg.mode != "sampled":
        return {"max_tokens": cfg.max_new_tokens, "temperature": 0.0}
    return {"max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "seed": cfg.seed + int(hashlib.sha256(prompt_id.encode()).hexdigest()[:8], 16)}


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


def regenerate_via_server(prompts, client: SGLangClient, cfg: GenerationSettings, progress_file: Path, *,
                          progress: bool = True, on_response: Callable[[int, dict], None] | None = None
                          ) -> dict[str, dict]:
    """Ask the server for each prompt not yet in ``progress_file``; append each answer as one line.

    Resumable: a rerun reads the file and skips the ids it holds. Returns all records by id.
    """
    progress_file = Path(progress_file)
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    done = read_progress(progress_file)
    todo = [p for p in prompts if p.id not in done]
    bar = progress_bar(len(todo), "regenerate (server)", progress)
    with open(progress_file, "a", encoding="utf-8") as fh:
        for i, p in enumerate(todo):
            text, finish = client.chat(p.messages, **chat_options(cfg, p.id))
            row = {"id": p.id, "messages": list(p.messages), "response": text, "finish_reason": finish}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()
            done[p.id] = row
            bar.update(1)
            if on_response is not None:
                on_response(i, row)
    bar.close()
    return done
