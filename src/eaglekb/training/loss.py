"""The loss of one TTT step over the draft vocabulary: full logits, or chunked with the gradient formed as it goes.

Owns ``step_loss``: for a step's pre-norm drafter hidden ``[B,T,H]`` it returns the summed cross-entropy over the
loss positions (weights ``pm``) against the target's distribution (soft: the softmax of the target's final hidden
state times its lm_head rows of the draft vocab; hard: the target's argmax) and the drafter's argmax ``[B,T]``
(draft ids) for the accuracy counts.

* ``chunk = 0``: the reference, full logits ``[B,T,Vd]`` and their float32 log-softmax (what autograd keeps for
  the backward is as large again); the soft targets are computed once per batch by the caller (``soft``).
* ``chunk > 0``: the loss positions (``pm > 0``) in chunks of ``chunk``; for each chunk the logits, the
  target's distribution (soft targets from the target's final hidden state here, never a ``[B,T,Vd]`` tensor), the
  loss and its gradient with respect to the normed hidden state and the lm_head weight (``softmax - target``, the
  closed form of the cross-entropy's gradient) are formed and only the gradients kept, so no full logits exist at
  any time and the backward is two scalings (``_ChunkedCE``, Liger-kernel style). The GEMMs run in ``dtype`` (the
  autocast dtype under ``--amp``), softmax and sums in float32. The other positions the batch holds (``rows``:
  padding left out; prompt tokens, predictions past a turn) get the argmax only, without gradient work. Equal to
  the reference up to float rounding (tests: loss and gradients within 1e-5 in float32). Each chunk's passes
  over its ``[n,Vd]`` logits are ``chunk_terms``, a pure function that ``--compile`` runs through ``torch.compile``
  (the caller holds the compiled function and passes it as ``terms``).

Knows nothing about TTT alignment (the caller shifts targets and masks), data, optimisers or the task runner.
"""

from __future__ import annotations

import torch


class _ChunkedCE(torch.autograd.Function):
    """``sum(pm * CE(x @ w.T, target))`` over ``x [N,H]``, chunk by chunk; the gradients are formed in the forward."""

    @staticmethod
    def forward(ctx, x, weight, tpos, pm, th, head, chunk: int, dtype, terms):
        gx = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        preds = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
        w = weight.detach().to(dtype)
        h = head.to(dtype) if head is not None else None
        compiled = terms is not None
        terms = terms or chunk_terms
        for a in range(0, x.shape[0], chunk):
            xc = x[a:a + chunk].detach().to(dtype)
            target = th[a:a + chunk].to(dtype) if h is not None else tpos[a:a + chunk].clamp_min(0)[:, None]
            pmc = pm[a:a + chunk].float()
            if compiled:  # one graph for every chunk length (the last chunk of a step is shorter)
                for t in (xc, target, pmc):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
            ce, preds[a:a + chunk], g = terms(xc, w, target, h, pmc)
            loss = loss + ce
            gx[a:a + chunk] = (g @ w).float()
            gw += (g.t() @ xc).float()
        ctx.save_for_backward(gx, gw)
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.mark_non_differentiable(preds)
        return loss, preds

    @staticmethod
    def backward(ctx, grad_loss, _grad_preds):
        gx, gw = ctx.saved_tensors
        return ((gx * grad_loss).to(ctx.dtypes[0]), (gw * grad_loss).to(ctx.dtypes[1]),
                None, None, None, None, None, None, None)


