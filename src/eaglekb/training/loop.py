"""EAGLE-3 drafter training with test-time training (TTT), checkpoints and resume.

Owns: ``TrainConfig``, the TTT unroll (``TTTModel``), the per-step metrics (loss,
accuracy, full and conditional accuracy, simulated accept length), the training loop
(AdamW, warmup + cosine, gradient clipping, deterministic data order), validation on
held-out sequences, checkpoints without pickle (the drafter in SGLang format plus
trainer state as safetensors tensors + JSON scalars), ``--resume``, and DDP through
torchrun (``python -m eaglekb.training --config RUN.json``).

The TTT alignment (one anchor position ``t``; SpecForge ``specforge/core/eagle3.py``
``OnlineEagle3Model`` and ``specforge/modeling/draft/llama3_eagle.py`` read; the
engine's ``eaglekb.engine.draft`` contract):

* step 0 pairs the target's aux hidden state at ``t`` (``fc`` applied) with the
  embedding of token ``t+1`` and predicts token ``t+2``;
* step ``k > 0`` pairs the drafter's own output hidden of step ``k-1`` at ``t`` with the
  embedding of token ``t+k+1`` and predicts token ``t+k+2``;
* attention at step ``k`` sees the step-0 keys at positions ``<= t`` (causal) and, for
  each earlier step ``j in 1..k``, only its own anchor's key (the diagonal), exactly
  the keys a chain draft sees at inference after verifying token ``t+1``;
* rotary position at step ``k`` is ``t + k`` (``positions="runtime"``, what SGLang and
  the eaglekb engine use when drafting); SpecForge keeps ``t`` at every step
  (``positions="specforge"`` reproduces that);
* the target distribution is the softmax of the target's logits restricted to the draft
  vocab (``t2d``), from the target's final hidden state at ``t+k+1``; a position whose
  target argmax lies outside the draft vocab carries no loss and counts as a miss;
* the loss at step ``k`` is masked by the predicted token's loss mask (``t+k+2``, an
  assistant token) and normalised by the number of such positions; loss =
  ``sum_k 0.8**k * ploss_k``. SpecForge masks by the anchor's own token (``t``) instead
  and divides by all positions including padding; see docs/howto/train.md.

Knows nothing about generation (``eaglekb.data.datagen`` makes the data), vocab statistics
beyond calling ``eaglekb.data.vocab``, or the task runner.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, SchemaError

POSITIONS = ("runtime", "specforge")
#: Noise of a recorded training run: one run, 30% (GPU kernels and data order move losses and accuracies).
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.3}
STATE_DIR = "trainer"
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
METRICS = "metrics.json"


@dataclass
class TrainConfig:
    """One training run. Fields marked (fp) are part of the resume fingerprint."""

    data: str  # datagen folder (fp via its identity hash)
    out: str  # run folder: checkpoints/, drafter/, metrics.json
    val_data: str | None = None  # held-out datagen folder; None: hold out val_fraction of data (fp)
    val_fraction: float = 0.05  # (fp)
    max_val_sequences: int = 256  # cap on validation sequences (fp)
    init: str | None = None  # start from this drafter checkpoint
    remap: bool = True  # remap the init drafter's lm_head when its mapping differs from the data's
    mapping: str | None = None  # use this mapping (file or drafter folder) instead of building from data
    draft_vocab_size: int = 8192  # draft vocab when building the mapping from data (fp)
    intermediate_size: int | None = None  # drafter MLP width; None: the target's (fp)
    ttt_steps: int = 7  # (fp)
    step_weight: float = 0.8  # loss weight of step k is step_weight**k (fp)
    positions: str = "runtime"  # rotary position per TTT step: runtime (t+k) or specforge (t) (fp)
    batch_size: int = 8  # sequences per optimiser step, over all ranks (fp)
    max_len: int = 1024  # tokens kept per sequence (fp)
    steps: int | None = None  # optimiser steps; None: epochs * sequences / batch_size (fp)
    epochs: float = 1.0  # (fp)
    lr: float = 1e-4  # peak learning rate (fp)
    warmup_frac: float = 0.03  # share of steps with linear warmup (fp)
    min_lr_frac: float = 0.0  # cosine decays to lr * min_lr_frac (fp)
    weight_decay: float = 0.0  # (fp)
    grad_clip: float = 0.5  # max gradient norm; 0 disables (fp)
    seed: int = 0  # init weights, data order, validation split (fp)
    eval_every: int = 0  # validate every N steps; 0: at the end only
    save_every: int = 0  # checkpoint every N steps; 0: at the end only
    log_every: int = 10  # curve point every N steps
    keep_checkpoints: int = 2  # newest checkpoints kept
    device: str = "auto"  # auto, cpu, cuda
    amp: str = "bfloat16"  # autocast dtype on CUDA (bfloat16 or none); CPU runs float32
    online_target: str | None = None  # target folder for data with online features
    resume: bool = False  # continue from the newest checkpoint in out
    stop_after: int | None = None  # stop after this many steps of this process (tests, interruptions)

    FINGERPRINT = ("val_data", "val_fraction", "max_val_sequences", "draft_vocab_size", "intermediate_size",
                   "ttt_steps", "step_weight", "positions", "batch_size", "max_len", "steps", "epochs", "lr",
                   "warmup_frac", "min_lr_frac", "weight_decay", "grad_clip", "seed")

    @classmethod
    def from_dict(cls, doc: dict, where: str = "config") -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            raise SchemaError("unknown training option", where=f"{where}:{unknown[0]}",
                              expected=", ".join(sorted(names)), found=repr(unknown[0]))
        return cls(**doc)

    def check(self) -> None:
        if self.positions not in POSITIONS:
            raise BadInput("unknown TTT position mode", where="positions", expected=" or ".join(POSITIONS),
                           found=repr(self.positions))
        for name, low in (("ttt_steps", 1), ("batch_size", 1), ("max_len", 4), ("log_every", 1)):
            if int(getattr(self, name)) < low:
                raise BadInput("option out of range", where=name, expected=f">= {low}", found=str(getattr(self, name)))
        if self.steps is not None and self.steps < 1:
            raise BadInput("option out of range", where="steps", expected=">= 1", found=str(self.steps))
        if not 0 <= self.val_fraction < 1:
            raise BadInput("option out of range", where="val_fraction", expected="0 <= f < 1",
                           found=str(self.val_fraction))
        if self.lr <= 0:
            raise BadInput("option out of range", where="lr", expected="> 0", found=str(self.lr))


# ----------------------------------------------------------------------------- TTT


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x[:, n:]`` right-padded with zeros to the same length (dim 1)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat((x[:, n:], pad), dim=1) if n < x.shape[1] else torch.zeros_like(x)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class TTTModel(nn.Module):
    """The drafter unrolled over ``steps`` TTT steps; returns the weighted loss and per-step counts.

    Holds the frozen target embeddings and the target lm_head rows of the draft vocab
    as buffers (not parameters: DDP leaves them alone).
    """

    def __init__(self, drafter, embed: torch.Tensor, target_head: torch.Tensor | None, *, steps: int = 7,
                 step_weight: float = 0.8, positions: str = "runtime"):
        super().__init__()
        self.drafter = drafter
        self.steps = steps
        self.step_weight = step_weight
        self.positions = positions
        self.register_buffer("embed", embed.detach().float(), persistent=False)
        self.register_buffer("full_head", target_head.detach().float() if target_head is not None else None,
                             persistent=False)
        self.refresh_mapping()

    def refresh_mapping(self) -> None:
        """Recompute what depends on the drafter's d2t (after a remap or resume)."""
        d = self.drafter
        vd = d.config.draft_vocab_size
        selected = torch.arange(vd, device=d.d2t.device) + d.d2t
        self.register_buffer("selected", selected, persistent=False)
        pos = torch.full((d.config.vocab_size,), -1, dtype=torch.long, device=d.d2t.device)
        pos[selected] = torch.arange(vd, device=d.d2t.device)
        self.register_buffer("draft_pos", pos, persistent=False)
        head = self.full_head[selected.to(self.full_head.device)] if self.full_head is not None else None
        self.register_buffer("draft_head", head, persistent=False)

    def _attention(self, x, pos, keys, values):
        attn = self.drafter.midlayer.self_attn
        b, t, _ = x.shape
        nh, nkv, hd = attn.n_heads, attn.n_kv, attn.head_dim
        q = attn.q_proj(x).view(b, t, nh, hd).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        inv = self.drafter.inv_freq.to(x.device).float()
        freqs = pos.float()[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys.append(k)
        values.append(v)
        rep = nh // nkv

        def expand(z):
            return z.repeat_interleave(rep, dim=1) if rep > 1 else z

        scale = 1.0 / math.sqrt(hd)
        if len(keys) == 1:
            out = F.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True)
        else:
            causal = torch.full((t, t), float("-inf"), device=x.device).triu(1)
            s0 = (q @ expand(keys[0]).transpose(-1, -2)).float() * scale + causal
            diag = [((q * expand(kj)).sum(-1, keepdim=True)).float() * scale for kj in keys[1:]]
            p = torch.cat([s0, *diag], dim=-1).softmax(-1).to(q.dtype)
            out = p[..., :t] @ expand(values[0])
            for j, vj in enumerate(values[1:]):
                out = out + p[..., t + j:t + j + 1] * expand(vj)
        return attn.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd))

    def step_logits(self, input_ids, aux_hidden):
        """All TTT steps' draft logits ``[K][B,T,Vd]`` (teacher-forced inputs; for checks)."""
        return [lg for lg, _ in self._unroll(input_ids, aux_hidden)]

    def _unroll(self, input_ids, aux_hidden):
        d = self.drafter
        mid = d.midlayer
        b, t = input_ids.shape
        hidden = d.fc(aux_hidden.to(d.fc.weight.dtype))
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        base = torch.arange(t, device=input_ids.device)
        for k in range(self.steps):
            emb = F.embedding(shift(input_ids, k + 1), self.embed).to(hidden.dtype)
            x = torch.cat((mid.input_layernorm(emb), mid.hidden_norm(hidden)), dim=-1)
            pos = base + (k if self.positions == "runtime" else 0)
            h = hidden + self._attention(x, pos, keys, values)
            hidden = h + mid.mlp(mid.post_attention_layernorm(h))
            yield d.lm_head(d.norm(hidden)), hidden

    def forward(self, batch: dict, norms: torch.Tensor, world: int = 1):
        """Weighted TTT loss (scaled for DDP gradient averaging) and per-step counts ``[K, 5]``.

        ``norms[k]``: the number of loss positions of step ``k`` over the whole global batch.
        Counts per step: loss sum, positions, correct, chain-correct, chain-correct before this step.
        """
        ids, mask = batch["input_ids"], batch["loss_mask"].float()
        argmax = batch["target_argmax"].long()
        soft = None
        if batch.get("final_hidden") is not None and self.draft_head is not None:
            with torch.no_grad():
                tl = batch["final_hidden"].float() @ self.draft_head.t()
                soft = tl.softmax(-1)
        total = torch.zeros((), device=ids.device)
        stats = []
        chain = torch.ones_like(mask, dtype=torch.bool)
        for k, (logits, _) in enumerate(self._unroll(ids, batch["aux_hidden"])):
            w = shift(mask, k + 2)
            tgt = shift(argmax, k + 1)
            tpos = self.draft_pos[tgt]
            pm = w * (tpos >= 0).float()
            logp = logits.float().log_softmax(-1)
            if soft is not None:
                ce = -(shift(soft, k + 1) * logp).sum(-1)
            else:
                ce = -logp.gather(-1, tpos.clamp_min(0)[..., None]).squeeze(-1)
            loss_sum = (ce * pm).sum()
            total = total + (self.step_weight ** k) * loss_sum / norms[k].clamp_min(1.0) * world
            with torch.no_grad():
                correct = (self.selected[logits.argmax(-1)] == tgt) & (tpos >= 0)
                prev = chain
                chain = chain & correct
                wb = w > 0
                stats.append(torch.stack([loss_sum.detach(), w.sum(), (correct & wb).sum().float(),
                                          (chain & wb).sum().float(), (prev & wb).sum().float()]))
        return total, torch.stack(stats)


