"""The target's half-width copies on the CPU: a bfloat16 checkpoint's matrices held exactly by float16 (after a
power-of-two scale) run the row counts chosen for them, the steps give the float32 logits within float32 rounding
and greedy speculative decoding still equals plain greedy decoding; the per-row-count choice among plain, packed and
half-width on a virtual clock (no real sleeps); the modes' rules, the memory guard over both kinds of copies, the
refusals in one line and the bench record."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from helpers.models import VOCAB, bf16_exact, engine_steps, tiny_causal_lm, tiny_drafter, tiny_llama_config, \
    tiny_qwen2_config, write_tiny_target

from eaglekb.engine import cpu_packed
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput
from eaglekb.models import packed
from eaglekb.models.layers import linear
from eaglekb.models.target import default_capture_points

pytestmark = pytest.mark.skipif(not (packed.half_supported() and packed.supported()),
                                reason="this torch build has no FBGEMM float16 linear or no oneDNN packed linear")


def build(kind="llama", max_len=96, exact=True):
    cfg = (tiny_qwen2_config if kind == "qwen2" else tiny_llama_config)(max_position_embeddings=max_len)
    lm = tiny_causal_lm(cfg)
    return cfg, TargetModel(bf16_exact(lm) if exact else lm, default_capture_points(cfg.num_hidden_layers), max_len)


class VirtualClock:
    """A clock the fake step advances: no real time passes, so the choice cannot depend on the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_step(clock: VirtualClock, target, cost: dict[int, dict[str, float]]):
    """A target step of ``rows`` costing ``cost[rows][product]`` seconds for the product the target's copies run it
    on when it runs (10 s on the first call per product: the warm-up pass, which must not count)."""
    seen = set()

    def step(rows: int) -> None:
        on = [name for name, c in (("packed", target.packs), ("fp16", target.halves))
              if c is not None and rows in c.rows]
        assert len(on) <= 1  # a row count runs on one product at a time
        name = on[0] if on else "plain"
        clock.now += 10.0 if (rows, name) not in seen else cost[rows][name]
        seen.add((rows, name))
    return step


