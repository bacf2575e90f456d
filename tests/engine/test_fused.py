"""The fused greedy cycles (chain and tree): same tokens, trees and accept lengths as the named steps, for every
accept length."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.engine import record_fused_trees, record_trees
from helpers.models import VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine.draft import DraftModel
from eaglekb.engine.fused import FusedChain, FusedTree
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models.target import default_capture_points

CONFIGS = {"llama": tiny_llama_config, "qwen2": tiny_qwen2_config}


def _pair(kind="llama", max_len=128, sharp: float = 1.0):
    """A tiny target and drafter; ``sharp`` scales the drafter's lm_head (peaked drafts: trees reach every depth)."""
    cfg = CONFIGS[kind](max_position_embeddings=max_len)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)
    drafter = tiny_drafter(cfg)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(sharp)
    return tm, DraftModel(drafter, tm)


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
        assert (steps, 1, steps + 1) in fused._fused and len(a.accept_lens) > 1  # the fused cycle ran after the first


def test_fused_cycle_is_exact_for_every_accept_length():
    """Drafts replaced by the target's own continuation, corrupted at a random depth: every k in 0..steps."""
    tm, dm = _pair(max_len=160)
    steps, prompt = 4, list(range(5, 16))
    eng = Engine(tm, dm, fused=True)
    want = eng.generate(prompt, 90).tokens
    fc = eng._fused[(steps, 1, steps + 1)] = FusedChain(eng, steps)
    real, rng = fc.draft, random.Random(0)

    def oracle(meta, aux):
        vids, pos = real(meta, aux)  # the real drafter work, then its chain replaced
        cut, m = rng.randint(0, steps), int(pos[0]) + 1
        truth = [want[m - 1 + d - len(prompt)] if m - 1 + d - len(prompt) < len(want) else 0
                 for d in range(1, steps + 1)]
        chain = [t if d <= cut else (t + 1 + rng.randrange(VOCAB - 1)) % VOCAB for d, t in enumerate(truth, 1)]
        out = vids.clone()
        out[1:steps + 1] = torch.tensor(chain)
        return out, pos

    fc.draft = oracle
    got = eng.speculative(prompt, 90, SpecConfig(steps=steps))
    assert got.tokens == want
    assert set(got.accept_lens[1:]) == set(range(1, steps + 2))
    assert got.accepted_per_depth[0] >= got.accepted_per_depth[-1] > 0


TREES = [SpecConfig(steps=3, topk=2), SpecConfig(steps=4, topk=3, draft_tokens=8), SpecConfig(steps=1, topk=3),
         SpecConfig(steps=4, topk=4, draft_tokens=16), SpecConfig(steps=5, topk=4, draft_tokens=3)]


@pytest.mark.parametrize("kind,sharp", [("llama", 1.0), ("llama", 20.0), ("qwen2", 20.0)])
@pytest.mark.parametrize("spec", TREES, ids=lambda s: f"s{s.steps}k{s.topk}n{s.draft_tokens}")
def test_fused_tree_drafts_the_named_steps_trees_and_tokens(kind, sharp, spec):
    """Cycle by cycle the fused tree program drafts the very tree of ``Drafting.tree`` (nodes, parents, depths,
    order), and the tokens and accept lengths equal the named steps' and plain greedy decoding. A flat drafter keeps
    wide trees, a sharp one deep trees (every depth up to the budget)."""
    tm, dm = _pair(kind, sharp=sharp)
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    want = Engine(tm).generate(prompt, 40).tokens
    # int8 drafter copies round each call's activations at one scale, so rows drafted in other groupings differ:
    # the two programs' trees are compared over exact products
    named = Engine(tm, dm, fused=False, cpu_draft_int8="off")
    trees = record_trees(named)
    b = named.speculative(prompt, 40, spec)
    fused = Engine(tm, dm, fused=True, cpu_draft_int8="off")
    fc = fused._fused[(spec.steps, spec.topk, spec.draft_tokens)] = FusedTree(fused, spec.steps, spec.topk,
                                                                               spec.draft_tokens)
    seen = record_fused_trees(fc)
    a = fused.speculative(prompt, 40, spec)
    assert a.tokens == b.tokens == want
    assert a.accept_lens == b.accept_lens and a.accepted_per_depth == b.accepted_per_depth
    # the first cycle takes the named steps; the last draft, queued before the last cycle was read, is for none
    assert len(seen) == len(trees) > 1 and seen[:-1] == trees[1:]
    if sharp > 1:
        assert max(max(depths) for _, _, depths in seen) == min(spec.steps, spec.nodes)


