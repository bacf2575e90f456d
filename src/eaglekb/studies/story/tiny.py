"""Tiny mode: a random Llama with a character tokenizer and a few prompts, so the whole story runs on a CPU.

Owns the tiny chat tokenizer (ChatML specials and template; the datagen tests use it too), the tiny target
(written once into the work folder) and the tiny prompt sets. The numbers a tiny run gives mean nothing: the
plumbing is the point. Knows nothing about the stages that use them.
"""

from __future__ import annotations

from pathlib import Path

from eaglekb.data import prompts
from eaglekb.data.corpora import Prompt, PromptSet

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


def _write_tiny_target(folder: Path) -> None:
    """A 6-layer random Llama that never stops early (its eos is never predicted), with the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

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


def tiny_prompt_sets() -> dict[str, PromptSet]:
    """The tiny A, B and eval sets (each training text twice, numbered)."""
    texts = {"A": [f"{t} ({i})" for i in range(2) for t in TINY_A],
             "B": [f"{t} ({i})" for i in range(2) for t in TINY_B],
             "eval": list(TINY_EVAL)}
    return {k: PromptSet(f"tiny-{k}", [Prompt(id=f"tiny{k}:{i}", source=f"tiny{k}",
                                              messages=({"role": "user", "content": t},))
                                       for i, t in enumerate(v)],
                         manifest={"source": f"tiny-{k}", "count": len(v)})
            for k, v in texts.items()}


def make_tiny(work: Path) -> tuple[Path, Path]:
    """A tiny random Llama (char tokenizer, ChatML) and a prompts file: the whole pipeline on CPU."""
    folder = work / "tiny-target"
    if not (folder / "config.json").is_file():
        _write_tiny_target(folder)
    path = prompts.write_prompt_sets(work / "tiny-prompts.jsonl", tiny_prompt_sets())
    return folder, path
