"""Training checkpoints without pickle: the drafter in SGLang format plus the trainer state.

Owns the checkpoint folder layout ``out/checkpoints/step-NNNNNNN/`` (a drafter folder
that SGLang loads as is, plus ``trainer/state.safetensors``: float32 parameters, the
mapping buffers, AdamW moments and the torch RNG state, and ``trainer/state.json``:
step, history, optimiser hyper-parameters and the resume fingerprint),
``list_checkpoints``, ``save_checkpoint`` (written into a temp folder, then renamed;
the oldest beyond ``keep`` removed) and ``load_checkpoint`` (refuses a checkpoint
written under another fingerprint in one line naming the setting that changed, as the
user gives it, with the checkpoint's value and the new one; a truncated or corrupt state
file, a tensor missing or of another shape: one line, nothing restored). ``--new-data``
lets a resume continue on another dataset (the same mapping, drafter and schedule):
the way a run goes on over machines that cannot keep its data.

Checkpoints across machines that do not outlive a run (``pack_checkpoint`` /
``unpack_checkpoint``): the trainer state is cut into pieces with
``eaglekb.io.pieces.split`` beside one ``step-N.checkpoint.json`` that holds the small
files (``config.json``, ``state.json``) and the SHA-256 of ``model.safetensors``, which is
not in the pieces: it is rebuilt from the float32 parameters and checked against that hash.
Unpacking checks every piece, the fingerprint and the rebuilt drafter before the
checkpoint appears under ``out/checkpoints`` (a temp folder, then renamed): a missing,
truncated or corrupt piece, or a checkpoint of another config, is one line and leaves the
checkpoint folder untouched.

Knows nothing about data, the loss, processes or the task runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from eaglekb.data.datagen import first_difference
from eaglekb.formats.drafter import read_config
from eaglekb.io import pieces
from eaglekb.io.errors import Incompatible, IntegrityError, SchemaError
from eaglekb.io.files import (atomic_save_safetensors, atomic_write_json, atomic_write_text, process_alive, read_json,
                              read_safetensors)
from eaglekb.models.drafter import Eagle3Drafter, save_drafter

STATE_DIR = "trainer"
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
#: Fingerprint keys of the dataset itself: the only ones ``--new-data`` lets change on a resume.
DATA_KEYS = ("data", "data_tokens")
PACK_FORMAT = "eaglekb-checkpoint-pieces/1"
PACK_SUFFIX = ".checkpoint.json"
_STEP_NAME = re.compile(r"^step-\d{7}$")
#: Fingerprint keys -> the setting a user gives (``invoke finetune`` options), for one-line refusals.
SETTINGS = {"data": "--data (the dataset's identity)", "data_tokens": "--data (tokens in the dataset)",
            "total_steps": "--steps / --epochs (total steps)", "mapping_sha": "the draft-vocab mapping (--mapping, "
            "--draft-vocab-size or the data's token counts)", "init": "--init"}
#: Drafter config fields that come from the target rather than from an option.
TARGET_FIELDS = ("target_hidden_size", "vocab_size", "aux_layer_ids", "eagle_aux_hidden_state_layer_ids",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "max_position_embeddings")


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
    for stale in root.glob(".tmp-step-*"):  # a half-written checkpoint of a run that was killed (its pid is gone)
        pid = stale.name.rpartition("-")[2]
        if stale == tmp or not process_alive(int(pid) if pid.isdigit() else 0):
            shutil.rmtree(stale, ignore_errors=True)
    try:
        save_drafter(drafter, tmp)
        atomic_save_safetensors(tmp / STATE_DIR / STATE_TENSORS, _state_tensors(drafter, opt))
        doc = {"step": step, "fingerprint": fingerprint, "fingerprint_hash": fingerprint_hash(fingerprint),
               "history": history,
               "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}
        atomic_write_json(tmp / STATE_DIR / STATE_JSON, doc)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:  # interrupted or failed: no half-written checkpoint stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _leaves(a: Any, b: Any, path: tuple = ()) -> list[tuple[tuple, Any, Any]]:
    """Every (path, old, new) where two JSON trees differ, leaf by leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) for d in _leaves(a.get(k), b.get(k),
                                                                                               path + (k,))]
    return [(path, a, b)]


