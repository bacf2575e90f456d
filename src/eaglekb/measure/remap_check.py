"""The measured check of a remap: does moving lm_head rows keep what the drafter predicted?

Owns: ``Features`` (what an lm_head sees: the target's final hidden state at real prompt
positions, and the target's argmax there), ``content_features`` (those, from a target and
prompts), ``head_eval`` / ``check_remap`` (top-1 agreement on kept tokens, accuracy and
loss before and after, the accuracy bound), ``fit_head`` (an lm_head trained from random
init, as a drafter's is), ``compare_inits``, ``check_files`` (two drafter folders tensor by
tensor) and ``measure`` (``invoke remap.measure``: remap A -> B on the real target and
measure every init on held-out prompts), with ``render``.

Knows nothing about how rows are moved (``eaglekb.training.remap`` does it), counting
tokens, training loops or the task runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.nn import functional as F

from eaglekb.data import corpora
from eaglekb.data.vocab import content_mask
from eaglekb.formats.drafter import WEIGHTS_FILE, read_config_json, read_tensors
from eaglekb.formats.mapping import Mapping, load_mapping, save_mapping
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError
from eaglekb.io.files import read_safetensors
from eaglekb.models import sources
from eaglekb.models.drafter import build_drafter_for_target, save_drafter
from eaglekb.models.target import Target
from eaglekb.training.remap import INITS, TARGET_INITS, RemapPlan, plan_remap, read_target_head, remap_drafter, \
    remap_lm_head


@dataclass
class Features:
    """What an lm_head sees and what it should predict: ``feats [P,H]``, target argmax ``labels [P]``."""

    feats: torch.Tensor
    labels: torch.Tensor
    prompts: int
    tokens: int


def head_eval(feats: torch.Tensor, labels: torch.Tensor, head: torch.Tensor, mapping: Mapping,
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


def check_remap(data: Features, src_head: torch.Tensor, src: Mapping, new_head: torch.Tensor, dst: Mapping,
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


def fit_head(data: Features, mapping: Mapping, *, steps: int = 300, lr: float = 3e-3, batch: int = 512,
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


def compare_inits(data: Features, src_head: torch.Tensor, src: Mapping, dst: Mapping,
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
    a, b = read_tensors(src_drafter), read_tensors(new_drafter)
    same = sorted(k for k in a if k in b and a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                  and torch.equal(a[k], b[k]))
    ca, cb = read_config_json(src_drafter), read_config_json(new_drafter)
    changed = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    if set(a) != set(b):
        raise IntegrityError("remapped drafter has other tensor names", where=str(new_drafter),
                             expected=", ".join(sorted(a)), found=", ".join(sorted(b)))
    return {"identical_tensors": same, "changed_tensors": sorted(set(a) - set(same)), "changed_config": changed}


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
    torch.manual_seed(seed)
    start = time.perf_counter()
    a, b, path, tgt, head_rows = _load_inputs(mapping_a, mapping_b, target)
    eval_sets, train = _prompt_sets(eval_corpora, eval_limit, train_corpora, train_limit, fit_steps, seed)
    data = content_features(tgt, [p for s in eval_sets for p in s.prompts], max_tokens=max_tokens, progress=progress)
    plan = plan_remap(a, b)
    metrics = _mapping_metrics(a, b, plan, data)
    heads = {"target_rows": head_rows[a.selected].clone()}
    if fit_steps:
        train_data = content_features(tgt, train.prompts, max_tokens=max_tokens, progress=progress)
        heads["fitted"] = fit_head(train_data, a, steps=fit_steps, seed=seed)
        metrics["eval"]["fit_positions_count"] = int(train_data.labels.numel())
    results = {name: compare_inits(data, head, a, b, head_rows) for name, head in heads.items()}
    metrics.update({name: _head_metrics(res) for name, res in results.items()})
    best = {name: max(res, key=lambda m: (res[m]["new_acc"], -res[m]["new_loss"])) for name, res in results.items()}
    files = None
    if out is not None:
        files = _through_files(Path(out), tgt, a, b, heads["target_rows"], path)
        metrics["files"] = {"identical_tensors_count": len(files["identical_tensors"]),
                            "changed_tensors_count": len(files["changed_tensors"])}
    kept_ok = all(r["kept_rows_agree_frac"] == 1.0 and r["bound_holds"] for res in results.values()
                  for r in res.values())
    counts = plan.counts()
    config = _measure_config(a, b, eval_sets, train, target=target, mapping_a=mapping_a, mapping_b=mapping_b,
                             eval_corpora=eval_corpora, eval_limit=eval_limit, max_tokens=max_tokens,
                             train_corpora=train_corpora, train_limit=train_limit, fit_steps=fit_steps, seed=seed)
    return {
        "config": config, "metrics": metrics, "best_init": best, "kept_predictions_preserved": kept_ok,
        "files": files, "seconds": round(time.perf_counter() - start, 1),
        "noise": {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02,
                  "tolerance_abs": {}},
        "summary": (f"A->B remap on smollm2-135m: {counts['kept']} kept ({counts['moved']} moved), {counts['new']} new, "
                    f"{counts['dropped']} dropped; kept-token predictions preserved: {kept_ok}; best init "
                    + ", ".join(f"{k}: {v}" for k, v in best.items())),
    }


def _load_inputs(mapping_a, mapping_b, target: str):
    """Both mappings, the target (loaded) and its lm_head rows, the vocab checked."""
    a, b = load_mapping(mapping_a), load_mapping(mapping_b)
    path = sources.resolve(target)
    tgt = Target.load(path)
    head_rows, info = read_target_head(path)
    if a.vocab_size != info["vocab_size"] or b.vocab_size != info["vocab_size"]:
        raise Incompatible("mapping is for another target vocab", where=str(mapping_a),
                           expected=str(info["vocab_size"]), found=f"{a.vocab_size} / {b.vocab_size}")
    return a, b, path, tgt, head_rows


def _prompt_sets(eval_corpora, eval_limit: int, train_corpora, train_limit: int, fit_steps: int, seed: int):
    """Held-out eval prompt sets and (when fitting a head) the train mix, checked disjoint."""
    eval_sets = [corpora.load(n, split="eval", limit=eval_limit) for n in eval_corpora]
    train = corpora.mix(train_corpora, per_source=train_limit, seed=seed) if fit_steps else None
    if train is not None:
        for s in eval_sets:
            corpora.check_disjoint(train, s)
    return eval_sets, train


def _mapping_metrics(a: Mapping, b: Mapping, plan: RemapPlan, data: Features) -> dict[str, Any]:
    """What the plan keeps, moves, adds and drops; how often the eval labels fall inside A and B."""
    metrics: dict[str, Any] = {
        "mapping": {f"{k}_count": v for k, v in plan.counts().items()},
        "eval": {"positions_count": int(data.labels.numel()), "prompts_count": data.prompts,
                 "label_in_a_pct": _pct(float(a.t2d[data.labels].float().mean())),
                 "label_in_b_pct": _pct(float(b.t2d[data.labels].float().mean()))},
    }
    if a.counts is not None and a.counts.total:
        metrics["mapping"]["source_mass_lost_pct"] = _pct(float(a.counts.counts[plan.dropped_ids].sum()) / a.counts.total)
    if b.counts is not None and b.counts.total:
        metrics["mapping"]["new_mass_pct"] = _pct(float(b.counts.counts[plan.new_ids].sum()) / b.counts.total)
    return metrics


def _head_metrics(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One source head's metric tree: the source itself, then each init."""
    first = next(iter(res.values()))
    out: dict[str, Any] = {"source_acc_pct": _pct(first["src_acc"]), "source_ce_loss": _round(first["src_loss"]),
                           "dropped_correct_pct": _pct(first["dropped_correct_frac"]),
                           "acc_bound_pct": _pct(first["acc_bound"])}
    for method, r in res.items():
        out[method.replace("-", "_")] = {
            "acc_pct": _pct(r["new_acc"]), "ce_loss": _round(r["new_loss"]),
            "kept_only_acc_pct": _pct(r["kept_only_acc"]),
            "kept_agree_pct": _pct(r["kept_rows_agree_frac"]), "full_agree_pct": _pct(r["full_agree_frac"]),
        }
    return out


