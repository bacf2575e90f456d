"""Move a drafter to a new draft-vocab mapping: lm_head rows by target token id.

Owns: the remap plan (which target tokens are kept, moved, new, dropped), moving
``lm_head`` rows by target token id (never by position), the initialisations for
rows of tokens new to the mapping, reading the target's lm_head for them, and writing
the remapped drafter (every other tensor byte-identical, config.json unchanged but for
``draft_vocab_size``). The measured check on real hidden states (agreement and accuracy
before and after, the comparison of initialisations) is ``eaglekb.measure.remap_check``.

Initialisations for a token new to the mapping (``INITS``):

* ``target-scaled`` (the default with a target): the target's own lm_head row for that
  token times one scalar, the mean kept drafter row norm over the mean kept target row
  norm (a tied lm_head such as SmolLM2's has embedding-scale rows).
* ``target-fit``: the target's row mapped into the drafter's row space by the
  least-squares linear map fitted on the kept tokens (target row -> drafter row).
* ``target``: the target's row as it is.
* ``mean`` (the default without a target): the mean of the kept rows (one shared logit).
* ``zeros``: logit 0 for every new token.

The default was chosen by measurement (baseline ``remap/smollm2-chat-to-math``,
docs/howto/vocab.md): with a head on the target's scale every target-based init recovers
the new tokens (+7 points top-1 over mean/zeros, loss 0.8 instead of 1.8-2.3); with a
weaker head trained on another scale the raw target rows swamp the kept tokens (13% top-1
instead of 31%), while the scaled rows cost nothing in top-1 and about half a nat of
loss against zeros. ``target-scaled`` is the best worst case.

Knows nothing about counting tokens (``eaglekb.data.vocab``), measuring, training loops
or the task runner.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eaglekb.formats.drafter import (CONFIG_FILE, WEIGHTS_FILE, DrafterConfig, read_config, read_config_json,
                                     read_tensors, to_sglang_names, to_speculators_names)
from eaglekb.formats.mapping import Mapping, TokenCounts, drafter_d2t
from eaglekb.io.errors import BadInput, Incompatible, MissingFile, SchemaError
from eaglekb.io.files import (atomic_save_safetensors, atomic_write_json, read_json, read_safetensors, replace_folder,
                              safetensors_keys)

INITS = ("target-scaled", "target-fit", "target", "mean", "zeros")
TARGET_INITS = ("target-scaled", "target-fit", "target")
DEFAULT_INIT = "target-scaled"
FALLBACK_INIT = "mean"  # when no target is given


# ----------------------------------------------------------------------------- plan + lm_head


@dataclass
class RemapPlan:
    """Which rows go where: ``new_rows[kept_dst] = old_rows[kept_src]``."""

    kept_ids: torch.Tensor  # target ids in both mappings (ascending)
    kept_src: torch.Tensor  # source row of each kept token
    kept_dst: torch.Tensor  # its row in the new mapping
    new_dst: torch.Tensor  # rows of tokens new to the mapping
    new_ids: torch.Tensor  # their target ids
    dropped_ids: torch.Tensor  # target ids in the source mapping only

    def counts(self) -> dict[str, int]:
        return {"kept": int(self.kept_src.numel()), "moved": int((self.kept_src != self.kept_dst).sum()),
                "stayed": int((self.kept_src == self.kept_dst).sum()), "new": int(self.new_dst.numel()),
                "dropped": int(self.dropped_ids.numel())}


def plan_remap(src: Mapping, dst: Mapping) -> RemapPlan:
    """Match rows by target token id."""
    if src.vocab_size != dst.vocab_size:
        raise Incompatible("mappings are for different target vocab sizes", where="remap",
                           expected=f"target vocab {src.vocab_size} (the drafter's)", found=str(dst.vocab_size),
                           fix="build the new mapping with the drafter's target tokenizer")
    pos_src = src.positions()
    sel_dst = dst.selected
    rows_in_src = pos_src[sel_dst]
    keep = rows_in_src >= 0
    dst_rows = torch.arange(dst.draft_vocab_size, dtype=torch.int64)
    dropped = src.selected[~dst.t2d[src.selected]]
    return RemapPlan(kept_ids=sel_dst[keep], kept_src=rows_in_src[keep], kept_dst=dst_rows[keep], new_dst=dst_rows[~keep],
                     new_ids=sel_dst[~keep], dropped_ids=dropped)


def init_rows(method: str, plan: RemapPlan, lm_head: torch.Tensor, target_rows: torch.Tensor | None,
              *, ridge: float = 1e-4) -> torch.Tensor:
    """Rows ``[len(plan.new_ids), H]`` for the new tokens (float32)."""
    if method not in INITS:
        raise BadInput("unknown initialisation", where="--init", expected=", ".join(INITS), found=repr(method))
    h = lm_head.shape[1]
    n_new = int(plan.new_ids.numel())
    kept = lm_head[plan.kept_src].float()
    if method == "zeros" or n_new == 0:
        return torch.zeros(n_new, h)
    if method == "mean":
        if kept.numel() == 0:
            return torch.zeros(n_new, h)
        return kept.mean(0, keepdim=True).expand(n_new, h).clone()
    if target_rows is None:
        raise BadInput(f"--init {method} needs the target's lm_head", where="--init",
                       expected="--target MODEL", found="no target", fix=f"pass --target or use --init {FALLBACK_INIT}")
    tgt = target_rows.float()
    kept_ids = plan.kept_ids
    if method != "target-fit" and tgt.shape[1] != h:
        raise Incompatible("target lm_head width differs from the drafter's", where=f"--init {method}",
                           expected=str(h), found=str(tgt.shape[1]), fix="use --init target-fit")
    new = tgt[plan.new_ids]
    if method == "target":
        return new.clone()
    if kept.shape[0] == 0:
        raise BadInput("no kept tokens to calibrate the target rows on", where=f"--init {method}",
                       expected="at least one token in both mappings", found="none", fix="use --init target")
    src_kept_t = tgt[kept_ids]
    if method == "target-scaled":
        scale = kept.norm(dim=1).mean() / src_kept_t.norm(dim=1).mean().clamp_min(1e-12)
        return new * scale
    # target-fit: W = argmin ||X W - Y||^2 + ridge * tr(X^T X)/d * ||W||^2, X = target rows, Y = drafter rows.
    x, y = src_kept_t.double(), kept.double()
    gram = x.T @ x
    lam = ridge * float(gram.diagonal().mean())
    w = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=torch.float64), x.T @ y)
    return (new.double() @ w).float()


def remap_lm_head(lm_head: torch.Tensor, src: Mapping, dst: Mapping, *, init: str = FALLBACK_INIT,
                  target_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, RemapPlan]:
    """The new lm_head: kept tokens keep their source row (moved by target id), new rows by ``init``."""
    if lm_head.dim() != 2 or lm_head.shape[0] != src.draft_vocab_size:
        raise Incompatible("lm_head rows do not match d2t length", where="lm_head.weight",
                           expected=f"{src.draft_vocab_size} rows (one per d2t entry)", found=str(list(lm_head.shape)))
    if target_rows is not None and target_rows.shape[0] != src.vocab_size:
        raise Incompatible("target lm_head is for another vocab", where="--target",
                           expected=f"{src.vocab_size} rows", found=str(target_rows.shape[0]))
    plan = plan_remap(src, dst)
    out = torch.empty(dst.draft_vocab_size, lm_head.shape[1], dtype=lm_head.dtype)
    out[plan.kept_dst] = lm_head[plan.kept_src]
    if plan.new_dst.numel():
        out[plan.new_dst] = init_rows(init, plan, lm_head, target_rows).to(lm_head.dtype)
    return out, plan


# ----------------------------------------------------------------------------- target lm_head


_HEAD_NAMES = ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight")


def read_target_head(model_path: str | Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """The target's lm_head ``[vocab, hidden]`` (its input embeddings when tied), read from safetensors."""
    folder = Path(model_path)
    cfg = read_json(folder / "config.json", what="target config.json")
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingFile("no safetensors weights in target folder", where=str(folder))
    found: dict[str, torch.Tensor] = {}
    for file in files:
        keys, _ = safetensors_keys(file)
        wanted = [k for k in keys if k in _HEAD_NAMES]
        if wanted:
            found.update(read_safetensors(file, keys=wanted))
    head = found.get("lm_head.weight")
    if head is None and cfg.get("tie_word_embeddings", False):
        head = found.get("model.embed_tokens.weight", found.get("embed_tokens.weight"))
    if head is None:
        raise SchemaError("target has no lm_head.weight (and is not tied)", where=str(folder),
                          expected="lm_head.weight", found=", ".join(sorted(found)) or "neither")
    info = {"vocab_size": int(cfg.get("vocab_size", head.shape[0])), "hidden_size": int(cfg["hidden_size"]),
            "tied": bool(cfg.get("tie_word_embeddings", False)), "path": str(folder)}
    return head.float(), info