def _name(path: tuple) -> tuple[tuple[int, int], str]:
    """(priority, the setting as a user gives it) of a fingerprint path. The first named is the cause, not a
    consequence: another target's data, then another dataset, then an option or the drafter shape, then the
    mapping (it follows the data and --draft-vocab-size), the total steps last (they follow --epochs and the data)."""
    key = path[0] if path else ""
    if key == "drafter" and len(path) > 1:
        field = path[1]
        if field in TARGET_FIELDS:
            return (0, TARGET_FIELDS.index(field)), f"the target (drafter {field}; --data holds another target's data)"
        if field in ("intermediate_size", "draft_vocab_size"):
            return (2, 0), f"--{field.replace('_', '-')}"
        return (2, 0), f"the drafter shape ({'.'.join(path[1:])})"
    order = {"data": (1, 0), "data_tokens": (1, 1), "mapping_sha": (3, 0), "total_steps": (4, 0), "init": (2, 0)}
    if key in SETTINGS:
        return order[key], SETTINGS[key]
    return (2, 0), f"--{key.replace('_', '-')}" + (f" ({'.'.join(path[1:])})" if len(path) > 1 else "")


def changed_setting(old: dict, new: dict) -> tuple[str, Any, Any]:
    """The setting in which two fingerprints differ, named as the user gives it: (setting, old, new).

    Both sides are compared as JSON (a tuple and a list of the same items are the same setting)."""
    old, new = json.loads(json.dumps(old, default=str)), json.loads(json.dumps(new, default=str))
    diffs = _leaves(old, new)
    if not diffs:
        return "the checkpoint's fingerprint (its hash does not match its settings)", None, None
    path, a, b = min(diffs, key=lambda d: _name(d[0])[0])
    return _name(path)[1], a, b


def check_fingerprint(where: str, doc: dict, fingerprint: dict, *, new_data: bool = False) -> None:
    """Refuse a checkpoint (its state.json ``doc``) written under another config: one line, both sides.

    ``new_data`` (``--new-data``): the dataset may differ (``DATA_KEYS``); everything else must not."""
    if doc.get("fingerprint_hash") == fingerprint_hash(fingerprint):
        return
    old = doc.get("fingerprint", {}) if isinstance(doc.get("fingerprint"), dict) else {}
    new = dict(fingerprint)
    if new_data:
        old = {k: v for k, v in old.items() if k not in DATA_KEYS}
        new = {k: v for k, v in new.items() if k not in DATA_KEYS}
        if old and fingerprint_hash(old) == fingerprint_hash(new):
            return
    setting, a, b = changed_setting(old, new)
    fix = "resume with the settings that wrote it, or train into another --out"
    if setting == SETTINGS["mapping_sha"]:
        fix = "pass --mapping with the checkpoint's folder (its mapping) to train on other data, or another --out"
    elif setting.startswith("--data") and not new_data:
        fix = "pass --new-data to continue this run on another dataset, or train into another --out"
    raise Incompatible("checkpoint is from another training config", where=where,
                       expected=f"{setting} {_short(a)} (the checkpoint's)", found=f"{_short(b)} (now)", fix=fix)


def data_changed(doc: dict, fingerprint: dict) -> bool:
    """Whether a checkpoint (its state.json) was trained on another dataset than ``fingerprint`` names."""
    old = doc.get("fingerprint") or {}
    return any(old.get(k) != fingerprint.get(k) for k in DATA_KEYS)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def load_checkpoint(path: Path, drafter, opt, fingerprint: dict, *, new_data: bool = False) -> dict:
    """Restore drafter weights, mapping, optimiser and RNG from ``path``; returns its state.json."""
    doc = read_json(path / STATE_DIR / STATE_JSON, what="checkpoint state")
    if not isinstance(doc, dict) or not isinstance(doc.get("step"), int) or not isinstance(doc.get("history"), dict):
        raise SchemaError("checkpoint state is not a trainer state", where=str(path / STATE_DIR / STATE_JSON),
                          expected="step, history, fingerprint", found=type(doc).__name__)
    check_fingerprint(str(path), doc, fingerprint, new_data=new_data)
    tensors = read_safetensors(path / STATE_DIR / STATE_TENSORS)
    _check_tensors(path, tensors, drafter)
    _load_weights(drafter, tensors)
    _restore_optimizer(opt, drafter, tensors, doc["param_groups"])
    torch.set_rng_state(tensors["rng.torch"])
    return doc


