"""eaglekb.training.loop: overfit, online features, resume, bad input, init remap (CPU, tiny models)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglekb.data import datagen
from eaglekb.data.generation import load_target
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError
from eaglekb.models import sources
from eaglekb.models.drafter import build_drafter_for_target, load_drafter, save_drafter
from eaglekb.training.loop import train
from eaglekb.training.report import baseline_fields
from helpers.datagen import prompts, small_cfg
from helpers.models import tiny_llama_config
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_loss_decreases_on_a_tiny_overfit_set(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "run", data=str(data / "hard"), steps=25, lr=1e-2,
                                 val_fraction=0.0), progress=False)
    losses = rep["history"]["train_loss"]
    assert losses["25"] < 0.6 * losses["1"]
    assert (tmp_path / "run" / "drafter" / "model.safetensors").is_file()
    fields = baseline_fields(rep)
    assert fields["series"]["train_loss"]["unit"] == "_loss" and fields["metrics"]["throughput"]["train_tok_s"] > 0
    # the command's wall clock by part, beside the optimiser steps' own time
    wall = fields["metrics"]["wall"]
    assert {"total_s", "prepare_s", "validation_s", "checkpoints_s"} <= set(wall), wall
    parts = sum(v for k, v in wall.items() if k != "total_s")
    assert parts + rep["throughput"]["seconds"] <= wall["total_s"] + 0.01


def test_online_features_run_the_target_per_batch(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "o", data=str(data / "online"), steps=2, val_fraction=0.0,
                                 online_target=str(data / "target")), progress=False)
    assert rep["step"] == 2 and rep["history"]["train_loss"]["2"] > 0


@pytest.mark.parametrize("batching", ["random", "length"])
def test_resume_after_interruption_continues_identically(data, tmp_path, batching):
    whole = train(cfg_for(data, tmp_path / "whole", batching=batching), progress=False)
    cut = train(cfg_for(data, tmp_path / "cut", stop_after=3, batching=batching), progress=False)
    assert cut["stopped_early"] and cut["step"] == 3
    resumed = train(cfg_for(data, tmp_path / "cut", resume=True, batching=batching), progress=False)
    assert resumed["step"] == 6
    for step in map(str, range(1, 7)):
        assert resumed["history"]["train_loss"][step] == pytest.approx(whole["history"]["train_loss"][step], abs=1e-6)
    assert resumed["val"]["loss"] == pytest.approx(whole["val"]["loss"], abs=1e-6)


def test_a_time_budget_stops_between_steps_and_resume_goes_on(data, tmp_path):
    whole = train(cfg_for(data, tmp_path / "whole"), progress=False)
    cut = train(cfg_for(data, tmp_path / "cut", time_budget_s=1e-9), progress=False)  # spent after one step
    assert cut["stopped_early"] and cut["step"] == 1
    assert not (tmp_path / "cut" / "drafter").exists() and list((tmp_path / "cut" / "checkpoints").iterdir())
    resumed = train(cfg_for(data, tmp_path / "cut", resume=True), progress=False)
    assert resumed["step"] == 6 and not resumed["stopped_early"]
    assert resumed["val"]["loss"] == pytest.approx(whole["val"]["loss"], abs=1e-6)
    with pytest.raises(BadInput, match="time budget"):
        train(cfg_for(data, tmp_path / "bad", time_budget_s=0.0), progress=False)


def test_bad_inputs_are_one_line_and_write_nothing(data, tmp_path):
    train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    # resume with another config
    with pytest.raises(Incompatible, match="another training config") as err:
        train(cfg_for(data, tmp_path / "run", steps=2, lr=1e-3, resume=True), progress=False)
    assert "lr" in str(err.value) and "\n" not in str(err.value)
    # a rerun into a used folder without --resume
    with pytest.raises(BadInput, match="already holds a training run"):
        train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == ckpts
    # an init drafter for a target of another hidden size
    wide = build_drafter_for_target(tiny_llama_config(hidden_size=48), 40, aux_layer_ids=[1, 3, 4])
    save_drafter(wide, tmp_path / "wide")
    with pytest.raises(Incompatible, match="hidden size"):
        train(cfg_for(data, tmp_path / "x1", init=str(tmp_path / "wide")), progress=False)
    assert not (tmp_path / "x1").exists()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_all_masked_and_corrupt_data_are_refused(data, tmp_path):
    masked = _copy(data / "soft", tmp_path / "masked")
    for shard in masked.glob("shard-*.safetensors"):
        with safe_open(str(shard), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
            meta = fh.metadata()
        tensors["loss_mask"] = torch.zeros_like(tensors["loss_mask"])
        save_file(tensors, str(shard), metadata=meta)
    with pytest.raises(BadInput, match="no loss tokens"):
        train(cfg_for(data, tmp_path / "o1", data=str(masked)), progress=False)
    corrupt = _copy(data / "soft", tmp_path / "corrupt")
    shard = corrupt / "shard-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[:8] = b"\x00\xff" * 4
    shard.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="shard-00001"):
        train(cfg_for(data, tmp_path / "o2", data=str(corrupt)), progress=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_init_with_another_mapping_is_remapped_or_reproduces_the_failure(data, tmp_path):
    first = train(cfg_for(data, tmp_path / "a", steps=3), progress=False)
    assert first["mapping"]["source"].startswith("built from the data")
    # a drafter whose mapping differs from the data's: the ids 0..39
    src = load_drafter(tmp_path / "a" / "drafter")
    d2t_data = src.d2t.clone()
    src.set_mapping(torch.zeros(40, dtype=torch.long))
    save_drafter(src, tmp_path / "other")
    rep = train(cfg_for(data, tmp_path / "b", steps=1, init=str(tmp_path / "other")), progress=False)
    assert "remap" in rep["mapping"] and any("remapped" in n for n in rep["notes"])
    assert torch.equal(load_drafter(tmp_path / "b" / "drafter").d2t, d2t_data)
    bad = train(cfg_for(data, tmp_path / "c", steps=1, init=str(tmp_path / "other"), remap=False),
                         progress=False)
    assert any("WITHOUT moving lm_head rows" in n for n in bad["notes"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_training_on_cuda_matches_the_cpu_shapes(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "gpu", device="cuda", steps=3), progress=False)
    assert rep["device"].startswith("cuda") and rep["step"] == 3


@pytest.mark.slow
def test_real_smollm2_datagen_and_two_training_steps(tmp_path):
    folder = sources.model_dir("smollm2-135m")
    if not (folder / "config.json").is_file():
        pytest.skip("smollm2-135m not prepared (invoke models.prepare)")
    target = load_target(folder, dtype="float32")
    man = datagen.run(target, prompts(2), tmp_path / "ds", small_cfg(max_new_tokens=16, max_len=256,
                                                                     dtype="bfloat16"), progress=False)
    assert man["totals"]["hidden_bytes_per_token"] == 4 * 576 * 2
    rep = train(cfg_for(tmp_path, tmp_path / "run", data=str(tmp_path / "ds"), draft_vocab_size=12288,
                                 intermediate_size=1536, steps=2, batch_size=2, val_fraction=0.0, ttt_steps=7),
                         progress=False)
    assert rep["drafter"]["bf16_bytes"] <= 25_000_000