# ----------------------------------------------------------------------------- drafter files


def _read_drafter(path: Path) -> tuple[DrafterConfig, str, dict, Mapping]:
    """Config, format, tensors (SGLang names) and mapping of a drafter folder, lm_head and d2t checked."""
    cfg, fmt = read_config(path)
    tensors = to_sglang_names(read_tensors(path))
    for key in ("lm_head.weight", "d2t"):
        if key not in tensors:
            raise SchemaError("required tensor missing", where=str(path), expected=key, found="absent")
    d2t = drafter_d2t(tensors["d2t"], tensors.get("t2d"), tensors["lm_head.weight"].shape[0], cfg.vocab_size,
                      cfg.draft_vocab_size, str(path))
    return cfg, fmt, tensors, Mapping(d2t, cfg.vocab_size, source=str(path))


def _target_rows(target: str | Path | None, cfg: DrafterConfig) -> torch.Tensor | None:
    """The target's lm_head rows, checked against the drafter's vocab and target hidden size."""
    if target is None:
        return None
    target_rows, target_info = read_target_head(target)
    drafter_th = cfg.target_hidden_size or cfg.hidden_size
    if target_info["vocab_size"] != cfg.vocab_size or target_rows.shape[0] != cfg.vocab_size:
        raise Incompatible("target and drafter have different vocab sizes", where=str(target),
                           expected=str(cfg.vocab_size), found=str(target_info["vocab_size"]))
    if target_info["hidden_size"] != drafter_th:
        raise Incompatible("drafter was built for a target of another hidden size", where=str(target),
                           expected=f"hidden_size {drafter_th} (drafter target_hidden_size)",
                           found=str(target_info["hidden_size"]))
    return target_rows