def step_norms(mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Loss positions per TTT step for a batch's loss mask ``[B,T]``."""
    return torch.stack([shift(mask.float(), k + 2).sum() for k in range(steps)])


def summarise(stats: torch.Tensor, weight: float = 0.8) -> dict:
    """Per-step metrics from summed counts ``[K, 5]`` (see ``TTTModel.forward``)."""
    s = stats.double().cpu()
    pos = s[:, 1].clamp_min(1)
    ploss = (s[:, 0] / pos).tolist()
    acc = (s[:, 2] / pos).tolist()
    full = (s[:, 3] / pos).tolist()
    cond = (s[:, 3] / s[:, 4].clamp_min(1)).tolist()
    sim, run = 0.0, 1.0
    for a in acc:
        run *= a
        sim += run
    chain = sum(full)
    return {
        "loss": sum(weight ** k * v for k, v in enumerate(ploss)),
        "ploss": ploss, "acc": acc, "full_acc": full, "cond_acc": cond,
        "simulated_acc_len": sim,  # SpecForge: sum_i prod_{j<=i} acc_j, no bonus token
        "chain_acc_len": chain,  # sum_i full_acc_i: the teacher-forced chain, no bonus token
        "positions": int(s[0, 1]),
    }


# ----------------------------------------------------------------------------- data


class Batches:
    """Deterministic batches of sequences from a dataset (order = f(seed, epoch))."""

    def __init__(self, dataset, indices: list[int], batch_size: int, max_len: int, seed: int):
        self.ds, self.indices, self.bs, self.max_len, self.seed = dataset, indices, batch_size, max_len, seed
        self.per_epoch = max(1, len(indices) // batch_size)

    def items(self, step: int) -> list[int]:
        epoch, j = divmod(step, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.indices), generator=g).tolist()
        take = order[j * self.bs:(j + 1) * self.bs] or order[: self.bs]
        return [self.indices[i] for i in take]


def collate(dataset, items: list[int], max_len: int, device, features=None) -> dict:
    seqs = [dataset.get(i, max_len) for i in items]
    t = max(len(s["input_ids"]) for s in seqs)
    b = len(seqs)
    ids = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.float32)
    valid = torch.zeros((b, t), dtype=torch.bool)
    for i, s in enumerate(seqs):
        n = len(s["input_ids"])
        ids[i, :n] = s["input_ids"].long()
        mask[i, :n] = s["loss_mask"].float()
        valid[i, :n] = True
    out = {"input_ids": ids.to(device), "loss_mask": mask.to(device), "valid": valid.to(device)}
    if features is not None:  # online: run the target now
        out.update(features(out["input_ids"], out["valid"]))
        return out
    for key in ("aux_hidden", "final_hidden", "target_argmax"):
        if key not in seqs[0]:
            continue
        first = seqs[0][key]
        full = torch.zeros((b, t, *first.shape[1:]), dtype=first.dtype)
        for i, s in enumerate(seqs):
            full[i, : len(s[key])] = s[key]
        out[key] = full.to(device, non_blocking=True)
    return out


