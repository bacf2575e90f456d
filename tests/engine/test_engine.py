"""Engine exactness: own forward vs HF, speculative == greedy (chain, tree), sampled distribution."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.models import VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine.draft import DraftModel, Drafting, DraftTree
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.kv import causal_rows, tree_rows
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.models.target import default_capture_points

CONFIGS = {"llama": tiny_llama_config, "qwen2": tiny_qwen2_config}


from helpers.engine import OracleDrafting  # noqa: E402


def build(kind="llama", max_len=96, **over):
    cfg = CONFIGS[kind](max_position_embeddings=max_len, **over)
    hf = tiny_causal_lm(cfg)
    return cfg, hf, TargetModel(hf, default_capture_points(cfg.num_hidden_layers), max_len)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_own_forward_matches_hf_logits_and_aux(kind):
    cfg, hf, tm = build(kind)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    ref = hf(ids, output_hidden_states=True)
    kv = tm.new_cache()
    ar = torch.arange(12)
    logits, aux = tm(ids, ar, ar, causal_rows(0, 12, 12, "cpu"), kv)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, torch.cat([ref.hidden_states[c] for c in tm.capture_points], -1))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_engine_greedy_matches_hf_generate(kind):
    cfg, hf, tm = build(kind)
    prompt = list(range(3, 14))
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert Engine(tm).generate(prompt, 24).tokens == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("rows", range(1, 10))
def test_cpu_few_rows_linear_is_the_same_product(rows, monkeypatch):
    """layers.linear (w @ x.T for 1-7 rows on the CPU where chosen) equals F.linear, with and without a bias,
    2-D and 3-D."""
    from torch.nn import functional as F

    from eaglekb.models import layers
    from eaglekb.models.layers import linear

    monkeypatch.setattr(layers, "_TRANSPOSED", {r: True for r in range(1, 8)})

    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(48, 16, generator=g), torch.randn(48, generator=g)
    for x in (torch.randn(rows, 16, generator=g), torch.randn(1, rows, 16, generator=g)):
        for bias in (None, b):
            y = linear(x, w, bias)
            assert y.shape == (*x.shape[:-1], 48) and y.is_contiguous()
            torch.testing.assert_close(y, F.linear(x, w, bias), atol=1e-5, rtol=1e-5)


def test_cpu_steps_through_the_few_rows_product_equal_f_linear(monkeypatch):
    """On the CPU a decode step (one row, as two identical columns) and a verify of up to 7 rows run unpadded
    through layers.linear: the same logits and aux as through F.linear."""
    from eaglekb.models import layers

    cfg, hf, tm = build("qwen2")
    assert [Engine(tm).pad_rows(n) for n in (1, 2, 5, 7, 8, 9)] == [1, 2, 5, 7, 8, 12]
    prompt = list(range(3, 14))
    n = len(prompt)

    def steps():
        eng = Engine(tm)
        eng.prefill(torch.tensor([prompt]))
        ar = torch.arange(n, n + 5)
        return [eng.decode_one(20, n), eng.decode_one(21, n + 1),
                tm(torch.tensor([[22, 23, 24, 25, 26]]), ar, ar, causal_rows(n, 5, n + 5, "cpu"), eng.tkv)]

    monkeypatch.setattr(layers, "_TRANSPOSED", {r: True for r in range(1, 8)})
    fast = steps()
    monkeypatch.setattr(layers, "_TRANSPOSED", {})  # every product through F.linear
    for (lf, af), (lr, ar_) in zip(fast, steps()):
        assert lf.shape == lr.shape and af.shape == ar_.shape
        torch.testing.assert_close(lf, lr, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(af, ar_, atol=1e-5, rtol=1e-5)


def test_the_cpu_product_is_timed_per_row_count_and_kept_per_process(monkeypatch):
    """calibrate_cpu_products times both products for 1-7 rows on matrices large enough to time, keeps the
    faster per row count (recorded as cpu_products), times a set of shapes once per process, and leaves tiny
    matrices (a test model's) at the default."""
    from eaglekb.models import layers

    monkeypatch.setattr(layers, "_TRANSPOSED", {r: True for r in range(1, 8)})
    monkeypatch.setattr(layers, "_CALIBRATED", {})
    assert layers.calibrate_cpu_products([torch.randn(48, 16)]) == {str(r): "transposed" for r in range(1, 8)}
    assert layers._CALIBRATED == {}  # too small to time
    w = torch.randn(1024, 1024)
    chosen = layers.calibrate_cpu_products([w], repeats=1)
    assert set(chosen) == {str(r) for r in range(1, 8)} and set(chosen.values()) <= {"direct", "transposed"}
    assert chosen == layers.cpu_products() and len(layers._CALIBRATED) == 1
    calls = []
    monkeypatch.setattr(layers, "linear", lambda *a: calls.append(1))
    assert layers.calibrate_cpu_products([w], repeats=1) == chosen and not calls  # kept, not timed again
    eng = Engine(build("qwen2")[2])
    assert eng.cpu_products == layers.cpu_products()  # an engine on the CPU says which product it runs


SPECS = [SpecConfig(steps=1), SpecConfig(steps=3), SpecConfig(steps=6), SpecConfig(steps=3, topk=2),
         SpecConfig(steps=4, topk=3, draft_tokens=8)]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"s{s.steps}k{s.topk}n{s.draft_tokens}")
