"""The engine on CUDA (run with ``-m gpu`` on a GPU machine): compiled + graphed paths stay exact in float32."""

from __future__ import annotations

import pytest
import torch

from helpers.engine import record_fused_trees, record_trees
from helpers.models import tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine.batch import BatchDecoder, Request
from eaglekb.engine.draft import DraftModel, top_children
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.models.target import default_capture_points

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CONFIGS = {"llama": tiny_llama_config, "qwen2": tiny_qwen2_config}


def _cuda_pair(kind: str, max_len: int = 128):
    cfg = CONFIGS[kind](max_position_embeddings=max_len)
    hf = tiny_causal_lm(cfg).to("cuda")
    tm = TargetModel(hf, default_capture_points(cfg.num_hidden_layers), max_len)
    return tm, DraftModel(tiny_drafter(cfg).to("cuda"), tm)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_compiled_graphed_engine_is_exact_float32(kind):
    tm, dm = _cuda_pair(kind)
    prompt = list(range(3, 20))
    want = Engine(tm, max_len=96).generate(prompt, 40).tokens  # eager reference
    fast = Engine(tm, dm, max_len=96, graphs=True)
    assert fast.compiled and fast.generate(prompt, 40).tokens == want
    for spec in (SpecConfig(steps=3), SpecConfig(steps=1), SpecConfig(steps=4, topk=2, draft_tokens=8)):
        assert fast.speculative(prompt, 40, spec).tokens == want
    assert fast.fused and sorted(fast._fused) == [(1, 1, 2), (3, 1, 4), (4, 2, 8)]  # chains and the tree: fused
    unfused = Engine(tm, dm, max_len=96, graphs=True, fused=False)
    for steps in (2, 5):
        a, b = fast.speculative(prompt, 40, SpecConfig(steps=steps)), unfused.speculative(prompt, 40, SpecConfig(steps=steps))
        assert a.tokens == b.tokens == want and a.accept_lens == b.accept_lens


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fused_tree_graphed_equals_the_eager_named_steps_float32(kind):
    """The fused tree cycle, compiled and graphed, drafts the eager named steps' trees and gives their tokens and
    accept lengths; a sharp drafter (lm_head x 20) makes the trees reach every depth."""
    tm, dm = _cuda_pair(kind)
    with torch.no_grad():
        dm.lm_head.mul_(20.0)
    prompt = list(range(3, 20))
    want = Engine(tm, max_len=96).generate(prompt, 40).tokens
    for spec in (SpecConfig(steps=4, topk=4, draft_tokens=16), SpecConfig(steps=3, topk=2), SpecConfig(steps=5, topk=4,
                                                                                                       draft_tokens=3)):
        eager = Engine(tm, dm, max_len=96)
        trees = record_trees(eager)
        b = eager.speculative(prompt, 40, spec)
        fast = Engine(tm, dm, max_len=96, graphs=True)
        a = fast.speculative(prompt, 40, spec)
        assert a.tokens == b.tokens == want and a.accept_lens == b.accept_lens
        fc = fast.fused_cycle(spec)
        assert fc.draft.graphs and fc.verify.graphs  # captured: the tree ran as two graph replays per cycle
        seen = record_fused_trees(fc)
        assert fast.speculative(prompt, 40, spec).tokens == want
        assert len(seen) == len(trees) and seen[:-1] == trees[1:]  # the last: the spare draft queued after the end


def test_top_children_rounds_on_cuda_are_the_stable_sort():
    """CUDA's max returns the first maximal index too: the rounds give the stable sort's first k (ties to the lower
    id), in float32 and bfloat16, on random and tie-heavy rows of the bench's draft vocab, eager and graphed."""
    g = torch.Generator().manual_seed(0)
    for levels in (None, 2, 7):
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(4, 12288, generator=g) * 3 if levels is None else
                 torch.randint(0, levels, (4, 12288), generator=g).float()).to(dtype).cuda()
            s = torch.sort(torch.log_softmax(x.float(), -1), dim=-1, descending=True, stable=True)
            vals, ids = top_children(x, 4)
            assert torch.equal(vals, s.values[:, :4]) and torch.equal(ids, s.indices[:, :4])
            assert torch.equal(vals, torch.log_softmax(x.float(), -1).topk(4).values)
            graph, static = torch.cuda.CUDAGraph(), x.clone()
            top_children(static, 4)  # warm-up
            with torch.cuda.graph(graph):
                out = top_children(static, 4)
            static.copy_(x.flip(-1))
            graph.replay()
            s = torch.sort(torch.log_softmax(x.flip(-1).float(), -1), dim=-1, descending=True, stable=True)
            assert torch.equal(out[0], s.values[:, :4]) and torch.equal(out[1], s.indices[:, :4])


def test_graphed_uncompiled_and_eager_widths_agree():
    tm, dm = _cuda_pair("llama")
    prompt = list(range(5, 30))
    a = Engine(tm, dm, max_len=96, graphs=True, compile=False).speculative(prompt, 30, SpecConfig(steps=2)).tokens
    b = Engine(tm, dm, max_len=96, graphs=False).speculative(prompt, 30, SpecConfig(steps=2)).tokens
    assert a == b == Engine(tm, max_len=96).generate(prompt, 30).tokens


def test_batch_decoder_graphed_matches_single_stream():
    tm, _ = _cuda_pair("llama", max_len=160)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (int(n),), generator=g).tolist() for n in torch.randint(2, 50, (9,), generator=g)]
    want = [Engine(tm, max_len=128).generate(p, 24).tokens for p in prompts]
    dec = BatchDecoder(tm, rows=4, max_len=128, graphs=True)
    assert dec.generate([Request(p, 0.0, 24) for p in prompts]) == want
    assert BatchDecoder(tm, rows=3, max_len=128, graphs=True).generate([Request(p, 0.0, 24) for p in prompts[1::2]]) \
        == want[1::2]
