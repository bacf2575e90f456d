"""Inspect one EAGLE-3 drafter checkpoint without loading it into a model.

Owns: ``inspect_checkpoint`` (config summary, every tensor's shape and dtype, parameter
counts, findings), the named checks it runs (keys, config, shapes, mapping, dtypes,
target), ``aux_layer_report`` and ``render_inspection``. Everything a loader (probe, bench,
finetune --init) refuses is an error finding here too, through the same functions
(``eaglekb.formats.drafter``: ``layout_problems``, ``expected_shapes``, ``nonfinite_tensors``), so that
no folder passes inspect and fails a probe. Reads the headers, the d2t/t2d tensors, and each
weight file once to check that every weight is finite. The side-by-side comparison
of two checkpoints is ``eaglekb.formats.compare``.

Each finding is ``{code, severity, message}`` with severity ``error`` (SGLang or
vLLM would misbehave, often silently) or ``warning`` (probably unintended);
neutral facts (aux-layer convention, shared embeddings) go to ``notes``. A corrupt or
truncated safetensors file, a missing folder or an unparsable config.json raise an
``EaglekbError`` (one line) instead.

Knows nothing about the torch module, targets beyond their config.json, training or the
task runner.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import torch

from eaglekb.formats.drafter import (
    MASK_KEYS,
    METHOD_FIELD,
    OPTIONAL_KEYS,
    REQUIRED_KEYS,
    SGLANG_ARCH,
    TOKENS_FIELD,
    expected_shapes,
    layout_problems,
    nonfinite_error,
    nonfinite_tensors,
    not_servable_by_sglang,
    read_config,
    read_config_json,
)
from eaglekb.formats.headers import folder_headers
from eaglekb.io.errors import EaglekbError, MissingFile
from eaglekb.io.files import read_safetensors

_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_KNOWN = set(REQUIRED_KEYS) | set(OPTIONAL_KEYS)
_CONFIG_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "num_hidden_layers", "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps",
    "rope_theta", "max_position_embeddings", "hidden_act", "torch_dtype", "tie_word_embeddings",
)
_INT_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "num_hidden_layers", "vocab_size", "draft_vocab_size", "target_hidden_size", "max_position_embeddings")
_SGLANG_KNOWN_FIELDS = set(_CONFIG_FIELDS) | {
    "architectures", "model_type", "eagle_config", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "pretraining_tp", "use_cache", "attention_bias", "attention_dropout",
    "mlp_bias", "rope_scaling", "rope_parameters", "transformers_version", "_name_or_path", "bias",
    "dtype", "norm_before_residual",
}


def _finding(code: str, severity: str, message: str) -> dict:
    return {"code": code, "severity": severity, "message": message}


# ----------------------------------------------------------------------------- reading


def _load_tensor(folder: Path, file: str, key: str) -> torch.Tensor:
    return read_safetensors(folder / file, keys=[key])[key]


def _object(config: dict, key: str, findings: list) -> dict:
    """``config[key]`` when it is an object (or absent: {}); anything else is a finding."""
    value = config.get(key)
    if value is None or isinstance(value, dict):
        return value or {}
    findings.append(_finding("config-field-type", "error", f"config field {key!r} is {value!r:.60}; expected an object"))
    return {}


def _typed(flat: dict, findings: list) -> None:
    """Config values of the wrong type or out of range (a config.json from elsewhere) become error
    findings and are treated as absent by the checks that follow."""
    for key in _INT_FIELDS:
        v = flat.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 1 << 24):
            findings.append(_finding("config-field-type", "error",
                                     f"config field {key!r} is {v!r:.60}; expected a positive whole number"))
            flat[key] = None
    for key in ("rms_norm_eps", "rope_theta"):
        v = flat.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            findings.append(_finding("config-field-type", "error", f"config field {key!r} is {v!r:.60}; expected a number > 0"))
            flat[key] = None
    ids = flat.get("aux_layer_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                              and 0 <= i < 4096 for i in ids)):
        findings.append(_finding("config-field-type", "error", f"aux layer ids are {ids!r:.60}; expected a list of layer numbers"))
        flat["aux_layer_ids"] = None


def _normalise_speculators(config: dict, findings: list) -> tuple[dict, dict[str, str]]:
    layer = _object(config, "transformer_layer_config", findings)
    flat = {k: layer.get(k) for k in _CONFIG_FIELDS if k in layer}
    for k in ("draft_vocab_size", "target_hidden_size", "torch_dtype"):
        if config.get(k) is not None:
            flat[k] = config[k]
    points = config.get("eagle_aux_hidden_state_layer_ids")
    ok = isinstance(points, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in points)
    flat["aux_layer_ids"] = [p - 1 for p in points] if points and ok else (points or None)
    if config.get("speculators_model_type") != "eagle3":
        findings.append(_finding("unknown-architecture", "error",
                                 f"speculators_model_type {config.get('speculators_model_type')!r} "
                                 "is not 'eagle3'"))
    if config.get("norm_before_residual"):
        findings.append(_finding("norm-before-residual", "warning",
                                 "norm_before_residual=true: the residual is the normed hidden "
                                 "state; SGLang's LlamaForCausalLMEagle3 uses the raw one"))
    return flat, {"layers.0.": "midlayer."}


def _normalise_sglang(config: dict, findings: list) -> tuple[dict, dict[str, str]]:
    arch = config.get("architectures") or []
    if not isinstance(arch, list) or SGLANG_ARCH not in arch:
        findings.append(_finding("unknown-architecture", "error",
                                 f"architectures {arch!r} is not [{SGLANG_ARCH!r}]: SGLang will not "
                                 "load it as an EAGLE-3 drafter"))
    flat = {k: config.get(k) for k in _CONFIG_FIELDS if k in config}
    if "rope_theta" not in flat and isinstance(config.get("rope_parameters"), dict):
        flat["rope_theta"] = config["rope_parameters"].get("rope_theta")
    flat["aux_layer_ids"] = _object(config, "eagle_config", findings).get("eagle_aux_hidden_state_layer_ids")
    parallel = not_servable_by_sglang(config)
    if parallel:
        findings.append(_finding("parallel-drafter", "error", f"{parallel}: serve it with eaglekb's engine "
                                 "(invoke bench, invoke probe)"))
    for key in sorted(set(config) - _SGLANG_KNOWN_FIELDS - ({METHOD_FIELD, TOKENS_FIELD} if parallel else set())):
        findings.append(_finding("config-unknown-field", "warning",
                                 f"config field {key!r} is not an EAGLE-3 drafter field; "
                                 "SGLang ignores it"))
    return flat, {"model.": ""}  # SGLang's loader also accepts a model. prefix


def _normalise(config: dict, tensors: dict) -> tuple[str, dict, dict[str, str], list[dict]]:
    """Detect the format; return (format, flat config, canonical-name -> stored-name, findings)."""
    findings: list[dict] = []
    if "speculators_model_type" in config:
        fmt = "speculators"
        flat, rename = _normalise_speculators(config, findings)
    else:
        fmt = "sglang"
        flat, rename = _normalise_sglang(config, findings)
    _typed(flat, findings)
    names: dict[str, str] = {}
    for stored in tensors:
        canon = stored
        for src, dst in rename.items():
            if canon.startswith(src):
                canon = dst + canon[len(src):]
        names[canon] = stored
    return fmt, flat, names, findings


# ----------------------------------------------------------------------------- checks


def _check_keys(config: dict, names: dict[str, str], findings: list) -> None:
    """Tensors SGLang would skip silently, and required ones that are absent."""
    known = _KNOWN | ({"fc.bias"} if config.get("bias") else set()) | \
        (set(MASK_KEYS) if not_servable_by_sglang(config) else set())  # reported once, as parallel-drafter
    for canon, stored in sorted(names.items(), key=lambda kv: kv[1]):
        if canon not in known:
            near = difflib.get_close_matches(canon, sorted(_KNOWN), n=1, cutoff=0.8)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            findings.append(_finding("ignored-key", "error",
                                     f"tensor {stored!r} is not a name SGLang loads: it is skipped "
                                     f"silently{hint}"))
    for key in REQUIRED_KEYS:
        if key not in names:
            sev = "warning" if key == "t2d" else "error"
            note = " (SGLang derives nothing from it, but SpecForge and vLLM read it)" if key == "t2d" else \
                " (SGLang would keep random weights)"
            findings.append(_finding("missing-key", sev, f"required tensor {key!r} is absent{note}"))


def _check_config(config: dict, flat: dict, findings: list) -> None:
    """Missing sizes, no draft_vocab_size, tied embeddings, more than one midlayer."""
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads"):
        if not isinstance(flat.get(key), int):
            findings.append(_finding("config-missing-field", "error",
                                     f"config field {key!r} is missing or not an integer"))
    if flat.get("draft_vocab_size") is None:
        findings.append(_finding("config-missing-field", "error",
                                 "draft_vocab_size is absent: SGLang assumes the full vocab and loads "
                                 "lm_head from the target"))
    layer = config.get("transformer_layer_config")
    if config.get("tie_word_embeddings") or (isinstance(layer, dict) and layer.get("tie_word_embeddings")):
        findings.append(_finding("tied-embeddings", "error",
                                 "tie_word_embeddings=true: SGLang uses embed_tokens as lm_head and "
                                 "ignores the trained lm_head"))
    layers = flat.get("num_hidden_layers", 1)
    if layers not in (None, 1):
        findings.append(_finding("num-hidden-layers", "warning",
                                 f"num_hidden_layers={layers}: eaglekb and most tools expect one midlayer"))


def _check_shapes(flat: dict, shape: dict[str, list[int]], findings: list) -> None:
    """fc, lm_head, norms, attention inputs and embeddings against the config sizes."""
    hidden, vocab, draft_vocab = flat.get("hidden_size"), flat.get("vocab_size"), flat.get("draft_vocab_size")
    target_hidden = flat.get("target_hidden_size") or hidden
    if not isinstance(hidden, int):
        return
    if "fc.weight" in shape:
        fc = shape["fc.weight"]
        if len(fc) != 2 or fc[1] != 3 * (target_hidden or 0) or fc[0] != hidden:
            findings.append(_finding("fc-shape", "error",
                                     f"fc.weight is {fc}; expected [{hidden}, {3 * target_hidden}] "
                                     f"(3 x target hidden {target_hidden})"))
    if isinstance(draft_vocab, int) and "lm_head.weight" in shape and \
            shape["lm_head.weight"] != [draft_vocab, hidden]:
        findings.append(_finding("shape-mismatch", "error",
                                 f"lm_head.weight is {shape['lm_head.weight']}; expected "
                                 f"[{draft_vocab}, {hidden}]"))
    for key in ("norm.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                "midlayer.post_attention_layernorm.weight"):
        if key in shape and shape[key] != [hidden]:
            findings.append(_finding("shape-mismatch", "error", f"{key} is {shape[key]}; expected [{hidden}]"))
    for key in ("q_proj", "k_proj", "v_proj"):
        k = f"midlayer.self_attn.{key}.weight"
        if k in shape and (len(shape[k]) != 2 or shape[k][1] != 2 * hidden):
            findings.append(_finding("shape-mismatch", "error",
                                     f"{k} is {shape[k]}; its input must be 2 x hidden = {2 * hidden} "
                                     "(embedding ++ hidden)"))
    if "embed_tokens.weight" in shape and isinstance(vocab, int) and shape["embed_tokens.weight"] != [vocab, hidden]:
        findings.append(_finding("shape-mismatch", "error",
                                 f"embed_tokens.weight is {shape['embed_tokens.weight']}; expected "
                                 f"[{vocab}, {hidden}]"))


def _check_like_loaders(folder: Path, tensors: dict, shape: dict[str, list[int]], findings: list) -> None:
    """What every loader refuses (probe, bench, finetune --init), with the loaders' own checks: heads that do
    not divide over the KV heads and other layouts the module cannot run, any tensor whose shape is not the
    config's, and weights that are not all finite."""
    try:
        cfg, _fmt = read_config(folder)
    except EaglekbError as exc:
        cfg = None
        if not any(f["severity"] == "error" for f in findings):  # what the loaders refuse, said once
            findings.append(_finding("config-invalid", "error", exc.line()))
    if cfg is not None:
        for code, err in layout_problems(cfg, "config.json"):
            findings.append(_finding(code, "error", err.line()))
        said = " ".join(f["message"] for f in findings)
        for key, want in expected_shapes(cfg, with_embeddings="embed_tokens.weight" in shape).items():
            got = shape.get(key)
            if got is not None and tuple(got) != want and key not in said:
                findings.append(_finding("shape-mismatch", "error", f"{key} is {got}; the config gives {list(want)}"))
    bad: list[str] = []
    for file in sorted({t["file"] for t in tensors.values()}):
        try:
            bad += nonfinite_tensors(read_safetensors(folder / file))
        except (RuntimeError, TypeError):  # a dtype torch cannot test (e.g. float8): not checked here
            continue
    if bad:
        findings.append(_finding("nonfinite-weights", "error", nonfinite_error(bad, str(folder)).line()))