# ----------------------------------------------------------------------------- distributed


def dist_info() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x)
    return x


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- setup


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            from eaglekb.io.errors import Unavailable

            raise Unavailable("CUDA is not available", where=f"device={name}", fix="use --device cpu")
        if name == "cuda" and "LOCAL_RANK" in os.environ:
            name = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return torch.device(name)


def _split(dataset, cfg: TrainConfig, loss_counts: list[int]) -> tuple[list[int], list[int]]:
    usable = [i for i in range(len(dataset)) if loss_counts[i] > 0]
    if not usable:
        raise BadInput("dataset has no loss tokens (empty or all-masked)", where=str(dataset.path),
                       expected="assistant tokens with loss_mask 1", found=f"{len(dataset)} sequences, 0 loss tokens",
                       fix="regenerate with invoke datagen")
    if cfg.val_data is not None or cfg.val_fraction == 0 or len(usable) < 2:
        return usable, []
    g = torch.Generator().manual_seed(cfg.seed + 7919)
    order = torch.randperm(len(usable), generator=g).tolist()
    n_val = min(cfg.max_val_sequences, max(1, round(len(usable) * cfg.val_fraction)))
    val = sorted(usable[i] for i in order[:n_val])
    held = set(val)
    return [i for i in usable if i not in held], val


