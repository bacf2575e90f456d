"""Features: what the target computes for each token of a training sequence.

Owns: one teacher-forced target pass per batch (``featurise``) storing, per token, the
token id, the loss mask, the target's auxiliary hidden states at the capture points,
its final (post-norm) hidden state and the argmax of its logits; packing a shard's
batches with their sequence offsets (``pack``); the target's input embeddings and
lm_head, saved once per dataset (``save_target_head``: the final hidden state times
lm_head gives the target's exact distribution over any draft vocabulary at training
time); and the same features per training batch with the target in memory when only
token ids were stored (``OnlineFeatures``: one causal pass per right-padded batch without
its attention mask, the argmax without full logits, no host sync of its own).

Knows nothing about prompts, generation, manifests or the task runner; the file
layout is ``eaglekb.formats.shards``.
"""

from __future__ import annotations

from pathlib import Path

from eaglekb.formats.shards import HEAD_FILE
from eaglekb.io.files import atomic_save_safetensors


def featurise(target, seqs: list[list[int]], masks: list[list[int]], *, dtype: str = "bfloat16",
              store_final_hidden: bool = True, with_hidden: bool = True) -> dict:
    """One teacher-forced target pass over right-padded sequences; returns packed per-token tensors."""
    import torch

    n = len(seqs)
    width = max(len(s) for s in seqs)
    ids = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    keep = attn.bool()
    out = {
        "input_ids": ids[keep].to(torch.int32),
        "loss_mask": torch.cat([torch.tensor(m, dtype=torch.uint8) for m in masks]),
    }
    if with_hidden:
        st = getattr(torch, dtype)
        res = target.forward(ids.to(target.device), attention_mask=attn.to(target.device))
        k = keep.to(res.aux_hidden.device)
        out["aux_hidden"] = res.aux_hidden[k].to(st).cpu()
        out["target_argmax"] = res.logits.argmax(-1)[k].to(torch.int32).cpu()
        if store_final_hidden:
            out["final_hidden"] = res.final_hidden[k].to(st).cpu()
    return out


def pack(parts: list[dict], lengths: list[int]) -> dict:
    """Concatenate featurised batches into one shard's tensors, with ``offsets`` of the sequences."""
    import torch

    tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    tensors["offsets"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    return tensors


def save_target_head(target, out: Path, dtype: str) -> dict:
    """Write the target's input embeddings and lm_head once per dataset (frozen in training)."""
    import torch

    embed = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    tensors = {"embed_tokens.weight": embed.detach().to(getattr(torch, dtype)).cpu()}
    if not tied:
        tensors["lm_head.weight"] = head.detach().to(getattr(torch, dtype)).cpu()
    path = atomic_save_safetensors(Path(out) / HEAD_FILE, tensors, metadata={"tied": str(tied).lower()})
    return {"file": HEAD_FILE, "tied": tied, "bytes": path.stat().st_size}


class OnlineFeatures:
    """Computes what a stored dataset would hold, per batch, with the target in memory.

    One ``Target.features`` pass per batch: no attention mask, which is exact for right-padded batches (a real
    token never attends to a later pad; positions come from the index, not the mask). The values at pad positions
    are not those of a masked pass; training never reads them (the loss mask and the ``valid`` rows leave them
    out). Token ids are not range-checked per batch (a sync): they come from the target's own tokenizer and
    generation, and an id out of range still fails in the embedding lookup.
    """

    def __init__(self, target, store_final_hidden: bool = True):
        self.target = target
        self.store_final_hidden = store_final_hidden

    def __call__(self, input_ids, valid) -> dict:
        """``valid [B,T]`` must be right-padded (``collate``'s batches): asserted on the device, without a sync."""
        import torch

        dev = self.target.device
        valid = valid.to(dev).bool()
        if valid.shape[1] > 1:  # a failure on CUDA is a device-side assert: a caller's bug, not bad data
            torch._assert_async((valid[:, :-1] >= valid[:, 1:]).all(), "online features need right-padded batches")
        res = self.target.features(input_ids.to(dev))
        out = {"aux_hidden": res.aux_hidden, "target_argmax": res.argmax}
        if self.store_final_hidden:
            out["final_hidden"] = res.final_hidden
        return {k: v.to(input_ids.device) for k, v in out.items()}