def _check_dtypes(tensors: dict, findings: list) -> None:
    float_dtypes = sorted({t["dtype"] for t in tensors.values() if t["dtype"] in _FLOAT_DTYPES})
    if len(float_dtypes) > 1:
        by = {d: sorted(k for k, t in tensors.items() if t["dtype"] == d) for d in float_dtypes}
        detail = "; ".join(f"{d}: {len(v)} ({v[0]}...)" for d, v in by.items())
        findings.append(_finding("dtype-mix", "warning", f"floating tensors use {len(float_dtypes)} "
                                                        f"dtypes: {detail}"))


def _param_counts(tensors: dict, names: dict[str, str]) -> dict:
    params: dict[str, int] = {}
    for canon, stored in names.items():
        t = tensors[stored]
        if t["dtype"] not in _FLOAT_DTYPES:
            continue
        group = canon.split(".")[0]
        n = 1
        for s in t["shape"]:
            n *= s
        params[group] = params.get(group, 0) + n
    total = sum(params.values())
    return {"total": total, "without_embed_tokens": total - params.get("embed_tokens", 0), "by_group": params}


def _check_target(target, flat: dict, shape: dict, aux: dict, findings: list) -> dict:
    """Drafter versus a target's config.json: hidden size, vocab, capture points."""
    if not Path(target).is_dir():
        raise MissingFile("target folder not found", where=str(target))
    tc = read_config_json(Path(target))
    tc = tc["text_config"] if isinstance(tc.get("text_config"), dict) else tc
    hidden, vocab, layers = (v if isinstance(v, int) and not isinstance(v, bool) else None
                             for v in (tc.get("hidden_size"), tc.get("vocab_size"), tc.get("num_hidden_layers")))
    fc = shape.get("fc.weight")
    if fc and isinstance(hidden, int) and (len(fc) != 2 or fc[1] != 3 * hidden):
        findings.append(_finding("target-hidden", "error",
                                 f"fc.weight takes {fc[1] if len(fc) == 2 else fc} inputs; the target's "
                                 f"3 aux hidden states give 3 x {hidden} = {3 * hidden}"))
    if isinstance(vocab, int) and flat.get("vocab_size") not in (None, vocab):
        findings.append(_finding("target-vocab", "error",
                                 f"drafter vocab_size {flat.get('vocab_size')} != target vocab_size {vocab}"))
    points = aux.get("sglang_capture_points")
    if points and isinstance(layers, int) and any(not 0 <= c < layers for c in points):
        findings.append(_finding("target-layers", "error",
                                 f"capture points {points} are not all inside the target's {layers} layers"))
    return {"path": str(target), "hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": layers}


