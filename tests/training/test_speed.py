"""The training speed levers change no result: chunked loss, compiled unroll and loss, bf16 autocast, profile, features
once.

Each lever against its reference on the same tiny batch: the loss, the per-step counts and every parameter's
gradient, within the tolerance the test states (float32: 1e-5; bfloat16 autocast: 2e-2 on the loss, 5e-2 on the
relative gradient norm). Speed itself is measured in finetune baselines (``--profile``), never here.
"""

from __future__ import annotations

import copy

import pytest
import torch

from eaglekb.data.features import OnlineFeatures
from eaglekb.io.errors import BadInput
from eaglekb.training import ttt
from eaglekb.training.config import TrainConfig
from eaglekb.training.loop import train
from eaglekb.training.report import baseline_fields, render_text
from eaglekb.training.speed import PHASES, StepProfile
from eaglekb.training.ttt import TTTModel, step_norms
from helpers.models import tiny_drafter
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 3


def _batch(soft: bool, seed: int = 0) -> dict:
    """Three right-padded sequences (lengths 14, 11, 6), loss masks with gaps, targets in and out of the draft vocab."""
    g = torch.Generator().manual_seed(seed)
    b, t = 3, 14
    valid = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate((14, 11, 6)):
        valid[i, :n] = True
    mask = (torch.rand(b, t, generator=g) > 0.3).float() * valid
    batch = {"input_ids": torch.randint(0, 128, (b, t), generator=g) * valid, "loss_mask": mask, "valid": valid,
             "aux_hidden": torch.randn(b, t, 96, generator=g),
             "target_argmax": torch.randint(0, 128, (b, t), generator=g)}
    if soft:
        batch["final_hidden"] = torch.randn(b, t, 32, generator=g)
    return batch


def _model(loss_chunk: int, soft: bool = True) -> TTTModel:
    torch.manual_seed(0)
    drafter = tiny_drafter().float()
    g = torch.Generator().manual_seed(5)
    head = torch.randn(128, 32, generator=g) if soft else None
    return TTTModel(drafter, torch.randn(128, 32, generator=g), head, steps=STEPS, loss_chunk=loss_chunk)


def _run(model: TTTModel, batch: dict):
    loss, stats = model(batch, step_norms(batch["loss_mask"], STEPS))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), stats, grads


