"""``draft.top_children``, the k best children of each row that the named and the fused tree both take: both of its
paths (the rounds of max of the device program, the CPU's topk with its ties repaired) are exactly the first ``k`` of a
stable descending sort of the log-softmax, on random and tie-heavy rows, and give the scores of the former
``log_softmax(...).topk(k)`` bit for bit, hence the same frontiers."""

from __future__ import annotations

import pytest
import torch

from eaglekb.engine.draft import top_children

PATHS = pytest.mark.parametrize("rounds", [True, False], ids=["rounds", "cpu-topk"])


def _rows(seed: int, n: int = 300):
    """(logits, k): shapes [V] and [R, V], float32 and bfloat16, continuous or a few levels (exact ties), some rows
    with -inf entries (at least k finite)."""
    g = torch.Generator().manual_seed(seed)
    for t in range(n):
        shape = [int(torch.randint(1, 6, (1,), generator=g))] if t % 4 else []
        v = int(torch.randint(4, 160, (1,), generator=g))
        k = int(torch.randint(1, min(v, 8) + 1, (1,), generator=g))
        levels = int(torch.randint(0, 4, (1,), generator=g))
        x = torch.randn(*shape, v, generator=g) * 4 if levels == 0 else \
            torch.randint(0, levels + 1, (*shape, v), generator=g).float()
        if t % 5 == 0:
            x = x.to(torch.bfloat16)
        if t % 7 == 0:
            x[..., :v - k - int(torch.randint(0, 3, (1,), generator=g))] = float("-inf")
        yield x, k


def _stable(x: torch.Tensor, k: int):
    s = torch.sort(torch.log_softmax(x.float(), -1), dim=-1, descending=True, stable=True)
    return s.values[..., :k], s.indices[..., :k]


@PATHS
@pytest.mark.parametrize("seed", [0, 1])
def test_top_children_is_the_stable_sort_cut_to_k(rounds, seed):
    ties = 0
    for x, k in _rows(seed):
        before = x.clone()
        vals, ids = top_children(x, k, rounds=rounds)
        want_v, want_i = _stable(x, k)
        assert vals.dtype == torch.float32 and ids.dtype == torch.long and vals.shape == ids.shape == want_v.shape
        assert torch.equal(vals, want_v) and torch.equal(ids, want_i)
        assert torch.equal(x, before)  # the caller's logits are never the masked ones
        ties += int((want_v[..., 1:] == want_v[..., :-1]).any())
    assert ties > 50  # the tie-heavy rows were there


@PATHS
def test_top_children_has_topks_values_and_its_ids_where_no_two_are_equal(rounds):
    """Against the former ``log_softmax(logits.float()).topk(k)``: the same values bit for bit; the same ids on every
    row whose top ``k + 1`` log-probabilities are distinct (elsewhere topk's order among equal values is its own)."""
    checked = 0
    for x, k in _rows(2):
        old = torch.log_softmax(x.float(), -1).topk(k)
        vals, ids = top_children(x, k, rounds=rounds)
        assert torch.equal(vals, old.values)
        lp = torch.log_softmax(x.float(), -1).reshape(-1, x.shape[-1])
        top = lp.topk(min(k + 1, lp.shape[-1])).values
        distinct = ~(top[:, 1:] == top[:, :-1]).any(-1)
        got, want = ids.reshape(-1, k)[distinct], old.indices.reshape(-1, k)[distinct]
        assert torch.equal(got, want)
        checked += int(distinct.sum())
    assert checked > 100


@PATHS
def test_frontier_scores_and_selection_are_the_former_ones(rounds):
    """A frontier of 4 rows over a 12,288-entry vocab (the bench's drafter), float32 and bfloat16 logits: each child's
    cumulative score ``parent + logp`` is bit for bit the former one, and the stable sort keeps the same frontier
    scores; on tie-free rows the same children (row, id)."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(8):
            logits = (torch.randn(4, 12288, generator=g) * 3).to(dtype)
            parent = torch.randn(4, generator=g).sort(descending=True).values - 2
            old = torch.log_softmax(logits.float(), -1).topk(4, dim=-1)
            vals, ids = top_children(logits, 4, rounds=rounds)
            old_scores, new_scores = (parent[:, None] + old.values).flatten(), (parent[:, None] + vals).flatten()
            assert torch.equal(new_scores, old_scores)
            a = torch.sort(old_scores, descending=True, stable=True)
            b = torch.sort(new_scores, descending=True, stable=True)
            assert torch.equal(a.values[:4], b.values[:4])
            if not (old.values[:, 1:] == old.values[:, :-1]).any():
                assert torch.equal(ids, old.indices) and torch.equal(a.indices[:4], b.indices[:4])


def test_rounds_write_into_given_values_and_refuse_k_over_the_vocab():
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    out = torch.empty(3, 5)
    vals, ids = top_children(x, 5, rounds=True, values=out)
    assert vals is out and torch.equal(out, _stable(x, 5)[0]) and torch.equal(ids, _stable(x, 5)[1])
    buf = torch.zeros(8)
    vals, ids = top_children(x[0], 5, rounds=False, values=buf[2:7])
    assert vals.data_ptr() == buf[2:7].data_ptr() and torch.equal(buf[2:7], _stable(x[0], 5)[0])
    with pytest.raises(ValueError, match="top 41 of 40"):
        top_children(x, 41)


def test_the_cpu_default_is_the_topk_path_and_both_paths_agree_on_ties():
    """All-equal rows (every id tied): the lowest ids, in order, by either path and by default."""
    x = torch.zeros(2, 50)
    for rounds in (None, True, False):
        vals, ids = top_children(x, 4, rounds=rounds)
        assert ids.tolist() == [[0, 1, 2, 3]] * 2
        assert torch.equal(vals, torch.full((2, 4), -torch.log(torch.tensor(50.0))))