# ----------------------------------------------------------------------------- mapping


def _d2t_findings(d2t: torch.Tensor, dtype: str, vocab, draft_vocab, findings: list) -> torch.Tensor:
    """Dtype, length, order, duplicates and range of d2t; returns the selected ids ``i + d2t[i]``."""
    if d2t.dtype != torch.int64:
        findings.append(_finding("d2t-dtype", "warning", f"d2t is {dtype}; SGLang and SpecForge store int64"))
    d2t = d2t.to(torch.int64).reshape(-1)
    if isinstance(draft_vocab, int) and d2t.numel() != draft_vocab:
        findings.append(_finding("d2t-length", "error",
                                 f"d2t has {d2t.numel()} entries; draft_vocab_size is {draft_vocab}"))
    selected = torch.arange(d2t.numel(), dtype=torch.int64) + d2t
    if selected.numel() > 1:
        steps = selected[1:] - selected[:-1]
        dups = int((steps == 0).sum())
        backs = int((steps < 0).sum())
        if dups or backs:
            findings.append(_finding("d2t-order", "error",
                                     f"i + d2t[i] must be strictly increasing: {dups} repeated and "
                                     f"{backs} decreasing steps (first at draft id "
                                     f"{int((steps <= 0).nonzero()[0]) + 1})"))
        uniq = int(torch.unique(selected).numel())
        if uniq != selected.numel():
            findings.append(_finding("d2t-duplicates", "error",
                                     f"{selected.numel() - uniq} draft ids map to a target token "
                                     "another draft id already covers"))
    if selected.numel() and isinstance(vocab, int):
        bad = int(((selected < 0) | (selected >= vocab)).sum())
        if bad:
            findings.append(_finding("d2t-range", "error",
                                     f"{bad} entries of i + d2t[i] fall outside the target vocab "
                                     f"[0, {vocab - 1}] (range found {int(selected.min())}.."
                                     f"{int(selected.max())})"))
    return selected


