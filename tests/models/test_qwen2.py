"""Qwen2 targets in the engine (qwen2.5-coder-0.5b's layout): biases, heads, untied head, rope theta, exactness.

The default tests run a tiny random Qwen2 with qwen2.5-coder-0.5b's head layout (14 query heads over 2 K/V
heads), rope theta 1e6, q/k/v biases set to non-zero values (transformers initialises them to zero, which would
hide a missing bias) and both embedding layouts: tied (upstream) and untied (the GGUF the embedded model is
converted from). ``-m slow`` runs the real model on the CPU in float32; ``-m gpu`` runs it (and the tiny one) on
CUDA with the compiled, graphed and fused paths.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.engine import OracleDrafting
from helpers.models import VOCAB, tiny_causal_lm, tiny_qwen2_config

from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.kv import causal_rows
from eaglekb.engine.model import TargetModel, check_architecture
from eaglekb.io.errors import Incompatible
from eaglekb.models.drafter import build_drafter_for_target
from eaglekb.models.layers import rope_tables
from eaglekb.models.target import default_capture_points

SPECS = [SpecConfig(steps=1), SpecConfig(steps=3), SpecConfig(steps=5), SpecConfig(steps=3, topk=2, draft_tokens=6)]


def qwen05_like(tied: bool, max_len: int = 128):
    """A tiny Qwen2 with qwen2.5-coder-0.5b's head layout (14 heads, 2 K/V heads), theta 1e6, non-zero biases."""
    cfg = tiny_qwen2_config(hidden_size=112, num_attention_heads=14, num_key_value_heads=2, intermediate_size=160,
                            num_hidden_layers=6, rope_theta=1e6, tie_word_embeddings=tied,
                            max_position_embeddings=max_len)
    hf = tiny_causal_lm(cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=g) * 0.5)
        if not tied:
            hf.lm_head.weight.copy_(torch.randn(hf.lm_head.weight.shape, generator=g) * 0.05)
    return cfg, hf


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_layout_biases_head_and_rope(tied):
    cfg, hf = qwen05_like(tied)
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), 128)
    assert (tm.n_heads, tm.n_kv, tm.head_dim) == (14, 2, 8)
    a = hf.model.layers[0].self_attn
    assert torch.equal(tm.layers[0].bqkv, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
    assert (tm.lm_head.data_ptr() == tm.embed_weight.data_ptr()) is tied  # the head the HF model runs
    cos, sin = rope_tables(1e6, 8, 128, "cpu")
    assert torch.equal(tm.cos, cos) and torch.equal(tm.sin, sin)
    assert not torch.equal(cos, rope_tables(1e4, 8, 128, "cpu")[0])


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_matches_hf_and_biases_matter(tied):
    cfg, hf = qwen05_like(tied)
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), 128)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
    ref = hf(ids, output_hidden_states=True)
    ar = torch.arange(13)
    logits, aux = tm(ids, ar, ar, causal_rows(0, 13, 13, "cpu"), tm.new_cache(batch=2))
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, torch.cat([ref.hidden_states[c] for c in tm.capture_points], -1))
    for w in tm.layers:  # without the biases the forward is another model: the test above would see it
        w.bqkv = None
    assert (tm(ids, ar, ar, causal_rows(0, 13, 13, "cpu"), tm.new_cache(batch=2))[0] - ref.logits).abs().max() > 1e-2


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_greedy_equals_hf_and_speculative_equals_greedy(tied):
    cfg, hf = qwen05_like(tied)
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), 128)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
    want = ref[0, len(prompt):].tolist()
    eng = Engine(tm, DraftModel(build_drafter_for_target(cfg, 48, torch_dtype="float32", seed=1), tm))
    assert eng.generate(prompt, 32).tokens == want
    for spec in SPECS:
        assert eng.speculative(prompt, 32, spec).tokens == want
    eng.drafting = OracleDrafting(eng.drafting, want, len(prompt), seed=2)  # right drafts to random depths
    got = eng.speculative(prompt, 32, SpecConfig(steps=4))
    assert got.tokens == want and max(got.accept_lens) > 1


def test_unsupported_architecture_is_one_line():
    with pytest.raises(Incompatible) as err:
        check_architecture({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, where="m/config.json")
    line = err.value.line()
    assert "\n" not in line and "gpt2" in line and "llama" in line and "qwen2" in line and err.value.exit_code == 2
    for bad, word in (({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096}, "sliding"),
                      ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn")):
        with pytest.raises(Incompatible, match=word):
            check_architecture(bad, where="m/config.json")
    check_architecture({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4096}, where="m")
    check_architecture(json.loads(tiny_qwen2_config().to_json_string()), where="m")


# ----------------------------------------------------------------------------- the real model


def _real(device: str):
    from eaglekb.models import sources
    from eaglekb.models.checks import load_causal_lm

    if device != "cpu" and sources.read_manifest(sources.model_dir("qwen2.5-coder-0.5b")) is None:
        pytest.skip("qwen2.5-coder-0.5b is not prepared here (invoke models.prepare qwen2.5-coder-0.5b)")
    path = sources.resolve("qwen2.5-coder-0.5b", prepare_missing=True)
    hf = load_causal_lm(path, dtype=torch.float32).to(device).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a string."}],
                                   tokenize=False, add_generation_prompt=True)
    return hf, tok(text, add_special_tokens=False)["input_ids"]


def _check_real(hf, prompt, device, **engine_kw):
    cfg = hf.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (14, 2, 151936)
    assert cfg.tie_word_embeddings is False and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr()
    tm = TargetModel(hf, default_capture_points(24), 256)
    assert tm.head_dim == 64 and tm.layers[0].bqkv is not None and float(tm.layers[0].bqkv.abs().max()) > 1.0
    ids = torch.tensor([prompt], device=device)
    ar = torch.arange(len(prompt), device=device)
    with torch.no_grad():
        ref = hf(ids).logits
    logits, _ = tm(ids, ar, ar, causal_rows(0, len(prompt), len(prompt), device), tm.new_cache())
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    want = hf.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
    drafter = build_drafter_for_target(cfg, 32768, torch_dtype="float32", seed=0).to(device)
    eng = Engine(tm, DraftModel(drafter, tm), max_len=192, **engine_kw)
    assert eng.generate(prompt, 24).tokens == want
    for spec in (SpecConfig(steps=3), SpecConfig(steps=4, topk=2, draft_tokens=8)):
        assert eng.speculative(prompt, 24, spec).tokens == want
    return eng


@pytest.mark.slow
def test_real_qwen25_coder_05b_exact_on_cpu():
    hf, prompt = _real("cpu")
    _check_real(hf, prompt, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_qwen2_graphed_fused_exact_on_cuda(tied):
    cfg, hf = qwen05_like(tied, max_len=160)
    hf = hf.to("cuda")
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), 160)
    dm = DraftModel(build_drafter_for_target(cfg, 48, torch_dtype="float32", seed=1).to("cuda"), tm)
    prompt = list(range(3, 20))
    want = Engine(tm, max_len=128).generate(prompt, 40).tokens
    fast = Engine(tm, dm, max_len=128, graphs=True)
    assert fast.compiled and fast.generate(prompt, 40).tokens == want
    for spec in SPECS:
        assert fast.speculative(prompt, 40, spec).tokens == want
    assert fast.fused


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_qwen25_coder_05b_exact_on_cuda_graphed():
    hf, prompt = _real("cuda")
    eng = _check_real(hf, prompt, "cuda", graphs=True)
    assert eng.compiled and eng.fused