def _loss_counts(dataset, max_len: int) -> list[int]:
    from eaglekb.data.datagen import read_shard_tensor

    out: list[int] = []
    for file, offs in zip(dataset.shard_files, dataset.offsets):
        m = read_shard_tensor(file, "loss_mask").long()
        for a, b in zip(offs[:-1], offs[1:]):
            # positions that can carry a loss: the mask shifted by two (see TTTModel.forward)
            out.append(int(m[a + 2:min(b, a + max_len)].sum()))
    return out


def data_mapping(dataset, draft_vocab_size: int):
    """The SpecForge-semantics mapping of the data's loss-masked tokens (``eaglekb.data.vocab``)."""
    from eaglekb.data import vocab

    v = dataset.target["vocab_size"]
    counts = torch.zeros(v, dtype=torch.int64)
    for ids, mask in dataset.token_ids_and_masks():
        counts += vocab.counts_from_token_ids(ids, mask, v)
    return vocab.build_mapping(vocab.TokenCounts(counts, {"what": "loss-masked tokens", "dataset": str(dataset.path)}),
                               min(draft_vocab_size, v))


def _remap(drafter, mapping, target_rows: torch.Tensor | None):
    """The init drafter moved to ``mapping``: lm_head rows by target token id (``eaglekb.training.remap``)."""
    import dataclasses

    from eaglekb.training import remap
    from eaglekb.data import vocab
    from eaglekb.models.drafter import Eagle3Drafter

    src = vocab.Mapping(d2t=drafter.d2t.detach().cpu().clone(), vocab_size=drafter.config.vocab_size)
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


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    warm = max(1, int(round(total * cfg.warmup_frac))) if cfg.warmup_frac > 0 else 0
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    low = cfg.lr * cfg.min_lr_frac
    return low + (cfg.lr - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


# ----------------------------------------------------------------------------- checkpoints


def _checkpoints(out: Path) -> list[Path]:
    root = out / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / STATE_DIR / STATE_JSON).is_file())