def chunk_terms(xc, w, target, head, pmc):
    """One chunk of the chunked loss: ``(sum(pmc * CE), the drafter's argmax, the logits' gradient in xc's dtype)``.

    ``xc [n,H]`` and ``w [Vd,H]`` in the GEMM dtype; ``target``: the target's final hidden ``[n,H]`` with ``head
    [Vd,H]`` (soft targets), or the draft ids ``[n,1]`` with ``head`` None (hard); ``pmc [n]`` float32 weights.
    Softmax and sums in float32. A pure function of its tensors: what ``--compile`` hands to ``torch.compile``, which
    fuses the passes over the ``[n,Vd]`` logits (float cast, argmax, log-softmax, exp, the target's softmax, the
    products and sums) that the eager chunk makes one by one."""
    logits = (xc @ w.t()).float()
    preds = logits.argmax(-1)
    logp = logits.log_softmax(-1)
    g = logp.exp()
    if head is not None:
        q = (target @ head.t()).float().softmax(-1)
        ce = -(q * logp).sum(-1)
        g = g - q
    else:
        ce = -logp.gather(-1, target).squeeze(-1)
        g = g.scatter_add(-1, target, torch.full(target.shape, -1.0, dtype=g.dtype, device=g.device))
    return (ce * pmc).sum(), preds, (g * pmc[:, None]).to(xc.dtype)


def compute_dtype(device: torch.device) -> torch.dtype:
    """The GEMM dtype of the chunked loss: the autocast dtype when autocast is on, else float32."""
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else torch.float32


def step_loss(drafter, hidden: torch.Tensor, tpos: torch.Tensor, pm: torch.Tensor, *, soft: torch.Tensor | None,
              soft_hidden: torch.Tensor | None, soft_head: torch.Tensor | None, rows: torch.Tensor | None,
              chunk: int, terms=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed CE over the loss positions, the drafter's argmax draft ids ``[B,T]``) of one TTT step.

    ``tpos [B,T]``: the target token's draft id (-1: outside the draft vocab); ``pm [B,T]``: loss weights;
    ``soft``: the full soft targets ``[B,T,Vd]`` (reference path), or ``soft_hidden [B,T,H]`` (the target's final
    hidden state at the predicted position) with ``soft_head [Vd,H]`` (chunked path); neither: hard targets.
    ``rows [B,T]`` (bool): the positions to compute in the chunked path (padding left out). ``terms``: a compiled
    ``chunk_terms`` (``torch.compile``), or None for the eager one."""
    if chunk <= 0:
        logits = drafter.logits(hidden)
        logp = logits.float().log_softmax(-1)
        if soft is not None:
            ce = -(soft * logp).sum(-1)
        else:
            ce = -logp.gather(-1, tpos.clamp_min(0)[..., None]).squeeze(-1)
        return (ce * pm).sum(), logits.argmax(-1)
    normed = drafter.norm(hidden)
    b, t, width = normed.shape
    flat_pm = pm.reshape(-1)
    seen = flat_pm > 0 if rows is None else rows.reshape(-1) & (flat_pm > 0)
    grad_rows = seen.nonzero().squeeze(-1)  # loss positions: loss and gradient
    rest = ((rows.reshape(-1) if rows is not None else torch.ones_like(seen)) & ~seen).nonzero().squeeze(-1)
    flat = normed.reshape(b * t, width)
    dtype = compute_dtype(hidden.device)
    th = soft_hidden.reshape(b * t, -1).index_select(0, grad_rows) if soft_hidden is not None else None
    loss, pred = _ChunkedCE.apply(flat.index_select(0, grad_rows), drafter.lm_head.weight,
                                  tpos.reshape(-1).index_select(0, grad_rows), flat_pm.index_select(0, grad_rows), th,
                                  soft_head if soft_hidden is not None else None, int(chunk), dtype, terms)
    preds = torch.zeros(b * t, dtype=torch.long, device=hidden.device).index_copy(0, grad_rows, pred)
    with torch.no_grad():  # the other positions the batch holds: the argmax only (accuracy counts)
        w = drafter.lm_head.weight.to(dtype)
        for a in range(0, rest.numel(), chunk):
            idx = rest[a:a + chunk]
            preds.index_copy_(0, idx, (flat.index_select(0, idx).to(dtype) @ w.t()).argmax(-1))
    return loss, preds.view(b, t)
