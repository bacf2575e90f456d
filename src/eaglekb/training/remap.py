"""Move a drafter to a new draft-vocab mapping, and measure what the move preserves.

Owns: the remap plan (which target tokens are kept, moved, new, dropped), moving
``lm_head`` rows by target token id (never by position), the initialisations for
rows of tokens new to the mapping, writing the remapped drafter (every other tensor
byte-identical, config.json unchanged but for ``draft_vocab_size``), and the measured
check on real hidden states: teacher-forced top-1 agreement and accuracy before and
after, and the comparison of initialisations.

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

Knows nothing about counting tokens (``eaglekb.data.vocab``), training loops or the task runner.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.nn import functional as F

from eaglekb.data import vocab as V
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError

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


def plan_remap(src: V.Mapping, dst: V.Mapping) -> RemapPlan:
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


def remap_lm_head(lm_head: torch.Tensor, src: V.Mapping, dst: V.Mapping, *, init: str = FALLBACK_INIT,
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


def read_target_head(model_path: str | Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """The target's lm_head ``[vocab, hidden]`` (its input embeddings when tied), read from safetensors."""
    from safetensors import safe_open

    folder = Path(model_path)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise MissingFile("target config.json not found", where=str(cfg_path))
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingFile("no safetensors weights in target folder", where=str(folder))
    names = ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight")
    found: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                if key in names:
                    found[key] = fh.get_tensor(key)
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


def _read_drafter(path: Path):
    from eaglekb.models.drafter import read_config, read_tensors, to_sglang_names

    cfg, fmt = read_config(path)
    raw = read_tensors(path)
    tensors = to_sglang_names(raw)
    for key in ("lm_head.weight", "d2t"):
        if key not in tensors:
            raise SchemaError("required tensor missing", where=str(path), expected=key, found="absent")
    rows = tensors["lm_head.weight"].shape[0]
    d2t = tensors["d2t"].reshape(-1)
    if rows != d2t.numel():
        raise Incompatible("lm_head rows do not match d2t length", where=f"{path}:lm_head.weight",
                           expected=f"{d2t.numel()} rows (one per d2t entry)", found=f"{rows} rows")
    if d2t.numel() != cfg.draft_vocab_size:
        raise Incompatible("d2t length does not match draft_vocab_size", where=f"{path}:d2t",
                           expected=str(cfg.draft_vocab_size), found=str(d2t.numel()))
    V.check_mapping(d2t, tensors.get("t2d"), cfg.vocab_size, str(path))
    mapping = V.Mapping(d2t.to(torch.int64), cfg.vocab_size, source=str(path))
    return cfg, fmt, raw, tensors, mapping


