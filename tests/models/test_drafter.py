"""The EAGLE-3 drafter: names, forward semantics, save/load and format round trips."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eaglekb.formats.drafter import REQUIRED_KEYS, DrafterConfig, read_tensors
from eaglekb.formats.mapping import mapping_from_selected
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, MissingFile, SchemaError
from eaglekb.models.drafter import KVCache, build_drafter_for_target, load_drafter, save_drafter
from helpers.models import DRAFT_VOCAB, VOCAB, rewrite_config, rewrite_tensors, tiny_drafter, tiny_llama_config


def _inputs(d, b=2, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(b, t, d.config.fc_in, generator=g)
    emb = torch.randn(b, t, d.config.hidden_size, generator=g)
    return aux, emb


def test_parameter_names_and_shapes_match_sglang():
    d = tiny_drafter()
    sd = d.state_dict()
    assert set(sd) == set(REQUIRED_KEYS)
    h = d.config.hidden_size
    assert sd["fc.weight"].shape == (h, 3 * h)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (4 * 8, 2 * h)
    assert sd["midlayer.self_attn.k_proj.weight"].shape == (2 * 8, 2 * h)
    assert sd["lm_head.weight"].shape == (DRAFT_VOCAB, h)
    assert sd["d2t"].dtype == torch.int64 and sd["d2t"].shape == (DRAFT_VOCAB,)
    assert sd["t2d"].dtype == torch.bool and int(sd["t2d"].sum()) == DRAFT_VOCAB


def test_mapping_semantics():
    d2t, t2d = mapping_from_selected([9, 3, 5], VOCAB)
    assert d2t.tolist() == [3, 4, 7]  # sorted ids 3,5,9 minus 0,1,2
    assert t2d.nonzero().reshape(-1).tolist() == [3, 5, 9]
    d = tiny_drafter(selected=list(range(0, 80, 2)))
    assert d.draft_to_target(torch.tensor([0, 1, 39])).tolist() == [0, 2, 78]


def _reference_midlayer(d, aux, emb):
    """Independent re-derivation of SpecForge's forward (explicit softmax, per-head loop)."""
    cfg, m = d.config, d.midlayer
    hd, nh, nkv = cfg.dim_head, cfg.num_attention_heads, cfg.num_key_value_heads

    def rms(w, x):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps))

    h = aux @ d.fc.weight.T
    x = torch.cat([rms(m.input_layernorm.weight, emb), rms(m.hidden_norm.weight, h)], -1)
    t = x.shape[1]
    q = (x @ m.self_attn.q_proj.weight.T).view(x.shape[0], t, nh, hd)
    k = (x @ m.self_attn.k_proj.weight.T).view(x.shape[0], t, nkv, hd)
    v = (x @ m.self_attn.v_proj.weight.T).view(x.shape[0], t, nkv, hd)
    pos = torch.arange(t, dtype=torch.float64)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos[:, None] * inv[None]  # [t, hd/2]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()

    def rot(z):  # rotate pairs (i, i + hd/2), Llama's "rotate_half" layout
        a, b = z[..., : hd // 2], z[..., hd // 2:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    q, k = rot(q), rot(k)
    out = torch.zeros_like(q)
    for head in range(nh):
        kh = head // (nh // nkv)
        scores = q[:, :, head] @ k[:, :, kh].transpose(1, 2) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        out[:, :, head] = scores.softmax(-1) @ v[:, :, kh]
    h2 = h + out.reshape(x.shape[0], t, nh * hd) @ m.self_attn.o_proj.weight.T
    y = rms(m.post_attention_layernorm.weight, h2)
    mlp = (torch.nn.functional.silu(y @ m.mlp.gate_proj.weight.T) * (y @ m.mlp.up_proj.weight.T))
    h3 = h2 + mlp @ m.mlp.down_proj.weight.T
    return h3, rms(d.norm.weight, h3) @ d.lm_head.weight.T


def test_forward_matches_independent_reference():
    d = tiny_drafter()
    with torch.no_grad():
        for p in d.parameters():  # non-trivial norm weights
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    aux, emb = _inputs(d)
    with torch.no_grad():
        out = d(aux, inputs_embeds=emb)
        hidden, logits = _reference_midlayer(d, aux, emb)
    torch.testing.assert_close(out.hidden, hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-4)


def test_kv_cache_steps_equal_full_pass_and_next_step_skips_fc():
    d = tiny_drafter()
    aux, emb = _inputs(d, t=7)
    with torch.no_grad():
        full = d(aux, inputs_embeds=emb)
        cache = KVCache()
        a = d(aux[:, :4], inputs_embeds=emb[:, :4], cache=cache)
        b = d(aux[:, 4:], inputs_embeds=emb[:, 4:], cache=cache)
        torch.testing.assert_close(torch.cat([a.logits, b.logits], 1), full.logits)
        assert cache.length == 7
        # next draft step: previous drafter hidden (width H) goes in without fc
        nxt = d(full.hidden[:, -1:], inputs_embeds=emb[:, -1:], cache=cache)
        assert nxt.logits.shape == (2, 1, DRAFT_VOCAB)
        cache.crop(3)
        assert cache.length == 3


def test_forward_rejects_bad_inputs():
    d = tiny_drafter()
    aux, emb = _inputs(d)
    with pytest.raises(Incompatible, match="hidden state width"):
        d(aux[..., :-1], inputs_embeds=emb)
    with pytest.raises(BadInput, match="embed_tokens"):
        d(aux, input_ids=torch.zeros(2, 6, dtype=torch.long))


def test_save_load_round_trip_is_bit_exact(tmp_path):
    d = tiny_drafter(dtype="bfloat16")
    save_drafter(d, tmp_path / "a")
    loaded = load_drafter(tmp_path / "a")
    expected = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in d.state_dict().items()}
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for k in expected:
        assert got[k].dtype == expected[k].dtype, k
        assert torch.equal(got[k], expected[k]), k
    # and again: save(load(x)) is byte-identical tensor content
    save_drafter(loaded, tmp_path / "b")
    ta, tb = read_tensors(tmp_path / "a"), read_tensors(tmp_path / "b")
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    doc = json.loads((tmp_path / "a" / "config.json").read_text())
    assert doc["architectures"] == ["LlamaForCausalLMEagle3"]
    assert doc["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert doc["tie_word_embeddings"] is False and doc["num_hidden_layers"] == 1


def test_speculators_export_import_round_trip_same_outputs(tmp_path):
    d = tiny_drafter()
    save_drafter(d, tmp_path / "sg", format="sglang")
    save_drafter(d, tmp_path / "spec", format="speculators", verifier="tiny-llama")
    spec_t = read_tensors(tmp_path / "spec")
    assert "layers.0.self_attn.q_proj.weight" in spec_t and not any(k.startswith("midlayer.") for k in spec_t)
    doc = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert doc["speculators_model_type"] == "eagle3"
    assert doc["speculators_config"]["algorithm"] == "eagle3"
    assert doc["transformer_layer_config"]["hidden_size"] == 32
    assert doc["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM capture points = SGLang ids + 1
    a, b = load_drafter(tmp_path / "sg"), load_drafter(tmp_path / "spec")
    assert a.config.aux_layer_ids == b.config.aux_layer_ids == [1, 3, 4]
    aux, emb = _inputs(d)
    with torch.no_grad():
        oa, ob = a(aux, inputs_embeds=emb), b(aux, inputs_embeds=emb)
    assert torch.equal(oa.logits, ob.logits) and torch.equal(oa.hidden, ob.hidden)
    # and back: speculators -> sglang keeps every tensor
    save_drafter(b, tmp_path / "back", format="sglang")
    ta, tb = read_tensors(tmp_path / "sg"), read_tensors(tmp_path / "back")
    assert set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_embeddings_optional(tmp_path):
    cfg = tiny_llama_config()
    d = build_drafter_for_target(cfg, DRAFT_VOCAB, with_embeddings=True, torch_dtype="float32")
    assert not d.embed_tokens.weight.requires_grad
    save_drafter(d, tmp_path / "no-emb")
    save_drafter(d, tmp_path / "emb", include_embeddings=True)
    assert "embed_tokens.weight" not in read_tensors(tmp_path / "no-emb")
    loaded = load_drafter(tmp_path / "emb")
    ids = torch.randint(0, VOCAB, (1, 5))
    aux = torch.randn(1, 5, d.config.fc_in)
    with torch.no_grad():
        torch.testing.assert_close(loaded(aux, input_ids=ids).logits,
                                   d(aux, inputs_embeds=d.embed_tokens(ids)).logits)


def test_build_for_qwen2_target_and_defaults():
    from helpers.models import tiny_qwen2_config

    d = build_drafter_for_target(tiny_qwen2_config(), 16, intermediate_size=40)
    assert d.config.hidden_size == 48 and d.config.intermediate_size == 40
    assert d.config.aux_layer_ids == [1, 2, 2]  # SpecForge default [1, N//2-1, N-4] for N=6
    assert d.d2t.tolist() == [0] * 16
    with pytest.raises(BadInput):
        build_drafter_for_target(tiny_qwen2_config(), 4, mapping=[1, 1, 2, 3])


def test_unknown_config_field_is_named(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)
    rewrite_config(tmp_path, lambda doc: doc.update(hiden_size=32))
    with pytest.raises(SchemaError, match="hiden_size"):
        load_drafter(tmp_path)


def test_unknown_architecture_refused(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)
    rewrite_config(tmp_path, lambda doc: doc.update(architectures=["LlamaForCausalLM"]))
    with pytest.raises(SchemaError, match="architecture"):
        load_drafter(tmp_path)


def test_misspelt_tensor_refused_on_load(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)

    def edit(t):
        t["midlayer.self_atn.q_proj.weight"] = t.pop("midlayer.self_attn.q_proj.weight")
    rewrite_tensors(tmp_path, edit)
    with pytest.raises(SchemaError, match="self_atn"):
        load_drafter(tmp_path)


def test_t2d_that_disagrees_with_d2t_refused_on_load(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)

    def edit(t):
        t2d = t["t2d"].clone()
        first = int(t2d.nonzero()[0])
        t2d[first] = False  # the first selected target token is no longer marked
        t["t2d"] = t2d
    rewrite_tensors(tmp_path, edit)
    with pytest.raises(BadInput, match="t2d does not match d2t") as e:
        load_drafter(tmp_path)
    assert str(tmp_path) in e.value.line()


def test_truncated_safetensors_is_integrity_error(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(IntegrityError, match="unreadable safetensors file"):
        load_drafter(tmp_path)


def test_missing_weights_and_config(tmp_path):
    with pytest.raises(MissingFile):
        load_drafter(tmp_path)
    save_drafter(tiny_drafter(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(MissingFile, match="no safetensors"):
        load_drafter(tmp_path)


def test_fc_shape_mismatch_refused(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)
    rewrite_config(tmp_path, lambda doc: doc.update(target_hidden_size=64))
    with pytest.raises(Incompatible, match="fc.weight"):
        load_drafter(tmp_path)


def test_config_dataclass_round_trip():
    cfg = tiny_drafter().config
    again = DrafterConfig.from_sglang_json(cfg.to_sglang_json())
    assert again.to_sglang_json() == cfg.to_sglang_json()
    spec = DrafterConfig.from_speculators_json(cfg.to_speculators_json())
    assert spec.to_sglang_json() == cfg.to_sglang_json()


def test_scaled_rope_refused_rather_than_run_wrong(tmp_path):
    save_drafter(tiny_drafter(), tmp_path)
    rewrite_config(tmp_path, lambda doc: doc.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(Incompatible, match="RoPE"):
        load_drafter(tmp_path)