def test_speculative_equals_greedy_random_drafter(kind, spec):
    cfg, hf, tm = build(kind)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm))
    for seed in range(1):
        prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        want = eng.generate(prompt, 30).tokens
        got = eng.speculative(prompt, 30, spec)
        assert got.tokens == want
        assert sum(got.accept_lens) >= 30 - 1


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("topk", [1, 3])
def test_every_accept_length_is_exact(kind, topk):
    cfg, hf, tm = build(kind, max_len=128)
    steps = 4
    spec = SpecConfig(steps=steps, topk=topk, draft_tokens=None if topk == 1 else 1 + steps * topk)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm))
    prompt = list(range(5, 16))
    want = eng.generate(prompt, 60).tokens
    eng.drafting = OracleDrafting(eng.drafting, want, len(prompt), seed=topk)
    got = eng.speculative(prompt, 60, spec)
    assert got.tokens == want
    assert set(got.accept_lens) >= set(range(1, steps + 2)) - {steps + 1} or max(got.accept_lens) == steps + 1
    assert max(got.accept_lens) == steps + 1 and min(got.accept_lens) == 1
    assert got.accepted_per_depth[0] >= got.accepted_per_depth[-1] > 0


def test_stop_token_and_truncation():
    cfg, hf, tm = build()
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm))
    prompt = list(range(5, 16))
    want = eng.generate(prompt, 40).tokens
    eng.drafting = OracleDrafting(eng.drafting, want, len(prompt))
    stop = want[17]
    first = want.index(stop)
    got = eng.speculative(prompt, 40, SpecConfig(steps=5), stop_ids=(stop,))
    assert got.tokens == want[:first + 1]
    assert eng.generate(prompt, 40, stop_ids=(stop,)).tokens == want[:first + 1]
    assert len(eng.speculative(prompt, 7, SpecConfig(steps=5)).tokens) == 7


def test_tree_mask_sees_prefix_and_ancestors():
    m = tree_rows(3, [-1, 0, 0, 1], 8, "cpu")
    assert m[:, :3].all()
    assert m[3, 3:7].tolist() == [True, True, False, True]
    assert m[2, 3:7].tolist() == [True, False, True, False]
    assert not m[:, 7].any()


def test_bad_input_cache_and_drafter():
    cfg, hf, tm = build(max_len=32)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm))
    with pytest.raises(BadInput, match="prompt longer than the cache"):
        eng.speculative(list(range(20)), 10, SpecConfig(steps=3))
    with pytest.raises(BadInput, match="token id out of range"):
        eng.generate([VOCAB + 3], 4)
    other = tiny_llama_config(hidden_size=64)
    with pytest.raises(Incompatible, match="hidden size"):
        DraftModel(tiny_drafter(other), tm)
    with pytest.raises(Incompatible, match="vocab"):
        DraftModel(tiny_drafter(tiny_llama_config(vocab_size=VOCAB * 2)), tm)
    with pytest.raises(BadInput):
        SpecConfig(steps=3, topk=1, draft_tokens=7)
    bad = tiny_drafter(cfg)
    bad.d2t[-1] = VOCAB  # maps the last draft token outside the target vocab
    with pytest.raises(BadInput, match="outside the target vocab"):
        DraftModel(bad, tm)


# ---------------------------------------------------------------- sampled verification


