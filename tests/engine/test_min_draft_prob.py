"""``--min-draft-prob``: a chain that ends after a drafted token the drafter is unsure of drafts fewer tokens and
decodes exactly what greedy decoding does (CPU, tiny random models). Its speed is measured in probe records."""

from __future__ import annotations

import pytest
import torch

from helpers.models import VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models.target import default_capture_points


@pytest.fixture(scope="module")
def engine():
    cfg = tiny_llama_config(max_position_embeddings=128)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), 128)
    return Engine(tm, DraftModel(tiny_drafter(cfg), tm))


PROMPTS = [torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]


@pytest.mark.parametrize("p", [1e-12, 0.02, 0.5, 0.99])
def test_a_probability_stop_decodes_exactly_the_greedy_tokens(engine, p):
    for prompt in PROMPTS:
        want = engine.generate(prompt, 40).tokens
        got = engine.speculative(prompt, 40, SpecConfig(steps=6, min_draft_prob=p))
        assert got.tokens == want
        assert got.cycles <= got.drafted <= 6 * got.cycles


def test_the_chain_goes_as_deep_as_the_drafter_is_sure(engine):
    """A stop no draft falls below drafts every step; one every draft falls below drafts one token a cycle (a
    random drafter's top probability over its draft vocabulary is far below 0.99); between, in between."""
    prompt = PROMPTS[0]
    never = engine.speculative(prompt, 40, SpecConfig(steps=6, min_draft_prob=1e-12))
    always = engine.speculative(prompt, 40, SpecConfig(steps=6, min_draft_prob=0.99))
    plain = engine.speculative(prompt, 40, SpecConfig(steps=6))
    assert never.drafted == 6 * never.cycles and plain.drafted == 6 * plain.cycles
    assert always.drafted == always.cycles


def test_a_sampled_chain_stops_too(engine):
    got = engine.speculative(PROMPTS[1], 30, SpecConfig(steps=5, temperature=1.0, min_draft_prob=0.99))
    assert len(got.tokens) == 30 and got.drafted == got.cycles


@pytest.mark.parametrize("over, found", [(dict(min_draft_prob=1.0), "1.0"), (dict(min_draft_prob=-0.1), "-0.1"),
                                         (dict(min_draft_prob=True), "True"),
                                         (dict(topk=2, min_draft_prob=0.3), "--topk 2")])
def test_a_bad_probability_stop_is_one_line(over, found):
    with pytest.raises(BadInput, match="--min-draft-prob") as err:
        SpecConfig(steps=3, **over)
    assert found in str(err.value) and "\n" not in str(err.value)


def test_bench_names_a_stopped_chain():
    from eaglekb.measure.bench import BenchConfig, spec_name

    stopped = BenchConfig(sweep=[(3, 1, None), (6, 1, None)], min_draft_prob=0.3).specs()
    assert [spec_name(s) for s in stopped] == ["spec_s3_k1_n4_p30", "spec_s6_k1_n7_p30"]
    assert spec_name(BenchConfig().specs()[0]) == "spec_s3_k1_n4"
