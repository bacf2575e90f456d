"""A randomly initialised copy of a model: its config and tokenizer, new weights from a seed.

Owns ``random_copy``: for plumbing checks and timings that do not depend on the weights
(a decode step costs the same with any weights of the same shapes; a multi-GPU run
must agree with a one-GPU run whatever it learns), without the pinned model's licence
or its download. The copy is ``AutoModelForCausalLM.from_config`` after
``torch.manual_seed(seed)``, saved in ``dtype``, next to the source's tokenizer files,
so the same seed gives the same weights on any machine with the same torch.

Knows nothing about drafters, data or the task runner.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from eaglekb.io.errors import BadInput, MissingFile
from eaglekb.models.sources import resolve

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt")


def random_copy(name: str, out: str | Path, *, seed: int = 0, dtype: str = "bfloat16") -> dict:
    """Write ``out``: ``name``'s config and tokenizer with weights drawn from ``seed``; returns what was written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in ("float32", "bfloat16", "float16"):
        raise BadInput("unsupported dtype", where="--dtype", expected="float32, bfloat16 or float16", found=repr(dtype))
    src = Path(resolve(str(name)))
    if not (src / "config.json").is_file():
        raise MissingFile("model folder has no config.json", where=str(src), fix=f"invoke models.prepare {name}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BadInput("output folder is not empty", where=str(out), fix="choose a new --out (nothing was changed)")
    cfg = AutoConfig.from_pretrained(str(src))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    copied = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    for f in copied:
        shutil.copy(src / f, out / f)
    return {"source": str(src), "out": str(out), "seed": seed, "dtype": dtype,
            "parameters_count": sum(p.numel() for p in model.parameters()), "tokenizer_files": copied}
