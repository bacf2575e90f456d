"""The test-time-training (TTT) unroll of the drafter: per-step logits, the weighted loss, counts.

Owns: ``TTTModel`` (the drafter unrolled over ``steps`` TTT steps, with the TTT-specific
attention over earlier steps' diagonal keys), ``shift`` and ``step_norms``.

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

Every per-step piece but that attention is the drafter's own (``Eagle3Drafter``
``project_hidden`` / ``rope`` / ``logits``, ``MidLayer.fuse`` / ``feed_forward``,
``Attention.project`` / ``output``), so training and inference run one forward.

Speed levers (each switchable, ``eaglekb.training.config``): ``hiddens`` (the unroll up to
each step's hidden state, no logits) is the function ``torch.compile`` compiles
(``compile_unroll``: the whole unroll as one graph, or one TTT step, ``--compile step``, whose graphs serve every
depth; a compile error falls back to eager with a note), and the loss over the
draft vocabulary is ``eaglekb.training.loss.step_loss``, chunked by default (no full logits), each chunk's
passes over its logits compiled too (``compile_loss``, the same fallback).

Knows nothing about datasets, optimisers, checkpoints, processes or the task runner.
"""

from __future__ import annotations

import math

import torch
import torch._dynamo
from torch import nn
from torch.nn import functional as F

from eaglekb.io.errors import compiler_failure
from eaglekb.models.layers import attend
from eaglekb.training.loss import chunk_terms, step_loss

#: The torch.compile backend of the unroll and the loss's chunk (tests use "aot_eager": the traced graphs without code generation).
COMPILE_BACKEND = "inductor"


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x[:, n:]`` right-padded with zeros to the same length (dim 1)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat((x[:, n:], pad), dim=1) if n < x.shape[1] else torch.zeros_like(x)