def _measure_config(a: Mapping, b: Mapping, eval_sets, train, *, target, mapping_a, mapping_b, eval_corpora,
                    eval_limit: int, max_tokens: int, train_corpora, train_limit: int, fit_steps: int,
                    seed: int) -> dict[str, Any]:
    """Everything needed to rerun the check, with the prompt manifests."""
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
    return config


def _content_rows(tok, items, max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Each prompt rendered with the chat template: (token ids, 1 where the token is user content)."""
    rows = []
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
        rows.append((enc["input_ids"][:max_tokens], content_mask(enc["offset_mapping"][:max_tokens], spans)))
    return rows


def _padded_batch(group: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and the kept (user-content) positions of one batch."""
    width = max(len(ids) for ids, _ in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    attn = torch.zeros(len(group), width, dtype=torch.long)
    keep = torch.zeros(len(group), width, dtype=torch.bool)
    for j, (row_ids, mask) in enumerate(group):
        ids[j, : len(row_ids)] = torch.tensor(row_ids)
        attn[j, : len(row_ids)] = 1
        keep[j, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return ids, attn, keep


def content_features(target, prompts, *, max_tokens: int = 256, batch: int = 16,
                     progress: bool = False) -> Features:
    """Teacher-forced positions of real prompts: the target's final hidden state and its argmax.

    Only positions inside user message contents count (the default system prompt would
    repeat in every prompt). The features are what an ideal drafter body would hand its
    lm_head (the target's own post-norm state); a remap changes lm_head only. Prompts run
    in right-padded batches (causal attention: padding never changes earlier positions).
    """
    from tqdm import tqdm

    items = list(getattr(prompts, "prompts", prompts))
    rows = _content_rows(target.tokenizer, items, max_tokens)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    feats, labels = [], []
    with torch.no_grad(), tqdm(total=len(rows), desc="target forward", unit="prompt", leave=False,
                               disable=not progress) as bar:
        for lo in range(0, len(order), batch):
            ids, attn, keep = _padded_batch([rows[i] for i in order[lo: lo + batch]])
            out = target.forward(ids, attention_mask=attn)
            feats.append(out.final_hidden.float().cpu()[keep])
            labels.append(out.logits.argmax(-1).cpu()[keep])
            bar.update(ids.shape[0])
    lab = torch.cat(labels)
    return Features(torch.cat(feats), lab, len(items), int(lab.numel()))


def _through_files(out: Path, tgt, a: Mapping, b: Mapping, head: torch.Tensor, target_path) -> dict[str, Any]:
    """Write the target-rows drafter for A, remap it to B through the files, and compare the folders."""
    drafter = build_drafter_for_target(tgt.model.config, a.draft_vocab_size, mapping=a.selected,
                                       torch_dtype="float32")
    with torch.no_grad():
        drafter.lm_head.weight.copy_(head)
    src = save_drafter(drafter, out / "source-a")
    b_file = save_mapping(out / "mapping-b.safetensors", b)
    report = remap_drafter(src, load_mapping(b_file), out / "remapped-b", target=target_path, force=True)
    files = check_files(src, out / "remapped-b")
    new_head, _ = remap_lm_head(head, a, b, init=report["init"], target_rows=read_target_head(target_path)[0])
    written = read_safetensors(out / "remapped-b" / WEIGHTS_FILE, keys=["lm_head.weight"])["lm_head.weight"]
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
