"""Tiny random models, tokenizers and drafter checkpoints shared by the tests (CPU, fast)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 128
DRAFT_VOCAB = 40


def tiny_llama_config(**over):
    from transformers import LlamaConfig

    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6, tie_word_embeddings=False)
    kw.update(over)
    return LlamaConfig(**kw)


def tiny_qwen2_config(**over):
    from transformers import Qwen2Config

    kw = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6, tie_word_embeddings=True)
    kw.update(over)
    return Qwen2Config(**kw)


def tiny_causal_lm(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def engine_steps(engine, tm, prompt: list[int], rows_list=(5, 12)):
    """After a prefill of ``prompt``: ``engine``'s decode step, then one target step of each row count in
    ``rows_list`` (random tokens, seeded by the row count) at the next positions of its cache."""
    from eaglekb.engine.kv import causal_rows

    n = len(prompt)
    engine.prefill(torch.tensor([prompt]))
    out = [engine.decode_one(20, n)]
    for rows in rows_list:
        ar = torch.arange(n + 1, n + 1 + rows)
        ids = torch.randint(0, VOCAB, (1, rows), generator=torch.Generator().manual_seed(rows))
        out.append(tm(ids, ar, ar, causal_rows(n + 1, rows, n + 1 + rows, "cpu"), engine.tkv))
    return out


def bf16_exact(module):
    """The module with every float weight rounded to bfloat16 values (what a bfloat16 checkpoint loads as)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.copy_(p.bfloat16().float())
    return module


def tiny_drafter(config=None, *, selected=None, seed: int = 0, dtype: str = "float32"):
    from eaglekb.models.drafter import build_drafter_for_target

    config = config or tiny_llama_config()
    selected = list(range(0, 2 * DRAFT_VOCAB, 2)) if selected is None else selected
    return build_drafter_for_target(config, len(selected), mapping=selected, seed=seed,
                                    torch_dtype=dtype)


def write_drafter(path: Path, *, selected=None, fmt: str = "sglang", seed: int = 0) -> Path:
    from eaglekb.models.drafter import save_drafter

    return save_drafter(tiny_drafter(selected=selected, seed=seed), path, format=fmt)


def rewrite_tensors(path: Path, edit) -> None:
    """Load model.safetensors, let ``edit(dict)`` change it in place, write it back."""
    from safetensors.torch import load_file, save_file

    file = Path(path) / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def rewrite_config(path: Path, edit) -> None:
    file = Path(path) / "config.json"
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))


WORDS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant"]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    for i in range(len(WORDS), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    return fast


def write_tiny_target(folder: Path, *, bf16_values: bool = False) -> Path:
    """A tiny Llama target folder (weights and tokenizer); ``bf16_values``: weights a bfloat16 checkpoint holds."""
    cfg = tiny_llama_config(max_position_embeddings=256, eos_token_id=2)
    model = tiny_causal_lm(cfg)
    if bf16_values:
        bf16_exact(model)
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder
