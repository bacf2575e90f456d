"""probe: teacher-forced acceptance matches the inference path; online metrics; runbook errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.models import DRAFT_VOCAB, VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config

from eaglekb.measure import probe
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine
from eaglekb.engine.kv import causal_rows
from eaglekb.engine.model import TargetModel
from eaglekb.io.errors import BadInput, Incompatible, MissingFile
from eaglekb.models.target import default_capture_points

ROOT = Path(__file__).resolve().parents[2]
def _sequential_chain(tm, dm, seq, root, steps):
    """Reference: the inference path (extend 0..root, then a chain fed the true tokens)."""
    dev = tm.device
    L = len(seq)
    ar = torch.arange(L)
    _, aux = tm(torch.tensor([seq]), ar, ar, causal_rows(0, L, L, dev), tm.new_cache(L))
    dkv = dm.new_cache(L + steps)
    n = root + 1
    j = torch.arange(n)
    logits, hidden = dm(torch.tensor([seq[1:n + 1]]), aux[:, :n], j, j, causal_rows(0, n, n, dev), dkv)
    preds = [int(dm.to_target(logits[0, -1].argmax()))]
    h = hidden[:, -1:]
    for s in range(1, steps):
        slot = n + s - 1
        logits, h = dm(torch.tensor([[seq[root + 1 + s]]]), h, torch.tensor([root + s]), torch.tensor([slot]),
                       causal_rows(slot, 1, slot + 1, dev), dkv)
        preds.append(int(dm.to_target(logits[0, -1].argmax())))
    return preds


def test_teacher_forced_equals_sequential_inference_path():
    cfg = tiny_llama_config(max_position_embeddings=128)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), 128)
    dm = DraftModel(tiny_drafter(cfg, seed=4), tm)
    seq = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    steps, prompt_len = 4, 10
    preds, labels = probe.teacher_forced_preds(tm, dm, seq, prompt_len, steps)
    for k, root in enumerate(range(prompt_len - 1, len(seq) - steps)):
        if k % 7:
            continue
        assert preds[:, k].tolist() == _sequential_chain(tm, dm, seq, root, steps), root


def test_teacher_forced_counts_the_tokens_the_draft_vocabulary_holds():
    """in_draft_vocab_frac is the share of the target's own next tokens in d2t's set: step 1's ceiling."""
    cfg = tiny_llama_config(max_position_embeddings=128)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), 128)
    selected = set(range(0, 2 * DRAFT_VOCAB, 2))
    dm = DraftModel(tiny_drafter(cfg, seed=4), tm)  # tiny_drafter's default mapping: these target ids
    seq = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    correct, held = probe.teacher_forced(tm, dm, seq, 10, 3)
    _, labels = probe.teacher_forced_preds(tm, dm, seq, 10, 3)
    assert held.tolist() == [t in selected for t in labels[0].tolist()]
    m = probe.offline_metrics(correct, held)
    assert m["in_draft_vocab_frac"] == pytest.approx(sum(t in selected for t in labels[0].tolist()) / labels.shape[1])
    assert 0 < m["in_draft_vocab_frac"] < 1
    assert m["acc_step1_frac"] <= m["in_draft_vocab_frac"]
    assert not (correct[0] & ~held).any()  # a token the draft vocabulary lacks is never drafted


def test_offline_metrics_chain_arithmetic():
    correct = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    m = probe.offline_metrics(correct)
    assert m["acc_step1_frac"] == 0.75 and m["full_acc_step2_frac"] == 0.5 and m["full_acc_step3_frac"] == 0.25
    assert m["simulated_accept_len"] == pytest.approx(1 + (0.75 + 0.5 + 0.25))
    with pytest.raises(BadInput):
        probe.offline_metrics(torch.zeros(3, 0, dtype=torch.bool))


