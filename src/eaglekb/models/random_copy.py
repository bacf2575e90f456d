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

import math
import shutil
from pathlib import Path

from eaglekb.io.errors import BadInput, MissingFile, first_line
from eaglekb.models.checks import FLOAT_FIELDS, INT_FIELDS, check_config
from eaglekb.models.sources import resolve

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt")


def _check_overrides(overrides: dict) -> None:
    """Size fields whole numbers in range and float fields positive and finite, as ``check_config`` reads them
    in a model folder: a copy with 0 layers or a NaN width is refused, not written."""
    for key, value in overrides.items():
        top = INT_FIELDS.get(key)
        bad_int = top is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top)
        bad_float = key in FLOAT_FIELDS and (isinstance(value, bool) or not isinstance(value, (int, float))
                                             or not (math.isfinite(value) and value > 0))
        if bad_int or bad_float:
            raise BadInput("config value out of range", where=f"--set {key}={value}",
                           expected=f"a whole number in 1..{top}" if bad_int else "a number > 0", found=repr(value)[:80])


def random_copy(name: str, out: str | Path, *, seed: int = 0, dtype: str = "bfloat16",
                overrides: dict | None = None, device: str = "cpu") -> dict:
    """Write ``out``: ``name``'s config and tokenizer with weights drawn from ``seed``; returns what was written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in ("float32", "bfloat16", "float16"):
        raise BadInput("unsupported dtype", where="--dtype", expected="float32, bfloat16 or float16", found=repr(dtype))
    # a folder needs only its config and tokenizer (a shape to copy); an embedded name must be prepared
    src = Path(name).expanduser() if Path(name).expanduser().is_dir() else Path(resolve(str(name)))
    if not (src / "config.json").is_file():
        raise MissingFile("model folder has no config.json", where=str(src), fix=f"invoke models.prepare {name}")
    check_config(src)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BadInput("output folder is not empty", where=str(out), fix="choose a new --out (nothing was changed)")
    cfg = AutoConfig.from_pretrained(str(src))
    if overrides:  # another size of the same architecture (--set hidden_size=3584): the config rebuilt whole
        doc = cfg.to_dict()
        for key, value in overrides.items():
            if key not in doc:
                raise BadInput("not a field of the model's config", where=f"--set {key}={value}",
                               expected="a config.json field of " + type(cfg).__name__, found=repr(key))
        _check_overrides(overrides)
        doc.update(overrides)
        if "num_hidden_layers" in overrides:  # per-layer lists follow the new depth
            doc.pop("layer_types", None)
            if "max_window_layers" in doc and "max_window_layers" not in overrides:
                doc["max_window_layers"] = overrides["num_hidden_layers"]
        try:
            cfg = type(cfg).from_dict(doc)
        except Exception as exc:  # transformers' own field validation: the values the user set
            raise BadInput("the config refuses these --set values", where="--set " + ", ".join(
                f"{k}={v}" for k, v in overrides.items()), expected="values of the config's field types",
                found=first_line(exc, 120)) from None
    torch.manual_seed(seed)
    with torch.device(device):  # on a GPU, billions of parameters initialise in seconds
        model = AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    copied = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    for f in copied:
        shutil.copy(src / f, out / f)
    return {"source": str(src), "out": str(out), "seed": seed, "dtype": dtype, "device": device,
            "overrides": dict(overrides or {}),
            "parameters_count": sum(p.numel() for p in model.parameters()), "tokenizer_files": copied}