def step_norms(mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Loss positions per TTT step for a batch's loss mask ``[B,T]``."""
    return torch.stack([shift(mask.float(), k + 2).sum() for k in range(steps)])


def _dynamic_length(*pairs) -> None:
    """Mark each ``(tensor, dim)``'s sequence length dynamic for ``torch.compile`` (one graph for every length)."""
    for x, dim in pairs:
        if x.shape[dim] > 1:
            torch._dynamo.mark_dynamic(x, dim)


def _repeat_kv(z: torch.Tensor, rep: int) -> torch.Tensor:
    return z.repeat_interleave(rep, dim=1) if rep > 1 else z


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Step ``len(keys)-1``'s attention: causal over step 0's keys, plus each later step's diagonal key.

    ``q [B,Hq,T,D]``; ``keys`` / ``values`` ``[B,Hkv,T,D]`` of steps ``0..k``. Scores in
    float32, one softmax over ``T + k`` keys per query.
    """
    if len(keys) == 1:
        return attend(q, keys[0], values[0], causal=True)
    t, rep = q.shape[2], q.shape[1] // keys[0].shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    causal = torch.full((t, t), float("-inf"), device=q.device).triu(1)
    s0 = (q @ _repeat_kv(keys[0], rep).transpose(-1, -2)).float() * scale + causal
    diag = [((q * _repeat_kv(kj, rep)).sum(-1, keepdim=True)).float() * scale for kj in keys[1:]]
    p = torch.cat([s0, *diag], dim=-1).softmax(-1).to(q.dtype)
    out = p[..., :t] @ _repeat_kv(values[0], rep)
    for j, vj in enumerate(values[1:]):
        out = out + p[..., t + j:t + j + 1] * _repeat_kv(vj, rep)
    return out


def diag_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                   live: torch.Tensor) -> torch.Tensor:
    """``ttt_attention`` with the later steps' diagonal keys and values stacked in ``J`` slots ``[J,B,Hkv,T,D]``;
    slot ``j`` takes part where ``live[j]`` (a dead slot scores -inf: softmax weight and gradient exactly 0). One
    shape for every step of an unroll, so one compiled graph serves them all (``TTTModel.compile_unroll("step")``)."""
    t, rep = q.shape[2], q.shape[1] // k0.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    causal = torch.full((t, t), float("-inf"), device=q.device).triu(1)
    s0 = (q @ _repeat_kv(k0, rep).transpose(-1, -2)).float() * scale + causal
    dk, dv = (dk.repeat_interleave(rep, dim=2), dv.repeat_interleave(rep, dim=2)) if rep > 1 else (dk, dv)
    diag = ((q[None] * dk).sum(-1).float() * scale).masked_fill(~live[:, None, None, None], float("-inf"))
    p = torch.cat([s0, diag.permute(1, 2, 3, 0)], dim=-1).softmax(-1).to(q.dtype)
    return p[..., :t] @ _repeat_kv(v0, rep) + torch.einsum("bhtj,jbhtd->bhtd", p[..., t:], dv)


class TTTModel(nn.Module):
    """The drafter unrolled over ``steps`` TTT steps; returns the weighted loss and per-step counts.

    Holds the frozen target embeddings and the target lm_head rows of the draft vocab
    as buffers (not parameters: DDP leaves them alone).
    """

    def __init__(self, drafter, embed: torch.Tensor, target_head: torch.Tensor | None, *, steps: int = 7,
                 step_weight: float = 0.8, positions: str = "runtime", loss_chunk: int = 0):
        super().__init__()
        self.drafter = drafter
        self.steps = steps
        self.step_weight = step_weight
        self.positions = positions
        self.loss_chunk = loss_chunk  # positions per chunk of the draft-vocab loss; 0: full logits
        self.timer = None  # an ``eaglekb.engine.timing.PhaseTimer`` while profiling (marks unroll / loss)
        self._compiled = None
        self._step_fns = None  # compile_unroll("step"): the compiled (_first_step, _later_step)
        self.compile_scope: str | None = None  # "unroll" or "step" while compiled, else None
        self._loss_terms = None  # the loss's chunk_terms through torch.compile (compile_loss), or None: eager
        self.compile_error: str | None = None
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

    def step_logits(self, input_ids, aux_hidden):
        """All TTT steps' draft logits ``[K][B,T,Vd]`` (teacher-forced inputs; for checks)."""
        return [self.drafter.logits(h) for h in self._unroll(input_ids, aux_hidden)]

    def compile_unroll(self, scope: str = "unroll") -> None:
        """Run the unroll through ``torch.compile`` (``COMPILE_BACKEND``) from the next forward on.

        ``scope`` "unroll": the whole unroll is one graph, so its compile grows with the TTT depth (forward and
        backward of every step). "step": one TTT step is compiled, as two graphs (step 0, and every later step with
        the diagonal keys in fixed slots, ``diag_attention``) that serve every depth, so the compile is bounded.
        The sequence length is marked dynamic at every call, so the graphs compiled on the first batch serve
        every later length. Left to dynamo's automatic dynamic shapes, the second distinct length (every batch
        of ``--batching length``) compiled the whole unroll again: 66 s on the CPU for a tiny drafter.
        """
        if scope == "step":
            self._step_fns = (torch.compile(self._first_step, backend=COMPILE_BACKEND),
                              torch.compile(self._later_step, backend=COMPILE_BACKEND))
            self._compiled = self._stepped_unroll
        else:
            self._compiled = torch.compile(self._unroll, backend=COMPILE_BACKEND)
        self.compile_scope = scope
        self.compile_error = None

    def compile_loss(self) -> None:
        """Run each chunk of the chunked loss (``loss.chunk_terms``) through ``torch.compile`` (``COMPILE_BACKEND``)
        from the next forward on: its passes over the chunk's logits fused. No effect with full logits
        (``loss_chunk`` 0). The chunk length is marked dynamic, so one graph serves every chunk."""
        self._loss_terms = torch.compile(chunk_terms, backend=COMPILE_BACKEND) if self.loss_chunk > 0 else None
        self.compile_error = None

    def eager(self, reason: str) -> None:
        """Fall back to the eager unroll and loss for good (a compile failure); ``reason`` is kept for the report."""
        self._compiled = None
        self._step_fns = None
        self.compile_scope = None
        self._loss_terms = None
        self.compile_error = reason

    @property
    def compiled_loss(self) -> bool:
        return self._loss_terms is not None

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def hiddens(self, input_ids, aux_hidden) -> list[torch.Tensor]:
        """Each TTT step's pre-norm output hidden ``[K][B,T,H]``: compiled when on and training, eager after a
        compile error and without gradients (validation: a graph without autograd would be a second compile, 44 s
        at the first validation of an H200 run, for a few eager batches)."""
        if self._compiled is not None and torch.is_grad_enabled():
            _dynamic_length((input_ids, 1), (aux_hidden, 1))  # one graph for every batch length
            try:
                return self._compiled(input_ids, aux_hidden)
            except Exception as exc:  # a compiler failure of any kind: the eager unroll computes the same
                self.eager(compiler_failure(exc))
        return self._unroll(input_ids, aux_hidden)

    def _unroll(self, input_ids, aux_hidden) -> list[torch.Tensor]:
        """The output hidden of each TTT step (see the module docstring)."""
        d = self.drafter
        mid, attn = d.midlayer, d.midlayer.self_attn
        hidden = d.project_hidden(aux_hidden.to(d.fc.weight.dtype))
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out: list[torch.Tensor] = []
        base = torch.arange(input_ids.shape[1], device=input_ids.device)
        for k in range(self.steps):
            emb, cos, sin = self._step_inputs(input_ids, base, k, hidden.dtype)
            q, key, value = attn.project(mid.fuse(emb, hidden), cos, sin)
            keys.append(key)
            values.append(value)
            hidden = mid.feed_forward(hidden + attn.output(ttt_attention(q, keys, values)))
            out.append(hidden)
        return out

    def _step_inputs(self, input_ids, base, k: int, dtype):
        """TTT step ``k``'s inputs: the embedding of token ``t+k+1`` at anchor ``t``, and the rotary cos/sin."""
        emb = F.embedding(shift(input_ids, k + 1), self.embed).to(dtype)
        return (emb, *self.drafter.rope((base + (k if self.positions == "runtime" else 0))[None]))

    def _stepped_unroll(self, input_ids, aux_hidden) -> list[torch.Tensor]:
        """``_unroll`` one step at a time through ``_first_step`` and ``_later_step`` (compiled: ``compile_unroll``),
        the diagonal keys of steps ``1..k`` in ``steps - 1`` fixed slots."""
        d = self.drafter
        first, later = self._step_fns or (self._first_step, self._later_step)
        hidden = d.project_hidden(aux_hidden.to(d.fc.weight.dtype))
        dev = input_ids.device
        base = torch.arange(input_ids.shape[1], device=dev)
        slots = max(self.steps - 1, 1)
        order = torch.arange(slots, device=dev)
        out: list[torch.Tensor] = []
        for k in range(self.steps):
            emb, cos, sin = self._step_inputs(input_ids, base, k, hidden.dtype)
            _dynamic_length((emb, 1), (hidden, 1), (cos, 2), (sin, 2))
            if k == 0:
                hidden, k0, v0 = first(emb, hidden, cos, sin)
                dk = k0.new_zeros((slots, *k0.shape))
                dv = torch.zeros_like(dk)
                if torch.is_grad_enabled():  # as the later steps' slots: one guard, one graph
                    dk.requires_grad_()
                    dv.requires_grad_()
            else:
                _dynamic_length((k0, 2), (v0, 2), (dk, 3), (dv, 3))
                hidden, dk, dv = later(emb, hidden, cos, sin, k0, v0, dk, dv, order < k, order == k - 1)
            out.append(hidden)
        return out

    def _first_step(self, emb, hidden, cos, sin):
        """TTT step 0: its output hidden, and its keys and values (every later step attends to them causally)."""
        mid, attn = self.drafter.midlayer, self.drafter.midlayer.self_attn
        q, key, value = attn.project(mid.fuse(emb, hidden), cos, sin)
        return mid.feed_forward(hidden + attn.output(ttt_attention(q, [key], [value]))), key, value

    def _later_step(self, emb, hidden, cos, sin, k0, v0, dk, dv, live, slot):
        """TTT step ``k > 0``: its key and value written to ``slot`` (slot ``k - 1``), attention over step 0's keys
        and the ``live`` slots; its output hidden and the slots."""
        mid, attn = self.drafter.midlayer, self.drafter.midlayer.self_attn
        q, key, value = attn.project(mid.fuse(emb, hidden), cos, sin)
        here = slot[:, None, None, None, None]
        dk, dv = torch.where(here, key[None], dk), torch.where(here, value[None], dv)
        hidden = mid.feed_forward(hidden + attn.output(diag_attention(q, k0, v0, dk, dv, live)))
        return hidden, dk.contiguous(), dv.contiguous()  # the layout of the slots passed in: no recompile

    def _mark(self, phase: str) -> None:
        if self.timer is not None:
            self.timer.mark(phase)

    def forward(self, batch: dict, norms: torch.Tensor, world: int = 1, rows: bool = False):
        """Weighted TTT loss (scaled for DDP gradient averaging) and per-step counts ``[K, 5]``.

        ``norms[k]``: the number of loss positions of step ``k`` over the whole global batch.
        Counts per step: loss sum, positions, correct, chain-correct, chain-correct before this step.
        ``rows``: also return the counts but the loss per batch row ``[B, K, 4]``, whose sum over rows is
        ``counts[:, 1:]`` (validation per source).
        """
        ids, mask = batch["input_ids"], batch["loss_mask"].float()
        argmax = batch["target_argmax"].long()
        self._mark("unroll")
        hiddens = self.hiddens(ids, batch["aux_hidden"])
        self._mark("loss")
        chunked = self.loss_chunk > 0
        soft = None if chunked else self._soft_targets(batch)
        final = batch.get("final_hidden") if chunked and self.draft_head is not None else None
        total = torch.zeros((), device=ids.device)
        stats, per_row = [], []
        chain = torch.ones_like(mask, dtype=torch.bool)
        for k, hidden in enumerate(hiddens):
            w = shift(mask, k + 2)
            tgt = shift(argmax, k + 1)
            tpos = self.draft_pos[tgt]
            pm = w * (tpos >= 0).float()
            loss_sum, pred = self._step_loss(hidden, tpos, pm, soft=shift(soft, k + 1) if soft is not None else None,
                                             soft_hidden=shift(final, k + 1) if final is not None else None,
                                             rows=batch.get("valid"))
            total = total + (self.step_weight ** k) * loss_sum / norms[k].clamp_min(1.0) * world
            with torch.no_grad():
                correct = (self.selected[pred] == tgt) & (tpos >= 0)
                prev = chain
                chain = chain & correct
                wb = w > 0
                counts = torch.stack([w.sum(1), (correct & wb).sum(1).float(), (chain & wb).sum(1).float(),
                                      (prev & wb).sum(1).float()], dim=-1)
                per_row.append(counts)
                stats.append(torch.cat([loss_sum.detach().float()[None], counts.sum(0)]))
        if rows:
            return total, torch.stack(stats), torch.stack(per_row, dim=1)
        return total, torch.stack(stats)

    def _step_loss(self, hidden, tpos, pm, **kw):
        """``step_loss`` with the compiled chunk when on, and the eager one for good after a compiler failure."""
        kw.update(soft_head=self.draft_head, chunk=self.loss_chunk)
        if self._loss_terms is not None and torch.is_grad_enabled():
            try:
                return step_loss(self.drafter, hidden, tpos, pm, terms=self._loss_terms, **kw)
            except Exception as exc:  # a compiler failure of any kind: the eager chunk computes the same
                self.eager(compiler_failure(exc))
        return step_loss(self.drafter, hidden, tpos, pm, **kw)

    def _soft_targets(self, batch: dict) -> torch.Tensor | None:
        """The target's softmax over the draft vocab ``[B,T,Vd]``, when the batch has final hidden states."""
        if batch.get("final_hidden") is None or self.draft_head is None:
            return None
        with torch.no_grad():
            return (batch["final_hidden"].float() @ self.draft_head.t()).softmax(-1)