def _check_mapping_vocab(cfg: DrafterConfig, mapping: Mapping) -> None:
    if mapping.vocab_size != cfg.vocab_size:
        raise Incompatible("mapping and drafter are for different target vocab sizes",
                           where=f"{mapping.source or 'mapping'}", expected=f"target vocab {cfg.vocab_size}",
                           found=str(mapping.vocab_size))


def _check_counts_and_out(cfg: DrafterConfig, source_counts: TokenCounts | None, src_path: Path, out: Path,
                          force: bool) -> None:
    """Refuse counts of another vocab, and an output folder that is in use, holds or is inside the source,
    or (with ``force``) is anything but a drafter folder: ``--force`` replaces a drafter, nothing else."""
    if source_counts is not None and source_counts.vocab_size != cfg.vocab_size:
        raise Incompatible("source counts are for another vocab", where="--source-counts",
                           expected=str(cfg.vocab_size), found=str(source_counts.vocab_size))
    src, dst = src_path.resolve(), out.resolve()
    if dst == src or dst in src.parents or src in dst.parents:
        raise BadInput("output folder is, holds or is inside the source drafter", where=f"--out {out}",
                       expected="a folder apart from the source", found=f"source {src_path}",
                       fix="choose an --out outside the source drafter (replacing it would delete the source)")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BadInput("output is not a folder", where=f"--out {out}", expected="a new folder",
                       found="a link" if out.is_symlink() else "a file", fix="choose another --out")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise BadInput("output folder exists and is not empty", where=str(out), expected="a new folder",
                           found="existing files", fix="choose another --out or pass --force")
        if not (out / CONFIG_FILE).is_file() or any(p.is_dir() or p.is_symlink() for p in out.iterdir()):
            raise BadInput("--force replaces a drafter folder only", where=f"--out {out}",
                           expected="a drafter folder (config.json and weight files, no subfolders)",
                           found="other files", fix="choose a new --out; nothing was deleted")


