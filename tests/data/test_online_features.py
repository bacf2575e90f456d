"""OnlineFeatures: the mask-free, chunked-argmax pass equals the masked full-logits pass at every real token."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.models import VOCAB, tiny_causal_lm, tiny_llama_config, tiny_qwen2_config

from eaglekb.data.features import OnlineFeatures
from eaglekb.models import target as target_mod
from eaglekb.models.target import Target

LENGTHS = {"ragged": [20, 13, 1, 7], "unpadded": [12, 12, 12], "single": [1], "ones": [1, 1]}


def _batch(lengths: list[int], vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (pad id 0, as ``collate``) and their ``valid`` mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    valid = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g) * valid
    return ids, valid


def _reference(target: Target, ids, valid) -> dict:
    """The masked pass with full logits (what OnlineFeatures computed before)."""
    res = target.forward(ids, attention_mask=valid.long())
    return {"aux_hidden": res.aux_hidden, "target_argmax": res.logits.argmax(-1), "final_hidden": res.final_hidden}


def _assert_equal_at_valid(new: dict, ref: dict, valid, atol: float = 1e-5) -> None:
    assert set(new) == set(ref)
    for k in ("aux_hidden", "final_hidden"):
        assert new[k].shape == ref[k].shape and new[k].dtype == ref[k].dtype
        torch.testing.assert_close(new[k][valid], ref[k][valid], atol=atol, rtol=1e-5)
    assert new["target_argmax"].dtype == ref["target_argmax"].dtype
    assert torch.equal(new["target_argmax"][valid], ref["target_argmax"][valid])


class _Watch(TorchDispatchMode):
    """Records the largest ``[..., vocab]`` tensor any op returns and where each host read of a tensor value
    (``.item()``, ``int(t)``, ``bool(t)``: ``aten._local_scalar_dense``, a device sync on CUDA) comes from."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.largest, self.reads = vocab, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            f = sys._getframe(1)
            while f is not None and f"{os.sep}torch{os.sep}" in f.f_code.co_filename:
                f = f.f_back
            self.reads.append(f.f_code.co_filename if f is not None else "?")
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out

    def ours(self) -> list[str]:
        return [r for r in self.reads if f"{os.sep}eaglekb{os.sep}" in r]


@pytest.mark.parametrize("make", [tiny_llama_config, tiny_qwen2_config], ids=["llama", "qwen2"])
@pytest.mark.parametrize("case", list(LENGTHS))
def test_equal_to_the_masked_full_logits_pass_at_valid_positions(make, case):
    target = Target(tiny_causal_lm(make()))
    ids, valid = _batch(LENGTHS[case], VOCAB)
    new = OnlineFeatures(target)(ids, valid)
    _assert_equal_at_valid(new, _reference(target, ids, valid), valid)


def test_small_chunks_give_the_same_argmax():
    target = Target(tiny_causal_lm(tiny_llama_config()))
    ids, valid = _batch(LENGTHS["ragged"], VOCAB)
    whole = target.features(ids)
    for chunk in (1, 7, 16):
        assert torch.equal(target.features(ids, chunk=chunk).argmax, whole.argmax)


def test_without_final_hidden():
    target = Target(tiny_causal_lm(tiny_qwen2_config()))
    ids, valid = _batch(LENGTHS["ragged"], VOCAB)
    assert set(OnlineFeatures(target, store_final_hidden=False)(ids, valid)) == {"aux_hidden", "target_argmax"}


def test_other_model_types_take_the_full_forward(monkeypatch):
    monkeypatch.setattr(target_mod, "PLAIN_HEAD", frozenset())
    target = Target(tiny_causal_lm(tiny_llama_config()))
    ids, valid = _batch(LENGTHS["ragged"], VOCAB)
    _assert_equal_at_valid(OnlineFeatures(target)(ids, valid), _reference(target, ids, valid), valid)


def test_no_full_logits_and_no_host_reads_of_ours():
    target = Target(tiny_causal_lm(tiny_llama_config()))
    ids, valid = _batch([40, 33, 1, 27], VOCAB)
    with _Watch(VOCAB) as new:
        target.features(ids, chunk=16)
    assert new.largest == 32 * VOCAB and new.ours() == []  # lm_head.weight.t() (hidden 32); a chunk: 16 x VOCAB
    with _Watch(VOCAB) as old:  # the watch sees what the masked full forward does
        target.forward(ids, attention_mask=valid.long())
    assert old.largest == ids.numel() * VOCAB and old.ours()


def test_a_left_padded_batch_is_refused():
    target = Target(tiny_causal_lm(tiny_llama_config()))
    ids, valid = _batch(LENGTHS["ragged"], VOCAB)
    with pytest.raises(RuntimeError, match="right-padded"):
        OnlineFeatures(target)(ids, valid.flip(1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_targets_equal_the_masked_pass(name):
    from eaglekb.data.generation import load_target
    from eaglekb.models import sources

    folder = sources.model_dir(name)
    if not (folder / "config.json").is_file():
        pytest.skip(f"{name} not prepared (invoke models.prepare)")
    target = load_target(folder, device="cpu", dtype="float32")
    ids, valid = _batch([128, 97, 1, 64], target.vocab_size)
    _assert_equal_at_valid(OnlineFeatures(target)(ids, valid), _reference(target, ids, valid), valid, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(LENGTHS))
def test_on_cuda_equal_to_the_masked_pass(case):
    target = Target(tiny_causal_lm(tiny_llama_config()).to("cuda"))
    ids, valid = _batch(LENGTHS[case], VOCAB)
    ids, valid = ids.cuda(), valid.cuda()
    new = OnlineFeatures(target)(ids, valid)
    _assert_equal_at_valid(new, _reference(target, ids, valid), valid, atol=1e-4)


@pytest.mark.parametrize("make", [tiny_llama_config, tiny_qwen2_config], ids=["llama", "qwen2"])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_pass_equals_the_eager_one(make, backend):
    """``compile_features``: the decoder pass through torch.compile gives the eager pass's features at every real
    token, and batches of other shapes compile nothing more (batch and length dynamic from the first call)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    target = Target(tiny_causal_lm(make()))
    target.compile_features(counter)
    assert target.compiled_features
    for lengths in ([20, 13, 2, 7], [9, 9, 3], [31, 5, 30, 12, 2]):
        ids, valid = _batch(lengths, VOCAB)
        compiled = OnlineFeatures(target)(ids, valid)
        target._compiled_pass, keep = None, target._compiled_pass
        eager = OnlineFeatures(target)(ids, valid)
        target._compiled_pass = keep
        _assert_equal_at_valid(compiled, eager, valid)
        if lengths == [20, 13, 2, 7]:
            frames = counter.frame_count
    assert target.compiled_features and target.compile_error is None
    assert frames >= 1 and counter.frame_count == frames


def test_a_failing_compile_falls_back_to_the_eager_pass():
    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    torch._dynamo.reset()
    target = Target(tiny_causal_lm(tiny_llama_config()))
    target.compile_features(broken)
    ids, valid = _batch(LENGTHS["ragged"], VOCAB)
    got = OnlineFeatures(target)(ids, valid)
    assert not target.compiled_features and "no compiler here" in target.compile_error
    _assert_equal_at_valid(got, _reference(target, ids, valid), valid)


def test_other_model_types_are_not_compiled(monkeypatch):
    monkeypatch.setattr(target_mod, "PLAIN_HEAD", frozenset())
    target = Target(tiny_causal_lm(tiny_llama_config()))
    target.compile_features("aot_eager")
    assert not target.compiled_features
