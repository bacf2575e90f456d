"""The story's three prompt sets: A (wiki + chitchat), B (gsm8k + gpqa) and eval (gsm8k-eval), disjoint by text.

Owns which corpora make each set, the long-prompt cut and the disjointness checks between the sets. The file
format (a prompt-sets file with its manifest) and the corpora are ``eaglekb.data.prompts`` and
``eaglekb.data.corpora``; knows nothing about models or the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglekb.data import corpora, prompts
from eaglekb.data.corpora import PromptSet
from eaglekb.io.errors import BadInput
from eaglekb.studies.story.config import A_CORPORA, B_CORPORA, EVAL_SET, SETS


def _drop_long(ps: PromptSet, max_prompt_chars: int) -> None:
    """A long prompt left-pads its whole generate batch: drop the few very long ones (in place)."""
    keep = [p for p in ps.prompts if len(p.text) <= max_prompt_chars]
    ps.manifest.update(dropped_long_count=len(ps.prompts) - len(keep), max_prompt_chars=max_prompt_chars,
                       count=len(keep), sha256=corpora.prompts_hash(keep))
    ps.prompts = keep


def write_prompts(out: str | Path, *, a_per_source: int = 1152, b_per_source: int = 1200,
                  max_prompt_chars: int = 1500, eval_count: int = 16, seed: int = 0) -> dict[str, Any]:
    """Write the A, B and eval prompts (one JSON line each, with its ``set``) and a manifest beside them."""
    out = Path(out)
    a = prompts.training_prompts(list(A_CORPORA), per_source=a_per_source, seed=seed)
    b = prompts.training_prompts(list(B_CORPORA), per_source=b_per_source, seed=seed)
    ev = corpora.load(EVAL_SET, split="eval", limit=eval_count)
    if len(ev) < eval_count:  # refused, never clamped
        raise BadInput("fewer eval prompts than asked for", where="--eval-count",
                       expected=f"at most {len(ev)} (the {EVAL_SET} prompts there are)", found=str(eval_count))
    for ps in (a, b):
        _drop_long(ps, max_prompt_chars)
    for train in (a, b):  # training_prompts checked both eval sets; the two domains must not share prompts either
        corpora.check_disjoint(train, ev)
    corpora.check_disjoint(a, b)
    prompts.write_prompt_sets(out, dict(zip(SETS, (a, b, ev))))
    return {"file": str(out), "bytes": out.stat().st_size, "A": len(a), "B": len(b), "eval": len(ev)}


def read_prompts(path: str | Path) -> dict[str, PromptSet]:
    """{"A": PromptSet, "B": PromptSet, "eval": PromptSet} from a prompts file and its manifest."""
    return prompts.read_prompt_sets(path, SETS, made_by="the file `invoke story.prompts` writes")