def _load_weights(drafter, tensors: dict) -> None:
    """The drafter's parameters and mapping buffers from a checkpoint's tensors (already checked)."""
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            p.copy_(tensors[f"param.{n}"].to(p.dtype))
        drafter.d2t.copy_(tensors["buffer.d2t"])
        drafter.t2d.copy_(tensors["buffer.t2d"])


def _check_tensors(path: Path, tensors: dict[str, torch.Tensor], drafter) -> None:
    """Every parameter and mapping buffer in the state file, of the drafter's shape (else one line)."""
    want = {f"param.{n}": tuple(p.shape) for n, p in drafter.named_parameters()}
    want.update({"buffer.d2t": tuple(drafter.d2t.shape), "buffer.t2d": tuple(drafter.t2d.shape), "rng.torch": None})
    for key, shape in want.items():
        if key not in tensors:
            raise IntegrityError("checkpoint state misses a tensor", where=str(path / STATE_DIR / STATE_TENSORS),
                                 expected=key, found=f"{len(tensors)} other tensors")
        if shape is not None and tuple(tensors[key].shape) != shape:
            raise Incompatible("checkpoint tensor has another shape than the drafter", where=f"{path}:{key}",
                               expected=str(list(shape)), found=str(list(tensors[key].shape)))


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


# ----------------------------------------------------------------------------- across machines: pieces


def pack_checkpoint(ckpt: Path, dest: Path, piece_bytes: int) -> dict:
    """``ckpt`` (a ``step-N`` folder) as pieces of at most ``piece_bytes`` under ``dest``; what was written
    (``manifest`` path, ``files``, ``bytes``, ``largest_bytes``).

    Writes ``step-N.state.safetensors.partNNN`` with their piece manifest, then ``step-N.checkpoint.json`` (last,
    so a reader never finds a manifest without its pieces). Packing the same step again replaces its set."""
    ckpt, dest = Path(ckpt), Path(dest)
    state = read_json(ckpt / STATE_DIR / STATE_JSON, what="checkpoint state")
    split = pieces.split(ckpt / STATE_DIR / STATE_TENSORS, dest, piece_bytes, name=f"{ckpt.name}.{STATE_TENSORS}",
                         force=True, where="--piece-mib")
    doc = {"format": PACK_FORMAT, "checkpoint": ckpt.name, "step": state["step"],
           "fingerprint_hash": state.get("fingerprint_hash"),
           "config_json": (ckpt / "config.json").read_text(encoding="utf-8"),
           "state_json": (ckpt / STATE_DIR / STATE_JSON).read_text(encoding="utf-8"),
           "model_sha256": pieces.sha256_file(ckpt / "model.safetensors"),
           "d2t": read_safetensors(ckpt / STATE_DIR / STATE_TENSORS, keys=["buffer.d2t"])["buffer.d2t"].tolist(),
           "state_pieces": pieces.manifest_path(dest, split["name"]).name}
    manifest = atomic_write_json(dest / f"{ckpt.name}{PACK_SUFFIX}", doc)
    files = sorted(f for f in dest.glob(f"{ckpt.name}.*") if f.is_file())
    return {"manifest": str(manifest), "files": [f.name for f in files], "bytes": sum(f.stat().st_size for f in files),
            "largest_bytes": max(f.stat().st_size for f in files)}


def checkpoint_d2t(out: Path, resume_from: str | None) -> torch.Tensor | None:
    """The mapping (d2t) of the checkpoint a resume would start from: the newest pieces in ``resume_from``, else
    the newest checkpoint in ``out``; None when there is none (a first run)."""
    if resume_from:
        doc = read_pack(newest_pack(Path(resume_from)))
        if not isinstance(doc.get("d2t"), list) or not all(isinstance(v, int) for v in doc["d2t"]):
            raise SchemaError("checkpoint pieces manifest holds no mapping", where=str(resume_from),
                              expected="d2t: a list of integers", found=type(doc.get("d2t")).__name__)
        return torch.tensor(doc["d2t"], dtype=torch.int64)
    existing = list_checkpoints(out)
    if not existing:
        return None
    return read_safetensors(existing[-1] / STATE_DIR / STATE_TENSORS, keys=["buffer.d2t"])["buffer.d2t"].long()


