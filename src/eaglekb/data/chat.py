"""The chat template, applied to prompts and conversations (token ids and the loss mask).

Owns: the prompt's token ids with the assistant header (``chat_prefix_ids``) and a
whole conversation's token ids with its loss mask, 1 on the assistant's response
(``conversation_ids``), refusing a tokenizer without a chat template or one whose
prompt is not a prefix of the conversation (the mask would be wrong).

Knows nothing about models, generation, datasets or the task runner.
"""

from __future__ import annotations

from typing import Sequence

from eaglekb.io.errors import Incompatible, MissingFile


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
