"""BatchDecoder: greedy rows equal single-stream greedy decoding, independent of batch company; budgets, stops."""

from __future__ import annotations

import pytest
import torch

from helpers.models import VOCAB, tiny_causal_lm, tiny_llama_config

from eaglekb.engine.batch import BatchDecoder, Request
from eaglekb.engine.generate import Engine
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models.target import default_capture_points

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tm():
    cfg = tiny_llama_config(max_position_embeddings=160)
    return TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), 160)


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_greedy_rows_equal_single_stream_and_ignore_batch_company(tm):
    prompts = _prompts(11)
    want = [Engine(tm, max_len=120).generate(p, 20).tokens for p in prompts]
    dec = BatchDecoder(tm, rows=4, max_len=120, check_every=3)
    assert dec.generate([Request(p, 0.0, 20) for p in prompts]) == want
    # a different batch size and a subset (another "shard") give the same tokens for the same prompts
    sub = BatchDecoder(tm, rows=3, max_len=120, check_every=5).generate([Request(p, 0.0, 20) for p in prompts[::2]])
    assert sub == want[::2]
    assert dec.stats.tokens == sum(map(len, want)) and 0 < dec.stats.utilisation <= 1


def test_stop_tokens_budgets_and_sampling(tm):
    prompts = _prompts(6, seed=1)
    ref = BatchDecoder(tm, rows=2, max_len=120).generate([Request(p, 0.0, 30) for p in prompts])
    stop = ref[0][5]
    got = BatchDecoder(tm, rows=2, max_len=120, stop_ids=[stop]).generate([Request(p, 0.0, 30) for p in prompts])
    for r, g in zip(ref, got):
        cut = r.index(stop) + 1 if stop in r else len(r)
        assert g == r[:cut]
    budgets = BatchDecoder(tm, rows=3, max_len=120).generate([Request(p, 0.0, 1 + i) for i, p in enumerate(prompts)])
    assert [len(b) for b in budgets] == [1 + i for i in range(len(prompts))]
    reqs = [Request(p, 0.9, 25) for p in prompts]
    a = BatchDecoder(tm, rows=3, max_len=120, seed=7).generate(reqs)
    b = BatchDecoder(tm, rows=3, max_len=120, seed=7).generate(reqs)
    assert a == b and a != ref and all(len(x) == 25 for x in a)


def test_bad_requests_are_one_line(tm):
    dec = BatchDecoder(tm, rows=2, max_len=64)
    for req in (Request([], 0.0, 4), Request(list(range(3, 70)), 0.0, 4), Request([5], 0.0, 0), Request([5], 3.0, 4)):
        with pytest.raises(BadInput):
            dec.generate([req])
    with pytest.raises(BadInput):
        BatchDecoder(tm, rows=0, max_len=64)
