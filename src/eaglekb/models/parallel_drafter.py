"""P-EAGLE: the EAGLE-3 drafter that proposes k tokens in ONE forward pass (parallel drafting).

Owns: reading the method field of a drafter's ``config.json`` (``eaglekb.formats.drafter.METHOD_FIELD``:
``"eagle3"``, absent, or ``"p-eagle"`` with ``TOKENS_FIELD``: the k tokens one pass proposes) with ``method_of`` /
``parallel_tokens_of`` (read and check them), ``add_mask_inputs`` (the two learned vectors ``Eagle3Drafter``
holds when its config says p-eagle: ``mask_embed`` ``[H]`` and ``mask_hidden`` ``[3*target_H]``, the inputs of
the positions not yet known; its ``parallel_tokens`` is then k, else 0), ``mask_inputs`` / ``draft_pass`` (the
module's one pass) and ``to_parallel`` (an EAGLE-3 drafter, or a P-EAGLE one, as a P-EAGLE drafter of k tokens:
the same weights, fresh mask vectors).

The contract (the one ``eaglekb.training.parallel`` trains and ``eaglekb.engine.parallel`` drafts with; read from
SpecForge's ``PEagleDraftModel`` / ``OnlinePEagleModel``, written here for the one-layer EAGLE-3 drafter):

* depth 0 at anchor ``t`` is an EAGLE-3 step: ``fc(aux[t])`` with the embedding of token ``t+1``, predicting
  token ``t+2``; its K/V stay in the drafter's cache like any verified position;
* depth ``d`` in ``1..k-1`` at anchor ``t`` is a mask position: ``fc(mask_hidden)`` with ``mask_embed``, rotary
  position ``t+d``, predicting token ``t+d+2``; it attends to the depth-0 keys at positions ``<= t`` and to its own
  rollout's mask keys of depths ``1..d``. Nothing in it depends on the tokens it precedes, so at inference the k
  rows are one causal pass over ``[anchor, mask x (k-1)]``.

SpecForge's P-EAGLE uses 4 decoder layers, a trainable token embedding with a mask token id, and samples the
training depths (COD); here the drafter keeps the one EAGLE-3 layer, the target's frozen embeddings plus a learned
mask embedding, and trains every anchor at every depth, so the two methods differ only in how they draft.

Below ``eaglekb.models.drafter`` (which calls it); knows nothing about training, engines or the task runner.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from eaglekb.formats.drafter import EAGLE3, MASK_KEYS, METHOD_FIELD, P_EAGLE, TOKENS_FIELD, DrafterConfig
from eaglekb.io.errors import BadInput, Incompatible, SchemaError

METHODS = (EAGLE3, P_EAGLE)
#: The most tokens one P-EAGLE pass may propose (a config from elsewhere must not size a huge draft).
MAX_TOKENS = 64


def method_of(cfg: DrafterConfig, where: str = "config.json") -> str:
    """The config's drafting method (absent: eagle3); an unknown one is refused."""
    method = cfg.extra.get(METHOD_FIELD, EAGLE3)
    if method not in METHODS:
        raise SchemaError("unknown drafting method", where=f"{where}:{METHOD_FIELD}", expected=" or ".join(METHODS),
                          found=repr(method))
    return method


def check_tokens(k, where: str) -> int:
    """``k`` as the tokens of one parallel pass: a whole number in ``2..MAX_TOKENS``."""
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= MAX_TOKENS:
        raise BadInput("parallel draft tokens out of range", where=where, expected=f"a whole number 2..{MAX_TOKENS}",
                       found=repr(k))
    return k


def parallel_tokens_of(cfg: DrafterConfig, where: str = "config.json") -> int:
    """Tokens one pass proposes: k for a P-EAGLE config, 0 for EAGLE-3."""
    if method_of(cfg, where) == EAGLE3:
        return 0
    return check_tokens(cfg.extra.get(TOKENS_FIELD), f"{where}:{TOKENS_FIELD}")


def parallel_config(cfg: DrafterConfig, k: int) -> DrafterConfig:
    """A copy of ``cfg`` that describes a P-EAGLE drafter of ``k`` tokens."""
    extra = {**cfg.extra, METHOD_FIELD: P_EAGLE, TOKENS_FIELD: check_tokens(k, "parallel draft tokens")}
    return dataclasses.replace(cfg, extra=extra)


def add_mask_inputs(drafter: nn.Module, cfg: DrafterConfig) -> None:
    """Register a P-EAGLE drafter's learned mask inputs on ``drafter`` (``Eagle3Drafter.__init__`` calls it when
    its config says p-eagle): ``mask_embed [H]`` and ``mask_hidden [3*target_H]``, zero until initialised."""
    drafter.mask_embed = nn.Parameter(torch.zeros(cfg.hidden_size))
    drafter.mask_hidden = nn.Parameter(torch.zeros(cfg.fc_in))


def mask_inputs(drafter, batch: int, rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask positions' token embeddings ``[B,R,H]`` and aux-width hidden ``[B,R,3*target_H]``."""
    return (drafter.mask_embed.to(dtype).expand(batch, rows, -1),
            drafter.mask_hidden.to(dtype).expand(batch, rows, -1))


def draft_pass(drafter, aux: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
    """One pass of a P-EAGLE drafter over verified positions (``aux [B,T,3*target_H]`` with the embeddings of the
    tokens after them) and ``k-1`` mask rows: the draft-vocab logits of the last anchor's k tokens ``[B,k,Vd]``."""
    b, t, _ = aux.shape
    emb, hid = mask_inputs(drafter, b, drafter.parallel_tokens - 1, aux.dtype)
    out = drafter(torch.cat((aux, hid), dim=1), inputs_embeds=torch.cat((inputs_embeds.to(aux.dtype), emb), dim=1))
    return out.logits[:, t - 1:]


def to_parallel(drafter, k: int, *, seed: int = 0, std: float = 0.02):
    """``drafter`` (an ``eaglekb.models.drafter.Eagle3Drafter``) as a P-EAGLE drafter of ``k`` tokens: a P-EAGLE
    drafter of ``k`` as is; an EAGLE-3 drafter's weights and mapping with fresh mask inputs (random, ``std``,
    seeded) in a new module of its class; another k is refused."""
    k = check_tokens(k, "--parallel-tokens")
    if drafter.parallel_tokens:
        if drafter.parallel_tokens != k:
            raise Incompatible("init drafter proposes another number of tokens per pass", where="--parallel-tokens",
                               expected=str(drafter.parallel_tokens), found=str(k))
        return drafter
    out = type(drafter)(parallel_config(drafter.config, k), with_embeddings=drafter.embed_tokens is not None)
    ref = next(drafter.parameters())
    out = out.to(device=ref.device, dtype=ref.dtype)
    missing, unexpected = out.load_state_dict(drafter.state_dict(), strict=False)
    if unexpected or set(missing) != set(MASK_KEYS):
        raise Incompatible("drafter weights do not fit P-EAGLE", where="drafter",
                           expected="an EAGLE-3 drafter's weights", found=str((unexpected or missing)[:1]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (out.mask_embed, out.mask_hidden):
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    out.inv_freq = drafter.inv_freq
    if out.embed_tokens is not None:
        out.embed_tokens.weight.requires_grad_(False)
    return out