def read_pack(path: Path) -> dict:
    """A checkpoint pieces manifest, its shape checked (one line on anything else)."""
    doc = read_json(path, what="checkpoint pieces manifest")
    keys = ("checkpoint", "config_json", "state_json", "model_sha256", "state_pieces")
    if not (isinstance(doc, dict) and doc.get("format") == PACK_FORMAT and all(isinstance(doc.get(k), str)
                                                                                for k in keys)):
        raise SchemaError("not a checkpoint pieces manifest", where=str(path), expected=f"format {PACK_FORMAT}",
                          found=repr(doc.get("format")) if isinstance(doc, dict) else type(doc).__name__)
    if not _STEP_NAME.match(doc["checkpoint"]) or Path(doc["state_pieces"]).name != doc["state_pieces"]:
        raise SchemaError("checkpoint pieces manifest names another path", where=str(path),
                          expected="step-NNNNNNN and a plain file name", found=repr(doc["checkpoint"]))
    return doc


def newest_pack(folder: Path) -> Path:
    """The checkpoint pieces manifest of the highest step in ``folder`` (one line when there is none)."""
    found = sorted(Path(folder).glob(f"step-*{PACK_SUFFIX}")) if Path(folder).is_dir() else []
    if not found:
        raise IntegrityError("no checkpoint pieces there", where=str(folder), expected=f"step-NNNNNNN{PACK_SUFFIX} "
                             "and its pieces", found="none", fix="copy the pieces written by --pieces-out there")
    return found[-1]


def unpack_checkpoint(path: Path, out: Path, fingerprint: dict, *, write: bool = True, new_data: bool = False) -> Path:
    """Join the checkpoint of manifest ``path`` into ``out/checkpoints/step-N``, everything checked first.

    A piece missing, truncated or corrupt, a checkpoint of another config, a rebuilt drafter that does not match
    its hash, or another checkpoint of that step already there: one line, ``out/checkpoints`` untouched.
    ``write=False`` makes the checks only (the other processes of a run, while the first one writes)."""
    path = Path(path)
    doc = read_pack(path)
    pieces.check(path.parent / doc["state_pieces"])
    try:
        state = json.loads(doc["state_json"])
    except json.JSONDecodeError as exc:
        raise SchemaError("checkpoint state in the manifest is not valid JSON", where=str(path),
                          found=str(exc).splitlines()[0]) from None
    check_fingerprint(str(path), state if isinstance(state, dict) else {}, fingerprint, new_data=new_data)
    root = Path(out) / "checkpoints"
    final = root / doc["checkpoint"]
    if final.exists():
        if (final / "model.safetensors").is_file() and pieces.sha256_file(final / "model.safetensors") == \
                doc["model_sha256"] and (final / STATE_DIR / STATE_JSON).is_file():
            return final  # already there: the same checkpoint
        raise Incompatible("another checkpoint of that step is there", where=str(final),
                           expected=f"model sha256 {doc['model_sha256'][:16]}", found="other files",
                           fix="train into another --out (nothing was overwritten)")
    if not write:
        return final
    tmp = root / f".tmp-unpack-{doc['checkpoint']}-{os.getpid()}"
    try:
        _join_into(tmp, path, doc)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _join_into(tmp: Path, path: Path, doc: dict) -> None:
    """The checkpoint folder of ``doc`` written under ``tmp``: state joined, small files, the drafter rebuilt."""
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / STATE_DIR).mkdir(parents=True)
    pieces.join(path.parent / doc["state_pieces"], tmp / STATE_DIR / STATE_TENSORS)
    atomic_write_text(tmp / "config.json", doc["config_json"])
    atomic_write_text(tmp / STATE_DIR / STATE_JSON, doc["state_json"])
    tensors = read_safetensors(tmp / STATE_DIR / STATE_TENSORS)
    drafter = Eagle3Drafter(read_config(tmp)[0], with_embeddings="param.embed_tokens.weight" in tensors)
    _check_tensors(tmp, tensors, drafter)
    _load_weights(drafter, tensors)
    save_drafter(drafter, tmp)
    atomic_write_text(tmp / "config.json", doc["config_json"])
    found = pieces.sha256_file(tmp / "model.safetensors")
    if found != doc["model_sha256"]:
        raise IntegrityError("rebuilt drafter does not match the packed checkpoint", where=str(path),
                             expected=f"model.safetensors sha256 {doc['model_sha256'][:16]}", found=found[:16])
