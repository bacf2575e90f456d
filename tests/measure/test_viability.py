"""The viability arithmetic reproduces every figure of the K2.5 investigation."""

import math

import pytest
from hypothesis import given, strategies as st

from eaglekb.measure import viability as v
from eaglekb.io.errors import BadInput


@pytest.fixture(scope="module")
def k25():
    return v.plan(baseline_tok_s=82, cycle_ms=30, accept_len=2.0, targets=[150, 200], steps=2)


def test_investigation_spec_tok_s_and_breakeven(k25):
    assert k25.spec_tok_s == pytest.approx(66.67, abs=0.01)  # "about 67 tok/s"
    assert k25.breakeven_len == pytest.approx(2.46)  # 82 x 0.030
    assert k25.viable is False


def test_investigation_targets_need_4_5_and_6(k25):
    t150, t200 = k25.targets
    assert t150.required_accept_len == pytest.approx(4.5)
    assert t200.required_accept_len == pytest.approx(6.0)
    # The team's unbounded conversion: 78% and 83% per step.
    assert t150.required_p_unbounded == pytest.approx(0.778, abs=5e-4)
    assert t200.required_p_unbounded == pytest.approx(0.833, abs=5e-4)


def test_the_point_the_investigation_missed(k25):
    """With 2 steps the chain emits at most 3 tokens: both targets are unreachable."""
    assert k25.ceiling_len == 3
    assert [t.reachable for t in k25.targets] == [False, False]
    assert [t.required_p_steps for t in k25.targets] == [None, None]
    assert [t.fewest_steps for t in k25.targets] == [4, 6]
    for t in k25.targets:
        assert v.expected_accept_len(t.required_p_at_fewest_steps, t.fewest_steps) == pytest.approx(t.required_accept_len)


def test_finite_chain_p064_gives_2_05():
    assert v.expected_accept_len(0.64, 2) == pytest.approx(2.0496)


def test_breakeven_per_step_at_two_steps(k25):
    # 1 + p + p^2 = 2.46
    assert 1 + k25.breakeven_p_steps + k25.breakeven_p_steps**2 == pytest.approx(2.46)
    assert k25.breakeven_p_unbounded == pytest.approx(1 - 1 / 2.46)


def test_phase0_is_not_viable():
    r = v.plan(baseline_tok_s=82, cycle_ms=30, accept_len=1.5, steps=2)
    assert r.viable is False and r.spec_tok_s == pytest.approx(50.0)


def test_tree_ceiling_is_depth_plus_one_capped_by_budget():
    assert v.ceiling(3) == 4
    assert v.ceiling(3, draft_tokens=3) == 3
    r = v.plan(baseline_tok_s=100, cycle_ms=20, steps=5, topk=4, draft_tokens=8, targets=[400])
    assert r.ceiling_len == 6 and r.targets[0].reachable is False


@given(p=st.floats(0, 0.999), k=st.integers(1, 12))
def test_required_p_inverts_expected_len(p, k):
    e = v.expected_accept_len(p, k)
    q = v.required_p(e, k)
    assert q is not None
    assert v.expected_accept_len(q, k) == pytest.approx(e, rel=1e-9, abs=1e-9)
    assert 1 <= e <= k + 1


@given(p=st.floats(0, 0.99), k=st.integers(1, 10))
def test_finite_chain_below_unbounded(p, k):
    assert v.expected_accept_len(p, k) <= v.expected_accept_len(p, None) + 1e-12


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(baseline_tok_s=-1, cycle_ms=30),
        dict(baseline_tok_s=0, cycle_ms=30),
        dict(baseline_tok_s=82, cycle_ms=0),
        dict(baseline_tok_s=82, cycle_ms=math.nan),
        dict(baseline_tok_s=82, cycle_ms=30, accept_len=0.5),
        dict(baseline_tok_s=82, cycle_ms=30, steps=0),
        dict(baseline_tok_s=82, cycle_ms=30, targets=[-5]),
        dict(baseline_tok_s=82, cycle_ms=30, topk=0),
    ],
)
def test_bad_input_is_one_line(kwargs):
    with pytest.raises(BadInput) as exc:
        v.plan(**kwargs)
    assert "\n" not in str(exc.value) and "expected" in str(exc.value)


def test_metrics_carry_units(k25):
    from eaglekb.io.files import flatten
    from eaglekb.kb.schema import unit_of

    for path in flatten(v.metrics(k25)):
        assert unit_of(path.rsplit(".", 1)[-1]), path
