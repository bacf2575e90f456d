"""EAGLE-3 drafter training: set a run up, train it (or resume it), validate it.

Owns: ``prepare`` (open the data, choose the draft-vocab mapping, build or load the
drafter and move an init drafter's lm_head to the data's mapping, wrap it in the TTT
unroll; everything checked before anything is written), ``train`` (AdamW, warmup +
cosine ``lr_at``, gradient clipping, deterministic data order, periodic validation and
checkpoints, ``--resume``, DDP when run under torchrun; writes ``out/metrics.json``
and ``out/drafter``) and ``evaluate`` (validation on held-out sequences).

The pieces it runs: ``eaglekb.training.config`` (options), ``.ttt`` (the TTT unroll and
loss), ``.batches`` (split, order, padding), ``.checkpoints``, ``.distributed``,
``.report``; processes are started by ``.launch``.

Knows nothing about generation (``eaglekb.data.datagen`` makes the data), vocab
statistics beyond calling ``eaglekb.data.vocab``, or the task runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from eaglekb.data.features import OnlineFeatures
from eaglekb.data.generation import load_target
from eaglekb.data.vocab import counts_from_dataset
from eaglekb.formats.drafter import read_config
from eaglekb.formats.mapping import Mapping, build_mapping, load_mapping
from eaglekb.formats.shards import open_dataset
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.io.files import atomic_write_json
from eaglekb.models.drafter import Eagle3Drafter, build_drafter_for_target, load_drafter, save_drafter
from eaglekb.training import remap
from eaglekb.training.batches import Batches, collate, loss_counts, sequence_lengths, split_indices
from eaglekb.training.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
from eaglekb.training.config import METRICS, TrainConfig
from eaglekb.training.distributed import all_reduce, barrier, dist_info, pick_device
from eaglekb.training.report import build_report, summarise
from eaglekb.training.ttt import TTTModel, step_norms

Log = Callable[[str], None]

# ----------------------------------------------------------------------------- setting a run up


@dataclass
class Run:
    """What ``prepare`` sets up (validated, nothing written yet)."""

    cfg: TrainConfig
    dataset: Any
    val_dataset: Any
    train_idx: list[int]
    val_idx: list[int]
    drafter: Any
    model: TTTModel
    mapping_report: dict
    fingerprint: dict
    total_steps: int
    device: torch.device
    features: Any = None
    notes: list[str] = field(default_factory=list)


def prepare(cfg: TrainConfig) -> Run:
    """Open data, build or load the drafter, check everything; raises before writing anything."""
    cfg.check()
    device = pick_device(cfg.device)
    ds = open_dataset(cfg.data)
    features = _online_features(cfg, ds, device)
    val_ds, train_idx, val_idx = _split(cfg, ds)
    mapping, mapping_report = _choose_mapping(cfg, ds)
    notes: list[str] = []
    drafter = _drafter_for(cfg, ds, mapping, mapping_report, notes)
    if ds.target["hidden_size"] != (drafter.config.target_hidden_size or drafter.config.hidden_size):
        raise Incompatible("dataset hidden size does not match the drafter", where=cfg.data,
                           expected=str(drafter.config.target_hidden_size), found=str(ds.target["hidden_size"]))
    drafter = drafter.float().to(device)
    drafter.inv_freq = drafter.inv_freq.float()
    embed, head = _target_tables(ds, features)
    if embed.shape[1] != drafter.config.hidden_size:
        raise Incompatible("target embeddings do not fit the drafter", where=cfg.data,
                           expected=f"width {drafter.config.hidden_size}", found=f"width {embed.shape[1]}")
    model = TTTModel(drafter, embed, head, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                     positions=cfg.positions).to(device)
    total = cfg.steps or max(1, math.ceil(cfg.epochs * len(train_idx) / cfg.batch_size))
    fingerprint = {k: getattr(cfg, k) for k in TrainConfig.FINGERPRINT}
    fingerprint.update(total_steps=total, data=ds.manifest["identity_hash"],
                       data_tokens=ds.manifest["totals"]["tokens"], drafter=drafter.config.to_sglang_json(),
                       mapping_sha=_sha(drafter.d2t), init=cfg.init is not None)
    return Run(cfg, ds, val_ds, train_idx, val_idx, drafter, model, mapping_report, fingerprint, total, device,
               features, notes)


def _online_features(cfg: TrainConfig, ds, device: torch.device):
    """For data with online features: the target, loaded here, that computes them per batch."""
    if ds.features != "online":
        return None
    path = cfg.online_target or ds.manifest.get("target_path")
    if not path:
        raise BadInput("online-features data needs the target", where="--online-target",
                       expected="the target folder", found="none")
    t = load_target(path, device=str(device), dtype="bfloat16" if device.type == "cuda" else "float32",
                            capture_points=ds.capture_points)
    return OnlineFeatures(t, store_final_hidden=True)


def _split(cfg: TrainConfig, ds):
    """(validation dataset, train indices, validation indices)."""
    train_idx, val_idx = split_indices(ds, loss_counts(ds, cfg.max_len), seed=cfg.seed,
                                       val_fraction=cfg.val_fraction, max_val_sequences=cfg.max_val_sequences,
                                       separate_val=cfg.val_data is not None)
    if cfg.val_data is None:
        return ds, train_idx, val_idx
    val_ds = open_dataset(cfg.val_data)
    tgt = ds.target
    if val_ds.target["hidden_size"] != tgt["hidden_size"] or val_ds.capture_points != ds.capture_points:
        raise Incompatible("validation data comes from another target or capture points", where=cfg.val_data,
                           expected=f"hidden {tgt['hidden_size']}, points {ds.capture_points}",
                           found=f"hidden {val_ds.target['hidden_size']}, points {val_ds.capture_points}")
    counts = loss_counts(val_ds, cfg.max_len)
    return val_ds, train_idx, [i for i, c in enumerate(counts) if c > 0][: cfg.max_val_sequences]


def _choose_mapping(cfg: TrainConfig, ds):
    """The run's mapping (a file, or built from the data) and the start of its report."""
    if cfg.mapping:
        mapping = load_mapping(cfg.mapping)
        if mapping.vocab_size != ds.target["vocab_size"]:
            raise Incompatible("mapping is for another target vocab", where=cfg.mapping,
                               expected=str(ds.target["vocab_size"]), found=str(mapping.vocab_size))
        source = f"file {cfg.mapping}"
    else:
        size = read_config(cfg.init)[0].draft_vocab_size if cfg.init else cfg.draft_vocab_size
        mapping = data_mapping(ds, size)
        source = f"built from the data's loss-masked tokens (top {size})"
    return mapping, {"source": source, "draft_vocab_size": mapping.draft_vocab_size,
                     "coverage_frac": mapping.meta.get("coverage_frac")}