def save_checkpoint(out: Path, step: int, drafter, opt, fingerprint: dict, history: dict, keep: int) -> Path:
    from safetensors.torch import save_file

    from eaglekb.models.drafter import save_drafter

    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_drafter(drafter, tmp)
    (tmp / STATE_DIR).mkdir()
    tensors: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in drafter.named_parameters()}
    for n, p in drafter.named_parameters():
        tensors[f"param.{n}"] = p.detach().float().cpu().contiguous()
    for n, b in drafter.named_buffers():
        if n in ("d2t", "t2d"):
            tensors[f"buffer.{n}"] = b.detach().cpu().contiguous()
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for key, value in st.items():
                if torch.is_tensor(value):
                    tensors[f"opt.{names[id(p)]}.{key}"] = value.detach().float().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    save_file(tensors, str(tmp / STATE_DIR / STATE_TENSORS))
    doc = {"step": step, "fingerprint": fingerprint, "fingerprint_hash": _hash(fingerprint), "history": history,
           "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}
    (tmp / STATE_DIR / STATE_JSON).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in _checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, drafter, opt, fingerprint: dict) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        doc = json.loads((path / STATE_DIR / STATE_JSON).read_text())
    except ValueError as exc:
        raise IntegrityError("checkpoint state is not valid JSON", where=str(path / STATE_DIR / STATE_JSON),
                             found=str(exc)) from None
    if doc.get("fingerprint_hash") != _hash(fingerprint):
        from eaglekb.data.datagen import first_difference

        where, old, new = first_difference(doc.get("fingerprint", {}), fingerprint)
        diff = f"{where}: {old!r} in the checkpoint, {new!r} now"
        raise Incompatible("checkpoint is from another training config", where=str(path),
                           expected="the same data, drafter shape, mapping and schedule", found=diff,
                           fix="resume with the config that wrote it, or use another --out")
    try:
        tensors = load_file(str(path / STATE_DIR / STATE_TENSORS))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise IntegrityError("unreadable checkpoint state", where=str(path / STATE_DIR / STATE_TENSORS),
                             found=str(exc).splitlines()[0][:120]) from None
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            p.copy_(tensors[f"param.{n}"].to(p.dtype))
        drafter.d2t.copy_(tensors["buffer.d2t"])
        drafter.t2d.copy_(tensors["buffer.t2d"])
    by_name = dict(drafter.named_parameters())
    state = {}
    for idx, (n, p) in enumerate(by_name.items()):
        st = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"opt.{n}.")
              and k.count(".") == n.count(".") + 2}
        if st:
            state[idx] = {k: (v.to(p.device) if k != "step" else v) for k, v in st.items()}
    groups = [dict(g, params=list(range(len(by_name)))) for g in doc["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(tensors["rng.torch"])
    return doc


def _hash(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]



# ----------------------------------------------------------------------------- the run


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
    from eaglekb.data import datagen
    from eaglekb.data import vocab
    from eaglekb.models.drafter import build_drafter_for_target, load_drafter

    cfg.check()
    device = _device(cfg.device)
    ds = datagen.open_dataset(cfg.data)
    tgt = ds.target
    features = None
    if ds.features == "online":
        path = cfg.online_target or ds.manifest.get("target_path")
        if not path:
            raise BadInput("online-features data needs the target", where="--online-target",
                           expected="the target folder", found="none")
        t = datagen.load_target(path, device=str(device), dtype="bfloat16" if device.type == "cuda" else "float32",
                                capture_points=ds.capture_points)
        features = datagen.OnlineFeatures(t, store_final_hidden=True)
    counts = _loss_counts(ds, cfg.max_len)
    train_idx, val_idx = _split(ds, cfg, counts)
    val_ds = ds
    if cfg.val_data is not None:
        val_ds = datagen.open_dataset(cfg.val_data)
        if val_ds.target["hidden_size"] != tgt["hidden_size"] or val_ds.capture_points != ds.capture_points:
            raise Incompatible("validation data comes from another target or capture points", where=cfg.val_data,
                               expected=f"hidden {tgt['hidden_size']}, points {ds.capture_points}",
                               found=f"hidden {val_ds.target['hidden_size']}, points {val_ds.capture_points}")
        vcounts = _loss_counts(val_ds, cfg.max_len)
        val_idx = [i for i, c in enumerate(vcounts) if c > 0][: cfg.max_val_sequences]
    notes: list[str] = []
    if cfg.mapping:
        mapping = vocab.load_mapping(cfg.mapping)
        if mapping.vocab_size != tgt["vocab_size"]:
            raise Incompatible("mapping is for another target vocab", where=cfg.mapping,
                               expected=str(tgt["vocab_size"]), found=str(mapping.vocab_size))
        mapping_src = f"file {cfg.mapping}"
    else:
        size = cfg.draft_vocab_size
        if cfg.init:
            from eaglekb.models.drafter import read_config

            size = read_config(cfg.init)[0].draft_vocab_size
        mapping = data_mapping(ds, size)
        mapping_src = f"built from the data's loss-masked tokens (top {size})"
    config_ids = [c - 1 for c in ds.capture_points]
    mapping_report: dict[str, Any] = {"source": mapping_src, "draft_vocab_size": mapping.draft_vocab_size,
                                      "coverage_frac": mapping.meta.get("coverage_frac")}
    if cfg.init:
        drafter = load_drafter(cfg.init, dtype="float32")
        dc = drafter.config
        if (dc.target_hidden_size or dc.hidden_size) != tgt["hidden_size"]:
            raise Incompatible("dataset hidden size does not match the init drafter", where=cfg.init,
                               expected=f"target_hidden_size {tgt['hidden_size']} (the data's)",
                               found=str(dc.target_hidden_size or dc.hidden_size))
        if dc.vocab_size != tgt["vocab_size"]:
            raise Incompatible("init drafter is for another target vocab", where=cfg.init,
                               expected=str(tgt["vocab_size"]), found=str(dc.vocab_size))
        if dc.aux_layer_ids is not None and list(dc.aux_layer_ids) != config_ids:
            raise Incompatible("init drafter reads other aux layers than the data holds", where=cfg.init,
                               expected=f"aux_layer_ids {config_ids} (data capture points {ds.capture_points})",
                               found=str(dc.aux_layer_ids))
        same = torch.equal(drafter.d2t.cpu(), mapping.d2t) if drafter.d2t.numel() == mapping.d2t.numel() else False
        if same:
            mapping_report["init"] = "same mapping as the data: no remap"
        elif cfg.remap:
            rows = ds.target_head()[1].float() if ds.features == "stored" else None
            drafter, mapping_report["remap"] = _remap(drafter, mapping, rows)
            notes.append(f"init drafter's mapping differs from the data's: lm_head rows remapped by target token id "
                         f"({mapping_report['remap']})")
        else:
            if mapping.draft_vocab_size != dc.draft_vocab_size:
                raise Incompatible("--no-remap keeps the init lm_head: the draft vocab size must not change",
                                   where="--mapping", expected=str(dc.draft_vocab_size),
                                   found=str(mapping.draft_vocab_size))
            drafter.set_mapping(mapping.d2t)
            notes.append("init drafter's mapping differs from the data's and --no-remap was given: d2t replaced "
                         "WITHOUT moving lm_head rows (reproduces the misaligned-head failure; do not ship)")
            mapping_report["remap"] = "skipped (--no-remap)"
    else:
        drafter = build_drafter_for_target(
            tgt, mapping.draft_vocab_size, intermediate_size=cfg.intermediate_size, mapping=mapping.selected,
            aux_layer_ids=config_ids, torch_dtype="bfloat16", seed=cfg.seed)
    if ds.target["hidden_size"] != (drafter.config.target_hidden_size or drafter.config.hidden_size):
        raise Incompatible("dataset hidden size does not match the drafter", where=cfg.data,
                           expected=str(drafter.config.target_hidden_size), found=str(ds.target["hidden_size"]))
    drafter = drafter.float().to(device)
    drafter.inv_freq = drafter.inv_freq.float()
    if ds.features == "stored":
        embed, head = ds.target_head()
    else:
        m = features.target.model
        embed, head = m.get_input_embeddings().weight.detach().cpu(), m.get_output_embeddings().weight.detach().cpu()
    if embed.shape[1] != drafter.config.hidden_size:
        raise Incompatible("target embeddings do not fit the drafter", where=cfg.data,
                           expected=f"width {drafter.config.hidden_size}", found=f"width {embed.shape[1]}")
    model = TTTModel(drafter, embed, head, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                     positions=cfg.positions).to(device)
    n_train = len(train_idx)
    total = cfg.steps or max(1, math.ceil(cfg.epochs * n_train / cfg.batch_size))
    fingerprint = {k: getattr(cfg, k) for k in TrainConfig.FINGERPRINT}
    fingerprint.update(total_steps=total, data=ds.manifest["identity_hash"],
                       data_tokens=ds.manifest["totals"]["tokens"], drafter=drafter.config.to_sglang_json(),
                       mapping_sha=_sha(drafter.d2t), init=cfg.init is not None)
    return Run(cfg, ds, val_ds, train_idx, val_idx, drafter, model, mapping_report, fingerprint, total, device,
               features, notes)


def evaluate(run: Run, model: TTTModel) -> dict | None:
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
    return summarise(_all_reduce(stats), run.cfg.step_weight)


def _autocast(run: Run):
    import contextlib

    if run.device.type == "cuda" and run.cfg.amp == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def launch(cfg: TrainConfig, nproc: int, *, progress: bool = True) -> dict:
    """Run ``train`` in ``nproc`` processes through torchrun (one per GPU, or gloo on CPU)."""
    import subprocess
    import sys
    import tempfile

    from eaglekb.io.errors import EaglekbError, Unavailable

    cfg.check()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "train.json"
        conf.write_text(json.dumps(asdict(cfg)))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "eaglekb.training", "--config", str(conf)] + ([] if progress else ["--no-progress"])
        proc = subprocess.run(cmd, capture_output=True, text=True)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error: ")]
    if errors:
        raise EaglekbError(errors[0][len("error: "):])
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable("torchrun failed", where=" ".join(cmd[:6]), found=tail[:200])
    return json.loads((Path(cfg.out) / METRICS).read_text())


def train(cfg: TrainConfig, *, progress: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) one training; returns the report written to ``out/metrics.json``."""
    from tqdm import tqdm

    rank, world = dist_info()
    run = prepare(cfg)
    out = Path(cfg.out)
    existing = _checkpoints(out)
    if existing and not cfg.resume:
        raise BadInput("output folder already holds a training run", where=str(out),
                       expected="an empty or new folder", found=existing[-1].name,
                       fix="pass --resume to continue it, or another --out (nothing was overwritten)")
    drafter, model = run.drafter, run.model
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start = 0
    history: dict[str, dict[str, float]] = {"train_loss": {}, "train_acc0": {}, "val_loss": {}, "val_acc0": {},
                                            "val_simulated_acc_len": {}, "train_tok_s": {}}
    if cfg.resume and existing:
        doc = load_checkpoint(existing[-1], drafter, opt, run.fingerprint)
        model.refresh_mapping()
        start, history = doc["step"], doc["history"]
        if log:
            log(f"resumed from {existing[-1]} at step {start}")
    elif cfg.resume and log:
        log("no checkpoint to resume from: starting at step 0")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    ddp = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[run.device.index] if run.device.type == "cuda" else None,
                  broadcast_buffers=False)
    batches = Batches(run.dataset, run.train_idx, cfg.batch_size, cfg.max_len, cfg.seed)
    bar = tqdm(total=run.total_steps, initial=start, desc="finetune", disable=not progress or rank != 0,
               dynamic_ncols=True, mininterval=2.0)
    tokens_done = 0
    t_train = 0.0
    window = torch.zeros((cfg.ttt_steps, 5), dtype=torch.float64, device=run.device)
    window_tokens, window_t = 0, 0.0
    step = start
    last_val = None
    stopped = False
    for step in range(start, run.total_steps):
        if cfg.stop_after is not None and step - start >= cfg.stop_after:
            stopped = True
            break
        t0 = time.perf_counter()
        items = batches.items(step)
        mine = items[rank::world]
        batch = collate(run.dataset, mine, cfg.max_len, run.device, run.features)
        norms = _all_reduce(step_norms(batch["loss_mask"], cfg.ttt_steps))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, run.total_steps, cfg)
        with _autocast(run):
            loss, st = ddp(batch, norms, world)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        ntok = torch.tensor([float(batch["valid"].sum())], device=run.device)
        window += _all_reduce(st.double())
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        dt = time.perf_counter() - t0
        tok = int(_all_reduce(ntok).item())
        tokens_done += tok
        t_train += dt
        window_tokens += tok
        window_t += dt
        done = step + 1
        if done % cfg.log_every == 0 or done == run.total_steps:
            sm = summarise(window, cfg.step_weight)
            history["train_loss"][str(done)] = round(sm["loss"], 5)
            history["train_acc0"][str(done)] = round(100 * sm["acc"][0], 3)
            history["train_tok_s"][str(done)] = round(window_tokens / window_t, 1) if window_t else 0.0
            bar.set_postfix(loss=f"{sm['loss']:.3f}", acc0=f"{sm['acc'][0]:.3f}",
                            tok_s=f"{window_tokens / window_t:.0f}")
            if log and rank == 0:
                log(f"step {done}/{run.total_steps} loss {sm['loss']:.4f} acc0 {sm['acc'][0]:.3f} "
                    f"lr {lr_at(step, run.total_steps, cfg):.2e} {window_tokens / window_t:.0f} tok/s")
            window.zero_()
            window_tokens, window_t = 0, 0.0
        if cfg.eval_every and done % cfg.eval_every == 0 and done != run.total_steps:
            last_val = _record_val(run, model, history, done, log, rank)
        if cfg.save_every and done % cfg.save_every == 0 and done != run.total_steps:
            if rank == 0:
                save_checkpoint(out, done, drafter, opt, run.fingerprint, history, cfg.keep_checkpoints)
            _barrier()
        bar.update(1)
    else:
        step = run.total_steps
    bar.close()
    final_step = step if stopped else run.total_steps
    if not stopped:
        last_val = _record_val(run, model, history, final_step, log, rank)
    if rank == 0:
        save_checkpoint(out, final_step, drafter, opt, run.fingerprint, history, cfg.keep_checkpoints)
    _barrier()
    report = _report(run, history, last_val, final_step, tokens_done, t_train, stopped, world)
    if rank == 0:
        from eaglekb.models.drafter import save_drafter

        if not stopped:
            save_drafter(drafter, out / "drafter")
        tmp = out / f".{METRICS}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out / METRICS)
    _barrier()
    return report


def _record_val(run: Run, model: TTTModel, history: dict, step: int, log, rank: int) -> dict | None:
    val = evaluate(run, model)
    if val is None:
        return None
    history["val_loss"][str(step)] = round(val["loss"], 5)
    history["val_acc0"][str(step)] = round(100 * val["acc"][0], 3)
    history["val_simulated_acc_len"][str(step)] = round(val["simulated_acc_len"], 4)
    if log and rank == 0:
        log(f"val @ {step}: loss {val['loss']:.4f} acc {' '.join(f'{a:.3f}' for a in val['acc'])} "
            f"simulated_acc_len {val['simulated_acc_len']:.3f}")
    return val


def _report(run: Run, history: dict, val: dict | None, step: int, tokens: int, seconds: float, stopped: bool,
            world: int) -> dict:
    cfg = run.cfg
    drafter = run.drafter
    n_params = sum(p.numel() for p in drafter.parameters())
    bf16_bytes = sum(t.numel() * (2 if t.is_floating_point() else t.element_size())
                     for t in drafter.state_dict().values())
    return {
        "config": asdict(cfg),
        "step": step,
        "total_steps": run.total_steps,
        "stopped_early": stopped,
        "world_size": world,
        "device": str(run.device),
        "train_sequences": len(run.train_idx),
        "val_sequences": len(run.val_idx),
        "mapping": run.mapping_report,
        "notes": run.notes,
        "drafter": {"config": drafter.config.to_sglang_json(), "parameters": n_params, "bf16_bytes": bf16_bytes},
        "throughput": {"tokens": tokens, "seconds": round(seconds, 3),
                       "tok_s": round(tokens / seconds, 2) if seconds else None},
        "val": val,
        "history": history,
        "data": {"path": str(run.dataset.path), "identity_hash": run.dataset.manifest["identity_hash"],
                 "prompts": run.dataset.manifest.get("prompts"), "totals": run.dataset.manifest.get("totals")},
    }


def baseline_fields(report: dict) -> dict:
    """metrics / series / summary for a ``finetune`` baseline (units in every leaf name)."""
    val = report.get("val") or {}
    metrics: dict[str, Any] = {
        "throughput": {"train_tok_s": report["throughput"]["tok_s"] or 0.0,
                       "train_s": report["throughput"]["seconds"], "train_tokens": report["throughput"]["tokens"]},
        "run": {"optimizer_steps": report["step"], "train_sequences_count": report["train_sequences"],
                "val_sequences_count": report["val_sequences"],
                "drafter_params": report["drafter"]["parameters"],
                "drafter_bf16_bytes": report["drafter"]["bf16_bytes"]},
    }
    if report["mapping"].get("coverage_frac") is not None:
        metrics["run"]["draft_vocab_coverage_frac"] = round(report["mapping"]["coverage_frac"], 5)
    if val:
        metrics["val"] = {
            "loss": {"weighted_loss": round(val["loss"], 5),
                     **{f"step{k}_loss": round(v, 5) for k, v in enumerate(val["ploss"])}},
            "acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["acc"])},
            "full_acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["full_acc"])},
            "cond_acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["cond_acc"])},
            "simulated_acc_len": round(val["simulated_acc_len"], 4),
            "simulated_acc_plus_bonus_len": round(val["simulated_acc_len"] + 1, 4),
            "chain_acc_len": round(val["chain_acc_len"], 4),
            "chain_acc_plus_bonus_len": round(val["chain_acc_len"] + 1, 4),
            "positions_count": val["positions"],
        }
    h = report["history"]
    units = {"train_loss": "_loss", "val_loss": "_loss", "train_acc0": "_pct", "val_acc0": "_pct",
             "val_simulated_acc_len": "_len", "train_tok_s": "_tok_s"}
    series = {name: {"x": "step", "unit": units[name], "points": pts} for name, pts in h.items() if pts}
    summary = (f"{report['step']} steps, {report['throughput']['tok_s']} train tok/s on {report['device']}"
               + (f"; val acc0 {100 * val['acc'][0]:.1f}%, simulated_acc_len {val['simulated_acc_len']:.2f} "
                  f"(+1 bonus = {val['simulated_acc_len'] + 1:.2f})" if val else ""))
    return {"metrics": metrics, "series": series, "summary": summary}


def render_text(report: dict) -> str:
    lines = [f"trained {report['step']}/{report['total_steps']} steps on {report['device']} "
             f"(world {report['world_size']}): {report['throughput']['tok_s']} tok/s"]
    lines += [f"note: {n}" for n in report["notes"]]
    lines.append(f"mapping: {report['mapping']['source']}")
    val = report.get("val")
    if val:
        lines.append("val acc per step:      " + " ".join(f"{a:.3f}" for a in val["acc"]))
        lines.append("val full acc per step: " + " ".join(f"{a:.3f}" for a in val["full_acc"]))
        lines.append("val cond acc per step: " + " ".join(f"{a:.3f}" for a in val["cond_acc"]))
        lines.append(f"simulated_acc_len {val['simulated_acc_len']:.3f} (SpecForge, no bonus); "
                     f"+1 for runtime accept length = {val['simulated_acc_len'] + 1:.3f}")
    lines.append(f"drafter: {Path(report['config']['out']) / 'drafter'}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- torchrun entry


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc_per_node N -m eaglekb.training --config RUN.json``."""
    import argparse

    import torch.distributed as dist

    from eaglekb.io.errors import EaglekbError

    ap = argparse.ArgumentParser(description="Train an EAGLE-3 drafter (TTT); one process per GPU under torchrun.")
    ap.add_argument("--config", required=True, help="TrainConfig as JSON (see eaglekb.training.loop.TrainConfig)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in out")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        doc = json.loads(Path(args.config).read_text())
        cfg = TrainConfig.from_dict(doc, args.config)
        if args.resume:
            cfg.resume = True
        if world > 1:
            backend = "nccl" if torch.cuda.is_available() and cfg.device != "cpu" else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
        train(cfg, progress=not args.no_progress, log=lambda s: print(s, flush=True))
    except EaglekbError as exc:
        print(f"error: {exc.line()}", flush=True)
        return exc.exit_code
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0