def test_a_target_half_set_runs_only_its_row_counts():
    """A HalfSet with row counts gives its copy for those alone (the product within float32 rounding of F.linear);
    other row counts keep F.linear; release drops the copy and the row counts."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 40, generator=g) * 0.05).bfloat16().float()
    halves = packed.HalfSet([w], rows={4})
    try:
        assert packed.half_for(w, 4) is not None and packed.half_for(w, 1) is None and packed.half_for(w, 5) is None
        x = torch.randn(1, 4, 40, generator=g)
        torch.testing.assert_close(linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
    finally:
        halves.release()
    assert halves.rows == set() and packed.half_for(w, 4) is None


def test_choose_picks_the_fastest_copy_per_row_count_beyond_the_margin():
    """Each row count is timed plain, packed and half-width; the fastest copy is kept where it beats plain by more
    than 10%; a copy 5% faster than plain is noise and the row count stays plain."""
    _, tm = build()
    clock = VirtualClock()
    tm.packs, tm.halves = packed.PackSet([]), packed.HalfSet([], rows=set())
    cost = {1: {"plain": 0.040, "packed": 0.050, "fp16": 0.025}, 2: {"plain": 0.040, "packed": 0.038, "fp16": 0.039},
            4: {"plain": 0.070, "packed": 0.040, "fp16": 0.045}, 16: {"plain": 0.130, "packed": 0.070, "fp16": 0.050}}
    copies = {"fp16": tm.halves, "packed": tm.packs}
    times = cpu_packed.choose(fake_step(clock, tm, cost), copies, (1, 2, 4, 16), clock=clock, repeats=3)
    assert tm.halves.rows == {1, 16} and tm.packs.rows == {4}
    assert times[2] == pytest.approx(cost[2])  # the warm-up's 10 s not counted
    assert cpu_packed.fastest(times, margin=0.0) == {1: "fp16", 2: "packed", 4: "packed", 16: "fp16"}


def test_auto_times_both_copies_and_keeps_the_ones_that_win(monkeypatch):
    """auto with both kinds: every row count timed on each, the copies of a kind that wins no row count released;
    the engine's products say which row counts run on which."""
    monkeypatch.setattr(cpu_packed, "CALIBRATE_MIN_NUMEL", 0)
    _, tm = build()
    clock = VirtualClock()
    cost = {r: {"plain": 0.05 * r, "packed": 0.06 + 0.001 * r, "fp16": 0.03 + 0.002 * r} for r in cpu_packed.PACK_ROWS}
    choice = cpu_packed.setup(tm, "auto", fake_step(clock, tm, cost), fp16="auto", clock=clock, available=lambda: 1e6)
    assert choice.fp16_rows == list(cpu_packed.PACK_ROWS) and choice.rows == []
    assert tm.packs is None and tm.halves.rows == set(cpu_packed.PACK_ROWS) and choice.mib == 0
    assert choice.fp16_mib == pytest.approx(packed.copies_mib(cpu_packed.target_weights(tm)) / 2)
    assert set(choice.step_ms["4"]) == {"plain", "packed", "fp16"} and "packed: no row count" in choice.why
    cost = {r: {"plain": 0.02 * r, "packed": 0.02 + 0.001 * r, "fp16": 0.03 + 0.0001 * r} for r in cost}
    _, other = build()
    mixed = cpu_packed.setup(other, "auto", fake_step(clock, other, cost), fp16="auto", clock=clock,
                             available=lambda: 1e6)
    assert mixed.rows and mixed.fp16_rows and not set(mixed.rows) & set(mixed.fp16_rows)
    assert 1 not in mixed.rows + mixed.fp16_rows  # 1 row: neither beats plain by the margin
    off = cpu_packed.setup(other, "auto", fake_step(clock, other, cost), fp16="off", clock=clock,
                           available=lambda: 1e6)
    assert off.fp16_rows == [] and other.halves is None and set(off.step_ms["4"]) == {"plain", "packed"}


