"""Training checkpoints without pickle: the drafter in SGLang format plus the trainer state.

Owns the checkpoint folder layout ``out/checkpoints/step-NNNNNNN/`` (a drafter folder
that SGLang loads as is, plus ``trainer/state.safetensors``: float32 parameters, the
mapping buffers, AdamW moments and the torch RNG state, and ``trainer/state.json``:
step, history, optimiser hyper-parameters and the resume fingerprint),
``list_checkpoints``, ``save_checkpoint`` (written into a temp folder, then renamed;
the oldest beyond ``keep`` removed) and ``load_checkpoint`` (refuses a checkpoint
written under another fingerprint, naming the first difference).

Knows nothing about data, the loss, processes or the task runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from eaglekb.data.datagen import first_difference
from eaglekb.io.errors import Incompatible
from eaglekb.io.files import atomic_save_safetensors, atomic_write_json, read_json, read_safetensors
from eaglekb.models.drafter import save_drafter

STATE_DIR = "trainer"
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"


def list_checkpoints(out: Path) -> list[Path]:
    """The complete checkpoints of a run folder, oldest first."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / STATE_DIR / STATE_JSON).is_file())


def fingerprint_hash(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _state_tensors(drafter, opt) -> dict[str, torch.Tensor]:
    """Parameters (float32), d2t/t2d, AdamW moments by parameter name, and the torch RNG state."""
    tensors: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in drafter.named_parameters()}
    for n, p in drafter.named_parameters():
        tensors[f"param.{n}"] = p.detach().float().cpu().contiguous()
    for n, b in drafter.named_buffers():
        if n in ("d2t", "t2d"):
            tensors[f"buffer.{n}"] = b.detach().cpu().contiguous()
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value):
                    tensors[f"opt.{names[id(p)]}.{key}"] = value.detach().float().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    return tensors


def save_checkpoint(out: Path, step: int, drafter, opt, fingerprint: dict, history: dict, keep: int) -> Path:
    """Write ``out/checkpoints/step-<step>`` (temp folder, then renamed); keep the newest ``keep``."""
    root = Path(out) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_drafter(drafter, tmp)
    atomic_save_safetensors(tmp / STATE_DIR / STATE_TENSORS, _state_tensors(drafter, opt))
    doc = {"step": step, "fingerprint": fingerprint, "fingerprint_hash": fingerprint_hash(fingerprint),
           "history": history,
           "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}
    atomic_write_json(tmp / STATE_DIR / STATE_JSON, doc)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, drafter, opt, fingerprint: dict) -> dict:
    """Restore drafter weights, mapping, optimiser and RNG from ``path``; returns its state.json."""
    doc = read_json(path / STATE_DIR / STATE_JSON, what="checkpoint state")
    if doc.get("fingerprint_hash") != fingerprint_hash(fingerprint):
        where, old, new = first_difference(doc.get("fingerprint", {}), fingerprint)
        raise Incompatible("checkpoint is from another training config", where=str(path),
                           expected="the same data, drafter shape, mapping and schedule",
                           found=f"{where}: {old!r} in the checkpoint, {new!r} now",
                           fix="resume with the config that wrote it, or use another --out")
    tensors = read_safetensors(path / STATE_DIR / STATE_TENSORS)
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            p.copy_(tensors[f"param.{n}"].to(p.dtype))
        drafter.d2t.copy_(tensors["buffer.d2t"])
        drafter.t2d.copy_(tensors["buffer.t2d"])
    _restore_optimizer(opt, drafter, tensors, doc["param_groups"])
    torch.set_rng_state(tensors["rng.torch"])
    return doc


def _restore_optimizer(opt, drafter, tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> None:
    by_name = dict(drafter.named_parameters())
    state = {}
    for idx, (n, p) in enumerate(by_name.items()):
        st = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"opt.{n}.")
              and k.count(".") == n.count(".") + 2}
        if st:
            state[idx] = {k: (v.to(p.device) if k != "step" else v) for k, v in st.items()}
    groups = [dict(g, params=list(range(len(by_name)))) for g in param_groups]
    opt.load_state_dict({"state": state, "param_groups": groups})
