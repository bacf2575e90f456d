"""The drafter's half-width copies on the CPU: float16 holds a bfloat16 checkpoint's matrices exactly (after a
power-of-two scale) and FBGEMM multiplies them in float32, so a draft step gives the logits of the float32
product within float32 rounding and the engine drafts the same tokens; matrices float16 would round are left to
float32; the modes' rules, the refusals in one line, the CPU extend's last-row logits and the bench record."""

from __future__ import annotations

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

pytestmark = pytest.mark.skipif(not packed.half_supported(), reason="this torch build has no FBGEMM float16 linear")


def build(kind="llama", max_len=96, exact=True):
    cfg = (tiny_qwen2_config if kind == "qwen2" else tiny_llama_config)(max_position_embeddings=max_len)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)
    dr = tiny_drafter(cfg)
    return tm, DraftModel(bf16_exact(dr) if exact else dr, tm)


def test_half_scale_holds_bfloat16_values_exactly_and_refuses_the_rest():
    """A bfloat16-valued matrix (tiny and large entries alike) is held after a power-of-two scale; float32 values
    with more bits, non-finite values, other dtypes and a range wider than float16's are not."""
    g = torch.Generator().manual_seed(0)
    sign = torch.randint(0, 2, (64, 48), generator=g) * 2 - 1
    w = (sign * (0.5 + torch.rand(64, 48, generator=g) / 2) * torch.logspace(-7, 0, 48)).bfloat16().float()
    s = packed.half_scale(w)
    assert s is not None and 2**14 <= float(w.abs().max()) * 2.0**s < 2**15
    assert torch.equal((w * 2.0**s).half().float(), w * 2.0**s)
    assert packed.half_scale(w * 1024) == s - 10  # the scale follows the largest magnitude
    assert packed.half_scale(torch.zeros(4, 4)) == 0
    assert packed.half_scale(torch.randn(64, 48, generator=g)) is None  # float32 bits float16 cannot keep
    assert packed.half_scale(w.bfloat16()) is None and packed.half_scale(w[0]) is None
    wide = w.clone()
    wide[0, 0], wide[0, 1] = 1.0, 2.0**-40
    assert packed.half_scale(wide) is None
    wide[0, 1] = float("nan")
    assert packed.half_scale(wide) is None


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 40])
def test_half_linear_is_the_float32_product(rows):
    """layers.linear over a half-width copy equals F.linear within float32 rounding, with and without a bias, 2-D
    and 3-D: the activations stay float32 (float16 activations would be a thousand times further off)."""
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(96, 40, generator=g) * 0.05).bfloat16().float()
    w[0, :5] = torch.tensor([1e-7, -3e-6, 2e-8, 0.0, 0.25]).bfloat16().float()  # below float16's normal range
    b = torch.randn(96, generator=g)
    halves = packed.HalfSet([w])
    try:
        assert halves.kept == 1 and packed.half_for(w, 1) is not None
        for x in (torch.randn(rows, 40, generator=g) * 3, torch.randn(1, rows, 40, generator=g) * 3):
            ref = F.linear(x.double(), w.double())
            for bias in (None, b):
                y = linear(x, w, bias)
                assert y.dtype == torch.float32 and y.shape == (*x.shape[:-1], 96)
                torch.testing.assert_close(y, F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
            err = (linear(x, w).double() - ref).abs().max()
            assert err < (F.linear(x.half().double(), w.double()) - ref).abs().max() / 100
    finally:
        halves.release()
    assert packed.half_for(w, 1) is None


def test_copies_are_counted_refused_and_freed():
    """A HalfSet keeps one copy per matrix float16 holds exactly, counts the others, and its entries go with it
    (release) or with the weight (garbage collected)."""
    g = torch.Generator().manual_seed(1)
    w, r = torch.randn(64, 32, generator=g).bfloat16().float(), torch.randn(64, 32, generator=g)
    halves = packed.HalfSet([w, w, r])
    assert (halves.kept, halves.refused) == (1, 1) and halves.mib == pytest.approx(64 * 32 * 2 / 2**20)
    assert packed.half_for(w, 1) is not None and packed.half_for(r, 1) is None
    again = packed.HalfSet([w])  # a weight is in one set at a time
    assert halves.kept == 0 and again.kept == 1
    del w
    gc.collect()
    assert not [k for k, e in packed._HALVES.items() if e[-1] is again and e[0]() is None]
    again.release()


def test_the_modes_rules_and_one_line_refusals():
    """auto makes copies of the matrices held exactly (none for a float32-trained drafter, and says why); on
    refuses where one would round; off drops them; an unknown mode, or one on another device, is refused."""
    tm, dm = build()
    eng = Engine(tm, dm, cpu_draft_int8="off")
    assert eng.cpu_draft.mode == "auto" and eng.cpu_draft.matrices == 6 and dm.halves is not None
    assert eng.cpu_draft.mib > 0 and packed.half_for(dm.lm_head, 1) is not None
    eng = Engine(tm, dm, cpu_draft_int8="off", cpu_draft_fp16="off")
    assert eng.cpu_draft.matrices == 0 and dm.halves is None and packed.half_for(dm.lm_head, 1) is None
    Engine(tm, dm, cpu_draft_int8="off", cpu_draft_fp16="on")
    assert dm.halves.kept == 6
    _, raw = build(exact=False)
    eng = Engine(tm, raw, cpu_draft_int8="off")
    assert eng.cpu_draft.matrices == 0 and "none made" in eng.cpu_draft.why and raw.halves is None
    with pytest.raises(BadInput, match="--cpu-draft-fp16 on") as e:
        Engine(tm, raw, cpu_draft_int8="off", cpu_draft_fp16="on")
    assert "\n" not in str(e.value) and "6 of 6" in str(e.value) and raw.halves is None
    with pytest.raises(BadInput, match="--cpu-draft-fp16") as e:
        Engine(tm, dm, cpu_draft_int8="off", cpu_draft_fp16="fast")
    assert "\n" not in str(e.value)
    assert cpu_packed.draft_setup(dm, "auto", compiled=True).matrices == 0  # compiled layers keep F.linear
    with pytest.raises(BadInput, match="--cpu-draft-fp16 on"):
        cpu_packed.draft_setup(dm, "on", compiled=True)
    assert Engine(tm).cpu_draft is None  # no drafter: nothing to copy


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_drafting_on_half_copies_equals_float32_drafting(kind):
    """Draft steps on the copies give the float32 logits and hidden states within float32 rounding; greedy
    speculative decoding (chains and a tree) drafts the same tokens, accepts the same lengths and equals plain
    greedy decoding."""
    tm, dm = build(kind)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    runs = {}
    for mode in ("off", "on"):
        eng = Engine(tm, dm, cpu_draft_int8="off", cpu_draft_fp16=mode)
        _, aux = eng.prefill(torch.tensor([prompt]))
        logits, hidden = eng.draft_extend(prompt[1:] + [5], aux[0], 0)
        ar = torch.tensor([len(prompt)])
        step = dm(torch.tensor([[7]]), hidden[:, -1:], ar, ar, torch.ones(1, len(prompt) + 1, dtype=torch.bool),
                  eng.dkv)
        want = eng.generate(prompt, 24).tokens
        out = [(logits, hidden), step]
        for spec in (SpecConfig(steps=1), SpecConfig(steps=3), SpecConfig(steps=3, topk=3, draft_tokens=8)):
            r = eng.speculative(prompt, 24, spec)
            assert r.tokens == want
            out.append(r.accept_lens)
        runs[mode] = out
    for (lo, ho), (lh, hh) in zip(runs["off"][:2], runs["on"][:2]):
        torch.testing.assert_close(lh, lo, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hh, ho, atol=1e-5, rtol=1e-5)
    assert runs["on"][2:] == runs["off"][2:]


def test_the_cpu_extend_computes_the_last_rows_logits_alone():
    """On the CPU the drafter extend returns the last row's logits (those of the whole pass at that row) and every
    row's hidden state, padded or not."""
    tm, dm = build()
    eng = Engine(tm, dm, cpu_draft_int8="off", cpu_draft_fp16="off")
    _, aux = eng.prefill(torch.tensor([list(range(3, 23))]))
    for n in (1, 3, 9, 20):  # 9: padded to 12 rows; 20: the prompt's eager extend
        tokens = list(range(10, 10 + n))
        logits, hidden = eng.draft_extend(tokens, aux[0, :n], 0)
        assert logits.shape == (1, 1, dm.lm_head.shape[0]) and hidden.shape == (1, n, dm.hidden)
        ar = torch.arange(n)
        full_logits, full_hidden = dm(torch.tensor([tokens]), aux[0, :n][None], ar, ar,
                                      torch.ones(n, n, dtype=torch.bool).tril(), eng.dkv)
        torch.testing.assert_close(logits[0, -1], full_logits[0, -1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden, full_hidden, atol=1e-5, rtol=1e-5)


def test_bench_records_the_half_copies(tiny_pair):
    """The bench records the mode, the matrices copied and why; an unknown mode is refused in one line."""
    from eaglekb.measure import bench

    target, drafter = tiny_pair  # a float32 drafter: auto makes none and says why
    cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                            max_new_tokens=4, sweep=[(2, 1, None)], repeats=1, warmup=0, peers=[])
    r = bench.run(cfg, progress=False)
    assert r.config["cpu_draft_fp16"] == "auto" and r.config["cpu_draft_fp16_matrices"] == 0
    assert "none made" in r.config["cpu_draft_fp16_why"]
    assert "drafter half-width copies (auto): 0 matrices" in bench.render_text(r)
    with pytest.raises(BadInput, match="--cpu-draft-fp16") as e:
        bench.run(bench.BenchConfig(target=str(target), drafter=str(drafter), cpu_draft_fp16="fast"), progress=False)
    assert "\n" not in str(e.value)