def _t2d_findings(t2d: torch.Tensor, selected: torch.Tensor | None, vocab, draft_vocab, findings: list) -> int:
    """Length of t2d, how many tokens it marks, and whether it agrees with d2t; returns the marked count."""
    if isinstance(vocab, int) and t2d.numel() != vocab:
        findings.append(_finding("t2d-length", "error", f"t2d has {t2d.numel()} entries; vocab_size is {vocab}"))
    true = int((t2d != 0).sum())
    if isinstance(draft_vocab, int) and true != draft_vocab:
        findings.append(_finding("t2d-count", "error",
                                 f"t2d marks {true} target tokens; draft_vocab_size is {draft_vocab}"))
    if selected is not None:
        marked = set((t2d != 0).nonzero().reshape(-1).tolist())
        chosen = set(selected.tolist())
        if marked != chosen:
            findings.append(_finding("t2d-mismatch", "error",
                                     f"t2d and d2t disagree: {len(chosen - marked)} ids from d2t not in "
                                     f"t2d, {len(marked - chosen)} in t2d not from d2t"))
    return true


def _check_mapping(folder, tensors, names, vocab, draft_vocab, findings) -> tuple[dict, list[int] | None]:
    """The mapping summary and findings; also the selected ids (for a comparison)."""
    out: dict[str, Any] = {"draft_vocab_size": draft_vocab, "target_vocab_size": vocab}
    selected = None
    if "d2t" in names:
        info = tensors[names["d2t"]]
        d2t = _load_tensor(folder, info["file"], names["d2t"])
        selected = _d2t_findings(d2t, info["dtype"], vocab, draft_vocab, findings)
        out["selected_min"] = int(selected.min()) if selected.numel() else None
        out["selected_max"] = int(selected.max()) if selected.numel() else None
        out["identity_prefix"] = bool(selected.numel()) and bool((d2t == 0).all())
    if "t2d" in names:
        info = tensors[names["t2d"]]
        t2d = _load_tensor(folder, info["file"], names["t2d"]).reshape(-1)
        out["t2d_true"] = _t2d_findings(t2d, selected, vocab, draft_vocab, findings)
    return out, (selected.tolist() if selected is not None else None)