def _oracle_tree(steps: int, topk: int, nodes: int, truth: list[int], cut: int, rng: random.Random):
    """A tree of ``nodes`` nodes: ``topk`` children per depth under the path node, the target's token at a random
    child up to depth ``cut``, wrong (distinct) tokens elsewhere; (tokens, parent rows, depths) of rows 1..nodes."""
    toks, prow, depth = [], [], []
    parent = 0
    for d in range(1, steps + 1):
        right = rng.randrange(topk) if d <= cut else -1
        used = {truth[d - 1]}
        nxt = len(toks) + 1
        for c in range(topk):
            if len(toks) == nodes:
                break
            tok = truth[d - 1]
            if c != right:
                while tok in used:
                    tok = rng.randrange(VOCAB)
                used.add(tok)
            else:
                nxt = len(toks) + 1
            toks.append(tok)
            prow.append(parent)
            depth.append(d)
        parent = nxt
    while len(toks) < nodes:  # spare budget: wrong children of the root
        toks.append((truth[0] + 1 + len(toks)) % VOCAB if (truth[0] + 1 + len(toks)) % VOCAB != truth[0] else 0)
        prow.append(0)
        depth.append(1)
    return toks, prow, depth


@pytest.mark.parametrize("spec", [SpecConfig(steps=4, topk=3, draft_tokens=13), SpecConfig(steps=3, topk=2)],
                         ids=lambda s: f"s{s.steps}k{s.topk}n{s.draft_tokens}")
def test_fused_tree_verify_is_exact_for_every_accept_length(spec):
    """The drafted tree replaced by one holding the target's continuation at a random child (off-first-child paths)
    up to a random depth: the verify program's mask, walk and commit give plain greedy for every k in 0..steps."""
    tm, dm = _pair(max_len=200)
    prompt = list(range(5, 16))
    eng = Engine(tm, dm, fused=True)
    want = eng.generate(prompt, 100).tokens
    key = (spec.steps, spec.topk, spec.draft_tokens)
    fc = eng._fused[key] = FusedTree(eng, *key)
    real, rng = fc.draft, random.Random(2)

    def oracle(meta, aux):
        vids, depth, prow, slots = real(meta, aux)  # the real drafter work, then its tree replaced
        at = int(slots[0]) - len(prompt)
        truth = [want[at + d] if at + d < len(want) else 0 for d in range(1, spec.steps + 1)]
        toks, rows, depths = _oracle_tree(spec.steps, spec.topk, fc.nodes, truth, rng.randint(0, spec.steps), rng)
        n = fc.nodes
        vids, depth, prow = vids.clone(), depth.clone(), prow.clone()
        vids[1:n + 1], prow[1:n + 1], depth[1:n + 1] = torch.tensor(toks), torch.tensor(rows), torch.tensor(depths)
        return vids, depth, prow, slots

    fc.draft = oracle
    got = eng.speculative(prompt, 100, spec)
    assert got.tokens == want
    assert set(got.accept_lens[1:]) == set(range(1, spec.steps + 2))
    assert got.accepted_per_depth[0] >= got.accepted_per_depth[-1] > 0


def test_fused_is_on_for_greedy_trees_off_for_sampling_and_by_default_on_cpu():
    tm, dm = _pair()
    assert Engine(tm, dm).fused is False
    eng = Engine(tm, dm, fused=True)
    eng.speculative([3, 4, 5], 12, SpecConfig(steps=2, temperature=0.8))
    eng.speculative([3, 4, 5], 12, SpecConfig(steps=2, topk=2, temperature=0.8))
    assert eng._fused == {}
    eng.speculative([3, 4, 5], 12, SpecConfig(steps=2, topk=2))
    assert isinstance(eng._fused[(2, 2, 5)], FusedTree)
    off = Engine(tm, dm, fused=False)
    off.speculative([3, 4, 5], 12, SpecConfig(steps=2, topk=2))
    assert off._fused == {}
    with pytest.raises(BadInput, match="tree frontier larger than the drafter scratch"):  # (10 - 1) x 8 > 64 slots
        eng.speculative([3, 4, 5], 12, SpecConfig(steps=10, topk=8, draft_tokens=9))
