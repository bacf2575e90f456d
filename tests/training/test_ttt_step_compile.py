"""``--compile step``: the TTT unroll compiled one step at a time computes the whole unroll's result, and its graphs do
not grow with the depth (CPU, tiny drafter; graphs traced by ``aot_eager``, the ones inductor compiles).

Compile time itself is measured in finetune records (``metrics.wall.first_compile_s``), never here."""

from __future__ import annotations

import pytest
import torch

from eaglekb.io.errors import BadInput
from eaglekb.training import ttt
from eaglekb.training.config import TrainConfig
from eaglekb.training.loop import train
from eaglekb.training.ttt import TTTModel, diag_attention, step_norms, ttt_attention
from helpers.models import tiny_drafter
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(steps: int, positions: str = "runtime") -> TTTModel:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    head = torch.randn(128, 32, generator=g)
    return TTTModel(tiny_drafter().float(), torch.randn(128, 32, generator=g), head, steps=steps,
                    positions=positions, loss_chunk=4096)


def _batch(t: int = 14, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    valid = torch.zeros(3, t, dtype=torch.bool)
    for i, n in enumerate((t, t - 3, t // 2)):
        valid[i, :n] = True
    return {"input_ids": torch.randint(0, 128, (3, t), generator=g) * valid, "valid": valid,
            "loss_mask": (torch.rand(3, t, generator=g) > 0.3).float() * valid,
            "aux_hidden": torch.randn(3, t, 96, generator=g), "final_hidden": torch.randn(3, t, 32, generator=g),
            "target_argmax": torch.randint(0, 128, (3, t), generator=g)}


def _run(model: TTTModel, batch: dict):
    model.zero_grad(set_to_none=True)
    loss, stats = model(batch, step_norms(batch["loss_mask"], model.steps))
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_diag_attention_is_ttt_attention_with_dead_slots():
    """Slots past step k score -inf: the same output as ttt_attention over steps 0..k (grouped-query heads)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 7, 8, generator=g)
    keys = [torch.randn(2, 2, 7, 8, generator=g) for _ in range(4)]
    values = [torch.randn(2, 2, 7, 8, generator=g) for _ in range(4)]
    for k in (1, 2, 3):
        dk = torch.stack(keys[1:k + 1] + [torch.full_like(keys[0], 9.0)] * (3 - k))  # dead slots hold anything
        dv = torch.stack(values[1:k + 1] + [torch.full_like(values[0], 9.0)] * (3 - k))
        live = torch.arange(3) < k
        torch.testing.assert_close(diag_attention(q, keys[0], values[0], dk, dv, live),
                                   ttt_attention(q, keys[:k + 1], values[:k + 1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps,positions", [(1, "runtime"), (2, "runtime"), (5, "runtime"), (3, "specforge")])
def test_the_stepped_unroll_is_the_unroll(steps, positions):
    model, batch = _model(steps, positions), _batch()
    with torch.no_grad():
        whole = model._unroll(batch["input_ids"], batch["aux_hidden"])
        stepped = model._stepped_unroll(batch["input_ids"], batch["aux_hidden"])
    assert len(stepped) == steps
    for a, b in zip(stepped, whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps,graphs", [(1, 1), (2, 2), (5, 2)])
def test_a_step_compile_trains_as_eager_with_graphs_that_do_not_grow_with_depth(steps, graphs, monkeypatch):
    """Loss, counts and every gradient as the eager unroll; step 0's graph and one for every later step, whatever
    the depth, serving batches of every length."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", counter)
    model = _model(steps)
    model.compile_unroll("step")
    assert model.compiled and model.compile_scope == "step"
    for t in (14, 9, 23):
        ref_loss, ref_stats, ref_grads = _run(_model(steps), _batch(t))
        loss, stats, grads = _run(model, _batch(t))
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert torch.equal(stats[:, 1:], ref_stats[:, 1:])
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    assert model.compile_error is None and counter.frame_count == graphs


def test_a_step_compiled_run_trains_as_the_eager_run(data, tmp_path, monkeypatch):
    """Through ``train`` (batches of several lengths, validation eager): losses as the eager run's, the scope recorded."""
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", "aot_eager")
    eager = train(cfg_for(data, tmp_path / "eager", steps=3, compile="off", batching="length"), progress=False)
    fast = train(cfg_for(data, tmp_path / "step", steps=3, compile="step", batching="length"), progress=False)
    assert fast["speed"]["compile_scope"] == "step" and eager["speed"]["compile_scope"] is None
    assert fast["speed"]["compile_error"] is None and not fast["notes"]
    for step, loss in eager["history"]["train_loss"].items():
        assert fast["history"]["train_loss"][step] == pytest.approx(loss, rel=1e-5, abs=1e-6)


def test_step_compile_with_p_eagle_is_one_line():
    with pytest.raises(BadInput, match="--compile") as err:
        TrainConfig(data="d", out="o", method="p-eagle", parallel_tokens=4, compile="step").check()
    assert "\n" not in str(err.value) and "auto, on or off" in str(err.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_step_compile_on_cuda_trains_like_the_eager_run(data, tmp_path):
    """On CUDA (``-m gpu``): inductor, bf16 autocast, ``--compile step`` against the eager run (losses within 2e-2)."""
    ref = train(cfg_for(data, tmp_path / "ref", device="cuda", steps=4, compile="off", batching="length"),
                progress=False)
    fast = train(cfg_for(data, tmp_path / "step", device="cuda", steps=4, compile="step", batching="length"),
                 progress=False)
    assert fast["speed"]["compile_scope"] == "step", fast["speed"]["compile_error"]
    for step, loss in ref["history"]["train_loss"].items():
        assert fast["history"]["train_loss"][step] == pytest.approx(loss, rel=2e-2)
