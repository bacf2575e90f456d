"""Datagen helpers shared by the data and training tests: a tiny char-level target, prompts, a small config."""

from __future__ import annotations

from pathlib import Path

from eaglekb.data import datagen
from eaglekb.data.corpora import Prompt, PromptSet, prompts_hash

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!'\n"


def tiny_tokenizer():
    """A character-level fast tokenizer with ChatML specials (ids 0-2) and a chat template."""
    from eaglekb.studies.story import tiny_chat_tokenizer

    return tiny_chat_tokenizer(CHARS)


def make_target(folder: Path, *, seed: int = 0, hidden: int = 32) -> Path:
    """A tiny random Llama with the char tokenizer, saved as a transformers folder."""
    from helpers.models import tiny_causal_lm, tiny_llama_config

    cfg = tiny_llama_config(max_position_embeddings=512, hidden_size=hidden, eos_token_id=2, pad_token_id=2,
                            bos_token_id=1)
    model = tiny_causal_lm(cfg, seed=seed)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 2
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def prompts(n: int = 6) -> PromptSet:
    texts = ["tell me about owls.", "what is two plus two?", "hello there", "write a poem about rain.",
             "why is the sky blue?", "count to five.", "name a fruit.", "say hi."]
    items = [Prompt(id=f"t:{i}", source="t", messages=({"role": "user", "content": texts[i % len(texts)]},))
             for i in range(n)]
    return PromptSet("tiny", items, manifest={"source": "tiny", "count": n, "sha256": prompts_hash(items)})


def small_cfg(**over) -> datagen.DatagenConfig:
    kw = dict(max_new_tokens=12, max_len=96, batch_size=3, shard_size=4, dtype="float32")
    kw.update(over)
    return datagen.DatagenConfig(**kw)
