"""The packed product on the CPU: oneDNN's matmul over packed weight copies equals F.linear; the engine's steps
and greedy speculative decoding are unchanged by it; the per-row-count choice is timed on a virtual clock (no real
sleeps: a timing test under load must not flip); the memory guard, the modes' rules and the bench record."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.nn import functional as F

from helpers.models import VOCAB, engine_steps, tiny_causal_lm, tiny_drafter, tiny_llama_config, tiny_qwen2_config

from eaglekb.engine import cpu_packed
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models import packed
from eaglekb.models.layers import linear
from eaglekb.models.target import default_capture_points

pytestmark = pytest.mark.skipif(not packed.supported(), reason="this torch build has no oneDNN packed linear")


def build(kind="qwen2", max_len=96):
    cfg = (tiny_qwen2_config if kind == "qwen2" else tiny_llama_config)(max_position_embeddings=max_len)
    return cfg, TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8, 12, 16, 40])
def test_packed_linear_is_the_same_product(rows):
    """layers.linear over a packed copy equals F.linear within float32 rounding: with and without a bias, 2-D and
    3-D inputs; row counts the set does not run packed keep the other products."""
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 40, generator=g), torch.randn(96, generator=g)
    packs = packed.PackSet([w])
    packs.rows = {rows}
    try:
        assert packed.packed_for(w, rows) is not None and packed.packed_for(w, rows + 1) is None
        for x in (torch.randn(rows, 40, generator=g), torch.randn(1, rows, 40, generator=g)):
            for bias in (None, b):
                y = linear(x, w, bias)
                assert y.shape == (*x.shape[:-1], 96)
                torch.testing.assert_close(y, F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    finally:
        packs.release()
    assert packed.packed_for(w, rows) is None


def test_copies_are_counted_skipped_and_freed():
    """A PackSet counts its copies' memory, packs float32 CPU matrices only (one copy per matrix), and its
    entries go with it (release) or with the weight (garbage collected)."""
    w, h = torch.randn(64, 32), torch.randn(64, 32).bfloat16()
    packs = packed.PackSet([w, w, h])
    assert len(packs) == 1 and packs.mib == pytest.approx(64 * 32 * 4 / 2**20)
    assert packed.copies_mib([w, h]) == packs.mib
    packs.rows = {2}
    key = id(w)
    del w
    gc.collect()
    assert key not in packed._COPIES  # the copy went with its weight
    packs.release()
    assert packs.rows == set() and packs.mib == 0
    assert packed.fits(10, 20) and not packed.fits(11, 20) and not packed.fits(1, None)
    assert packed.available_mib() is None or packed.available_mib() > 0


class VirtualClock:
    """A clock the fake step advances: no real time passes, so the choice cannot depend on the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_step(clock: VirtualClock, packs, cost: dict[int, tuple[float, float]], calls: list | None = None):
    """A target step of ``rows`` that costs ``cost[rows]`` = (plain, packed) seconds, and 10 s on its first call
    per product (the warm-up pass, which must not count)."""
    seen = set()

    def step(rows: int) -> None:
        mode = rows in packs.rows
        clock.now += 10.0 if (rows, mode) not in seen else cost[rows][mode]
        seen.add((rows, mode))
        if calls is not None:
            calls.append((rows, mode))
    return step


def test_choose_keeps_packed_only_beyond_the_margin():
    """Each row count is timed plain and packed (warm-up first, then repeats alternating which goes first); packed
    is kept where it is faster by more than 10%: 5% faster is noise and stays plain."""
    clock, packs = VirtualClock(), packed.PackSet([])
    cost = {1: (0.040, 0.050), 2: (0.040, 0.038), 4: (0.070, 0.040), 16: (0.130, 0.070)}
    calls = []
    times = cpu_packed.choose(fake_step(clock, packs, cost, calls), {"packed": packs}, (1, 2, 4, 16), clock=clock,
                              repeats=3)
    assert packs.rows == {4, 16}
    assert times[2] == pytest.approx({"plain": 0.040, "packed": 0.038})  # the warm-up's 10 s not counted
    assert calls[:8] == [(1, False), (1, True), (1, True), (1, False), (1, False), (1, True), (1, True), (1, False)]
    assert cpu_packed.fastest(times, margin=0.0) == {2: "packed", 4: "packed", 16: "packed"}


def test_auto_times_the_target_step_and_keeps_the_times(monkeypatch):
    """auto on a model large enough to time: copies made, each row count timed through the step given, the
    faster kept; a second engine over the same target reuses the times (no step runs); a step that never gains
    leaves no copies."""
    monkeypatch.setattr(cpu_packed, "CALIBRATE_MIN_NUMEL", 0)
    _, tm = build()
    clock, calls = VirtualClock(), []
    cost = {r: (0.05 * r, 0.05 + 0.001 * r) for r in cpu_packed.PACK_ROWS}  # packed from 2 rows
    step = fake_step(clock, _Deferred(tm), cost, calls)
    choice = cpu_packed.setup(tm, "auto", step, clock=clock, available=lambda: 1e6)
    assert choice.rows == [r for r in cpu_packed.PACK_ROWS if r > 1] and tm.packs.rows == set(choice.rows)
    assert choice.mib == pytest.approx(packed.copies_mib(cpu_packed.target_weights(tm))) and choice.mib > 0
    assert set(choice.step_ms) == {str(r) for r in cpu_packed.PACK_ROWS}
    n = len(calls)
    again = cpu_packed.setup(tm, "auto", step, clock=clock, available=lambda: 1e6)
    assert again.rows == choice.rows and len(calls) == n  # times kept per target and thread count
    _, other = build()
    none = cpu_packed.setup(other, "auto", fake_step(clock, _Deferred(other), {r: (0.05, 0.05) for r in cost}),
                            clock=clock, available=lambda: 1e6)
    assert none.rows == [] and none.mib == 0 and other.packs is None and "none kept" in none.why


