"""The drafter's int8 copies on the CPU: FBGEMM's dynamic int8 product over each matrix but ``fc`` rounded per row,
close to the float32 product but not equal (lossy), so the drafter's proposals may change while the tokens kept stay
plain greedy decoding's; ``fc`` keeps its half-width copy; the modes' rules, the one-line refusals and the bench
record."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from torch.nn import functional as F

from helpers.models import VOCAB, bf16_exact, tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine import cpu_packed
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models import packed
from eaglekb.models.layers import linear
from eaglekb.models.target import default_capture_points

pytestmark = pytest.mark.skipif(not (packed.int8_supported() and packed.half_supported()),
                                reason="this torch build has no FBGEMM int8 or float16 linear")


def build(kind="llama", max_len=96):
    cfg = (tiny_qwen2_config if kind == "qwen2" else tiny_llama_config)(max_position_embeddings=max_len)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)
    return tm, DraftModel(bf16_exact(tiny_drafter(cfg)), tm)


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_int8_linear_is_close_to_the_float32_product(rows):
    """layers.linear over an int8 copy: float32 out, every row count, with and without a bias, within the rounding
    of 8-bit weights and activations (a few percent of the output's scale), not equal; released, it is F.linear."""
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 64, generator=g) * 0.05, torch.randn(96, generator=g)
    x = torch.randn(1, rows, 64, generator=g)
    copies = packed.Int8Set([w, w])
    try:
        assert (copies.kept, copies.refused) == (1, 0) and copies.mib == pytest.approx(96 * 64 / 2**20)
        for bias in (None, b):
            y, ref = linear(x, w, bias), F.linear(x, w, bias)
            assert y.dtype == torch.float32 and y.shape == ref.shape
            assert 0 < (y - ref).abs().max() < 0.05 * ref.abs().max()
    finally:
        copies.release()
    assert packed.half_for(w, rows) is None
    torch.testing.assert_close(linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)


def test_a_weight_is_in_one_set_and_its_entry_goes_with_it():
    """An Int8Set takes a weight from a HalfSet that held it (and back), and an entry goes with its weight."""
    w = torch.randn(64, 32).bfloat16().float()
    halves = packed.HalfSet([w])
    copies = packed.Int8Set([w])
    assert halves.kept == 0 and copies.kept == 1 and packed.half_for(w, 1)[0] is packed._int8_product
    again = packed.HalfSet([w])
    assert copies.kept == 0 and packed.half_for(w, 1)[0] is packed._fp16_product
    copies = packed.Int8Set([w])
    del w
    gc.collect()
    assert not [k for k, e in packed._HALVES.items() if e[-1] is copies and e[0]() is None]
    copies.release()
    again.release()


def test_the_modes_rules_and_one_line_refusals():
    """auto and on put every matrix but fc in int8 and fc in half-width; off (the default) leaves the half-width
    copies to all six; an unknown mode, or on where compiled layers keep F.linear, is refused in one line."""
    tm, dm = build()
    for mode in ("auto", "on"):
        eng = Engine(tm, dm, cpu_draft_int8=mode)
        d = eng.cpu_draft
        assert (d.int8, d.int8_matrices, d.matrices) == (mode, len(cpu_packed.DRAFT_INT8), 1)
        assert d.int8_mib > 0 and dm.int8 is not None and dm.halves is not None
        assert packed.half_for(dm.lm_head, 1)[0] is packed._int8_product
        assert packed.half_for(dm.fc, 1)[0] is packed._fp16_product
    eng = Engine(tm, dm)
    assert eng.cpu_draft.int8 == "off" and eng.cpu_draft.int8_matrices == 0 and dm.int8 is None and eng.cpu_draft.matrices == 6
    assert packed.half_for(dm.lm_head, 1)[0] is packed._fp16_product
    Engine(tm, dm, cpu_draft_int8="on", cpu_draft_fp16="off")
    assert dm.halves is None and packed.half_for(dm.fc, 1) is None and dm.int8.kept == 5
    with pytest.raises(BadInput, match="--cpu-draft-int8") as e:
        Engine(tm, dm, cpu_draft_int8="fast")
    assert "\n" not in str(e.value)
    assert cpu_packed.draft_setup(dm, "off", int8="auto", compiled=True).int8_matrices == 0
    with pytest.raises(BadInput, match="--cpu-draft-int8 on") as e:
        cpu_packed.draft_setup(dm, "off", int8="on", compiled=True)
    assert "\n" not in str(e.value) and dm.int8 is None


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_speculative_decoding_on_int8_copies_is_plain_greedy_decoding(kind):
    """Whatever the int8 drafter proposes, greedy speculative decoding (chains and a tree) keeps plain greedy
    decoding's tokens, on int8 copies as without them."""
    tm, dm = build(kind)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    eng = Engine(tm, dm, cpu_draft_int8="on")
    assert dm.int8 is not None
    want = eng.generate(prompt, 24).tokens
    for spec in (SpecConfig(steps=1), SpecConfig(steps=3), SpecConfig(steps=3, topk=3, draft_tokens=8)):
        assert eng.speculative(prompt, 24, spec).tokens == want


def test_bench_records_the_int8_copies(tiny_pair):
    """The bench records the mode and the matrices in int8 (a float32 drafter too: int8 needs no exact values), none
    with off (the default); an unknown mode is refused in one line."""
    from eaglekb.measure import bench

    target, drafter = tiny_pair
    cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                            max_new_tokens=4, sweep=[(2, 1, None)], repeats=1, warmup=0, peers=[],
                            cpu_draft_int8="auto")
    r = bench.run(cfg, progress=False)
    assert r.config["cpu_draft_int8"] == "auto" and r.config["cpu_draft_int8_matrices"] == 5
    assert "drafter int8 copies (auto): 5 matrices" in bench.render_text(r)
    off = bench.run(dataclasses.replace(cfg, cpu_draft_int8=bench.BenchConfig.cpu_draft_int8), progress=False)
    assert off.config["cpu_draft_int8"] == "off" and off.config["cpu_draft_int8_matrices"] == 0 and "int8 copies" not in bench.render_text(off)
    with pytest.raises(BadInput, match="--cpu-draft-int8") as e:
        bench.run(bench.BenchConfig(target=str(target), drafter=str(drafter), cpu_draft_int8="fast"), progress=False)
    assert "\n" not in str(e.value)
