"""The fused greedy chain cycle: same tokens and accept lengths as the named steps, for every accept length."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.models import VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine.draft import DraftModel
from eaglekb.engine.fused import FusedChain
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.models.target import default_capture_points

CONFIGS = {"llama": tiny_llama_config, "qwen2": tiny_qwen2_config}


def _pair(kind="llama", max_len=128):
    cfg = CONFIGS[kind](max_position_embeddings=max_len)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)
    return tm, DraftModel(tiny_drafter(cfg), tm)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("steps", [1, 3, 6])
def test_fused_chain_equals_named_steps_and_greedy(kind, steps):
    tm, dm = _pair(kind)
    for seed in range(2):
        prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        want = Engine(tm).generate(prompt, 40).tokens
        fused = Engine(tm, dm, fused=True)
        a = fused.speculative(prompt, 40, SpecConfig(steps=steps))
        b = Engine(tm, dm, fused=False).speculative(prompt, 40, SpecConfig(steps=steps))
        assert a.tokens == b.tokens == want
        assert a.accept_lens == b.accept_lens and a.accepted_per_depth == b.accepted_per_depth
        assert steps in fused._fused and len(a.accept_lens) > 1  # the fused cycle ran after the first


def test_fused_cycle_is_exact_for_every_accept_length():
    """Drafts replaced by the target's own continuation, corrupted at a random depth: every k in 0..steps."""
    tm, dm = _pair(max_len=160)
    steps, prompt = 4, list(range(5, 16))
    eng = Engine(tm, dm, fused=True)
    want = eng.generate(prompt, 90).tokens
    fc = eng._fused[steps] = FusedChain(eng, steps)
    real, rng = fc.draft, random.Random(0)

    def oracle(meta, aux):
        vids, base = real(meta, aux)  # the real drafter work, then its chain replaced
        cut, m = rng.randint(0, steps), int(base) + 1
        truth = [want[m - 1 + d - len(prompt)] if m - 1 + d - len(prompt) < len(want) else 0
                 for d in range(1, steps + 1)]
        chain = [t if d <= cut else (t + 1 + rng.randrange(VOCAB - 1)) % VOCAB for d, t in enumerate(truth, 1)]
        out = vids.clone()
        out[1:steps + 1] = torch.tensor(chain)
        return out, base

    fc.draft = oracle
    got = eng.speculative(prompt, 90, SpecConfig(steps=steps))
    assert got.tokens == want
    assert set(got.accept_lens[1:]) == set(range(1, steps + 2))
    assert got.accepted_per_depth[0] >= got.accepted_per_depth[-1] > 0


def test_fused_is_off_for_trees_sampling_and_by_default_on_cpu():
    tm, dm = _pair()
    assert Engine(tm, dm).fused is False
    eng = Engine(tm, dm, fused=True)
    eng.speculative([3, 4, 5], 12, SpecConfig(steps=2, topk=2))
    eng.speculative([3, 4, 5], 12, SpecConfig(steps=2, temperature=0.8))
    assert eng._fused == {}