def _init_method(init: str | None, target_rows: torch.Tensor | None) -> str:
    method = init or (DEFAULT_INIT if target_rows is not None else FALLBACK_INIT)
    if method in TARGET_INITS and target_rows is None:
        raise BadInput(f"--init {method} needs the target's lm_head", where="--init", expected="--target MODEL",
                       found="no target", fix=f"pass --target or use --init {FALLBACK_INIT}")
    return method


def _moved_tensors(tensors: dict, fmt: str, new_head: torch.Tensor, mapping: Mapping) -> dict:
    """The drafter's tensors with the new lm_head, d2t and t2d, under the source format's names."""
    new_tensors = dict(tensors)
    new_tensors["lm_head.weight"] = new_head.contiguous()
    new_tensors["d2t"] = mapping.d2t.to(tensors["d2t"].dtype).contiguous()
    new_tensors["t2d"] = mapping.t2d.to(tensors["t2d"].dtype if "t2d" in tensors else torch.bool).contiguous()
    return to_speculators_names(new_tensors) if fmt == "speculators" else new_tensors


def _write_folder(out: Path, tensors: dict, config_doc: dict) -> None:
    """Write the drafter into a new temporary sibling, then rename it to ``out``: the folder appears whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        atomic_save_safetensors(tmp / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
        atomic_write_json(tmp / CONFIG_FILE, config_doc)
        replace_folder(tmp, out)  # an existing drafter folder (checked first) goes once the new one is in place
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remap_drafter(drafter: str | Path, mapping: Mapping, out: str | Path, *, init: str | None = None,
                  target: str | Path | None = None, source_counts: TokenCounts | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Write a drafter moved to ``mapping`` into ``out``; return the report.

    Every check runs before anything is written; the folder appears whole (written to
    a temporary sibling, then renamed).
    """
    src_path, out = Path(drafter), Path(out)
    cfg, fmt, tensors, src_map = _read_drafter(src_path)
    _check_mapping_vocab(cfg, mapping)
    target_rows = _target_rows(target, cfg)
    method = _init_method(init, target_rows)
    _check_counts_and_out(cfg, source_counts, src_path, out, force)

    new_head, plan = remap_lm_head(tensors["lm_head.weight"], src_map, mapping, init=method,
                                   target_rows=target_rows)
    config_doc = read_config_json(src_path)
    config_doc["draft_vocab_size"] = mapping.draft_vocab_size
    _write_folder(out, _moved_tensors(tensors, fmt, new_head, mapping), config_doc)

    report: dict[str, Any] = {
        "drafter": str(src_path), "out": str(out), "format": fmt, "init": method,
        "mapping": mapping.source, "target": str(target) if target else None,
        "source_draft_vocab": src_map.draft_vocab_size, "new_draft_vocab": mapping.draft_vocab_size,
        "vocab_size": cfg.vocab_size, **plan.counts(),
        "unchanged_tensors": sorted(k for k in tensors if k not in ("lm_head.weight", "d2t", "t2d")),
    }
    if source_counts is not None and source_counts.total:
        lost = int(source_counts.counts[plan.dropped_ids].sum())
        report["source_mass_lost_frac"] = lost / source_counts.total
    if mapping.counts is not None and mapping.counts.total:
        report["new_mass_frac"] = float(mapping.counts.counts[plan.new_ids].sum()) / mapping.counts.total
    return report


def render_remap(report: dict[str, Any]) -> str:
    lines = [
        f"remapped {report['drafter']} -> {report['out']} ({report['format']} format)",
        f"draft vocab {report['source_draft_vocab']} -> {report['new_draft_vocab']} "
        f"(target vocab {report['vocab_size']})",
        f"kept {report['kept']} tokens (moved {report['moved']} to another row, {report['stayed']} on the same row), "
        f"new {report['new']} (init: {report['init']}), dropped {report['dropped']}",
    ]
    if "source_mass_lost_frac" in report:
        lines.append(f"source-distribution mass lost with the dropped tokens: "
                     f"{100 * report['source_mass_lost_frac']:.2f}%")
    if "new_mass_frac" in report:
        lines.append(f"new mapping's mass on tokens new to the drafter: {100 * report['new_mass_frac']:.2f}%")
    lines.append(f"unchanged: {len(report['unchanged_tensors'])} tensors; config.json changed only in draft_vocab_size")
    return "\n".join(lines)
