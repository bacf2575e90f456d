"""Checking a model folder that came from elsewhere, before anything loads or allocates it.

Owns: ``check_model_folder`` (config.json a JSON object whose size fields are whole numbers in range and
whose float fields are numbers; weights in safetensors only, a pickle checkpoint refused and never opened;
the output head the config promises present in the weights, ``check_head``; no NaN or infinity in them,
``check_finite_weights``, the same check as a drafter's;
a config that describes a model far larger than its weight files refused before any allocation), and
``load_causal_lm`` (transformers' ``from_pretrained`` with safetensors only, no remote code, and its
failures as one line naming the folder). Knows nothing about drafters, prompts or the task runner.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eaglekb.formats.drafter import nonfinite_error, nonfinite_in_file
from eaglekb.io.errors import EaglekbError, IntegrityError, MissingFile, SchemaError
from eaglekb.io.files import read_json, read_safetensors, safetensors_keys

#: Whole-number size fields of a transformers config and their largest sane value.
INT_FIELDS = {"hidden_size": 1 << 17, "num_hidden_layers": 4096, "num_attention_heads": 4096,
              "num_key_value_heads": 4096, "intermediate_size": 1 << 20, "vocab_size": 1 << 23,
              "max_position_embeddings": 1 << 24, "head_dim": 1 << 14}
#: Positive float fields (also inside ``rope_parameters``).
FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "layer_norm_eps")
#: Checkpoint formats that are pickles: refused, never opened.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def _where(folder: Path, key: str) -> str:
    return f"{folder / 'config.json'}: {key}"


def check_config(folder: Path) -> dict[str, Any]:
    """config.json of ``folder``, with its size and float fields checked (type and range)."""
    cfg = read_json(folder / "config.json", what="model config.json")
    if not isinstance(cfg, dict):
        raise SchemaError("model config.json is not a JSON object", where=str(folder / "config.json"),
                          found=type(cfg).__name__)
    for key, top in INT_FIELDS.items():
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
            raise SchemaError("model config field out of range", where=_where(folder, key),
                              expected=f"a whole number in 1..{top}", found=repr(value)[:80])
    for scope, holder in (("", cfg), ("rope_parameters.", cfg.get("rope_parameters"))):
        if not isinstance(holder, dict):
            continue
        for key in FLOAT_FIELDS:
            value = holder.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise SchemaError("model config field is not a positive number", where=_where(folder, scope + key),
                                  expected="a number > 0", found=repr(value)[:80])
    if cfg.get("rope_scaling") is not None and not isinstance(cfg["rope_scaling"], dict):
        raise SchemaError("model config field has the wrong type", where=_where(folder, "rope_scaling"),
                          expected="null or an object", found=repr(cfg["rope_scaling"])[:80])
    return cfg


def estimated_params(cfg: dict[str, Any]) -> int:
    """Parameters a Llama/Qwen-style config describes (embeddings, attention, MLP), for a size check."""
    h = int(cfg.get("hidden_size") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or (h // max(heads, 1)))
    inter = int(cfg.get("intermediate_size") or 4 * h)
    vocab = int(cfg.get("vocab_size") or 0)
    per_layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * inter
    return vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + layers * per_layer


def weight_files(folder: Path) -> list[Path]:
    """The safetensors weight files of ``folder``; refuses a folder whose weights are only pickles."""
    safetensors = sorted(folder.glob("*.safetensors"))
    pickles = sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if not safetensors and pickles:
        raise IntegrityError("pickle checkpoint refused (never unpickled)", where=str(pickles[0]),
                             expected="weights in *.safetensors", found=", ".join(p.name for p in pickles[:3]),
                             fix="convert the checkpoint to safetensors where you trust it, then use that folder")
    return safetensors


#: model types whose transformers config defaults to an untied lm_head (tie_word_embeddings false).
UNTIED_BY_DEFAULT = ("llama", "qwen2", "mistral")


def check_head(folder: Path, cfg: dict[str, Any], keys: dict[str, Path]) -> None:
    """The output head the config promises is the one the weights hold (transformers would not say).

    Untied (``tie_word_embeddings`` false) without an ``lm_head.weight``: transformers initialises the head at
    random, a model that only looks loaded. Tied with a stored ``lm_head.weight`` that differs from
    ``embed_tokens``: transformers drops the stored head (qwen2.5-coder-0.5b's GGUF holds its own ``output``
    tensor, so a tied config would run another model than the file).
    """
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        if cfg.get("model_type") not in UNTIED_BY_DEFAULT:
            return
        tied = False
    head = next((k for k in keys if k.endswith("lm_head.weight")), None)
    embed = next((k for k in keys if k.endswith("embed_tokens.weight")), None)
    where = str(folder / "config.json")
    if not tied and head is None and embed is not None:
        raise IntegrityError("config expects its own lm_head but the weights hold none", where=f"{where}: "
                             "tie_word_embeddings", expected="lm_head.weight in the safetensors (or "
                             "tie_word_embeddings: true)", found=f"false, and only {embed} (transformers would "
                             "initialise lm_head at random)")
    if tied and head is not None and embed is not None:
        h = read_safetensors(keys[head], keys=[head])[head]
        e = read_safetensors(keys[embed], keys=[embed])[embed]
        if h.shape != e.shape or not bool((h == e).all()):
            gap = f"max |difference| {float((h.float() - e.float()).abs().max()):.3g}" if h.shape == e.shape \
                else f"shapes {list(h.shape)} vs {list(e.shape)}"
            raise IntegrityError("config ties lm_head to the input embeddings, but the weights hold a different "
                                 "lm_head", where=f"{where}: tie_word_embeddings",
                                 expected=f"false (use the stored {head}) or a head equal to {embed}",
                                 found=f"true, stored head differs ({gap}); transformers would drop it")


#: Weight files already found finite in this process: (path, size, mtime), so a run that checks a folder
#: before loading it (probe, bench) reads each tensor once for this check.
_FINITE: set[tuple[str, int, int]] = set()


def check_finite_weights(files: list[Path]) -> None:
    """Every floating tensor of ``files`` holds no NaN and no infinity (one tensor in memory at a time);
    refused with one line naming the file and the tensor: a target that computes NaN would make every
    acceptance and every generated token meaningless."""
    for file in files:
        st = file.stat()
        key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
        if key in _FINITE:
            continue
        bad = nonfinite_in_file(file)
        if bad:
            raise nonfinite_error(bad, str(file), what="model")
        _FINITE.add(key)


def stored_bytes(files: list[Path]) -> int:
    """Bytes of tensor data in safetensors files (their sizes on disk; the headers are small)."""
    return sum(p.stat().st_size for p in files)


def check_model_folder(folder: str | Path, *, weights: bool = True) -> dict[str, Any]:
    """Check a model folder before loading it; returns its config.

    ``weights`` (default): the folder must hold safetensors weights (pickles refused) that are all finite, and
    a config that describes a model far larger than those files (less than one bit per described parameter)
    is refused before transformers allocates it.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise MissingFile("model folder has no config.json", where=str(folder))
    cfg = check_config(folder)
    if not weights:
        return cfg
    files = weight_files(folder)
    if not files:
        raise MissingFile("model folder has no weights", where=str(folder), expected="*.safetensors files",
                          found="none")
    keys = {}
    for file in files:
        keys.update(dict.fromkeys(safetensors_keys(file)[0], file))  # a corrupt file: one line naming it
    check_head(folder, cfg, keys)
    params, stored = estimated_params(cfg), stored_bytes(files)
    if params > 8 * stored + (64 << 20):
        raise IntegrityError("model config describes a model far larger than its weights", where=str(folder),
                             expected=f"about {stored:,} bytes of weights or fewer parameters",
                             found=f"{params:,} parameters in config.json",
                             fix="check config.json (hidden_size, num_hidden_layers, intermediate_size, vocab_size)")
    check_finite_weights(files)
    return cfg


def load_causal_lm(folder: str | Path, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained`` of a checked folder: safetensors only, no remote code,
    a loading failure as one line naming the folder."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    check_model_folder(folder)
    try:
        return AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True, **kwargs)
    except (EaglekbError, ImportError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to load a folder from elsewhere is about that folder
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise IntegrityError("model folder could not be loaded", where=str(folder),
                             expected="a transformers checkpoint (config.json and safetensors weights)",
                             found=f"{type(exc).__name__}: {first}", fix="check config.json against the weights") from None
