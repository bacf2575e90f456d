"""Target adapter: the verifier model and the auxiliary hidden states EAGLE-3 reads from it.

Owns: loading a causal LM with transformers (float32 or bf16, CPU or GPU), the
layer-id conventions (SpecForge/SGLang config ids versus capture points, vLLM's
reading of the same ids), and one forward that returns the concatenated
auxiliary hidden states ``[B, T, 3*H]`` plus logits and the final (post-norm)
hidden state, and a cheaper pass for training features (``features``: causal
attention only, the logits' argmax in chunks of positions, only the capture
points' hidden states kept, no host sync of its own).

Conventions, checked against SGLang ``python/sglang/srt/models/llama.py``
(``set_eagle3_layers_to_capture``) and vLLM ``model_executor/models/llama.py``:

* a *capture point* ``c`` is the residual stream entering decoder layer ``c``,
  i.e. the output of layer ``c-1`` (``c = 0``: the token embeddings). With HF
  transformers that is ``outputs.hidden_states[c]`` for ``0 <= c < N``.
* SGLang default capture points for ``N`` layers: ``[2, N//2, N-3]``.
* SGLang adds 1 to config ids: SpecForge's default ids ``[1, N//2-1, N-4]``
  become capture points ``[2, N//2, N-3]``. vLLM uses the ids as capture points
  unchanged, so the same config selects layers one lower there.
* HF's last entry ``hidden_states[N]`` is after the final norm, not the raw
  output of the last layer; no runtime captures it, and this module refuses it
  as a capture point.

Knows nothing about drafters, vocab mappings, caches or the task runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from eaglekb.io.errors import BadInput, Unavailable, compiler_failure
from eaglekb.models.checks import load_causal_lm

CONVENTIONS = ("sglang", "vllm")

#: Positions per lm_head GEMM of ``Target.argmax`` (8192 x 49152 bf16 logits: 0.8 GB at a time).
ARGMAX_CHUNK = 8192

#: Model types whose logits are exactly ``lm_head(final hidden)`` (read in transformers' ``*ForCausalLM.forward``);
#: ``Target.features`` runs the full forward for any other.
PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def default_capture_points(num_layers: int) -> list[int]:
    """SGLang's default capture points ``[2, N//2, N-3]`` for an ``N``-layer target."""
    if num_layers < 4:
        raise BadInput(
            "target too shallow for EAGLE-3 capture points",
            where="num_hidden_layers",
            expected=">= 4",
            found=str(num_layers),
        )
    return [2, num_layers // 2, num_layers - 3]


def default_config_ids(num_layers: int) -> list[int]:
    """SpecForge's default config ids ``[1, N//2-1, N-4]`` (SGLang adds 1 to each)."""
    return [c - 1 for c in default_capture_points(num_layers)]


def config_ids_to_capture_points(ids: Sequence[int], convention: str = "sglang") -> list[int]:
    """Capture points a runtime reads for config ``eagle_aux_hidden_state_layer_ids``.

    ``sglang`` (and SpecForge): ``c = id + 1``. ``vllm`` (and speculators): ``c = id``.
    """
    if convention not in CONVENTIONS:
        raise BadInput("unknown layer-id convention", where="convention",
                       expected=" or ".join(CONVENTIONS), found=repr(convention))
    shift = 1 if convention == "sglang" else 0
    return [int(i) + shift for i in ids]


def capture_points_to_config_ids(points: Sequence[int], convention: str = "sglang") -> list[int]:
    """Inverse of :func:`config_ids_to_capture_points`."""
    if convention not in CONVENTIONS:
        raise BadInput("unknown layer-id convention", where="convention",
                       expected=" or ".join(CONVENTIONS), found=repr(convention))
    shift = 1 if convention == "sglang" else 0
    return [int(c) - shift for c in points]


def check_capture_points(points: Sequence[int], num_layers: int) -> list[int]:
    points = [int(c) for c in points]
    bad = [c for c in points if not 0 <= c < num_layers]
    if bad or len(points) != 3:
        raise BadInput(
            "invalid capture points",
            where="capture_points",
            expected=f"three layer indices in [0, {num_layers - 1}] "
            f"({num_layers} is HF's post-norm output, which no runtime captures)",
            found=str(points),
        )
    return points


@dataclass
class TargetOutput:
    """One target forward: aux hidden states ``[B,T,3H]``, logits ``[B,T,V]``, final hidden ``[B,T,H]``."""

    aux_hidden: "object"
    logits: "object"
    final_hidden: "object"  # post-norm (HF hidden_states[-1])
    capture_points: list[int]


@dataclass
class TargetFeatures:
    """What training reads per token: aux hidden ``[B,T,3H]``, the logits' argmax ``[B,T]``, final hidden."""

    aux_hidden: "object"
    argmax: "object"
    final_hidden: "object"  # post-norm


class Target:
    """A loaded causal LM plus the capture points it serves to an EAGLE-3 drafter."""

    def __init__(self, model, tokenizer=None, capture_points: Sequence[int] | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        cfg = model.config
        self.num_layers = int(cfg.num_hidden_layers)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        points = capture_points if capture_points is not None else default_capture_points(self.num_layers)
        self.capture_points = check_capture_points(points, self.num_layers)
        self._compiled_pass = None  # features' decoder pass through torch.compile (compile_features), or None
        self.compile_error: str | None = None

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        capture_points: Sequence[int] | None = None,
        trust_remote_code: bool = False,
    ) -> "Target":
        """Load a transformers checkpoint folder (see ``sources.resolve`` for names and repo ids)."""
        import torch
        from transformers import AutoTokenizer

        if dtype not in ("float32", "bfloat16", "float16"):
            raise BadInput("unsupported dtype", where="dtype",
                           expected="float32, bfloat16 or float16", found=repr(dtype))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise Unavailable("CUDA is not available", where=f"device={device}",
                              fix="use --device cpu")
        model = load_causal_lm(path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code).to(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except (OSError, ValueError):
            tokenizer = None
        return cls(model, tokenizer, capture_points)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def embed_weight(self):
        """The target's input embedding matrix (the drafter shares it, frozen)."""
        return self.model.get_input_embeddings().weight

    def forward(self, input_ids, attention_mask=None) -> TargetOutput:
        """Run the target on ``input_ids [B,T]`` and return what EAGLE-3 reads from it."""
        import torch

        ids = torch.as_tensor(input_ids, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise BadInput("token id out of range", where="input_ids",
                           expected=f"[0, {self.vocab_size - 1}]",
                           found=f"[{int(ids.min())}, {int(ids.max())}]")
        with torch.no_grad():
            out = self.model(
                input_ids=ids,
                attention_mask=attention_mask,
                output_hidden_states=True,
                use_cache=False,
            )
        hs = out.hidden_states  # N+1 entries: embeddings, layer outputs, last one post-norm
        aux = torch.cat([hs[c] for c in self.capture_points], dim=-1)
        return TargetOutput(aux_hidden=aux, logits=out.logits, final_hidden=hs[-1],
                            capture_points=list(self.capture_points))

    __call__ = forward

    def features(self, input_ids, *, chunk: int = ARGMAX_CHUNK) -> TargetFeatures:
        """A pass over ``input_ids [B,T]`` with causal attention only (no mask): what ``forward`` gives at every
        position that sees no padding, i.e. every real token of a right-padded batch.

        No ``[B,T,V]`` logits (``argmax``), no hidden states but the capture points' and the final one, no host
        sync of its own: the id range is not checked here (an id out of range still fails in the embedding lookup).
        transformers (5.24) still reads one value: its packed-sequence check of the position ids when no mask is
        given, at the start of the pass. A model type outside ``PLAIN_HEAD`` takes ``forward`` itself, unmasked.
        """
        import torch

        ids = torch.as_tensor(input_ids, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        if self.model.config.model_type not in PLAIN_HEAD:  # logits may not be lm_head(h): the full forward
            res = self.forward(ids)
            return TargetFeatures(res.aux_hidden, res.logits.argmax(-1), res.final_hidden)
        if self._compiled_pass is not None:
            for dim in (0, 1):  # one graph for every batch shape
                torch._dynamo.maybe_mark_dynamic(ids, dim)
            try:
                with torch.no_grad():
                    aux, final = self._compiled_pass(ids)
                return TargetFeatures(aux, self.argmax(final, chunk=chunk), final)
            except Exception as exc:  # a compiler failure of any kind: the eager pass computes the same
                self._compiled_pass, self.compile_error = None, compiler_failure(exc)
        decoder = self.model.get_decoder()
        kept: dict[int, object] = {}

        def keep(point):
            def hook(_module, args, kwargs):  # capture point c: the residual stream entering layer c
                kept[point] = args[0] if args else kwargs["hidden_states"]
            return hook

        hooks = [decoder.layers[c].register_forward_pre_hook(keep(c), with_kwargs=True) for c in self.capture_points]
        try:
            with torch.no_grad():
                final = decoder(input_ids=ids, use_cache=False, output_hidden_states=False).last_hidden_state
        finally:
            for h in hooks:
                h.remove()
        aux = torch.cat([kept[c] for c in self.capture_points], dim=-1)
        return TargetFeatures(aux, self.argmax(final, chunk=chunk), final)

    def compile_features(self, backend: str = "inductor") -> None:
        """Run ``features``' decoder pass through ``torch.compile`` (``backend``) from the next call on: the norms,
        rotary embeddings, SiLU-mul and residual adds between the products fused instead of one pass each over the
        batch's activations. Batch and sequence length are marked dynamic (one graph serves every batch); a
        compiler error switches to the eager pass for good and is kept in ``compile_error``. A model type outside
        ``PLAIN_HEAD`` keeps its full forward."""
        import torch

        if self.model.config.model_type in PLAIN_HEAD:
            self._compiled_pass = torch.compile(self._decoder_pass, backend=backend)
            self.compile_error = None

    @property
    def compiled_features(self) -> bool:
        return self._compiled_pass is not None

    def _decoder_pass(self, ids):
        """(the capture points' residual streams side by side, the final hidden state) of one unmasked pass, from
        the decoder's hidden states (no hooks: a compiled function must not install them per call)."""
        import torch

        out = self.model.get_decoder()(input_ids=ids, use_cache=False, output_hidden_states=True)
        hs = out.hidden_states  # N+1 entries: embeddings, then each layer's output; capture point c is hs[c]
        return torch.cat([hs[c] for c in self.capture_points], dim=-1), out.last_hidden_state

    def argmax(self, final_hidden, *, chunk: int = ARGMAX_CHUNK):
        """``argmax(lm_head(final_hidden))`` per position ``[...]``, ``chunk`` positions per GEMM (model dtype)."""
        import torch

        head = self.model.get_output_embeddings()
        flat = final_hidden.reshape(-1, final_hidden.shape[-1])
        out = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)
        with torch.no_grad():
            for a in range(0, flat.shape[0], chunk):
                out[a:a + chunk] = head(flat[a:a + chunk]).argmax(-1)
        return out.view(final_hidden.shape[:-1])