def data_mapping(dataset, draft_vocab_size: int) -> Mapping:
    """The SpecForge-semantics mapping of the data's loss-masked tokens (``eaglekb.data.vocab``); a draft
    vocab larger than the target's is refused (``select_top``), never clamped."""
    v = dataset.target["vocab_size"]
    return build_mapping(counts_from_dataset(dataset.path, v), draft_vocab_size)


def _drafter_for(cfg: TrainConfig, ds, mapping, mapping_report: dict, notes: list[str]):
    """A fresh drafter for the data's target, or the init drafter moved to ``mapping``."""
    config_ids = [c - 1 for c in ds.capture_points]
    if not cfg.init:
        return build_drafter_for_target(
            ds.target, mapping.draft_vocab_size, intermediate_size=cfg.intermediate_size, mapping=mapping.selected,
            aux_layer_ids=config_ids, torch_dtype="bfloat16", seed=cfg.seed)
    drafter = load_drafter(cfg.init, dtype="float32")
    _check_init(cfg.init, drafter.config, ds, config_ids)
    same = torch.equal(drafter.d2t.cpu(), mapping.d2t) if drafter.d2t.numel() == mapping.d2t.numel() else False
    if same:
        mapping_report["init"] = "same mapping as the data: no remap"
    elif cfg.remap:
        rows = ds.target_head()[1].float() if ds.features == "stored" else None
        drafter, mapping_report["remap"] = _remap(drafter, mapping, rows)
        notes.append(f"init drafter's mapping differs from the data's: lm_head rows remapped by target token id "
                     f"({mapping_report['remap']})")
    else:
        if mapping.draft_vocab_size != drafter.config.draft_vocab_size:
            raise Incompatible("--no-remap keeps the init lm_head: the draft vocab size must not change",
                               where="--mapping", expected=str(drafter.config.draft_vocab_size),
                               found=str(mapping.draft_vocab_size))
        drafter.set_mapping(mapping.d2t)
        notes.append("init drafter's mapping differs from the data's and --no-remap was given: d2t replaced "
                     "WITHOUT moving lm_head rows (reproduces the misaligned-head failure; do not ship)")
        mapping_report["remap"] = "skipped (--no-remap)"
    return drafter