def _pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit (cells with expected count < 5 pooled), without scipy."""
    n = counts.sum()
    exp = probs.flatten().double() * n
    obs = counts.flatten().double()
    keep = exp >= 5
    obs = torch.cat([obs[keep], obs[~keep].sum()[None]])
    exp = torch.cat([exp[keep], exp[~keep].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(float(len(obs) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


@pytest.mark.parametrize("topk", [1, 2])
def test_sampled_rules_preserve_two_token_distribution(topk):
    """Rule level, many samples: drafts from q, target tables p; emitted (e1, e2) ~ p exactly."""
    from eaglekb.engine import verify as V

    g = torch.Generator().manual_seed(7)
    vocab, draft_vocab, n = 6, 4, 4000
    d2t = torch.tensor([0, 0, 1, 2])  # draft ids 0..3 -> target ids 0, 1, 3, 5
    t_ids = torch.arange(draft_vocab) + d2t
    p0 = torch.softmax(torch.randn(vocab, generator=g) * 2, -1)
    p1 = torch.softmax(torch.randn(vocab, vocab, generator=g) * 2, -1)  # p(e2 | e1)
    q0 = torch.softmax(torch.randn(draft_vocab, generator=g), -1)
    q1 = torch.softmax(torch.randn(draft_vocab, generator=g), -1)
    counts = torch.zeros(vocab, vocab)
    rej = 0
    for _ in range(n):
        if topk == 1:
            a = int(torch.multinomial(q0, 1, generator=g))
            b = int(torch.multinomial(q1, 1, generator=g))
            tree = DraftTree(tokens=[int(t_ids[a]), int(t_ids[b])], parents=[-1, 0], depths=[1, 2],
                             draft_ids=[a, b], q=torch.stack([q0, q1]))
            rows = torch.stack([p0, p1[tree.tokens[0]], p1[tree.tokens[0]]]).log()
            path, bonus = V.sampled_chain(tree, rows, 1.0, d2t, g)
        else:  # two root children, the first with one child
            tree = DraftTree(tokens=[1, 3, 5], parents=[-1, -1, 0], depths=[1, 1, 2], draft_ids=[0, 0, 0])
            rows = torch.stack([p0, p1[1], p1[3], p1[1]]).log()
            path, bonus = V.sampled_tree(tree, rows, 1.0, g)
        emitted = [tree.tokens[i] for i in path] + [bonus]
        rej += len(path) == 0
        if len(emitted) == 1:
            emitted.append(int(torch.multinomial(p1[emitted[0]], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    assert _pvalue(counts, p0[:, None] * p1) > 1e-3
    assert 0 < rej < n


def test_sampled_engine_end_to_end_matches_target():
    """Engine level: the first token of the first speculative cycle follows the target's distribution."""
    vocab, n = 8, 200
    cfg = tiny_llama_config(vocab_size=vocab, max_position_embeddings=16, num_hidden_layers=4)
    hf = tiny_causal_lm(cfg, seed=3)
    with torch.no_grad():
        hf.lm_head.weight.mul_(40.0)
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), 16)
    drafter = tiny_drafter(cfg, selected=[0, 1, 2, 4, 5, 7], seed=5)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(30.0)
    eng = Engine(tm, DraftModel(drafter, tm), seed=11)
    prompt = [1, 3, 5]
    counts = torch.zeros(vocab)
    accepted = 0
    for _ in range(n):
        r = eng.speculative(prompt, 3, SpecConfig(steps=1, temperature=1.0))  # a first cycle's 2 tokens all kept
        counts[r.tokens[1]] += 1
        accepted += r.accept_lens[0] > 1
    with torch.no_grad():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        p2 = torch.softmax(hf(torch.tensor([prompt + [a] for a in range(vocab)])).logits[:, -1], -1)
    assert _pvalue(counts, p1 @ p2) > 1e-3
    assert 0 < accepted < n


@pytest.mark.parametrize("steps", [1, 4])
def test_accept_lengths_count_output_tokens_only(steps):
    """A cycle that reaches the end (max_new_tokens, or a stop token anywhere in it) keeps only the tokens output:
    accept lengths sum to the output (the first token is the prefill's), depth counts agree with them, and no cycle
    runs after a stop token, wherever in a cycle it came (SGLang: completion tokens / verify passes)."""
    cfg, hf, tm = build("llama", max_len=128)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm))
    prompt = list(range(5, 16))
    want = eng.generate(prompt, 60).tokens
    eng.drafting = OracleDrafting(eng.drafting, want, len(prompt), seed=steps)
    for n, stop in ((60, ()), (37, ()), (60, (want[23],))):
        got = eng.speculative(prompt, n, SpecConfig(steps=steps), stop_ids=stop)
        assert sum(got.accept_lens) == len(got.tokens) - 1
        for d, n_d in enumerate(got.accepted_per_depth):  # a kept depth-(d+1) draft: d+1 tokens output (d+2 untrimmed)
            assert sum(a >= d + 2 for a in got.accept_lens) <= n_d <= sum(a >= d + 1 for a in got.accept_lens)
        if stop:
            assert got.tokens == want[:want.index(stop[0]) + 1]
