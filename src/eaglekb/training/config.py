"""The training run's options, and the names of what a run folder holds.

Owns: ``TrainConfig`` (one training run; the fields that form the resume fingerprint),
``POSITIONS`` (rotary position modes of the TTT steps), ``NOISE`` (the noise of a
recorded training run) and ``METRICS`` (the report file in the run folder).

Knows nothing about torch, data, drafters or how a run is executed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from eaglekb.io.errors import BadInput, SchemaError

POSITIONS = ("runtime", "specforge")
#: Autocast dtypes of the TTT forward on CUDA ("none": float32); the CPU runs float32.
AMP = ("bfloat16", "none")
#: torch.compile of the TTT unroll and the loss's chunks: auto (on with CUDA), on, step (as on, the unroll compiled one
#: TTT step at a time: a compile that does not grow with the depth), off.
COMPILE = ("auto", "on", "step", "off")
#: How sequences form batches: shuffled, or shuffled then grouped by length (same epoch, less padding).
BATCHING = ("random", "length")
#: Drafting methods a run trains (``eaglekb.models.parallel_drafter.METHODS``): EAGLE-3's TTT chain, or P-EAGLE.
METHODS = ("eagle3", "p-eagle")
#: Noise of a recorded training run: one run, 30% (GPU kernels and data order move losses and accuracies).
NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.3}
#: The report of a run, in its ``out`` folder (next to ``checkpoints/`` and ``drafter/``).
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
    method: str = "eagle3"  # eagle3, or p-eagle: parallel_tokens in one pass (fp via the drafter's config)
    parallel_tokens: int = 4  # p-eagle: tokens one drafter pass proposes, the depths trained (fp via the config)
    batch_size: int = 8  # sequences per optimiser step, over all ranks (fp)
    batching: str = "random"  # random batches, or "length": similar lengths together, less padding (fp)
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
    compile: str = "auto"  # torch.compile of the TTT unroll and the loss's chunks: auto (on with CUDA), on, step (one TTT step compiled), off; errors fall back to eager
    loss_chunk: int = 4096  # positions per chunk of the draft-vocab loss (no full logits); 0: full logits
    profile: bool = False  # time each phase of a step (CUDA events on a GPU, wall clock on CPU)
    online_target: str | None = None  # target folder for data with online features
    resume: bool = False  # continue from the newest checkpoint in out
    new_data: bool = False  # on resume: continue on another dataset (same mapping, drafter shape and schedule)
    resume_from: str | None = None  # a folder of checkpoint pieces (--pieces-out of another machine): join, resume
    pieces_out: str | None = None  # write the last checkpoint there in pieces of piece_mib (a machine that may stop mid-run)
    piece_mib: float = 16.0  # the largest piece of --pieces-out, MiB
    stop_after: int | None = None  # stop after this many steps of this process (tests, interruptions)
    time_budget_s: float | None = None  # start no step after this many seconds of this process's steps (a time-limited machine)

    FINGERPRINT = ("val_data", "val_fraction", "max_val_sequences", "draft_vocab_size", "intermediate_size",
                   "ttt_steps", "step_weight", "positions", "batch_size", "batching", "max_len", "steps", "epochs", "lr",
                   "warmup_frac", "min_lr_frac", "weight_decay", "grad_clip", "seed")

    @property
    def unroll_steps(self) -> int:
        """Steps of the unroll, as the per-step counts report them: TTT steps, or the depths of a p-eagle pass."""
        return self.parallel_tokens if self.method == "p-eagle" else self.ttt_steps

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
        for name, allowed in (("amp", AMP), ("compile", COMPILE)):
            if getattr(self, name) not in allowed:
                raise BadInput(f"unknown {name} mode", where=f"--{name}", expected=", ".join(allowed),
                               found=repr(getattr(self, name)))
        if self.method not in METHODS:
            raise BadInput("unknown drafting method", where="--method", expected=" or ".join(METHODS),
                           found=repr(self.method))
        if self.method == "p-eagle" and (isinstance(self.parallel_tokens, bool) or
                                         not isinstance(self.parallel_tokens, int) or not 2 <= self.parallel_tokens <= 64):
            raise BadInput("parallel tokens out of range", where="--parallel-tokens", expected="a whole number 2..64",
                           found=repr(self.parallel_tokens))
        if self.method == "p-eagle" and self.compile == "step":
            raise BadInput("p-eagle's depths are one pass, not TTT steps", where="--compile",
                           expected="auto, on or off with --method p-eagle", found="'step'")
        if self.method == "p-eagle" and self.positions != "runtime":
            raise BadInput("p-eagle drafts at runtime positions", where="--positions", expected="runtime",
                           found=repr(self.positions))
        if isinstance(self.loss_chunk, bool) or not isinstance(self.loss_chunk, int) or self.loss_chunk < 0:
            raise BadInput("loss chunk must be a whole number >= 0", where="--loss-chunk",
                           expected="positions per chunk (0: full logits)", found=repr(self.loss_chunk))
        if self.batching not in BATCHING:
            raise BadInput("unknown batching", where="batching", expected=" or ".join(BATCHING),
                           found=repr(self.batching))
        for name, low in (("ttt_steps", 1), ("batch_size", 1), ("max_len", 4), ("log_every", 1)):
            if int(getattr(self, name)) < low:
                raise BadInput("option out of range", where=name, expected=f">= {low}", found=str(getattr(self, name)))
        if self.steps is not None and self.steps < 1:
            raise BadInput("option out of range", where="steps", expected=">= 1", found=str(self.steps))
        if not 0 <= self.val_fraction < 1:
            raise BadInput("option out of range", where="val_fraction", expected="0 <= f < 1",
                           found=str(self.val_fraction))
        if not self.piece_mib > 0:
            raise BadInput("piece size out of range", where="--piece-mib", expected="> 0 (MiB)",
                           found=str(self.piece_mib))
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise BadInput("time budget out of range", where="--time-budget-s", expected="> 0 (seconds)",
                           found=str(self.time_budget_s))
        if self.lr <= 0:
            raise BadInput("option out of range", where="lr", expected="> 0", found=str(self.lr))
