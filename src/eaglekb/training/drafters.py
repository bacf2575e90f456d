"""The drafter a training run starts from: its draft-vocab mapping, and a fresh drafter or an init drafter moved to it.

Owns: ``choose_mapping`` (a mapping file, the checkpoint's with ``--new-data``, or the data's top loss-masked
tokens; its report), ``data_mapping``,
``drafter_for`` (a fresh drafter sized for the data's target, or ``--init`` checked against the data's target and
its lm_head rows remapped by target token id when the mappings differ; ``--no-remap`` reproduces the misaligned
head; a wider ``--intermediate-size`` widens its MLP, keeping what it computes: ``widen_mlp``) and the init
drafter's checks (hidden size, vocab, aux layers: one line naming both sides).

Knows nothing about the training loop, checkpoints, processes or the task runner.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from eaglekb.data.vocab import counts_from_dataset
from eaglekb.formats.drafter import read_config
from eaglekb.formats.mapping import Mapping, build_mapping, check_mapping, load_mapping
from eaglekb.io.errors import Incompatible
from eaglekb.models.drafter import Eagle3Drafter, build_drafter_for_target, load_drafter
from eaglekb.training import remap
from eaglekb.training.checkpoints import checkpoint_d2t
from eaglekb.training.config import TrainConfig


def choose_mapping(cfg: TrainConfig, ds):
    """The run's mapping (a file; with ``--new-data`` the checkpoint's; or built from the data) and the start of
    its report."""
    d2t = checkpoint_d2t(Path(cfg.out), cfg.resume_from) if cfg.new_data and not cfg.mapping else None
    if cfg.mapping:
        mapping = load_mapping(cfg.mapping)
        if mapping.vocab_size != ds.target["vocab_size"]:
            raise Incompatible("mapping is for another target vocab", where=cfg.mapping,
                               expected=str(ds.target["vocab_size"]), found=str(mapping.vocab_size))
        source = f"file {cfg.mapping}"
    elif d2t is not None:  # --new-data: the run goes on with the mapping it was trained with
        mapping = Mapping(d2t=d2t, vocab_size=int(ds.target["vocab_size"]))
        check_mapping(mapping.d2t, mapping.vocab_size, mapping.draft_vocab_size)
        source = f"the checkpoint's (--new-data; top {mapping.draft_vocab_size} of the first data)"
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


def drafter_for(cfg: TrainConfig, ds, mapping, mapping_report: dict, notes: list[str]):
    """A fresh drafter for the data's target, or the init drafter moved to ``mapping``."""
    config_ids = [c - 1 for c in ds.capture_points]
    if not cfg.init:
        return build_drafter_for_target(
            ds.target, mapping.draft_vocab_size, intermediate_size=cfg.intermediate_size, mapping=mapping.selected,
            aux_layer_ids=config_ids, torch_dtype="bfloat16", seed=cfg.seed)
    drafter = load_drafter(cfg.init, dtype="float32")
    _check_init(cfg.init, drafter.config, ds, config_ids)
    width = drafter.config.intermediate_size
    if cfg.intermediate_size and cfg.intermediate_size != width:  # narrower: refused by widen_mlp
        drafter = widen_mlp(drafter, cfg.intermediate_size, seed=cfg.seed)
        mapping_report["widen"] = {"from": width, "to": cfg.intermediate_size}
        notes.append(f"init drafter's MLP widened from {width} to {cfg.intermediate_size} channels: the new "
                     "channels start with zero output weights, so the widened drafter drafts as the init one did")
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


def widen_mlp(drafter: Eagle3Drafter, width: int, *, seed: int = 0) -> Eagle3Drafter:
    """``drafter`` with an MLP of ``width`` channels that computes what it did: its channels kept, the new ones'
    gate and up rows drawn as a fresh drafter's are (``init_weights``) and their down_proj columns zero, so the
    new channels add nothing until training moves them (their gradient flows through down_proj first)."""
    old = drafter.config.intermediate_size
    if width < old:
        raise Incompatible("cannot narrow a drafter's MLP", where="--intermediate-size",
                           expected=f"{old} or more (the init drafter's MLP width)", found=str(width))
    wide = Eagle3Drafter(dataclasses.replace(drafter.config, intermediate_size=width),
                         with_embeddings=drafter.embed_tokens is not None)
    wide.init_weights(seed)
    state = wide.state_dict()
    for name, value in drafter.state_dict().items():
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            state[name][:old] = value
        elif name.endswith("mlp.down_proj.weight"):
            state[name].zero_()
            state[name][:, :old] = value
        else:
            state[name] = value
    wide.load_state_dict(state)
    return wide.to(next(drafter.parameters()).dtype)


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