# ----------------------------------------------------------------------------- inspect


def inspect_checkpoint(path: str | Path, *, target: str | Path | None = None) -> dict:
    """Everything one needs to know before serving a drafter folder; see module docstring.

    ``target``: a target model folder (its config.json is read, no weights) to check the
    drafter against: fc input = 3 x target hidden, vocab size, capture points in range.
    """
    return inspect_with_mapping(path, target)[0]


def inspect_with_mapping(path: str | Path, target: str | Path | None = None) -> tuple[dict, list[int] | None]:
    """``inspect_checkpoint``'s report and the selected target ids of the drafter's d2t (None without d2t)."""
    folder = Path(path)
    if not folder.is_dir():
        raise MissingFile("drafter folder not found", where=str(folder))
    config = read_config_json(folder)
    tensors, files = folder_headers(folder)
    fmt, flat, names, findings = _normalise(config, tensors)
    shape = {canon: tensors[stored]["shape"] for canon, stored in names.items()}
    _check_keys(config, names, findings)
    _check_config(config, flat, findings)
    _check_shapes(flat, shape, findings)
    _check_like_loaders(folder, tensors, shape, findings)
    mapping, selected = _check_mapping(folder, tensors, names, flat.get("vocab_size"),
                                       flat.get("draft_vocab_size"), findings)
    _check_dtypes(tensors, findings)
    aux = aux_layer_report(flat.get("aux_layer_ids"), fmt)
    target_info = _check_target(target, flat, shape, aux, findings) if target is not None else None
    notes = [aux["summary"]]
    if "embed_tokens.weight" not in names:
        notes.append("no embed_tokens.weight: the runtime shares the target's (frozen) embeddings")
    errors = sum(f["severity"] == "error" for f in findings)
    return {
        "path": str(folder),
        "format": fmt,
        "files": files,
        "config": dict(flat),
        "tensors": {stored: {"shape": t["shape"], "dtype": t["dtype"]} for stored, t in sorted(tensors.items())},
        "params": _param_counts(tensors, names),
        "mapping": mapping,
        "aux_layers": aux,
        "target": target_info,
        "findings": findings,
        "notes": notes,
        "errors": errors,
        "warnings": sum(f["severity"] == "warning" for f in findings),
        "ok": errors == 0,
    }, selected


