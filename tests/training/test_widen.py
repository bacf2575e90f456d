"""Widening an init drafter's MLP (``finetune --init D --intermediate-size W``): it drafts as before, then trains.

A drafter whose curve has flattened on its data (docs/findings/F25) is given more MLP channels without losing what
it learned: the new channels' output weights start at zero. Tiny random drafters here, and the real default drafter
of smollm2-135m (committed under drafters/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglekb.data import datagen
from eaglekb.data.generation import load_target
from eaglekb.io.errors import Incompatible
from eaglekb.measure import probe
from eaglekb.models import sources
from eaglekb.models.drafter import build_drafter_for_target, load_drafter, save_drafter
from eaglekb.training.drafters import widen_mlp
from eaglekb.training.loop import train
from helpers.datagen import prompts, small_cfg
from helpers.models import tiny_llama_config
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "drafters" / "smollm2-135m-default"


def _same_drafts(narrow, wide, seed: int = 0) -> None:
    """Both drafters map the same target features and token embeddings to the same logits and hidden."""
    cfg = narrow.config
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 5, cfg.fc_in, generator=gen)
    embeds = torch.randn(2, 5, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        a = narrow(hidden, inputs_embeds=embeds)
        b = wide(hidden, inputs_embeds=embeds)
        a2 = narrow(a.hidden, inputs_embeds=embeds)  # a second draft step, from the drafter's own hidden
        b2 = wide(b.hidden, inputs_embeds=embeds)
    for x, y in ((a.logits, b.logits), (a.hidden, b.hidden), (a2.logits, b2.logits)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert torch.equal(narrow.d2t, wide.d2t) and torch.equal(narrow.t2d, wide.t2d)


def test_a_widened_drafter_drafts_as_the_one_it_came_from():
    narrow = build_drafter_for_target(tiny_llama_config(), 40, intermediate_size=48, aux_layer_ids=[1, 3, 4],
                                      torch_dtype="float32", seed=3)
    wide = widen_mlp(narrow, 96, seed=1)
    assert wide.config.intermediate_size == 96 and wide.midlayer.mlp.down_proj.weight.shape == (32, 96)
    assert torch.count_nonzero(wide.midlayer.mlp.down_proj.weight[:, 48:]) == 0
    assert torch.count_nonzero(wide.midlayer.mlp.gate_proj.weight[48:]) > 0  # the new channels can learn
    _same_drafts(narrow, wide)
    with pytest.raises(Incompatible, match="cannot narrow") as err:
        widen_mlp(narrow, 32)
    assert "\n" not in err.value.line() and "--intermediate-size" in err.value.line()


def test_finetune_with_a_wider_intermediate_size_widens_the_init_drafter_and_trains_it(data, tmp_path):
    train(cfg_for(data, tmp_path / "a", steps=3), progress=False)
    rep = train(cfg_for(data, tmp_path / "b", steps=3, init=str(tmp_path / "a" / "drafter"), intermediate_size=96),
                progress=False)
    assert rep["mapping"]["widen"] == {"from": 48, "to": 96}
    assert any("widened from 48 to 96" in note for note in rep["notes"])
    out = load_drafter(tmp_path / "b" / "drafter", dtype="float32")
    assert out.config.intermediate_size == 96
    assert torch.count_nonzero(out.midlayer.mlp.down_proj.weight[:, 48:]) > 0  # trained: the new channels moved


@pytest.mark.skipif(not (DEFAULT / "model.safetensors").is_file(), reason="the default drafter is not checked out")
def test_the_real_default_drafter_widened_three_times_drafts_as_it_did():
    narrow = load_drafter(DEFAULT, dtype="float32")
    wide = widen_mlp(narrow, 3 * narrow.config.intermediate_size)
    _same_drafts(narrow, wide, seed=7)


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT / "model.safetensors").is_file(), reason="the default drafter is not checked out")
def test_the_real_default_drafter_widened_trains_on_real_smollm2_data(tmp_path):
    folder = sources.model_dir("smollm2-135m")
    if not (folder / "config.json").is_file():
        pytest.skip("smollm2-135m not prepared (invoke models.prepare)")
    target = load_target(folder, dtype="float32")
    datagen.run(target, prompts(2), tmp_path / "ds", small_cfg(max_new_tokens=16, max_len=256, dtype="bfloat16"),
                progress=False)
    rep = train(cfg_for(tmp_path, tmp_path / "run", data=str(tmp_path / "ds"), init=str(DEFAULT), mapping=str(DEFAULT),
                        draft_vocab_size=12288, intermediate_size=4608, steps=2, batch_size=2, val_fraction=0.0,
                        ttt_steps=4), progress=False)
    assert rep["mapping"]["widen"] == {"from": 1536, "to": 4608}
    assert load_drafter(tmp_path / "run" / "drafter").config.intermediate_size == 4608


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT / "model.safetensors").is_file(), reason="the default drafter is not checked out")
def test_the_real_default_drafter_widened_accepts_what_it_did_in_our_engine(tmp_path):
    """The widened drafter, saved in the SGLang layout and served by our engine beside the default on the real
    target, accepts the same tokens on held-out chat: the engine reads the wider MLP from config.json."""
    if not (sources.model_dir("smollm2-135m") / "config.json").is_file():
        pytest.skip("smollm2-135m not prepared (invoke models.prepare)")
    narrow = load_drafter(DEFAULT, dtype="float32")
    save_drafter(widen_mlp(narrow, 3 * narrow.config.intermediate_size), tmp_path / "wide")
    cfg = probe.ProbeConfig(drafter=str(tmp_path / "wide"), reference_drafter=str(DEFAULT),
                            prompts="chatterbot-heldout", num_prompts=3, max_new_tokens=24)
    r = probe.run(cfg, progress=False)
    assert r.metrics["online"]["exact_match_frac"] == 1.0
    assert r.metrics["online"]["accept_len"] == pytest.approx(r.metrics["reference"]["online"]["accept_len"])