def remap_drafter(drafter: str | Path, mapping: V.Mapping, out: str | Path, *, init: str | None = None,
                  target: str | Path | None = None, source_counts: V.TokenCounts | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Write a drafter moved to ``mapping`` into ``out``; return the report.

    Every check runs before anything is written; the folder appears whole (written to
    a temporary sibling, then renamed).
    """
    from safetensors.torch import save_file

    from eaglekb.models.drafter import WEIGHTS_FILE, to_speculators_names

    src_path, out = Path(drafter), Path(out)
    cfg, fmt, raw, tensors, src_map = _read_drafter(src_path)
    if mapping.vocab_size != cfg.vocab_size:
        raise Incompatible("mapping and drafter are for different target vocab sizes",
                           where=f"{mapping.source or 'mapping'}", expected=f"target vocab {cfg.vocab_size}",
                           found=str(mapping.vocab_size))
    target_rows, target_info = None, None
    if target is not None:
        target_rows, target_info = read_target_head(target)
        drafter_th = cfg.target_hidden_size or cfg.hidden_size
        if target_info["vocab_size"] != cfg.vocab_size or target_rows.shape[0] != cfg.vocab_size:
            raise Incompatible("target and drafter have different vocab sizes", where=str(target),
                               expected=str(cfg.vocab_size), found=str(target_info["vocab_size"]))
        if target_info["hidden_size"] != drafter_th:
            raise Incompatible("drafter was built for a target of another hidden size", where=str(target),
                               expected=f"hidden_size {drafter_th} (drafter target_hidden_size)",
                               found=str(target_info["hidden_size"]))
    method = init or (DEFAULT_INIT if target_rows is not None else FALLBACK_INIT)
    if method in TARGET_INITS and target_rows is None:
        raise BadInput(f"--init {method} needs the target's lm_head", where="--init", expected="--target MODEL",
                       found="no target", fix=f"pass --target or use --init {FALLBACK_INIT}")
    if source_counts is not None and source_counts.vocab_size != cfg.vocab_size:
        raise Incompatible("source counts are for another vocab", where="--source-counts",
                           expected=str(cfg.vocab_size), found=str(source_counts.vocab_size))
    if out.exists() and any(out.iterdir()) and not force:
        raise BadInput("output folder exists and is not empty", where=str(out), expected="a new folder",
                       found="existing files", fix="choose another --out or pass --force")
    if out.resolve() == src_path.resolve():
        raise BadInput("output folder is the source drafter", where=str(out), expected="another folder")

    head = tensors["lm_head.weight"]
    new_head, plan = remap_lm_head(head, src_map, mapping, init=method, target_rows=target_rows)
    new_tensors = dict(tensors)
    new_tensors["lm_head.weight"] = new_head.contiguous()
    new_tensors["d2t"] = mapping.d2t.to(tensors["d2t"].dtype).contiguous()
    new_tensors["t2d"] = mapping.t2d.to(tensors["t2d"].dtype if "t2d" in tensors else torch.bool).contiguous()
    if fmt == "speculators":
        new_tensors = to_speculators_names(new_tensors)
    config_doc = json.loads((src_path / "config.json").read_text())
    config_doc["draft_vocab_size"] = mapping.draft_vocab_size

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(new_tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config_doc, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    counts = plan.counts()
    report: dict[str, Any] = {
        "drafter": str(src_path), "out": str(out), "format": fmt, "init": method,
        "mapping": mapping.source, "target": str(target) if target else None,
        "source_draft_vocab": src_map.draft_vocab_size, "new_draft_vocab": mapping.draft_vocab_size,
        "vocab_size": cfg.vocab_size, **counts, "unchanged_tensors": sorted(k for k in tensors
                                                                           if k not in ("lm_head.weight", "d2t", "t2d")),
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


# ----------------------------------------------------------------------------- measuring


@dataclass
class Features:
    """What an lm_head sees and what it should predict: ``feats [P,H]``, target argmax ``labels [P]``."""

    feats: torch.Tensor
    labels: torch.Tensor
    prompts: int
    tokens: int


def head_eval(feats: torch.Tensor, labels: torch.Tensor, head: torch.Tensor, mapping: V.Mapping,
              restrict_rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Top-1 predictions (as target ids), accuracy, and loss on positions whose label is in the mapping."""
    logits = feats.float() @ head.float().T
    if restrict_rows is not None:
        mask = torch.full((head.shape[0],), float("-inf"))
        mask[restrict_rows] = 0.0
        logits = logits + mask
    draft_pred = logits.argmax(-1)
    pred = mapping.selected[draft_pred]
    pos = mapping.positions()[labels]
    inside = pos >= 0
    loss = F.cross_entropy(logits[inside], pos[inside]).item() if bool(inside.any()) else float("nan")
    return {"pred": pred, "acc": float((pred == labels).float().mean()), "loss": loss,
            "label_coverage": float(inside.float().mean())}


def check_remap(data: Features, src_head: torch.Tensor, src: V.Mapping, new_head: torch.Tensor, dst: V.Mapping,
                plan: RemapPlan) -> dict[str, Any]:
    """Does the remap preserve behaviour? Agreement on kept tokens, and the accuracy bound."""
    s = head_eval(data.feats, data.labels, src_head, src)
    n = head_eval(data.feats, data.labels, new_head, dst)
    k = head_eval(data.feats, data.labels, new_head, dst, restrict_rows=plan.kept_dst)
    in_both = dst.t2d[s["pred"]]
    agree_kept = (k["pred"] == s["pred"])[in_both]
    agree_full = (n["pred"] == s["pred"])[in_both]
    correct = s["pred"] == data.labels
    dropped_correct = correct & ~dst.t2d[data.labels]
    # Integer counts: the bound is exact, no float rounding in the comparison.
    total = int(data.labels.numel())
    bound_count = int(correct.sum()) - int(dropped_correct.sum())
    kept_correct = int((k["pred"] == data.labels).sum())
    bound = bound_count / total if total else 0.0
    return {
        "positions": int(data.labels.numel()),
        "src_pred_in_both": int(in_both.sum()),
        "kept_rows_agree": int(agree_kept.sum()),
        "kept_rows_agree_frac": float(agree_kept.float().mean()) if agree_kept.numel() else 1.0,
        "full_agree_frac": float(agree_full.float().mean()) if agree_full.numel() else 1.0,
        "src_acc": s["acc"], "src_loss": s["loss"], "new_acc": n["acc"], "new_loss": n["loss"],
        "kept_only_acc": k["acc"],
        "dropped_correct_frac": float(dropped_correct.float().mean()),
        "acc_bound": bound,
        "bound_holds": kept_correct >= bound_count,
        "label_in_src_frac": s["label_coverage"], "label_in_dst_frac": n["label_coverage"],
    }


def fit_head(data: Features, mapping: V.Mapping, *, steps: int = 300, lr: float = 3e-3, batch: int = 512,
             seed: int = 0, std: float = 0.02) -> torch.Tensor:
    """Train an lm_head ``[N, H]`` from random init (as a drafter's is) on positions whose label is in the mapping."""
    gen = torch.Generator().manual_seed(seed)
    pos = mapping.positions()[data.labels]
    keep = pos >= 0
    x, y = data.feats[keep].float(), pos[keep]
    if not y.numel():
        raise BadInput("no training position has its label in the mapping", where="fit_head", found="0 positions")
    head = (torch.randn(mapping.draft_vocab_size, x.shape[1], generator=gen) * std).requires_grad_(True)
    opt = torch.optim.Adam([head], lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, y.numel(), (min(batch, y.numel()),), generator=gen)
        loss = F.cross_entropy(x[idx] @ head.T, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.detach()


def compare_inits(data: Features, src_head: torch.Tensor, src: V.Mapping, dst: V.Mapping,
                  target_rows: torch.Tensor | None, inits: Sequence[str] = INITS) -> dict[str, dict[str, Any]]:
    """Remap with each init and measure it on held-out positions."""
    out = {}
    for method in inits:
        if method in TARGET_INITS and target_rows is None:
            continue
        new_head, plan = remap_lm_head(src_head, src, dst, init=method, target_rows=target_rows)
        out[method] = check_remap(data, src_head, src, new_head, dst, plan)
    return out


def check_files(src_drafter: str | Path, new_drafter: str | Path) -> dict[str, Any]:
    """Compare two drafter folders tensor by tensor: which are byte-identical, and the config diff."""
    from eaglekb.models.drafter import read_tensors

    a, b = read_tensors(src_drafter), read_tensors(new_drafter)
    same = sorted(k for k in a if k in b and a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                  and torch.equal(a[k], b[k]))
    ca = json.loads((Path(src_drafter) / "config.json").read_text())
    cb = json.loads((Path(new_drafter) / "config.json").read_text())
    changed = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    if set(a) != set(b):
        raise IntegrityError("remapped drafter has other tensor names", where=str(new_drafter),
                             expected=", ".join(sorted(a)), found=", ".join(sorted(b)))
    return {"identical_tensors": same, "changed_tensors": sorted(set(a) - set(same)), "changed_config": changed}


# ----------------------------------------------------------------------------- the measured check


def _pct(x: float) -> float:
    return round(100.0 * x, 4)


def _round(x: float) -> float:
    return round(float(x), 6)


def measure(mapping_a: str | Path, mapping_b: str | Path, *, target: str = "smollm2-135m",
            eval_corpora: Sequence[str] = ("gsm8k-eval",), eval_limit: int = 200,
            train_corpora: Sequence[str] = ("wiki", "chitchat"), train_limit: int = 150, fit_steps: int = 400,
            max_tokens: int = 256, seed: int = 0, out: str | Path | None = None,
            progress: bool = False) -> dict[str, Any]:
    """Remap A -> B on the real target and measure it on held-out prompts (see docs/howto/vocab.md).

    Two source heads over mapping A: ``target-rows`` (the target's own lm_head rows: the
    drafter an ideal body would have) and ``fitted`` (trained from random init on A-domain
    training prompts, as a drafter's lm_head is: other scale, rare tokens barely trained).
    Features are the target's final hidden states at the user-content positions of each
    prompt, labels the target's argmax. For each head and each init: agreement on kept
    tokens, accuracy and loss before and after, and the accuracy bound. With ``out`` the
    target-rows head is also written as a drafter folder and remapped through the files.
    """
    import time

    from eaglekb.data import corpora
    from eaglekb.models import sources
    from eaglekb.models.target import Target

    torch.manual_seed(seed)
    start = time.perf_counter()
    a, b = V.load_mapping(mapping_a), V.load_mapping(mapping_b)
    path = sources.resolve(target)
    tgt = Target.load(path)
    head_rows, info = read_target_head(path)
    if a.vocab_size != info["vocab_size"] or b.vocab_size != info["vocab_size"]:
        raise Incompatible("mapping is for another target vocab", where=str(mapping_a),
                           expected=str(info["vocab_size"]), found=f"{a.vocab_size} / {b.vocab_size}")
    eval_sets = [corpora.load(n, split="eval", limit=eval_limit) for n in eval_corpora]
    eval_prompts = [p for s in eval_sets for p in s.prompts]
    train = corpora.mix(train_corpora, per_source=train_limit, seed=seed) if fit_steps else None
    if train is not None:
        for s in eval_sets:
            corpora.check_disjoint(train, s)
    data = content_features(tgt, eval_prompts, max_tokens=max_tokens, progress=progress)
    plan = plan_remap(a, b)
    counts = plan.counts()
    metrics: dict[str, Any] = {
        "mapping": {f"{k}_count": v for k, v in counts.items()},
        "eval": {"positions_count": int(data.labels.numel()), "prompts_count": data.prompts,
                 "label_in_a_pct": _pct(float(a.t2d[data.labels].float().mean())),
                 "label_in_b_pct": _pct(float(b.t2d[data.labels].float().mean()))},
    }
    if a.counts is not None and a.counts.total:
        metrics["mapping"]["source_mass_lost_pct"] = _pct(float(a.counts.counts[plan.dropped_ids].sum()) / a.counts.total)
    if b.counts is not None and b.counts.total:
        metrics["mapping"]["new_mass_pct"] = _pct(float(b.counts.counts[plan.new_ids].sum()) / b.counts.total)
    heads = {"target_rows": head_rows[a.selected].clone()}
    if fit_steps:
        train_data = content_features(tgt, train.prompts, max_tokens=max_tokens, progress=progress)
        heads["fitted"] = fit_head(train_data, a, steps=fit_steps, seed=seed)
        metrics["eval"]["fit_positions_count"] = int(train_data.labels.numel())
    results: dict[str, Any] = {}
    for name, head in heads.items():
        res = compare_inits(data, head, a, b, head_rows)
        results[name] = res
        first = next(iter(res.values()))
        metrics[name] = {"source_acc_pct": _pct(first["src_acc"]), "source_ce_loss": _round(first["src_loss"]),
                         "dropped_correct_pct": _pct(first["dropped_correct_frac"]),
                         "acc_bound_pct": _pct(first["acc_bound"])}
        for method, r in res.items():
            metrics[name][method.replace("-", "_")] = {
                "acc_pct": _pct(r["new_acc"]), "ce_loss": _round(r["new_loss"]),
                "kept_only_acc_pct": _pct(r["kept_only_acc"]),
                "kept_agree_pct": _pct(r["kept_rows_agree_frac"]), "full_agree_pct": _pct(r["full_agree_frac"]),
            }
    best = {name: max(res, key=lambda m: (res[m]["new_acc"], -res[m]["new_loss"])) for name, res in results.items()}
    files = None
    if out is not None:
        files = _through_files(Path(out), tgt, a, b, heads["target_rows"], path)
        metrics["files"] = {"identical_tensors_count": len(files["identical_tensors"]),
                            "changed_tensors_count": len(files["changed_tensors"])}
    kept_ok = all(r["kept_rows_agree_frac"] == 1.0 and r["bound_holds"] for res in results.values()
                  for r in res.values())
    config = {
        "target": target, "mapping_a": str(mapping_a), "mapping_b": str(mapping_b),
        "draft_vocab_a": a.draft_vocab_size, "draft_vocab_b": b.draft_vocab_size,
        "eval": {"corpora": list(eval_corpora), "limit": eval_limit,
                 "manifests": [s.manifest for s in eval_sets],
                 "positions": "user-content positions of each prompt rendered with the chat template "
                              "(add_generation_prompt), teacher-forced; label = target argmax",
                 "max_tokens": max_tokens},
        "heads": {"target_rows": "source lm_head = the target's own lm_head rows for mapping A",
                  "fitted": (f"source lm_head trained from random init (std 0.02) for {fit_steps} Adam steps "
                             f"on {'+'.join(train_corpora)} train prompts ({train_limit} each)") if fit_steps else None},
        "features": "the target's final (post-norm) hidden state: an ideal drafter body; remap changes only lm_head",
        "seed": seed, "inits": list(INITS),
    }
    if train is not None:
        config["train_manifest"] = train.manifest
    return {
        "config": config, "metrics": metrics, "best_init": best, "kept_predictions_preserved": kept_ok,
        "files": files, "seconds": round(time.perf_counter() - start, 1),
        "noise": {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02,
                  "tolerance_abs": {}},
        "summary": (f"A->B remap on smollm2-135m: {counts['kept']} kept ({counts['moved']} moved), {counts['new']} new, "
                    f"{counts['dropped']} dropped; kept-token predictions preserved: {kept_ok}; best init "
                    + ", ".join(f"{k}: {v}" for k, v in best.items())),
    }


def content_features(target, prompts, *, max_tokens: int = 256, batch: int = 16,
                     progress: bool = False) -> Features:
    """Teacher-forced positions of real prompts: the target's final hidden state and its argmax.

    Only positions inside user message contents count (the default system prompt would
    repeat in every prompt). The features are what an ideal drafter body would hand its
    lm_head (the target's own post-norm state); a remap changes lm_head only. Prompts run
    in right-padded batches (causal attention: padding never changes earlier positions).
    """
    tok = target.tokenizer
    rows = []
    items = list(getattr(prompts, "prompts", prompts))
    for p in items:
        msgs = [dict(m) for m in p.messages]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        spans, cursor = [], 0
        for m in msgs:
            at = text.find(m["content"], cursor)
            cursor = at + len(m["content"])
            if m["role"] == "user" and at >= 0:
                spans.append((at, cursor))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        rows.append((enc["input_ids"][:max_tokens], V.content_mask(enc["offset_mapping"][:max_tokens], spans)))
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    feats, labels = [], []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(rows), desc="target forward", unit="prompt", leave=False)
    with torch.no_grad():
        for lo in range(0, len(order), batch):
            group = [rows[i] for i in order[lo: lo + batch]]
            width = max(len(ids) for ids, _ in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            attn = torch.zeros(len(group), width, dtype=torch.long)
            keep = torch.zeros(len(group), width, dtype=torch.bool)
            for j, (row_ids, mask) in enumerate(group):
                ids[j, : len(row_ids)] = torch.tensor(row_ids)
                attn[j, : len(row_ids)] = 1
                keep[j, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
            out = target.forward(ids, attention_mask=attn)
            feats.append(out.final_hidden.float().cpu()[keep])
            labels.append(out.logits.argmax(-1).cpu()[keep])
            if bar is not None:
                bar.update(len(group))
    if bar is not None:
        bar.close()
    lab = torch.cat(labels)
    return Features(torch.cat(feats), lab, len(items), int(lab.numel()))


def _through_files(out: Path, tgt, a: V.Mapping, b: V.Mapping, head: torch.Tensor, target_path) -> dict[str, Any]:
    """Write the target-rows drafter for A, remap it to B through the files, and compare the folders."""
    from eaglekb.models.drafter import build_drafter_for_target, save_drafter

    drafter = build_drafter_for_target(tgt.model.config, a.draft_vocab_size, mapping=a.selected,
                                       torch_dtype="float32")
    with torch.no_grad():
        drafter.lm_head.weight.copy_(head)
    src = save_drafter(drafter, out / "source-a")
    b_file = V.save_mapping(out / "mapping-b.safetensors", b)
    report = remap_drafter(src, V.load_mapping(b_file), out / "remapped-b", target=target_path, force=True)
    files = check_files(src, out / "remapped-b")
    new_head, _ = remap_lm_head(head, a, b, init=report["init"], target_rows=read_target_head(target_path)[0])
    from safetensors.torch import load_file

    written = load_file(str(out / "remapped-b" / "model.safetensors"))["lm_head.weight"]
    files["lm_head_equals_in_memory"] = bool(torch.equal(written, new_head))
    files["report"] = report
    return files


def render(result: dict[str, Any]) -> str:
    m = result["metrics"]
    mp, ev = m["mapping"], m["eval"]
    lines = [
        f"mapping A -> B: kept {mp['kept_count']} (moved {mp['moved_count']}), new {mp['new_count']}, "
        f"dropped {mp['dropped_count']}"
        + (f"; A's mass lost {mp['source_mass_lost_pct']:.2f}%" if "source_mass_lost_pct" in mp else ""),
        f"held-out: {ev['positions_count']} positions from {ev['prompts_count']} prompts; target argmax in A "
        f"{ev['label_in_a_pct']:.2f}%, in B {ev['label_in_b_pct']:.2f}%",
    ]
    for name in ("target_rows", "fitted"):
        if name not in m:
            continue
        h = m[name]
        lines.append(f"{name} head: source acc {h['source_acc_pct']:.2f}% (bound after remap "
                     f"{h['acc_bound_pct']:.2f}%), loss {h['source_ce_loss']:.3f}")
        for method in INITS:
            r = h.get(method.replace("-", "_"))
            if r:
                lines.append(f"  init {method:<13} acc {r['acc_pct']:6.2f}%  loss {r['ce_loss']:.3f}  kept-token "
                             f"agreement {r['kept_agree_pct']:.1f}%  (with new rows {r['full_agree_pct']:.1f}%)")
    lines.append(f"kept-token predictions preserved: {result['kept_predictions_preserved']}; best init: "
                 + ", ".join(f"{k} -> {v}" for k, v in result["best_init"].items()))
    if result.get("files"):
        f = result["files"]
        lines.append(f"files: {len(f['identical_tensors'])} tensors byte-identical, changed "
                     f"{', '.join(f['changed_tensors'])}; config changed: {f['changed_config'] or 'nothing'}; "
                     f"written lm_head equals the in-memory remap: {f['lm_head_equals_in_memory']}")
    lines.append(f"({result['seconds']} s)")
    return "\n".join(lines)
