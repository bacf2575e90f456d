"""P-EAGLE (parallel drafting): the drafter, its training unroll, the engine's one-pass chain and the offline probe
agree with each other; greedy decoding with it is exact; its config round-trips; EAGLE-3 is untouched (CPU, tiny)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.kv import causal_rows
from eaglekb.engine.model import TargetModel
from eaglekb.engine.parallel import parallel_chain
from eaglekb.io.errors import BadInput, Incompatible, SchemaError
from eaglekb.measure.probe import teacher_forced_preds
from eaglekb.models.drafter import Eagle3Drafter, load_drafter, save_drafter
from eaglekb.models.parallel_drafter import draft_pass, to_parallel
from eaglekb.models.target import default_capture_points
from eaglekb.training.config import TrainConfig
from eaglekb.training.loop import train
from eaglekb.training.parallel import ParallelTTTModel, as_parallel
from helpers.models import DRAFT_VOCAB, VOCAB, rewrite_config, tiny_causal_lm, tiny_drafter, tiny_llama_config, \
    tiny_qwen2_config
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

K = 4


def pdrafter(config=None, k: int = K, seed: int = 0) -> Eagle3Drafter:
    return to_parallel(tiny_drafter(config, seed=seed), k, seed=seed)


def target(kind: str = "llama", max_len: int = 96):
    cfg = (tiny_llama_config if kind == "llama" else tiny_qwen2_config)(max_position_embeddings=max_len)
    return cfg, TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), max_len)


def test_forward_shapes_and_the_unroll_is_the_one_pass_forward():
    """Depth d at anchor t of the training unroll = row d of one causal pass over [anchor t, k-1 mask rows]."""
    torch.manual_seed(0)
    d = pdrafter()
    embed = torch.randn(VOCAB, 32)
    ids = torch.randint(0, VOCAB, (2, 10))
    aux = torch.randn(2, 10, 96)
    with torch.no_grad():
        logits = ParallelTTTModel(d, embed, None).step_logits(ids, aux)
        assert len(logits) == K and all(x.shape == (2, 10, DRAFT_VOCAB) for x in logits)
        for t in (0, 3, 7):
            one = draft_pass(d, aux[:, :t + 1], embed[ids[:, 1:t + 2]])
            assert one.shape == (2, K, DRAFT_VOCAB)
            for depth in range(K):
                torch.testing.assert_close(one[:, depth], logits[depth][:, t], atol=1e-5, rtol=1e-5)
        # the mask rows see no later token: other tokens after the anchor change nothing before it
        ids2 = ids.clone()
        ids2[:, 6:] = (ids2[:, 6:] + 1) % VOCAB
        again = ParallelTTTModel(d, embed, None).step_logits(ids2, aux)
    assert all(torch.equal(a[:, :5], b[:, :5]) for a, b in zip(logits, again))


def test_a_training_step_reduces_the_loss_on_a_repeated_batch():
    torch.manual_seed(0)
    d = pdrafter()
    embed = torch.randn(VOCAB, 32)
    batch = {"input_ids": torch.randint(0, VOCAB, (2, 12)), "aux_hidden": torch.randn(2, 12, 96),
             "loss_mask": torch.ones(2, 12), "target_argmax": torch.randint(0, 2 * DRAFT_VOCAB, (2, 12)) // 2 * 2}
    model = ParallelTTTModel(d, embed, None)
    norms = torch.full((K,), 24.0)
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(12):
        loss, stats = model(batch, norms)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert stats.shape == (K, 5)
    assert losses[-1] < 0.7 * losses[0]
    assert d.mask_hidden.grad is not None and d.mask_embed.grad is not None


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("steps", [1, 2, K])
def test_speculative_with_a_parallel_drafter_is_exact(kind, steps):
    cfg, tm = target(kind)
    eng = Engine(tm, DraftModel(pdrafter(cfg), tm))
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(steps)).tolist()
    want = eng.generate(prompt, 30).tokens
    got = eng.speculative(prompt, 30, SpecConfig(steps=steps))
    assert got.tokens == want and sum(got.accept_lens) >= 29
    sampled = eng.speculative(prompt, 12, SpecConfig(steps=steps, temperature=0.8))
    assert len(sampled.tokens) == 12


def test_every_cycle_drafts_from_the_whole_verified_context(monkeypatch):
    """With an oracle accepting 0..k drafts per cycle, each cycle's one pass still equals the drafter's pass over
    the whole sequence so far: the cache keeps the verified positions and the mask slots are rewritten."""
    cfg, tm = target(max_len=128)
    d = pdrafter(cfg)
    eng = Engine(tm, DraftModel(d, tm))
    prompt = list(range(5, 14))
    want = eng.generate(prompt, 40).tokens
    real = Engine._parallel_draft
    rng = __import__("random").Random(0)
    checked = []

    def oracle(self, seq, pending, start, m, spec, extended):
        tree = real(self, seq, pending, start, m, spec, extended)
        ids = torch.tensor([seq[:m - 1]])
        ar = torch.arange(m - 1)
        _, aux = tm(ids, ar, ar, causal_rows(0, m - 1, m - 1, "cpu"), tm.new_cache(m - 1))
        with torch.no_grad():
            full = draft_pass(d, aux, tm.embed_weight[torch.tensor([seq[1:m]])])[0].argmax(-1)
        assert tree.tokens == self.drafter.to_target(full).tolist()
        checked.append(m)
        right = want[m - len(prompt):m - len(prompt) + K]
        j = rng.randint(0, min(K, len(right)))
        tree.tokens = right[:j] + tree.tokens[j:]
        return tree

    monkeypatch.setattr(Engine, "_parallel_draft", oracle)
    got = eng.speculative(prompt, 40, SpecConfig(steps=K))
    assert got.tokens == want and len(checked) > 5 and max(got.accept_lens) == K + 1 and min(got.accept_lens) == 1


def test_the_engine_chain_is_the_drafter_pass_and_the_probe_agrees():
    cfg, tm = target()
    d = pdrafter(cfg)
    dm = DraftModel(d, tm)
    seq = list(range(3, 17))
    L = len(seq)
    ids = torch.tensor([seq])
    ar = torch.arange(L)
    _, aux = tm(ids, ar, ar, causal_rows(0, L, L, "cpu"), tm.new_cache(L))
    with torch.no_grad():
        want = [dm.to_target(draft_pass(d, aux[:, :t + 1], tm.embed_weight[ids[:, 1:t + 2]])[0].argmax(-1)).tolist()
                for t in range(L - 1)]
    eng = Engine(tm, dm)
    tree = parallel_chain(dm, eng.dkv, seq[1:], aux[0, :L - 1], 0, steps=K)  # every position and the masks at once
    assert tree.tokens == want[-1] and tree.parents == [-1, 0, 1, 2]
    logits, _ = eng.draft_extend(seq[1:], aux[0, :L - 1], 0)  # the prompt's extend, then the mask rows alone
    assert parallel_chain(dm, eng.dkv, [], None, L - 1, steps=K, root_logits=logits[0, -1]).tokens == want[-1]
    preds, _ = teacher_forced_preds(tm, dm, seq, 4, K)
    for col, root in enumerate(range(3, L - K)):
        assert preds[:, col].tolist() == want[root]


def test_what_a_parallel_drafter_cannot_draft_is_refused():
    cfg, tm = target()
    eng = Engine(tm, DraftModel(pdrafter(cfg, k=3), tm))
    with pytest.raises(BadInput, match="chains only"):
        eng.speculative([1, 2, 3], 5, SpecConfig(steps=2, topk=2))
    with pytest.raises(BadInput, match="more draft steps"):
        eng.speculative([1, 2, 3], 5, SpecConfig(steps=4))
    with pytest.raises(BadInput, match="fused cycles"):
        Engine(tm, DraftModel(pdrafter(cfg, k=3), tm), fused=True)
    assert not Engine(tm, DraftModel(pdrafter(cfg, k=3), tm)).fused
    with pytest.raises(BadInput, match="out of range"):
        to_parallel(tiny_drafter(), 1)
    with pytest.raises(Incompatible, match="another number"):
        to_parallel(pdrafter(k=3), 4)


def test_config_round_trip_and_bad_configs(tmp_path):
    d = pdrafter()
    save_drafter(d, tmp_path / "p")
    doc = json.loads((tmp_path / "p" / "config.json").read_text())
    assert doc["eaglekb_method"] == "p-eagle" and doc["parallel_draft_tokens"] == K
    back = load_drafter(tmp_path / "p")
    assert type(back) is Eagle3Drafter and back.parallel_tokens == K
    for name, tensor in d.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    save_drafter(back, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == doc
    with pytest.raises(BadInput, match="sglang layout only"):
        save_drafter(d, tmp_path / "s", format="speculators")
    rewrite_config(tmp_path / "p", lambda c: c.update(eaglekb_method="dflash"))
    with pytest.raises(SchemaError, match="unknown drafting method"):
        load_drafter(tmp_path / "p")
    rewrite_config(tmp_path / "p", lambda c: c.update(eaglekb_method="p-eagle", parallel_draft_tokens=1))
    with pytest.raises(BadInput, match="out of range"):
        load_drafter(tmp_path / "p")


def test_eagle3_is_unchanged(tmp_path):
    d = tiny_drafter()
    save_drafter(d, tmp_path / "e")
    doc = json.loads((tmp_path / "e" / "config.json").read_text())
    assert "eaglekb_method" not in doc and "parallel_draft_tokens" not in doc
    back = load_drafter(tmp_path / "e")
    assert back.parallel_tokens == 0 and not hasattr(back, "mask_hidden")
    assert [n for n, _ in back.named_parameters()] == [n for n, _ in d.named_parameters()]
    assert as_parallel(back, "eagle3", K) is back
    with pytest.raises(Incompatible, match="P-EAGLE drafter"):
        as_parallel(pdrafter(), "eagle3", K)
    cfg = TrainConfig(data="d", out="o", ttt_steps=5)
    assert cfg.method == "eagle3" and cfg.unroll_steps == 5
    assert TrainConfig(data="d", out="o", method="p-eagle", parallel_tokens=3).unroll_steps == 3
    with pytest.raises(BadInput, match="unknown drafting method"):
        TrainConfig(data="d", out="o", method="dflash").check()
    with pytest.raises(BadInput, match="runtime positions"):
        TrainConfig(data="d", out="o", method="p-eagle", positions="specforge").check()


def test_finetune_trains_and_saves_a_p_eagle_drafter(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "run", data=str(data / "hard"), steps=4, lr=1e-2, val_fraction=0.0,
                        method="p-eagle", parallel_tokens=3), progress=False)
    assert rep["step"] == 4
    d = load_drafter(tmp_path / "run" / "drafter")
    assert d.parallel_tokens == 3 and d.mask_hidden.shape == (96,)


def test_p_eagle_continues_an_eagle3_drafter_with_its_own_mapping(data, tmp_path):
    """The P-EAGLE recipe's shape: --init an EAGLE-3 drafter, --mapping that drafter's folder. The new drafter keeps
    its draft vocabulary, starts from its layer (the mask positions are new), and drafts K tokens a pass."""
    train(cfg_for(data, tmp_path / "e3", steps=2), progress=False)
    init = tmp_path / "e3" / "drafter"
    before = load_drafter(init)
    rep = train(cfg_for(data, tmp_path / "pe", steps=1, lr=1e-9, val_fraction=0.0, method="p-eagle",
                        parallel_tokens=K, init=str(init), mapping=str(init)), progress=False)
    assert rep["step"] == 1
    after = load_drafter(tmp_path / "pe" / "drafter")
    assert after.parallel_tokens == K and torch.equal(after.d2t, before.d2t)
    common = [n for n, _ in before.named_parameters() if n in dict(after.named_parameters())]
    assert common
    got = dict(after.named_parameters())
    for name, p in before.named_parameters():  # a step at lr 1e-9 leaves the inherited weights where they were
        assert torch.allclose(got[name].float(), p.float(), atol=1e-5), name
