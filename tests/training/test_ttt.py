"""eaglekb.training.ttt: the TTT unroll is the drafter's own inference forward, step by step (CPU, tiny)."""

from __future__ import annotations

import pytest
import torch

from eaglekb.models.drafter import KVCache
from eaglekb.training.ttt import TTTModel, shift, step_norms
from helpers.models import tiny_drafter

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ttt_step_k_equals_the_inference_forward_with_a_kv_cache():
    """Step k at anchor t = the drafter's cached forward after t+1 verified tokens and k drafted ones."""
    torch.manual_seed(0)
    drafter = tiny_drafter().float()
    embed = torch.randn(128, 32)
    ids = torch.randint(0, 128, (1, 12))
    aux = torch.randn(1, 12, 96)
    ttt = TTTModel(drafter, embed, None, steps=3)
    with torch.no_grad():
        logits = ttt.step_logits(ids, aux)
        for t in (0, 4, 8):
            cache = KVCache()
            out = drafter(aux[:, : t + 1], inputs_embeds=embed[ids[:, 1:t + 2]], cache=cache)
            assert torch.allclose(out.logits[0, -1], logits[0][0, t], atol=1e-5)
            hidden = out.hidden[:, -1:]
            for k in (1, 2):
                out = drafter(hidden, inputs_embeds=embed[ids[:, t + k + 1:t + k + 2]], cache=cache)
                assert torch.allclose(out.logits[0, -1], logits[k][0, t], atol=1e-5), (t, k)
                hidden = out.hidden
        spec = TTTModel(drafter, embed, None, steps=3, positions="specforge").step_logits(ids, aux)
    assert torch.allclose(spec[0], logits[0], atol=1e-6) and not torch.allclose(spec[1], logits[1], atol=1e-4)


def test_shift_and_step_norms():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert shift(x, 0) is x
    assert shift(x, 1).tolist() == [[2.0, 3.0, 4.0, 0.0]]
    assert shift(x, 4).tolist() == [[0.0, 0.0, 0.0, 0.0]]
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    assert step_norms(mask, 3).tolist() == [3.0, 2.0, 1.0]  # the loss of step k is masked by token t+k+2