def test_the_modes_rules_the_memory_guard_and_one_line_refusals(monkeypatch):
    """on runs every row count on the half-width copies without timing (packed auto then makes none); the memory
    guard counts both kinds together (fp16 first); off drops them; on is refused where a matrix would round, where
    the copies exceed the memory available, beside --cpu-packed on, and for compiled layers; an unknown mode is
    refused. Each refusal is one line naming --cpu-target-fp16."""
    monkeypatch.setattr(cpu_packed, "CALIBRATE_MIN_NUMEL", 0)
    _, tm = build()
    full = packed.copies_mib(cpu_packed.target_weights(tm))
    never = lambda rows: pytest.fail("timed although nothing is chosen by timing")  # noqa: E731
    on = cpu_packed.setup(tm, "auto", never, fp16="on", available=lambda: 1e6)
    assert on.fp16_rows == list(cpu_packed.PACK_ROWS) and on.rows == [] and tm.packs is None
    assert "--cpu-target-fp16 on takes every row count" in on.why
    clock = VirtualClock()
    cost = {r: {"plain": 1.0, "packed": 0.5, "fp16": 0.5} for r in cpu_packed.PACK_ROWS}
    half_only = cpu_packed.setup(tm, "auto", fake_step(clock, tm, cost), fp16="auto", clock=clock,
                                 available=lambda: 2.0 * full)  # room for the half-width copies (0.5) only
    assert half_only.fp16_rows and half_only.rows == [] and "packed copies" in half_only.why
    assert "exceed 50%" in half_only.why and tm.packs is None
    off = cpu_packed.setup(tm, "auto", never, fp16="off", available=lambda: 0.0)
    assert off.fp16_rows == [] and tm.halves is None and packed.half_for(tm.lm_head, 1) is None
    refusals = [dict(mode="auto", fp16="on", available=lambda: 0.4 * full),  # the copies take 0.5
                dict(mode="on", fp16="on"), dict(mode="auto", fp16="on", compiled=True),
                dict(mode="auto", fp16="sometimes")]
    for kw in refusals:
        mode = kw.pop("mode")
        with pytest.raises(BadInput, match="--cpu-target-fp16") as e:
            cpu_packed.setup(tm, mode, never, **kw)
        assert "\n" not in str(e.value) and tm.halves is None
    _, raw = build(exact=False)
    with pytest.raises(BadInput, match="--cpu-target-fp16 on") as e:
        cpu_packed.setup(raw, "off", never, fp16="on")
    assert "would round" in str(e.value) and raw.halves is None
    assert "held exactly" in cpu_packed.setup(raw, "off", never, fp16="auto").why
    assert cpu_packed.setup(tm, "off", never, fp16="auto", compiled=True).fp16_rows == []
    with pytest.raises(BadInput, match="--cpu-target-fp16") as e:
        Engine(tm, cpu_target_fp16="fast")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_engine_steps_on_half_copies_equal_the_float32_ones(kind):
    """With every row count on the half-width copies (on) the decode step and 5- and 12-row steps give the float32
    logits and aux within float32 rounding, and greedy speculative decoding, chain and tree, equals plain greedy
    decoding; the engine says which product each row count runs."""
    cfg, tm = build(kind)
    prompt = list(range(3, 14))
    n = len(prompt)

    def steps(mode):
        eng = Engine(tm, cpu_packed="off", cpu_target_fp16=mode)
        return eng, engine_steps(eng, tm, prompt)

    eng, half = steps("on")
    assert eng.cpu_packed.fp16_rows == list(cpu_packed.PACK_ROWS) and eng.cpu_products["12"] == "fp16"
    assert packed.half_for(tm.lm_head, 5) is not None and packed.half_for(tm.lm_head, 40) is None  # prefill: F.linear
    _, plain = steps("off")
    assert tm.halves is None
    for (lf, af), (lp, ap) in zip(half, plain):
        torch.testing.assert_close(lf, lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(af, ap, atol=1e-5, rtol=1e-5)
    eng = Engine(tm, DraftModel(bf16_exact(tiny_drafter(cfg)), tm), cpu_target_fp16="on")
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    want = eng.generate(prompt, 24).tokens
    for spec in (SpecConfig(steps=1), SpecConfig(steps=3), SpecConfig(steps=3, topk=3, draft_tokens=8)):
        assert eng.speculative(prompt, 24, spec).tokens == want
    Engine(tm, cpu_target_fp16="off")


def test_bench_records_the_target_half_copies(tmp_path, tiny_pair):
    """The bench records the mode, the row counts on half-width copies and their memory; an unknown mode is refused
    in one line."""
    from eaglekb.measure import bench

    _, drafter = tiny_pair
    target = write_tiny_target(tmp_path / "target", bf16_values=True)
    cfg = bench.BenchConfig(target=str(target), drafter=str(drafter), prompts="builtin", num_prompts=1,
                            max_new_tokens=4, sweep=[(2, 1, None)], repeats=1, warmup=0, peers=[],
                            cpu_target_fp16="on")
    r = bench.run(cfg, progress=False)
    assert r.config["cpu_target_fp16"] == "on" and r.config["cpu_target_fp16_rows"] == list(cpu_packed.PACK_ROWS)
    assert r.config["cpu_target_fp16_mib"] > 0 and r.config["cpu_products"]["4"] == "fp16"
    assert "target half-width copies (on)" in bench.render_text(r)
    with pytest.raises(BadInput, match="--cpu-target-fp16") as e:
        bench.run(bench.BenchConfig(target=str(target), drafter=str(drafter), cpu_target_fp16="fast"), progress=False)
    assert "\n" not in str(e.value)