def test_probe_run_on_tiny_target(tiny_pair):
    target, drafter = tiny_pair
    cfg = probe.ProbeConfig(target=str(target), drafter=str(drafter), reference_drafter=str(drafter),
                            prompts="builtin", num_prompts=2, max_new_tokens=12, steps=2)
    r = probe.run(cfg, progress=False)
    on, off = r.metrics["online"], r.metrics["offline"]
    assert on["exact_match_frac"] == 1.0 and on["divergent_prompts_count"] == 0
    assert on["accept_len"] >= 1.0 and off["simulated_accept_len"] >= 1.0
    assert sum(on["accept_len_hist"].values()) == on["cycles_count"]
    assert r.verdict["vs_reference"] == "equal"
    assert isinstance(r.verdict["viable"], bool) and r.verdict["breakeven_len"] > 0
    from eaglekb.kb.baselines import build
    build(kind="probe", name="t", config=r.config, metrics=r.metrics, noise=probe.noise(r.metrics))
    text = probe.render_text(r)
    assert "verdict" in text and "offline" in text


def test_probe_refuses_drafter_of_another_target(tiny_pair, tmp_path, monkeypatch):
    from eaglekb.models.drafter import save_drafter

    target, _ = tiny_pair
    other = save_drafter(tiny_drafter(tiny_llama_config(hidden_size=64)), tmp_path / "other")
    with pytest.raises(Incompatible, match="hidden size"):
        probe.run(probe.ProbeConfig(target=str(target), drafter=str(other), prompts="builtin", num_prompts=1),
                  progress=False)
    monkeypatch.chdir(tmp_path)  # no drafters/smollm2-135m-default here
    monkeypatch.setenv("EAGLEKB_ROOT", str(tmp_path))
    with pytest.raises(MissingFile, match="default drafter"):
        probe.run(probe.ProbeConfig(target=str(target), prompts="builtin"), progress=False)


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_runbook_one_line_errors_and_no_baseline(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    before = sorted((ROOT / "baselines").rglob("*.json"))
    out = _invoke("probe", "--target", str(target), "--drafter", str(tmp_path / "missing"), "--record", "x-test")
    assert out.returncode != 0 and out.stderr.strip().count("\n") == 0 and "not found" in out.stderr
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text(" ".join(["w9"] * 400) + "\n")
    out = _invoke("probe", "--target", str(target), "--drafter", str(drafter), "--prompts", str(long_prompt),
                  "--num-prompts", "1", "--record", "x-test")  # more than the file holds is refused, not clamped
    assert out.returncode != 0 and "longer than the cache" in out.stderr, out.stderr
    assert sorted((ROOT / "baselines").rglob("*.json")) == before


def test_runbook_json_last_line(tiny_pair):
    target, drafter = tiny_pair
    out = _invoke("probe", "--target", str(target), "--drafter", str(drafter), "--prompts", "builtin",
                  "--num-prompts", "1", "--max-new-tokens", "8", "--steps", "2", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["metrics"]["online"]["exact_match_frac"] == 1.0 and "history" in doc


@pytest.mark.slow
def test_smollm2_speculative_equals_greedy(tmp_path):
    """The real default target in float32 with a random drafter and injected right drafts."""
    from helpers.engine import OracleDrafting

    from eaglekb.data.prompts import eval_prompts
    from eaglekb.measure import setup as runsetup
    from eaglekb.models.drafter import build_drafter_for_target, save_drafter
    from eaglekb.engine.generate import SpecConfig
    from eaglekb.models.sources import model_dir, read_manifest

    if read_manifest(model_dir("smollm2-135m")) is None:
        pytest.skip("smollm2-135m not prepared (invoke models.prepare smollm2-135m)")
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(str(model_dir("smollm2-135m")))
    d = save_drafter(build_drafter_for_target(tcfg, 2048, torch_dtype="float32"), tmp_path / "d")
    loaded = runsetup.load("smollm2-135m", str(d), max_len=512)
    prompts = runsetup.encode(loaded.tokenizer, eval_prompts("builtin", 2))
    eng = Engine(loaded.target, loaded.drafter, max_len=256)
    for i, p in enumerate(prompts):
        want = eng.generate(p, 48).tokens
        assert eng.speculative(p, 48, SpecConfig(steps=3)).tokens == want
        eng2 = Engine(loaded.target, loaded.drafter, max_len=256)
        eng2.drafting = OracleDrafting(eng2.drafting, want, len(p), seed=i)
        got = eng2.speculative(p, 48, SpecConfig(steps=4, topk=2, draft_tokens=9))
        assert got.tokens == want and max(got.accept_lens) > 1