def _check_init(where: str, dc, ds, config_ids: list[int]) -> None:
    """The init drafter reads the data's target: hidden size, vocab, aux layers."""
    tgt = ds.target
    if (dc.target_hidden_size or dc.hidden_size) != tgt["hidden_size"]:
        raise Incompatible("dataset hidden size does not match the init drafter", where=where,
                           expected=f"target_hidden_size {tgt['hidden_size']} (the data's)",
                           found=str(dc.target_hidden_size or dc.hidden_size))
    if dc.vocab_size != tgt["vocab_size"]:
        raise Incompatible("init drafter is for another target vocab", where=where,
                           expected=str(tgt["vocab_size"]), found=str(dc.vocab_size))
    if dc.aux_layer_ids is not None and list(dc.aux_layer_ids) != config_ids:
        raise Incompatible("init drafter reads other aux layers than the data holds", where=where,
                           expected=f"aux_layer_ids {config_ids} (data capture points {ds.capture_points})",
                           found=str(dc.aux_layer_ids))


def _remap(drafter, mapping, target_rows: torch.Tensor | None):
    """The init drafter moved to ``mapping``: lm_head rows by target token id (``eaglekb.training.remap``)."""
    src = Mapping(d2t=drafter.d2t.detach().cpu().clone(), vocab_size=drafter.config.vocab_size)
    init = remap.DEFAULT_INIT if target_rows is not None else remap.FALLBACK_INIT
    head, plan = remap.remap_lm_head(drafter.lm_head.weight.detach().float().cpu(), src, mapping, init=init,
                                     target_rows=target_rows)
    if mapping.draft_vocab_size != drafter.config.draft_vocab_size:
        cfg = dataclasses.replace(drafter.config, draft_vocab_size=mapping.draft_vocab_size)
        moved = Eagle3Drafter(cfg, with_embeddings=drafter.embed_tokens is not None)
        state = {k: v for k, v in drafter.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
        moved.load_state_dict({**moved.state_dict(), **state})
        drafter = moved
    with torch.no_grad():
        drafter.lm_head.weight.copy_(head.to(drafter.lm_head.weight.dtype))
    drafter.set_mapping(mapping.d2t)
    return drafter, {**plan.counts(), "init": init}


def _target_tables(ds, features) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embeddings and lm_head (from the data, or from the online target)."""
    if ds.features == "stored":
        return ds.target_head()
    m = features.target.model
    return m.get_input_embeddings().weight.detach().cpu(), m.get_output_embeddings().weight.detach().cpu()


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


# ----------------------------------------------------------------------------- training


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup over ``warmup_frac`` of the steps, then cosine decay to ``lr * min_lr_frac``."""
    warm = max(1, int(round(total * cfg.warmup_frac))) if cfg.warmup_frac > 0 else 0
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    low = cfg.lr * cfg.min_lr_frac
    return low + (cfg.lr - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def _autocast(run: Run):
    if run.device.type == "cuda" and run.cfg.amp == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def evaluate(run: Run, model: TTTModel) -> dict | None:
    """Validation metrics (``summarise``) over the held-out sequences, summed over processes."""
    if not run.val_idx:
        return None
    rank, world = dist_info()
    stats = torch.zeros((run.cfg.ttt_steps, 5), device=run.device, dtype=torch.float64)
    model.eval()
    with torch.no_grad(), _autocast(run):
        for b in range(0, len(run.val_idx), run.cfg.batch_size):
            items = run.val_idx[b:b + run.cfg.batch_size][rank::world]
            if not items:
                continue
            batch = collate(run.val_dataset, items, run.cfg.max_len, run.device, run.features)
            _, st = model(batch, torch.ones(run.cfg.ttt_steps, device=run.device))
            stats += st.double()
    model.train()
    return summarise(all_reduce(stats), run.cfg.step_weight)


@dataclass
class Progress:
    """Where a training stands: steps, history, throughput, and the window since the last log point."""

    history: dict[str, dict[str, float]]
    window: torch.Tensor  # summed TTT counts [K, 5] since the last log point
    start: int = 0
    step: int = 0
    stopped: bool = False
    tokens: int = 0
    seconds: float = 0.0
    window_tokens: int = 0
    window_seconds: float = 0.0
    last_val: dict | None = None


def _empty_history() -> dict[str, dict[str, float]]:
    return {"train_loss": {}, "train_acc0": {}, "val_loss": {}, "val_acc0": {}, "val_simulated_acc_len": {},
            "train_tok_s": {}}


def _start(run: Run, opt, log: Log | None) -> Progress:
    """Refuse a used ``out`` without ``--resume``; with it, restore the newest checkpoint."""
    cfg, out = run.cfg, Path(run.cfg.out)
    existing = list_checkpoints(out)
    if existing and not cfg.resume:
        raise BadInput("output folder already holds a training run", where=str(out),
                       expected="an empty or new folder", found=existing[-1].name,
                       fix="pass --resume to continue it, or another --out (nothing was overwritten)")
    window = torch.zeros((cfg.ttt_steps, 5), dtype=torch.float64, device=run.device)
    if not existing:
        if cfg.resume and log:
            log("no checkpoint to resume from: starting at step 0")
        return Progress(_empty_history(), window)
    doc = load_checkpoint(existing[-1], run.drafter, opt, run.fingerprint)
    run.model.refresh_mapping()
    if log:
        log(f"resumed from {existing[-1]} at step {doc['step']}")
    return Progress(doc["history"], window, start=doc["step"], step=doc["step"])


def _wrap(run: Run, world: int):
    """The TTT model, wrapped in DDP when there are several processes."""
    if world == 1:
        return run.model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(run.model, device_ids=[run.device.index] if run.device.type == "cuda" else None,
               broadcast_buffers=False)


def _train_step(run: Run, ddp, opt, items: list[int], step: int) -> tuple[torch.Tensor, int, float]:
    """One optimiser step on this process's share of ``items``: (counts, tokens over processes, seconds)."""
    cfg = run.cfg
    rank, world = dist_info()
    t0 = time.perf_counter()
    batch = collate(run.dataset, items[rank::world], cfg.max_len, run.device, run.features)
    norms = all_reduce(step_norms(batch["loss_mask"], cfg.ttt_steps))
    for g in opt.param_groups:
        g["lr"] = lr_at(step, run.total_steps, cfg)
    with _autocast(run):
        loss, st = ddp(batch, norms, world)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.drafter.parameters(), cfg.grad_clip)
    opt.step()
    ntok = torch.tensor([float(batch["valid"].sum())], device=run.device)
    stats = all_reduce(st.double())
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    seconds = time.perf_counter() - t0
    return stats, int(all_reduce(ntok).item()), seconds


def _log_point(run: Run, p: Progress, step: int, bar, log: Log | None, rank: int) -> None:
    """A curve point from the window since the last one; the window restarts."""
    cfg, done = run.cfg, step + 1
    sm = summarise(p.window, cfg.step_weight)
    rate = p.window_tokens / p.window_seconds if p.window_seconds else 0.0
    p.history["train_loss"][str(done)] = round(sm["loss"], 5)
    p.history["train_acc0"][str(done)] = round(100 * sm["acc"][0], 3)
    p.history["train_tok_s"][str(done)] = round(rate, 1)
    bar.set_postfix(loss=f"{sm['loss']:.3f}", acc0=f"{sm['acc'][0]:.3f}", tok_s=f"{rate:.0f}")
    if log and rank == 0:
        log(f"step {done}/{run.total_steps} loss {sm['loss']:.4f} acc0 {sm['acc'][0]:.3f} "
            f"lr {lr_at(step, run.total_steps, cfg):.2e} {rate:.0f} tok/s")
    p.window.zero_()
    p.window_tokens, p.window_seconds = 0, 0.0


def _record_val(run: Run, history: dict, step: int, log: Log | None, rank: int) -> dict | None:
    val = evaluate(run, run.model)
    if val is None:
        return None
    history["val_loss"][str(step)] = round(val["loss"], 5)
    history["val_acc0"][str(step)] = round(100 * val["acc"][0], 3)
    history["val_simulated_acc_len"][str(step)] = round(val["simulated_acc_len"], 4)
    if log and rank == 0:
        log(f"val @ {step}: loss {val['loss']:.4f} acc {' '.join(f'{a:.3f}' for a in val['acc'])} "
            f"simulated_acc_len {val['simulated_acc_len']:.3f}")
    return val


def _steps(run: Run, opt, p: Progress, *, progress: bool, log: Log | None) -> None:
    """The optimiser steps from ``p.start``, with log points, validation and checkpoints between them."""
    from tqdm import tqdm

    cfg, out = run.cfg, Path(run.cfg.out)
    rank, world = dist_info()
    ddp = _wrap(run, world)
    lengths = sequence_lengths(run.dataset, cfg.max_len) if cfg.batching == "length" else None
    batches = Batches(run.dataset, run.train_idx, cfg.batch_size, cfg.max_len, cfg.seed, lengths)
    bar = tqdm(total=run.total_steps, initial=p.start, desc="finetune", disable=not progress or rank != 0,
               dynamic_ncols=True, mininterval=2.0)
    for step in range(p.start, run.total_steps):
        if cfg.stop_after is not None and step - p.start >= cfg.stop_after:
            p.stopped = True
            break
        stats, tok, seconds = _train_step(run, ddp, opt, batches.items(step), step)
        p.window += stats
        p.tokens, p.seconds = p.tokens + tok, p.seconds + seconds
        p.window_tokens, p.window_seconds = p.window_tokens + tok, p.window_seconds + seconds
        p.step = done = step + 1
        if done % cfg.log_every == 0 or done == run.total_steps:
            _log_point(run, p, step, bar, log, rank)
        if cfg.eval_every and done % cfg.eval_every == 0 and done != run.total_steps:
            p.last_val = _record_val(run, p.history, done, log, rank)
        if cfg.save_every and done % cfg.save_every == 0 and done != run.total_steps:
            if rank == 0:
                save_checkpoint(out, done, run.drafter, opt, run.fingerprint, p.history, cfg.keep_checkpoints)
            barrier()
        bar.update(1)
    bar.close()
    if not p.stopped:
        p.step = run.total_steps


def _finish(run: Run, opt, p: Progress, log: Log | None) -> dict:
    """Final validation, the last checkpoint, ``out/drafter`` (unless stopped early) and ``out/metrics.json``."""
    cfg, out = run.cfg, Path(run.cfg.out)
    rank, world = dist_info()
    if not p.stopped:
        p.last_val = _record_val(run, p.history, p.step, log, rank)
    if rank == 0:
        save_checkpoint(out, p.step, run.drafter, opt, run.fingerprint, p.history, cfg.keep_checkpoints)
    barrier()
    report = build_report(run, p.history, p.last_val, p.step, p.tokens, p.seconds, p.stopped, world)
    if rank == 0:
        if not p.stopped:
            save_drafter(run.drafter, out / "drafter")
        atomic_write_json(out / METRICS, report)
    barrier()
    return report


def train(cfg: TrainConfig, *, progress: bool = True, log: Log | None = None) -> dict:
    """Run (or resume) one training; returns the report written to ``out/metrics.json``."""
    rank, _world = dist_info()
    run = prepare(cfg)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW([p for p in run.drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    p = _start(run, opt, log)
    if rank == 0:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
    _steps(run, opt, p, progress=progress, log=log)
    return _finish(run, opt, p, log)
