"""Target adapter: capture points, the +1 convention, HF's post-norm last hidden state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helpers.models import VOCAB, tiny_causal_lm, tiny_llama_config, tiny_qwen2_config  # noqa: E402

from eaglekb.io.errors import BadInput  # noqa: E402
from eaglekb.models.target import (Target, capture_points_to_config_ids, config_ids_to_capture_points,  # noqa: E402
                            default_capture_points, default_config_ids)


def test_default_capture_points_match_sglang():
    assert default_capture_points(61) == [2, 30, 58]
    assert default_capture_points(30) == [2, 15, 27]
    assert default_config_ids(61) == [1, 29, 57]
    with pytest.raises(BadInput):
        default_capture_points(3)


def test_plus_one_convention():
    # SpecForge's default config ids become SGLang's default capture points
    for n in (8, 24, 28, 30, 61):
        ids = [1, n // 2 - 1, n - 4]
        assert config_ids_to_capture_points(ids, "sglang") == default_capture_points(n)
        # vLLM reads the same ids as capture points: one layer lower
        assert config_ids_to_capture_points(ids, "vllm") == [c - 1 for c in default_capture_points(n)]
        assert capture_points_to_config_ids(default_capture_points(n), "sglang") == ids
    with pytest.raises(BadInput):
        config_ids_to_capture_points([1, 2, 3], "trtllm")


def _layer_outputs(model, ids):
    """Raw outputs of each decoder layer, captured with hooks (independent of output_hidden_states)."""
    outs = {}
    hooks = [layer.register_forward_hook(
        lambda mod, args, out, i=i: outs.__setitem__(i, (out[0] if isinstance(out, tuple) else out).detach()))
        for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids)
        model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return emb, outs


@pytest.mark.parametrize("make_config", [tiny_llama_config, tiny_qwen2_config])
def test_aux_hidden_states_are_layer_outputs(make_config):
    cfg = make_config()
    model = tiny_causal_lm(cfg)
    target = Target(model)
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    out = target(ids)
    assert out.capture_points == default_capture_points(n)
    assert out.aux_hidden.shape == (2, 5, 3 * h)
    emb, layer_out = _layer_outputs(model, ids)
    for slot, c in enumerate(out.capture_points):
        expected = emb if c == 0 else layer_out[c - 1]  # capture point c = output of layer c-1
        torch.testing.assert_close(out.aux_hidden[..., slot * h:(slot + 1) * h], expected)
    # HF's last hidden state is post-norm: not the raw last layer output, but norm() of it
    assert not torch.allclose(out.final_hidden, layer_out[n - 1])
    torch.testing.assert_close(out.final_hidden, model.model.norm(layer_out[n - 1]))
    assert out.logits.shape == (2, 5, VOCAB)


def test_configurable_points_and_embeddings_point():
    cfg = tiny_llama_config()
    model = tiny_causal_lm(cfg)
    target = Target(model, capture_points=[0, 1, 7])
    ids = torch.tensor([[1, 2, 3]])
    out = target(ids)
    torch.testing.assert_close(out.aux_hidden[..., :32], model.get_input_embeddings()(ids))
    with pytest.raises(BadInput, match="post-norm"):
        Target(model, capture_points=[2, 4, 8])  # 8 = N: HF's post-norm output
    with pytest.raises(BadInput, match="token id"):
        target(torch.tensor([[VOCAB]]))


def test_load_from_folder(tmp_path):
    cfg = tiny_llama_config()
    tiny_causal_lm(cfg).save_pretrained(tmp_path)
    target = Target.load(tmp_path, dtype="bfloat16")
    assert target.num_layers == 8 and next(target.model.parameters()).dtype == torch.bfloat16
    assert target(torch.tensor([[1, 2]])).aux_hidden.dtype == torch.bfloat16
    with pytest.raises(BadInput):
        Target.load(tmp_path, dtype="int8")


@pytest.mark.slow
def test_smollm2_hidden_states_real_model():
    from eaglekb.models import sources

    path = sources.resolve("smollm2-135m", prepare_missing=True)
    target = Target.load(path)
    assert target.num_layers == 30 and target.hidden_size == 576
    assert target.capture_points == [2, 15, 27]
    ids = target.tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = target(ids)
    assert out.aux_hidden.shape == (1, ids.shape[1], 3 * 576)
    assert torch.isfinite(out.aux_hidden).all()
    emb, layer_out = _layer_outputs(target.model, ids)
    torch.testing.assert_close(out.aux_hidden[..., 576:1152], layer_out[14])
    next_id = int(out.logits[0, -1].argmax())
    assert "Paris" in target.tokenizer.decode([next_id])
