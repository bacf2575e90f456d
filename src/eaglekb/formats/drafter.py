"""The EAGLE-3 drafter checkpoint format: config.json fields, tensor names, reading and writing files.

Owns: ``DrafterConfig`` (the fields of SGLang/SpecForge's ``LlamaForCausalLMEagle3``
config.json) and its JSON (de)serialisation in both on-disk formats:

* ``sglang`` (SpecForge / SGLang "legacy EAGLE-3"): config.json with
  ``architectures: ["LlamaForCausalLMEagle3"]`` and weights ``fc``, ``midlayer.*``,
  ``norm``, ``lm_head``, ``d2t``, ``t2d`` (``embed_tokens`` optional).
* ``speculators`` (vLLM speculators): config.json with ``speculators_model_type:
  "eagle3"``, ``transformer_layer_config`` and ``speculators_config``; the decoder
  layer is stored as ``layers.0.*``.

plus the tensor-name constants, the name conversions between the two, and the files:
``read_config_json`` / ``read_config``, ``weight_files``, ``read_tensors``, and
``write_drafter_files`` (config.json + model.safetensors, each written atomically); and the checks that
``invoke inspect`` and every loader (probe, bench, finetune --init) share, so that nothing passes one
and fails the other: ``layout_problems`` (heads that do not divide over the KV heads, an fc bias, another
activation), ``expected_shapes`` (every tensor's shape from the config) and ``nonfinite_tensors`` (NaN or
inf weights, checked in ``read_tensors``; ``nonfinite_in_file`` for a target's shards);
``is_drafter_folder`` says whether a folder looks like one (what ``--force`` may replace).

Layer ids: eaglekb keeps ``aux_layer_ids`` in SGLang's config convention (SGLang
captures ``id + 1``). Speculators configs are read by vLLM as capture points
(no shift), so export writes ``id + 1`` and import subtracts 1: the drafter sees
the same hidden states in both runtimes.

Sources checked (see docs/reference/drafter-format.md): SpecForge
``specforge/modeling/draft/llama3_eagle.py``, SGLang
``python/sglang/srt/models/llama_eagle3.py``, speculators
``src/speculators/models/eagle3/{config,model_definitions}.py``.

Knows nothing about the torch module (``eaglekb.models.drafter`` builds it from these
files), targets, training or the task runner. Safetensors only; no pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from eaglekb.io.errors import BadInput, EaglekbError, Incompatible, IntegrityError, MissingFile, SchemaError
from eaglekb.io.files import atomic_save_safetensors, atomic_write_json, iter_safetensors, read_json, read_safetensors

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
FORMATS = ("sglang", "speculators")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

MIDLAYER_KEYS = (
    "input_layernorm.weight",
    "hidden_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
REQUIRED_KEYS = ("fc.weight", *(f"midlayer.{k}" for k in MIDLAYER_KEYS), "norm.weight",
                 "lm_head.weight", "d2t", "t2d")
OPTIONAL_KEYS = ("embed_tokens.weight",)

#: config.json fields of the drafting method (eaglekb.models.parallel_drafter reads and checks them): the method,
#: and for P-EAGLE the tokens one pass proposes.
METHOD_FIELD = "eaglekb_method"
TOKENS_FIELD = "parallel_draft_tokens"
EAGLE3 = "eagle3"
P_EAGLE = "p-eagle"
MASK_KEYS = ("mask_embed", "mask_hidden")  # a P-EAGLE drafter's learned mask inputs, beside the EAGLE-3 tensors


def not_servable_by_sglang(doc: dict) -> str | None:
    """Why SGLang cannot serve the drafter a config.json describes, or None: a P-EAGLE drafter proposes k tokens in
    one pass from learned mask inputs; SGLang's EAGLE3 (0.5.17 and main as of this writing) drafts a chain, one
    drafter pass a token, and would skip the mask inputs and draft with positions the drafter was never trained on."""
    if not isinstance(doc, dict) or doc.get(METHOD_FIELD) != P_EAGLE:
        return None
    k = doc.get(TOKENS_FIELD)
    return (f"{METHOD_FIELD} {P_EAGLE!r} ({k} tokens in one drafter pass): SGLang's EAGLE3 drafts a chain, one pass "
            "a token, and skips " + " and ".join(MASK_KEYS) + "; SGLang has no parallel drafting")


# Standard HF / SpecForge config.json fields a drafter config may carry without effect here.
_PASSIVE_FIELDS = {
    "architectures", "model_type", "num_hidden_layers", "torch_dtype", "dtype", "eagle_config",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "pretraining_tp",
    "use_cache", "attention_bias", "attention_dropout", "mlp_bias", "rope_scaling",
    "rope_parameters", "transformers_version", "tie_word_embeddings", "_name_or_path",
    "bias", "hidden_act", "head_dim", "target_hidden_size", "rope_theta", "draft_vocab_size",
    METHOD_FIELD, TOKENS_FIELD,  # kept in extra; eaglekb.models.parallel_drafter reads them
}


@dataclass
class DrafterConfig:
    """Shape and numerics of one EAGLE-3 drafter (one decoder layer)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int | None = None  # None: same as hidden_size
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    torch_dtype: str = "bfloat16"
    aux_layer_ids: list[int] | None = None  # SGLang config convention (capture point = id + 1)
    extra: dict[str, Any] = field(default_factory=dict)  # passive fields kept for round trips

    @property
    def fc_in(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    # -- SGLang / SpecForge config.json

    def _layer_json(self) -> dict:
        """The one Llama decoder layer's fields, the same in both formats."""
        return {
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.dim_head,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
            "tie_word_embeddings": False,  # SGLang ties lm_head to embed_tokens when true
        }

    def to_sglang_json(self) -> dict:
        doc = dict(self.extra)
        doc.update(self._layer_json())
        doc.update({
            "architectures": [SGLANG_ARCH],
            "draft_vocab_size": self.draft_vocab_size,
            "rope_scaling": None,
            "torch_dtype": self.torch_dtype,
            "target_hidden_size": self.target_hidden_size or self.hidden_size,
        })
        if self.aux_layer_ids is not None:
            doc["eagle_config"] = {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            }
        return doc

    @classmethod
    def from_sglang_json(cls, doc: dict, where: str = "config.json") -> "DrafterConfig":
        arch = doc.get("architectures") or []
        if not isinstance(arch, list) or SGLANG_ARCH not in arch:
            raise SchemaError("unknown drafter architecture", where=f"{where}:architectures",
                              expected=f"[{SGLANG_ARCH!r}] or a speculators config",
                              found=repr(arch))
        own = {f.name for f in fields(cls)} - {"extra", "aux_layer_ids"}
        unknown = sorted(set(doc) - own - _PASSIVE_FIELDS)
        if unknown:
            raise SchemaError("unknown config field", where=f"{where}:{unknown[0]}",
                              expected="a LlamaForCausalLMEagle3 field", found=repr(unknown[0]),
                              fix="remove or rename it (SGLang would ignore it silently)")
        if doc.get("tie_word_embeddings"):
            raise Incompatible("drafter config ties lm_head to the input embeddings", where=f"{where}:tie_word_embeddings",
                               expected=f"false (an EAGLE-3 drafter has its own lm_head of {doc.get('draft_vocab_size')} "
                                        "draft-vocab rows)",
                               found="true: SGLang would use the target's embed_tokens as the head and skip the "
                                     "trained lm_head")
        kwargs = {k: doc[k] for k in own if k in doc and k != "torch_dtype"}
        kwargs["torch_dtype"] = str(doc.get("torch_dtype") or doc.get("dtype") or "bfloat16")
        _check_rope(doc, where)
        rope = doc.get("rope_parameters") or {}
        if "rope_theta" not in doc and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        eagle = doc.get("eagle_config") or {}
        if not isinstance(eagle, dict):
            raise SchemaError("invalid config field", where=f"{where}:eagle_config", expected="an object",
                              found=repr(eagle)[:80])
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        extra = {k: v for k, v in doc.items() if k in _PASSIVE_FIELDS and k not in _WRITTEN}
        return _build(cls, kwargs, ids, extra, where)

    # -- speculators config.json

    def to_speculators_json(self, *, verifier: str | None = None, speculative_tokens: int = 3) -> dict:
        layer = {**self._layer_json(), "architectures": ["LlamaForCausalLM"]}
        return {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "eagle3",
            "draft_vocab_size": self.draft_vocab_size,
            "norm_before_residual": False,
            "target_hidden_size": self.target_hidden_size or self.hidden_size,
            # vLLM reads these as capture points: SGLang ids + 1 keep the same hidden states.
            "eagle_aux_hidden_state_layer_ids": (
                [i + 1 for i in self.aux_layer_ids] if self.aux_layer_ids is not None else None
            ),
            "embed_requires_grad": False,
            "torch_dtype": self.torch_dtype,
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }],
                "verifier": {"name_or_path": verifier, "architectures": []},
            },
        }

    @classmethod
    def from_speculators_json(cls, doc: dict, where: str = "config.json") -> "DrafterConfig":
        if doc.get("speculators_model_type") != "eagle3":
            raise SchemaError("not an EAGLE-3 speculators config", where=f"{where}:speculators_model_type",
                              expected="'eagle3'", found=repr(doc.get("speculators_model_type")))
        if doc.get("norm_before_residual"):
            raise Incompatible("norm_before_residual=true is not the SGLang layout",
                               where=f"{where}:norm_before_residual", expected="false", found="true")
        layer = doc.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SchemaError("missing transformer_layer_config", where=where,
                              expected="an object", found=repr(type(layer).__name__))
        _check_rope(layer, f"{where}:transformer_layer_config")
        own = {f.name for f in fields(cls)} - {"extra", "aux_layer_ids", "draft_vocab_size",
                                              "target_hidden_size", "torch_dtype"}
        kwargs = {k: layer[k] for k in own if k in layer}
        rope = layer.get("rope_parameters") or {}
        if "rope_theta" not in layer and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        kwargs["draft_vocab_size"] = doc.get("draft_vocab_size")
        kwargs["target_hidden_size"] = doc.get("target_hidden_size")
        kwargs["torch_dtype"] = str(doc.get("torch_dtype") or doc.get("dtype") or "bfloat16")
        points = doc.get("eagle_aux_hidden_state_layer_ids")
        if points is not None and not (isinstance(points, list) and all(_is_int(p) for p in points)):
            raise SchemaError("invalid aux layer ids", where=f"{where}:eagle_aux_hidden_state_layer_ids",
                              expected="a list of 3 integers", found=repr(points)[:80])
        ids = [int(p) - 1 for p in points] if points is not None else None
        return _build(cls, kwargs, ids, {}, where)


