"""EAGLE-3 drafter training: set a run up, train it (or resume it), validate it.

Owns: ``prepare`` (open the data, choose the draft-vocab mapping, build or load the
drafter and move an init drafter's lm_head to the data's mapping, wrap it in the TTT
unroll; everything checked before anything is written), ``train`` (AdamW, warmup +
cosine ``lr_at``, gradient clipping, deterministic data order, periodic validation and
checkpoints, ``--resume``, per-phase ``--profile``, DDP when run under torchrun; writes ``out/metrics.json``
and ``out/drafter``) and ``evaluate`` (validation on held-out sequences, mixed and per source).

The pieces it runs: ``eaglekb.training.config`` (options), ``.drafters`` (the mapping and
the drafter a run starts from), ``.ttt`` (the TTT unroll and loss), ``.loss`` (the loss
over the draft vocabulary), ``.speed`` (profile, autocast, compile), ``.batches`` (split,
order, padding), ``.checkpoints`` (also in pieces across machines: ``--pieces-out``,
``--resume-from``, ``--new-data``), ``.distributed``, ``.sources`` (validation per data source),
``.report``; processes are started by ``.launch``.

Knows nothing about generation (``eaglekb.data.datagen`` makes the data), vocab
statistics beyond calling ``eaglekb.data.vocab``, or the task runner.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from eaglekb.data.features import OnlineFeatures
from eaglekb.data.generation import load_target
from eaglekb.formats.drafter import read_config
from eaglekb.formats.shards import open_dataset
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.io.files import atomic_write_json
from eaglekb.models.drafter import save_drafter
from eaglekb.training.batches import Batches, collate, loss_counts, sequence_lengths, split_indices
from eaglekb.training.checkpoints import (data_changed, list_checkpoints, load_checkpoint, newest_pack,
                                          pack_checkpoint, save_checkpoint, unpack_checkpoint)
from eaglekb.training.config import METRICS, TrainConfig
from eaglekb.training.drafters import choose_mapping, data_mapping, drafter_for  # noqa: F401 (data_mapping: API)
from eaglekb.training.distributed import all_reduce, barrier, dist_info, pick_device
from eaglekb.training.report import build_report, source_curve, summarise
from eaglekb.training.sources import add_rows, source_metrics, val_sources
from eaglekb.training.speed import RunClock, StepProfile, autocast, probe_compile, wants_compile
from eaglekb.training.parallel import ParallelTTTModel, as_parallel
from eaglekb.training import ttt
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
    val_sources: Any = None  # ``sources.ValSources`` of the validation sequences (None: no sequence ids)


def prepare(cfg: TrainConfig) -> Run:
    """Open data, build or load the drafter, check everything; raises before writing anything."""
    cfg.check()
    device = pick_device(cfg.device)
    ds = open_dataset(cfg.data)
    val_ds, train_idx, val_idx = _split(cfg, ds)
    _check_init_target(cfg, ds)  # before its draft vocab is used: another target's drafter said as such
    mapping, mapping_report = choose_mapping(cfg, ds)
    notes: list[str] = []
    drafter = as_parallel(drafter_for(cfg, ds, mapping, mapping_report, notes), cfg.method, cfg.parallel_tokens,
                          cfg.seed)
    if ds.target["hidden_size"] != (drafter.config.target_hidden_size or drafter.config.hidden_size):
        raise Incompatible("dataset hidden size does not match the drafter", where=cfg.data,
                           expected=str(drafter.config.target_hidden_size), found=str(ds.target["hidden_size"]))
    features = _online_features(cfg, ds, device)  # the target loads only once the data, mapping and drafter fit
    drafter = drafter.float().to(device)
    drafter.inv_freq = drafter.inv_freq.float()
    embed, head = _target_tables(ds, features)
    if embed.shape[1] != drafter.config.hidden_size:
        raise Incompatible("target embeddings do not fit the drafter", where=cfg.data,
                           expected=f"width {drafter.config.hidden_size}", found=f"width {embed.shape[1]}")
    if cfg.method == "p-eagle":
        model = ParallelTTTModel(drafter, embed, head, step_weight=cfg.step_weight, loss_chunk=cfg.loss_chunk).to(device)
    else:
        model = TTTModel(drafter, embed, head, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                         positions=cfg.positions, loss_chunk=cfg.loss_chunk).to(device)
    if wants_compile(cfg.compile, device):
        model.compile_unroll("step" if cfg.compile == "step" else "unroll")
        model.compile_loss()
        if features is not None:  # online features: the target's pass too
            features.target.compile_features(ttt.COMPILE_BACKEND)
    total = cfg.steps or max(1, math.ceil(cfg.epochs * len(train_idx) / cfg.batch_size))
    fingerprint = {k: getattr(cfg, k) for k in TrainConfig.FINGERPRINT}
    fingerprint.update(total_steps=total, data=ds.manifest["identity_hash"],
                       data_tokens=ds.manifest["totals"]["tokens"], drafter=drafter.config.to_sglang_json(),
                       mapping_sha=_sha(drafter.d2t), init=cfg.init is not None)
    sources = val_sources(val_ds, val_idx)
    if val_idx and sources is None:
        notes.append(f"no validation per source: the shards of {val_ds.path} hold no sequence ids (an older datagen)")
    return Run(cfg, ds, val_ds, train_idx, val_idx, drafter, model, mapping_report, fingerprint, total, device,
               features, notes, sources)


def _check_init_target(cfg: TrainConfig, ds) -> None:
    """An --init drafter built for another target (another hidden size or vocabulary than the data's) is
    refused as that, before its draft vocab size builds the mapping (which would blame --draft-vocab-size)."""
    if not cfg.init:
        return
    dc = read_config(cfg.init)[0]
    hidden, vocab = dc.target_hidden_size or dc.hidden_size, dc.vocab_size
    want_hidden, want_vocab = ds.target["hidden_size"], ds.target["vocab_size"]
    if (hidden, vocab) != (want_hidden, want_vocab):
        raise Incompatible("init drafter was built for another target", where=f"--init {cfg.init}",
                           expected=f"target hidden size {want_hidden} and vocab {want_vocab} (the target of "
                                    f"--data {cfg.data})", found=f"hidden size {hidden}, vocab {vocab}",
                           fix="give a drafter of this target, or train from scratch (no --init)")


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
    want, c = ds.target, t.model.config
    shape = lambda h, v, n: f"hidden {h}, vocab {v}, {n} layers"  # noqa: E731
    if (c.hidden_size, c.vocab_size, c.num_hidden_layers) != (want["hidden_size"], want["vocab_size"],
                                                               want["num_hidden_layers"]):
        raise Incompatible("the online target is another model than the one that made the dataset", where=str(path),
                           expected=shape(want["hidden_size"], want["vocab_size"], want["num_hidden_layers"])
                           + f" (the target of {cfg.data})",
                           found=shape(c.hidden_size, c.vocab_size, c.num_hidden_layers),
                           fix="pass --online-target the folder of the dataset's target")
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
    return autocast(run.device, run.cfg.amp)


def evaluate(run: Run, model: TTTModel) -> dict | None:
    """Validation metrics (``summarise``) over the held-out sequences, summed over processes; ``by_source``: the
    numbers of each source (``sources.source_metrics``) from the same forward, when the shards hold sequence ids."""
    if not run.val_idx:
        return None
    rank, world = dist_info()
    stats = torch.zeros((run.cfg.unroll_steps, 5), device=run.device, dtype=torch.float64)
    src = run.val_sources
    per_source = src.counts(run.cfg.unroll_steps, run.device) if src is not None else None
    model.eval()
    with torch.no_grad(), _autocast(run):
        for b in range(0, len(run.val_idx), run.cfg.batch_size):
            items = run.val_idx[b:b + run.cfg.batch_size][rank::world]
            if not items:
                continue
            batch = collate(run.val_dataset, items, run.cfg.max_len, run.device, run.features)
            _, st, rows = model(batch, torch.ones(run.cfg.unroll_steps, device=run.device), rows=True)
            stats += st.double()
            if per_source is not None:
                add_rows(per_source, src, items, rows)
    model.train()
    val = summarise(all_reduce(stats), run.cfg.step_weight)
    if per_source is not None:
        val["by_source"] = source_metrics(all_reduce(per_source), src, run.cfg.step_weight)
    return val


@dataclass
class Progress:
    """Where a training stands: steps, history, throughput, and the window since the last log point."""

    history: dict[str, dict[str, float]]
    window: torch.Tensor  # summed TTT counts [K, 5] since the last log point
    clock: RunClock  # the run's wall clock by part, begun before the run was prepared
    start: int = 0
    step: int = 0
    stopped: bool = False
    tokens: int = 0
    seconds: float = 0.0
    window_tokens: int = 0
    window_seconds: float = 0.0
    last_val: dict | None = None
    profile: dict | None = None


def _empty_history() -> dict[str, dict[str, float]]:
    return {"train_loss": {}, "train_acc0": {}, "val_loss": {}, "val_acc0": {}, "val_simulated_acc_len": {},
            "train_tok_s": {}}


def _start(run: Run, opt, log: Log | None, clock: RunClock) -> Progress:
    """Refuse a used ``out`` without ``--resume``; with it, restore the newest checkpoint."""
    cfg, out = run.cfg, Path(run.cfg.out)
    existing = list_checkpoints(out)
    if existing and not (cfg.resume or cfg.resume_from):
        raise BadInput("output folder already holds a training run", where=str(out),
                       expected="an empty or new folder", found=existing[-1].name,
                       fix="pass --resume to continue it, or another --out (nothing was overwritten)")
    window = torch.zeros((cfg.unroll_steps, 5), dtype=torch.float64, device=run.device)
    if not existing:
        if cfg.resume and log:
            log("no checkpoint to resume from: starting at step 0")
        return Progress(_empty_history(), window, clock)
    doc = load_checkpoint(existing[-1], run.drafter, opt, run.fingerprint, new_data=cfg.new_data)
    if data_changed(doc, run.fingerprint):
        run.notes.append(f"continued on other data at step {doc['step']} (--new-data): dataset "
                         f"{run.fingerprint['data']} ({run.fingerprint['data_tokens']} tokens), the checkpoint's "
                         f"{doc['fingerprint'].get('data')} ({doc['fingerprint'].get('data_tokens')} tokens)")
    run.model.refresh_mapping()
    if log:
        log(f"resumed from {existing[-1]} at step {doc['step']}")
    return Progress(doc["history"], window, clock, start=doc["step"], step=doc["step"])


def _wrap(run: Run, world: int):
    """The TTT model, wrapped in DDP when there are several processes."""
    if world == 1:
        return run.model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(run.model, device_ids=[run.device.index] if run.device.type == "cuda" else None,
               broadcast_buffers=False)


def _batch(run: Run, items: list[int], timer=None) -> tuple[dict, torch.Tensor]:
    """This process's share of ``items`` padded into a batch, the target's features added once (online data),
    and the loss positions per TTT step over all processes."""
    rank, world = dist_info()
    if timer is not None:
        timer.mark("data")
    batch = collate(run.dataset, items[rank::world], run.cfg.max_len, run.device)
    norms = all_reduce(step_norms(batch["loss_mask"], run.cfg.unroll_steps))
    if run.features is not None:
        if timer is not None:
            timer.mark("target")
        batch.update(run.features(batch["input_ids"], batch["valid"]))
    return batch, norms


def _train_step(run: Run, ddp, opt, items: list[int], step: int, timer=None) -> tuple[torch.Tensor, int, float]:
    """One optimiser step on this process's share of ``items``: (counts, tokens over processes, seconds).

    ``timer``: a ``PhaseTimer`` marking the phases of ``eaglekb.training.speed.PHASES`` (profiling)."""
    cfg = run.cfg
    _rank, world = dist_info()
    t0 = time.perf_counter()
    batch, norms = _batch(run, items, timer)
    for g in opt.param_groups:
        g["lr"] = lr_at(step, run.total_steps, cfg)
    run.model.timer = timer
    with _autocast(run):
        loss, st = ddp(batch, norms, world)
    run.model.timer = None
    if timer is not None:
        timer.mark("backward")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if timer is not None:
        timer.mark("optimizer")
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.drafter.parameters(), cfg.grad_clip)
    opt.step()
    if timer is not None:
        timer.mark("sync")
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
    for name, m in (val.get("by_source") or {}).items():
        history.setdefault(source_curve(name), {})[str(step)] = round(m["simulated_acc_len"], 4)
    if log and rank == 0:
        log(f"val @ {step}: loss {val['loss']:.4f} acc {' '.join(f'{a:.3f}' for a in val['acc'])} "
            f"simulated_acc_len {val['simulated_acc_len']:.3f}")
    return val


def _compile_first(run: Run, items: list[int]) -> None:
    """Compile the target's pass (online features), the unroll and the loss's chunk on the first batch before the
    first step (not timed in it); eager if that fails."""
    batch, norms = _batch(run, items)
    target = run.features.target if run.features is not None else None
    if target is not None and target.compile_error:
        run.notes.append(f"torch.compile of the target's pass failed ({target.compile_error}): the eager pass ran "
                         "instead")
    if probe_compile(run.model, batch, norms, _autocast(run)):
        run.notes.append(f"torch.compile of the TTT unroll and loss failed ({run.model.compile_error}): the eager "
                         "unroll and loss ran instead")


def _over_budget(cfg: TrainConfig, began: float, device: torch.device) -> bool:
    """``--time-budget-s`` spent (checked from the second step of a run, so a run always moves; every process
    stops at the same step: the first process's clock decides)."""
    if cfg.time_budget_s is None:
        return False
    over = time.monotonic() - began >= cfg.time_budget_s
    if dist_info()[1] > 1:  # one process reads no device value here: no sync a step
        flag = torch.tensor([float(over)], device=device)
        torch.distributed.broadcast(flag, 0)
        over = bool(flag.item())
    return over


def _steps(run: Run, opt, p: Progress, *, progress: bool, log: Log | None) -> None:
    """The optimiser steps from ``p.start``, with log points, validation and checkpoints between them."""
    from tqdm import tqdm

    cfg, out = run.cfg, Path(run.cfg.out)
    rank, world = dist_info()
    lengths = sequence_lengths(run.dataset, cfg.max_len) if cfg.batching == "length" else None
    batches = Batches(run.dataset, run.train_idx, cfg.batch_size, cfg.max_len, cfg.seed, lengths)
    if (run.model.compiled or run.model.compiled_loss) and p.start < run.total_steps:
        with p.clock.part("first_compile"):
            _compile_first(run, batches.items(p.start))
    ddp = _wrap(run, world)
    prof = StepProfile(run.device, cfg.profile)
    bar = tqdm(total=run.total_steps, initial=p.start, desc="finetune", disable=not progress or rank != 0,
               dynamic_ncols=True, mininterval=2.0)
    began = time.monotonic()
    for step in range(p.start, run.total_steps):
        if (cfg.stop_after is not None and step - p.start >= cfg.stop_after
                or step > p.start and _over_budget(cfg, began, run.device)):
            p.stopped = True
            break
        timer = prof.timer()
        stats, tok, seconds = _train_step(run, ddp, opt, batches.items(step), step, timer)
        prof.add(timer)
        p.window += stats
        p.tokens, p.seconds = p.tokens + tok, p.seconds + seconds
        p.window_tokens, p.window_seconds = p.window_tokens + tok, p.window_seconds + seconds
        p.step = done = step + 1
        if done % cfg.log_every == 0 or done == run.total_steps:
            _log_point(run, p, step, bar, log, rank)
        if cfg.eval_every and done % cfg.eval_every == 0 and done != run.total_steps:
            with p.clock.part("validation"):
                p.last_val = _record_val(run, p.history, done, log, rank)
        if cfg.save_every and done % cfg.save_every == 0 and done != run.total_steps:
            with p.clock.part("checkpoints"):
                if rank == 0:
                    save_checkpoint(out, done, run.drafter, opt, run.fingerprint, p.history, cfg.keep_checkpoints)
                barrier()
        bar.update(1)
    bar.close()
    p.profile = prof.report()
    if not p.stopped:
        p.step = run.total_steps


def _finish(run: Run, opt, p: Progress, log: Log | None) -> dict:
    """Final validation, the last checkpoint, ``out/drafter`` (unless stopped early) and ``out/metrics.json``."""
    cfg, out = run.cfg, Path(run.cfg.out)
    rank, world = dist_info()
    if not p.stopped:
        with p.clock.part("validation"):
            p.last_val = _record_val(run, p.history, p.step, log, rank)
    packed = None
    if rank == 0:
        with p.clock.part("checkpoints"):
            ckpt = save_checkpoint(out, p.step, run.drafter, opt, run.fingerprint, p.history, cfg.keep_checkpoints)
        if cfg.pieces_out:
            packed = pack_checkpoint(ckpt, Path(cfg.pieces_out), max(1, int(cfg.piece_mib * (1 << 20))))
    barrier()
    target = run.features.target if run.features is not None else None
    if target is not None and target.compile_error and not any(target.compile_error in n for n in run.notes):
        run.notes.append(f"torch.compile of the target's pass failed during the run ({target.compile_error}): the "
                         "eager pass ran from then on")
    report = build_report(run, p.history, p.last_val, p.step, p.tokens, p.seconds, p.stopped, world, p.profile)
    report["pieces"] = packed
    if rank == 0:
        if not p.stopped:
            with p.clock.part("checkpoints"):
                save_drafter(run.drafter, out / "drafter")
        report["wall"] = p.clock.report()
        atomic_write_json(out / METRICS, report)
    barrier()
    return report


def _bring_in(run: Run, log: Log | None) -> None:
    """``--resume-from``: the newest checkpoint in pieces there joined into ``out/checkpoints`` (checked first; the
    first process writes, the others check)."""
    rank, _world = dist_info()
    manifest = newest_pack(Path(run.cfg.resume_from))
    final = unpack_checkpoint(manifest, Path(run.cfg.out), run.fingerprint, write=rank == 0, new_data=run.cfg.new_data)
    barrier()
    if log and rank == 0:
        log(f"joined {manifest.name} from {run.cfg.resume_from} into {final}")


def train(cfg: TrainConfig, *, progress: bool = True, log: Log | None = None) -> dict:
    """Run (or resume) one training; returns the report written to ``out/metrics.json``."""
    rank, _world = dist_info()
    clock = RunClock()
    with clock.part("prepare"):  # data, target and drafter loaded; with --resume-from, the pieces joined
        run = prepare(cfg)
        clock.device = run.device
        if cfg.resume_from:
            _bring_in(run, log)
        torch.manual_seed(cfg.seed)
        opt = torch.optim.AdamW([p for p in run.drafter.parameters() if p.requires_grad], lr=cfg.lr,
                                weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        p = _start(run, opt, log, clock)
    if rank == 0:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
    _steps(run, opt, p, progress=progress, log=log)
    return _finish(run, opt, p, log)