class _Deferred:
    """The target's PackSet as the step sees it when it runs (setup makes it after the step is built)."""

    def __init__(self, target):
        self.target = target

    @property
    def rows(self):
        return self.target.packs.rows if self.target.packs is not None else set()


def test_memory_guard_and_the_modes_rules(monkeypatch):
    """auto makes no copies beyond half the memory available; on packs every row count without timing, refused
    where the copies exceed all of it; off drops copies a target had; other dtypes and compiled layers: auto
    packs nothing, on is refused; an unknown mode is refused. Each refusal is one line naming --cpu-packed."""
    monkeypatch.setattr(cpu_packed, "CALIBRATE_MIN_NUMEL", 0)
    _, tm = build()
    mib = packed.copies_mib(cpu_packed.target_weights(tm))
    never = lambda rows: pytest.fail("timed although no copies may be made")  # noqa: E731
    guard = cpu_packed.setup(tm, "auto", never, available=lambda: 1.9 * mib)
    assert guard.rows == [] and tm.packs is None and "exceed 50%" in guard.why
    on = cpu_packed.setup(tm, "on", never, available=lambda: 1.9 * mib)
    assert on.rows == list(cpu_packed.PACK_ROWS) and tm.packs is not None and on.mib == pytest.approx(mib)
    off = cpu_packed.setup(tm, "off", never)
    assert off.rows == [] and tm.packs is None and packed.packed_for(tm.lm_head, 1) is None
    with pytest.raises(BadInput) as exc:
        cpu_packed.setup(tm, "on", never, available=lambda: 0.5 * mib)
    assert "--cpu-packed on" in str(exc.value) and "\n" not in str(exc.value)
    assert cpu_packed.setup(tm, "auto", never, compiled=True).rows == []
    with pytest.raises(BadInput, match="compiled"):
        cpu_packed.setup(tm, "on", never, compiled=True)
    with pytest.raises(BadInput, match="--cpu-packed"):
        cpu_packed.setup(tm, "sometimes", never)
    _, bf = build()
    bf.dtype = torch.bfloat16
    assert "float32 only" in cpu_packed.setup(bf, "auto", never).why
    with pytest.raises(BadInput, match="float32"):
        cpu_packed.setup(bf, "on", never)


def test_a_tiny_model_is_not_timed():
    """auto leaves matrices too small to time alone (the test models: microseconds are noise, not a choice)."""
    _, tm = build()
    eng = Engine(tm)
    assert eng.cpu_packed.mode == "auto" and eng.cpu_packed.rows == [] and tm.packs is None
    assert "too small" in eng.cpu_packed.why
    with pytest.raises(BadInput, match="--cpu-packed"):
        Engine(tm, cpu_packed="maybe")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_engine_steps_on_packed_copies_equal_the_plain_ones(kind):
    """With every row count packed (on) the engine's decode step and 5- and 12-row steps give the same logits and
    aux as without (off), and greedy speculative decoding, chain and tree, still equals plain greedy decoding;
    the engine says which product each row count runs."""
    cfg, tm = build(kind)
    prompt = list(range(3, 14))
    n = len(prompt)

    def steps(mode):
        eng = Engine(tm, cpu_packed=mode)
        return eng, engine_steps(eng, tm, prompt)

    eng, fast = steps("on")
    assert eng.cpu_packed.rows == list(cpu_packed.PACK_ROWS) and eng.cpu_products["12"] == "packed"
    assert packed.packed_for(tm.lm_head, 5) is not None
    _, plain = steps("off")
    assert tm.packs is None and packed.packed_for(tm.lm_head, 5) is None
    for (lf, af), (lp, ap) in zip(fast, plain):
        torch.testing.assert_close(lf, lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(af, ap, atol=1e-5, rtol=1e-5)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm), cpu_packed="on")
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    want = eng.generate(prompt, 24).tokens
    for spec in (SpecConfig(steps=3), SpecConfig(steps=3, topk=3, draft_tokens=8)):
        assert eng.speculative(prompt, 24, spec).tokens == want
    Engine(tm, cpu_packed="off")


def test_bench_records_the_packed_product(tiny_pair):
    """The bench records the mode, the row counts packed, the copies' memory and the engine's start time."""
    from eaglekb.measure import bench

    target, drafter = tiny_pair
    cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                            max_new_tokens=4, sweep=[(2, 1, None)], repeats=1, warmup=0, peers=[], cpu_packed="on")
    r = bench.run(cfg, progress=False)
    assert r.config["cpu_packed"] == "on" and r.config["cpu_packed_rows"] == list(cpu_packed.PACK_ROWS)
    assert r.config["cpu_packed_mib"] > 0 and r.metrics["engine"]["start_s"] > 0
    assert "packed products (on)" in bench.render_text(r)
    with pytest.raises(BadInput, match="--cpu-packed"):
        bench.run(bench.BenchConfig(target=str(target), drafter=str(drafter), cpu_packed="fast"), progress=False)