_WRITTEN = {"architectures", "model_type", "num_hidden_layers", "torch_dtype", "dtype", "eagle_config",
            "rope_scaling", "rope_parameters", "tie_word_embeddings", "head_dim", "hidden_act",
            "target_hidden_size", "rope_theta", "draft_vocab_size", "_name_or_path",
            "transformers_version"}


def _check_rope(doc: dict, where: str) -> None:
    """eaglekb's drafter implements default RoPE only; refuse scaled RoPE rather than run it wrong."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = doc.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise SchemaError("invalid config field", where=f"{where}:{key}", expected="null or an object",
                              found=repr(rope)[:80])
        kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
        if kind not in (None, "default"):
            raise Incompatible("unsupported RoPE scaling", where=f"{where}:{key}",
                               expected="null or default RoPE", found=repr(kind))


#: Whole-number fields and their largest sane value (a config from elsewhere must not size a huge tensor).
_INT_LIMITS = {"hidden_size": 1 << 17, "intermediate_size": 1 << 20, "num_attention_heads": 4096,
               "num_key_value_heads": 4096, "vocab_size": 1 << 23, "draft_vocab_size": 1 << 23,
               "target_hidden_size": 1 << 17, "head_dim": 1 << 14, "max_position_embeddings": 1 << 24}
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "draft_vocab_size")


# ----------------------------------------------------------------------------- checks (inspect and loaders)


def layout_problems(cfg: DrafterConfig, where: str = "config") -> list[tuple[str, EaglekbError]]:
    """What in a config the drafter module (and SGLang's) cannot run, as (finding code, one-line error):
    a loader raises the first, ``invoke inspect`` reports each as an error finding."""
    out: list[tuple[str, EaglekbError]] = []
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % kv:
        out.append(("heads-layout", SchemaError(
            "heads not divisible by kv heads", where=f"{where}:num_key_value_heads",
            expected="num_attention_heads % num_key_value_heads == 0 (whole groups of query heads)",
            found=f"{heads} % {kv}")))
    if cfg.head_dim is None and cfg.hidden_size % heads:
        out.append(("heads-layout", SchemaError(
            "hidden size not divisible by the heads", where=f"{where}:num_attention_heads",
            expected="hidden_size % num_attention_heads == 0, or a head_dim", found=f"{cfg.hidden_size} % {heads}")))
    if cfg.extra.get("bias"):
        out.append(("fc-bias", Incompatible("fc bias is not supported", where=f"{where}:bias", expected="false",
                                            found="true")))
    if cfg.hidden_act != "silu":
        out.append(("activation", Incompatible("unsupported activation", where=f"{where}:hidden_act",
                                               expected="'silu'", found=repr(cfg.hidden_act))))
    return out


def expected_shapes(cfg: DrafterConfig, *, with_embeddings: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape (SGLang names) as the config describes it; the module built from it agrees."""
    h, hd, i = cfg.hidden_size, cfg.dim_head, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    mid = {"input_layernorm.weight": (h,), "hidden_norm.weight": (h,), "self_attn.q_proj.weight": (q, 2 * h),
           "self_attn.k_proj.weight": (kv, 2 * h), "self_attn.v_proj.weight": (kv, 2 * h),
           "self_attn.o_proj.weight": (h, q), "post_attention_layernorm.weight": (h,),
           "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    out = {"fc.weight": (h, cfg.fc_in), **{f"midlayer.{k}": v for k, v in mid.items()}, "norm.weight": (h,),
           "lm_head.weight": (cfg.draft_vocab_size, h), "d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}
    if with_embeddings:
        out["embed_tokens.weight"] = (cfg.vocab_size, h)
    return out


def is_finite(tensor) -> bool:
    """A tensor holds no NaN and no infinity (integer tensors always; float8, which ``isfinite`` has no kernel
    for, through float16, which keeps its NaN)."""
    import torch

    if not tensor.is_floating_point():
        return True
    if tensor.element_size() == 1:
        tensor = tensor.to(torch.float16)
    return bool(torch.isfinite(tensor).all())


def nonfinite_tensors(tensors: dict) -> list[str]:
    """The names of the floating tensors that hold a NaN or an infinity (sorted)."""
    return sorted(k for k, t in tensors.items() if not is_finite(t))


def nonfinite_in_file(path: str | Path) -> list[str]:
    """``nonfinite_tensors`` of one safetensors file, one tensor in memory at a time (a target's shards)."""
    return sorted(name for name, tensor in iter_safetensors(path) if not is_finite(tensor))


def nonfinite_error(bad: list[str], where: str, *, what: str = "drafter") -> IntegrityError:
    """The one line for weights that are not all finite (a loader raises it; inspect reports it); ``where``
    the file that holds them."""
    return IntegrityError(f"{what} weights hold NaN or inf", where=f"{where}:{bad[0]}", expected="finite numbers",
                          found=f"{len(bad)} tensor(s) with NaN or inf: {', '.join(bad[:3])}",
                          fix="retrain, or restore the drafter from where it came; a run would draft garbage"
                          if what == "drafter" else f"restore the {what} from where it came (download or convert it "
                          "again); a run would compute garbage")


def is_drafter_folder(path: str | Path) -> bool:
    """A plain folder of a config.json and safetensors weights, nothing else in folders or links (what
    ``--force`` may replace with a drafter)."""
    folder = Path(path)
    if folder.is_symlink() or not folder.is_dir():
        return False
    entries = list(folder.iterdir())
    return ((folder / CONFIG_FILE).is_file() and any(p.suffix == ".safetensors" for p in entries)
            and not any(p.is_symlink() or p.is_dir() for p in entries))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_values(kwargs: dict, ids: Any, where: str) -> None:
    """Every field of the right type and in range (a config.json from elsewhere), one line for the first not."""
    for key, top in _INT_LIMITS.items():
        value = kwargs.get(key)
        if value is None and key not in _REQUIRED:
            continue
        if not _is_int(value) or not 0 < value <= top:
            raise SchemaError("missing or invalid config field", where=f"{where}:{key}",
                              expected=f"a whole number in 1..{top}", found=repr(value)[:80])
    for key in ("rms_norm_eps", "rope_theta"):
        value = kwargs.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < float("inf")):
            raise SchemaError("invalid config field", where=f"{where}:{key}", expected="a number > 0",
                              found=repr(value)[:80])
    if not isinstance(kwargs.get("hidden_act", "silu"), str):
        raise SchemaError("invalid config field", where=f"{where}:hidden_act", expected="text such as silu",
                          found=repr(kwargs["hidden_act"])[:80])
    if ids is not None and (not isinstance(ids, list) or len(ids) != 3 or not all(_is_int(i) for i in ids)):
        raise SchemaError("invalid aux layer ids", where=f"{where}:eagle_aux_hidden_state_layer_ids",
                          expected="a list of 3 integers", found=repr(ids)[:80])


def _build(cls, kwargs: dict, ids, extra: dict, where: str) -> DrafterConfig:
    _check_values(kwargs, ids, where)
    return cls(**kwargs, aux_layer_ids=[int(i) for i in ids] if ids is not None else None, extra=extra)


# ----------------------------------------------------------------------------- files


def read_config_json(path: str | Path) -> dict:
    """The raw ``config.json`` object of a model or drafter folder, with one-line errors."""
    cfg_path = Path(path) / CONFIG_FILE
    doc = read_json(cfg_path, what="drafter config.json")
    if not isinstance(doc, dict):
        raise SchemaError("config.json is not an object", where=str(cfg_path),
                          expected="a JSON object", found=type(doc).__name__)
    return doc


def config_from_doc(doc: Any, where: str) -> tuple[DrafterConfig, str]:
    """A drafter config.json's object (either format), checked; returns (config, format)."""
    if not isinstance(doc, dict):
        raise SchemaError("config.json is not an object", where=where, expected="a JSON object",
                          found=type(doc).__name__)
    if "speculators_model_type" in doc:
        return DrafterConfig.from_speculators_json(doc, where), "speculators"
    return DrafterConfig.from_sglang_json(doc, where), "sglang"


def read_config(path: str | Path) -> tuple[DrafterConfig, str]:
    """Parse ``config.json`` of a drafter folder; returns (config, format)."""
    return config_from_doc(read_config_json(path), str(Path(path) / CONFIG_FILE))


def weight_files(path: str | Path) -> list[Path]:
    """Every ``*.safetensors`` file of a drafter folder, sorted; none is a one-line error."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingFile("no safetensors weights in drafter folder", where=str(folder),
                          expected=WEIGHTS_FILE, found=", ".join(sorted(p.name for p in folder.iterdir()))
                          or "an empty folder",
                          fix="pytorch_model.bin is not read (no pickle); convert it to safetensors")
    return files


def read_tensors(path: str | Path) -> dict:
    """All tensors of a drafter folder (every ``*.safetensors``), with corrupt files named."""
    out: dict = {}
    for file in weight_files(path):
        tensors = read_safetensors(file)
        bad = nonfinite_tensors(tensors)  # every drafter load passes here: probe, bench, launch, finetune, remap
        if bad:
            raise nonfinite_error(bad, str(file))
        dup = set(out) & set(tensors)
        if dup:
            raise IntegrityError("tensor stored twice", where=str(file), found=sorted(dup)[0])
        out.update(tensors)
    return out


def read_drafter_files(path: str | Path) -> tuple[DrafterConfig, dict]:
    """The config and all tensors of a drafter folder in either format, tensors under SGLang names."""
    cfg, _fmt = read_config(path)
    return cfg, to_sglang_names(read_tensors(path))


def to_sglang_names(tensors: dict) -> dict:
    """``layers.0.*`` (speculators) -> ``midlayer.*`` (SGLang); other names unchanged."""
    return {("midlayer." + k[len("layers.0."):]) if k.startswith("layers.0.") else k: v
            for k, v in tensors.items()}


def to_speculators_names(tensors: dict) -> dict:
    """``midlayer.*`` (SGLang) -> ``layers.0.*`` (speculators); other names unchanged."""
    return {("layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k: v
            for k, v in tensors.items()}


def write_drafter_files(folder: str | Path, config: DrafterConfig, state: dict, *, format: str = "sglang",
                        verifier: str | None = None) -> Path:
    """Write ``model.safetensors`` then ``config.json`` in ``format``; ``state`` under SGLang names.

    Each file is written atomically (temp file, fsync, rename), weights first, so a
    reader never sees a config.json without its weights.
    """
    if format not in FORMATS:
        raise BadInput("unknown drafter format", where="format", expected=" or ".join(FORMATS), found=repr(format))
    folder = Path(folder)
    if format == "sglang":
        doc = config.to_sglang_json()
    else:
        doc = config.to_speculators_json(verifier=verifier)
        state = to_speculators_names(state)
    atomic_save_safetensors(folder / WEIGHTS_FILE, state, metadata={"format": "pt"})
    atomic_write_json(folder / CONFIG_FILE, doc)
    return folder
