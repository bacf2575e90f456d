"""Training data as batches: which sequences train and which validate, in which order, padded how.

Owns: ``loss_counts`` (loss-carrying positions per sequence), ``split_indices`` (the
deterministic train / validation split), ``Batches`` (a deterministic batch order per
step, a function of seed and epoch, so a resumed run sees the same batches) and
``sequence_lengths`` (for length grouping) and ``collate`` (sequences padded into one batch; online data runs the target here).

Knows nothing about the drafter, the loss, optimisers, processes or the task runner;
the dataset format is ``eaglekb.formats.shards``.
"""

from __future__ import annotations

import torch

from eaglekb.formats.shards import read_shard_tensor
from eaglekb.io.errors import BadInput


def loss_counts(dataset, max_len: int) -> list[int]:
    """Per sequence: positions that can carry a loss (the loss mask shifted by two, see ``TTTModel.forward``)."""
    out: list[int] = []
    for file, offs in zip(dataset.shard_files, dataset.offsets):
        m = read_shard_tensor(file, "loss_mask").long()
        for a, b in zip(offs[:-1], offs[1:]):
            out.append(int(m[a + 2:min(b, a + max_len)].sum()))
    return out


def split_indices(dataset, counts: list[int], *, seed: int, val_fraction: float, max_val_sequences: int,
                  separate_val: bool) -> tuple[list[int], list[int]]:
    """(train, validation) sequence indices; sequences without loss positions are dropped.

    ``separate_val``: validation comes from another dataset, so all usable sequences train.
    """
    usable = [i for i in range(len(dataset)) if counts[i] > 0]
    if not usable:
        raise BadInput("dataset has no loss tokens (empty or all-masked)", where=str(dataset.path),
                       expected="assistant tokens with loss_mask 1", found=f"{len(dataset)} sequences, 0 loss tokens",
                       fix="regenerate with invoke datagen")
    if separate_val or val_fraction == 0 or len(usable) < 2:
        return usable, []
    g = torch.Generator().manual_seed(seed + 7919)
    order = torch.randperm(len(usable), generator=g).tolist()
    n_val = min(max_val_sequences, max(1, round(len(usable) * val_fraction)))
    val = sorted(usable[i] for i in order[:n_val])
    held = set(val)
    return [i for i in usable if i not in held], val


class Batches:
    """Deterministic batches of sequences from a dataset (order = f(seed, epoch)).

    ``lengths`` (tokens kept per sequence, by dataset index) turns on length grouping: the
    epoch's shuffled order is cut into windows of ``GROUP`` batches, each window sorted by
    length and cut into batches, and the batches shuffled again, so a batch pads to a
    length close to its members' while every sequence is still seen once per epoch.
    """

    GROUP = 64

    def __init__(self, dataset, indices: list[int], batch_size: int, max_len: int, seed: int,
                 lengths: list[int] | None = None):
        self.ds, self.indices, self.bs, self.max_len, self.seed = dataset, indices, batch_size, max_len, seed
        self.per_epoch = max(1, len(indices) // batch_size)
        self.lengths = lengths
        self._epoch: tuple[int, list[list[int]]] | None = None

    def items(self, step: int) -> list[int]:
        epoch, j = divmod(step, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._plan(epoch))
        return self._epoch[1][j]

    def _plan(self, epoch: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.indices), generator=g).tolist()
        seqs = [self.indices[i] for i in order]
        if self.lengths is not None:
            span = self.bs * self.GROUP
            seqs = [i for w in range(0, len(seqs), span)
                    for i in sorted(seqs[w:w + span], key=lambda i: (self.lengths[i], i))]
        plan = [seqs[j * self.bs:(j + 1) * self.bs] for j in range(self.per_epoch)]  # per_epoch = len // bs: none empty
        if self.lengths is not None:
            perm = torch.randperm(len(plan), generator=g).tolist()
            plan = [plan[i] for i in perm]
        return plan


def sequence_lengths(dataset, max_len: int) -> list[int]:
    """Per sequence: tokens kept (its length, capped at ``max_len``)."""
    return [min(b - a, max_len) for offs in dataset.offsets for a, b in zip(offs[:-1], offs[1:])]


def collate(dataset, items: list[int], max_len: int, device, features=None) -> dict:
    """One batch ``{input_ids, loss_mask, valid, aux_hidden, final_hidden?, target_argmax}``, right-padded.

    ``features``: for online data, the callable that runs the target on the batch.
    """
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