def aux_layer_report(ids, fmt: str = "sglang") -> dict:
    """What capture points a config's aux layer ids (SGLang convention) imply in each runtime."""
    if not ids:
        return {"config_ids": None, "sglang_capture_points": None, "vllm_capture_points": None,
                "summary": "no eagle_aux_hidden_state_layer_ids: SGLang captures its defaults "
                           "[2, N//2, N-3] for an N-layer target"}
    ids = [int(i) for i in ids]
    sg = [i + 1 for i in ids]
    stored = sg if fmt == "speculators" else ids
    n_specforge = ids[2] + 4
    guesses = []
    if ids == [1, n_specforge // 2 - 1, n_specforge - 4]:
        guesses.append(f"SpecForge's default ids for a {n_specforge}-layer target "
                       f"(SGLang captures [2, {n_specforge // 2}, {n_specforge - 3}])")
    n_points = ids[2] + 3
    if ids == [2, n_points // 2, n_points - 3]:
        guesses.append(f"SGLang's default capture points for a {n_points}-layer target written as config "
                       f"ids: SGLang will capture one layer higher ({sg})")
    where = "speculators eagle_aux_hidden_state_layer_ids (vLLM capture points)" if fmt == "speculators" \
        else "eagle_config.eagle_aux_hidden_state_layer_ids"
    summary = (f"{where} = {stored}: SGLang captures the outputs entering layers {sg} "
               f"(HF hidden_states{sg}); a speculators export writes {sg} so vLLM reads the same layers")
    if guesses:
        summary += "; looks like " + " or ".join(guesses)
    return {"config_ids": ids, "sglang_capture_points": sg, "vllm_capture_points": sg if fmt == "speculators"
            else ids, "stored": stored, "summary": summary}



# ----------------------------------------------------------------------------- text


def render_inspection(report: dict) -> str:
    c = report["config"]
    lines = [
        f"{report['path']}  [{report['format']} format, {', '.join(report['files'])}]",
        "config: " + ", ".join(f"{k}={c[k]}" for k in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "draft_vocab_size", "target_hidden_size", "torch_dtype") if k in c),
        f"params: {report['params']['total']:,} total, "
        f"{report['params']['without_embed_tokens']:,} without embed_tokens",
        "tensors:",
    ]
    width = max((len(n) for n in report["tensors"]), default=0)
    for name, t in report["tensors"].items():
        lines.append(f"  {name:<{width}}  {str(t['shape']):<18} {t['dtype']}")
    m = report["mapping"]
    if m.get("selected_min") is not None:
        lines.append(f"mapping: draft ids -> target ids {m['selected_min']}..{m['selected_max']}"
                     + (f", t2d marks {m['t2d_true']}" if "t2d_true" in m else ""))
    for note in report["notes"]:
        lines.append(f"note: {note}")
    lines.append("findings:" if report["findings"] else "findings: none")
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
    verdict = "OK: no errors" if report["ok"] else f"FAIL: {report['errors']} error(s)"
    lines.append(f"{verdict}, {report['warnings']} warning(s)")
    return "\n".join(lines)