@pytest.mark.parametrize("soft", [True, False], ids=["soft", "hard"])
@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_loss_equals_full_logits(soft, chunk):
    """The chunked loss (gradient formed chunk by chunk, no full logits) = full logits: loss, counts, gradients."""
    ref_loss, ref_stats, ref_grads = _run(_model(0, soft), _batch(soft))
    loss, stats, grads = _run(_model(chunk, soft), _batch(soft))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(stats[:, 1:], ref_stats[:, 1:])  # positions, correct, chain counts: exactly
    torch.testing.assert_close(stats[:, 0], ref_stats[:, 0], rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and "drafter.lm_head.weight" in grads
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def compiled():
    """One model whose unroll is compiled by ``aot_eager`` (traced graphs run without code generation: the same
    graphs inductor compiles), counted: (model, counter). A compile is most of a test's time, and the three tests
    below ask the same model different questions; each zeroes the gradients before its backward, and the counter
    says how many graphs were compiled in all (one: the first call's, whatever ran since)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ttt, "COMPILE_BACKEND", counter)
        model = _model(4096)
        model.compile_unroll()
    return model, counter


def test_compiled_unroll_equals_eager(compiled):
    """torch.compile of the unroll (traced graphs run by ``aot_eager``: the same graphs inductor compiles)."""
    ref_loss, ref_stats, ref_grads = _run(_model(4096), _batch(True))
    model, _ = compiled
    model.zero_grad(set_to_none=True)
    loss, stats, grads = _run(model, _batch(True))
    assert model.compiled and model.compile_error is None
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(stats[:, 1:], ref_stats[:, 1:])
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_compiled_run_trains_as_the_eager_run(data, tmp_path, monkeypatch, backend):
    """Through ``train``: batches of several lengths (recompiles), validation without gradients; losses to 1e-5."""
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", backend)
    eager = train(cfg_for(data, tmp_path / "eager", steps=4, compile="off", batching="length"), progress=False)
    fast = train(cfg_for(data, tmp_path / "fast", steps=4, compile="on", batching="length"), progress=False)
    assert fast["speed"]["compiled_unroll"] and fast["speed"]["compiled_loss"]
    assert fast["speed"]["compile_error"] is None and not fast["notes"]
    for step, loss in eager["history"]["train_loss"].items():
        assert fast["history"]["train_loss"][step] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert fast["val"]["loss"] == pytest.approx(eager["val"]["loss"], rel=1e-5)


@pytest.mark.parametrize("soft", [True, False], ids=["soft", "hard"])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_loss_chunks_equal_eager(soft, backend, monkeypatch):
    """The loss's chunk through torch.compile (``compile_loss``): loss, counts and gradients as the eager chunk, and
    one graph for chunks of several lengths (chunks of 5 over the batch's loss positions: the last is shorter)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend(backend)
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", counter)
    ref_loss, ref_stats, ref_grads = _run(_model(5, soft), _batch(soft))
    model = _model(5, soft)
    model.compile_loss()
    loss, stats, grads = _run(model, _batch(soft))
    assert model.compiled_loss and not model.compiled and model.compile_error is None
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(stats[:, 1:], ref_stats[:, 1:])
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    assert counter.frame_count == 1


def test_full_logits_compile_no_loss():
    """With full logits (``loss_chunk`` 0) there is no chunk to compile: ``compile_loss`` leaves the loss eager."""
    model = _model(0)
    model.compile_loss()
    assert not model.compiled_loss


def test_a_compiled_run_on_online_features_compiles_the_target_too(data, tmp_path, monkeypatch):
    """Online features under ``--compile on``: the target's pass compiled as well, the losses as the eager run's."""
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", "aot_eager")
    online = dict(data=str(data / "online"), online_target=str(data / "target"), steps=3, val_fraction=0.0,
                  batching="length")
    eager = train(cfg_for(data, tmp_path / "eager", compile="off", **online), progress=False)
    fast = train(cfg_for(data, tmp_path / "fast", compile="on", **online), progress=False)
    assert fast["speed"]["compiled_target"] and not eager["speed"]["compiled_target"] and not fast["notes"]
    for step, loss in eager["history"]["train_loss"].items():
        assert fast["history"]["train_loss"][step] == pytest.approx(loss, rel=1e-5, abs=1e-6)


def test_a_target_compile_that_fails_later_is_reported(data, tmp_path, monkeypatch):
    """The target's compiled pass failing after the first batch: the eager pass takes over, the run's notes and
    ``speed.target_compile_error`` say why, and the losses are the eager run's."""
    from eaglekb.models.target import Target

    monkeypatch.setattr(ttt, "COMPILE_BACKEND", "aot_eager")
    compile_features = Target.compile_features

    def fails_on_the_second_call(self, backend="inductor"):
        compile_features(self, backend)
        compiled, calls = self._compiled_pass, []

        def once(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("graph broke on batch two")
            return compiled(*args, **kwargs)
        self._compiled_pass = once

    monkeypatch.setattr(Target, "compile_features", fails_on_the_second_call)
    online = dict(data=str(data / "online"), online_target=str(data / "target"), steps=3, val_fraction=0.0,
                  batching="length")
    eager = train(cfg_for(data, tmp_path / "eager", compile="off", **online), progress=False)
    late = train(cfg_for(data, tmp_path / "late", compile="on", **online), progress=False)
    assert not late["speed"]["compiled_target"] and "graph broke on batch two" in late["speed"]["target_compile_error"]
    assert any("failed during the run" in n and "graph broke on batch two" in n for n in late["notes"])
    assert eager["speed"]["target_compile_error"] is None
    for step, loss in eager["history"]["train_loss"].items():
        assert late["history"]["train_loss"][step] == pytest.approx(loss, rel=1e-5, abs=1e-6)


def _broken_backend(gm, example_inputs):
    raise RuntimeError("no compiler here")


def test_a_failing_compile_falls_back_to_the_eager_unroll(data, tmp_path, monkeypatch):
    """The model says why and runs eager; a run with a compiler that fails trains exactly as the eager run."""
    monkeypatch.setattr(ttt, "COMPILE_BACKEND", _broken_backend)
    model = _model(4096)
    model.compile_unroll()
    model.compile_loss()
    loss, _, _ = _run(model, _batch(True))
    assert not model.compiled and not model.compiled_loss and "no compiler here" in model.compile_error
    torch.testing.assert_close(loss, _run(_model(4096), _batch(True))[0])
    eager = train(cfg_for(data, tmp_path / "eager", steps=3, compile="off"), progress=False)
    broken = train(cfg_for(data, tmp_path / "broken", steps=3, compile="on"), progress=False)
    assert any("torch.compile of the TTT unroll and loss failed" in n for n in broken["notes"])
    assert not broken["speed"]["compiled_unroll"] and "no compiler here" in broken["speed"]["compile_error"]
    assert broken["history"]["train_loss"] == eager["history"]["train_loss"]


def test_bf16_autocast_is_close_to_float32():
    """The bf16 lever (autocast over float32 master weights), run on the CPU's bf16 kernels: loss within 2e-2,
    each gradient within 5e-2 of its norm."""
    ref_loss, _, ref_grads = _run(_model(4096), _batch(True))
    model = _model(4096)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = model(_batch(True), step_norms(_batch(True)["loss_mask"], STEPS))
    loss.backward()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay float32
    torch.testing.assert_close(loss.float(), ref_loss, rtol=2e-2, atol=0)
    for name, p in model.named_parameters():
        if p.grad is not None:
            ref = ref_grads[name]
            assert (p.grad - ref).norm() <= 5e-2 * ref.norm() + 1e-8, name


def test_profile_reports_every_phase_of_a_step(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "p", data=str(data / "online"), online_target=str(data / "target"),
                        steps=4, val_fraction=0.0, profile=True), progress=False)
    prof = rep["profile"]
    assert prof["steps"] == 3 and prof["timer"] == "wall clock"  # the first step (warm-up) is left out
    assert set(prof["ms_per_step"]) == set(PHASES) and all(v >= 0 for v in prof["ms_per_step"].values())
    assert prof["ms_per_step"]["target"] > 0 and prof["ms_per_step"]["unroll"] > 0
    assert sum(prof["share"].values()) == pytest.approx(1.0, abs=1e-3)
    metrics = baseline_fields(rep)["metrics"]["profile"]
    assert metrics["steps_count"] == 3 and {f"{p}_ms" for p in PHASES} <= set(metrics)
    assert "where a step's time goes" in render_text(rep)
    assert train(cfg_for(data, tmp_path / "q", steps=2), progress=False)["profile"] is None  # off by default


def test_the_target_runs_once_per_batch(data, tmp_path, monkeypatch):
    calls = []
    real = OnlineFeatures.__call__

    def counted(self, input_ids, valid):
        calls.append(tuple(input_ids.shape))
        return real(self, input_ids, valid)

    monkeypatch.setattr(OnlineFeatures, "__call__", counted)
    train(cfg_for(data, tmp_path / "o", data=str(data / "online"), online_target=str(data / "target"), steps=3,
                  val_fraction=0.0), progress=False)
    assert len(calls) == 3  # one target forward per optimiser step, whatever the TTT depth


def test_bad_lever_values_are_one_line():
    for over, where in ((dict(amp="fp8"), "--amp"), (dict(compile="maybe"), "--compile"), (dict(loss_chunk=-1),
                                                                                          "--loss-chunk")):
        with pytest.raises(BadInput, match=where) as err:
            TrainConfig(data="d", out="o", **over).check()
        assert "\n" not in str(err.value)
    assert copy.copy(TrainConfig(data="d", out="o")).loss_chunk > 0  # chunked by default


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_levers_train_like_the_reference(data, tmp_path):
    """On CUDA (``-m gpu``): inductor-compiled unroll + chunked loss against eager + full logits, both under bf16
    autocast (losses within 2e-2), and the float32 runs within 1e-4; the profile times with CUDA events."""
    for amp, tol in (("bfloat16", 2e-2), ("none", 1e-4)):
        ref = train(cfg_for(data, tmp_path / f"ref-{amp}", device="cuda", steps=4, amp=amp, compile="off",
                            loss_chunk=0, batching="length"), progress=False)
        fast = train(cfg_for(data, tmp_path / f"fast-{amp}", device="cuda", steps=4, amp=amp, compile="on",
                             loss_chunk=4096, profile=True, batching="length"), progress=False)
        assert fast["speed"]["compiled_unroll"], fast["speed"]["compile_error"]
        assert fast["profile"]["timer"] == "cuda events" and fast["profile"]["steps"] == 3
        for step, loss in ref["history"]["train_loss"].items():
            assert fast["history"]["train_loss"][step] == pytest.approx(loss, rel=tol)


def test_one_compile_serves_every_batch_length(compiled):
    """The sequence length is dynamic from the first compile: batches of other lengths compile nothing more."""
    model, counter = compiled
    model.zero_grad(set_to_none=True)
    for t in (14, 9, 23):
        batch = {k: v[:, :t].contiguous() if v.dim() > 1 and v.shape[1] == 14 else v for k, v in _batch(True).items()}
        if t > 14:  # longer than the fixture: pad every per-position tensor to t
            batch = {k: torch.cat([v, torch.zeros(v.shape[0], t - 14, *v.shape[2:], dtype=v.dtype)], 1)
                     for k, v in batch.items()}
        _run(model, batch)
    assert model.compiled and model.compile_error is None
    assert counter.frame_count == 1


def test_validation_runs_the_eager_unroll_and_compiles_nothing(compiled):
    """Without gradients (validation) the unroll runs eager: a graph without autograd would be a second compile."""
    model, counter = compiled
    model.zero_grad(set_to_none=True)
    batch = _batch(True)
    _run(model, batch)
    with torch.no_grad():
        hiddens = model.hiddens(batch["input_ids"], batch["aux_hidden"])
        eager = model._unroll(batch["input_ids"], batch["aux_hidden"])
    assert counter.frame_count == 1 and model.compiled
    for a, b in zip(hiddens, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Timed:
    """A finished step's phase seconds, as ``PhaseTimer`` gives them."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def stop(self):
        pass

    def totals(self):
        return {"unroll": self.seconds, "backward": self.seconds / 2}


def test_profile_leaves_out_compile_stalls_and_counts_them():
    prof = StepProfile(torch.device("cpu"), True)
    for secs in [30.0, 0.1, 20.0, 0.1, 0.12, 0.1, 0.1, 5.0, 0.1]:  # the first step, then two stalls among steady ones
        prof.add(_Timed(secs))
    rep = prof.report()
    assert rep["steps"] == 6 and rep["stalls"] == 2 and rep["stall_ms"] == pytest.approx(37500.0)
    assert rep["ms_per_step"]["unroll"] == pytest.approx(1000 * 0.62 / 6, abs=1e-3)
    steady = StepProfile(torch.device("cpu"), True)
    for secs in [1.0, 0.2, 0.3, 0.25]:
        steady.add(_Timed(secs))
    assert steady.report()["stalls"] == 0 and steady.report()["steps"] == 3
