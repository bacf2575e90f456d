"""Targets, drafters and mappings that do not fit together: one line naming both sides, exit 2, before weights load.

The cases of issue 25: an architecture the engine does not run, an output head the config promises but the
weights do not hold (or a tied config over a stored head), a drafter tied to the embeddings where SGLang expects
its own lm_head, and drafters, mappings or held-out data built for another vocabulary size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.hostile import run_cli
from helpers.models import rewrite_config, tiny_causal_lm, tiny_llama_config, tiny_qwen2_config, word_tokenizer, \
    write_drafter

from eaglekb.data import vocab
from eaglekb.formats.mapping import TokenCounts, build_mapping, save_mapping
from eaglekb.io.errors import EaglekbError, Incompatible, IntegrityError
from eaglekb.measure import setup
from eaglekb.models.checks import check_model_folder
from eaglekb.models.drafter import load_drafter


def _target(folder: Path, config) -> Path:
    tiny_causal_lm(config).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def _one_line(err: EaglekbError, *words: str) -> str:
    line = err.line()
    assert "\n" not in line and err.exit_code == 2
    for w in words:
        assert w in line, (w, line)
    return line


@pytest.fixture
def no_weights_load(monkeypatch):
    """Loading target weights fails the test: every refusal here must come before it."""
    def boom(*a, **k):
        raise AssertionError("target weights were loaded before the refusal")
    monkeypatch.setattr(setup, "load_causal_lm", boom)


def test_unsupported_architecture_refused_before_weights(tmp_path, no_weights_load):
    folder = _target(tmp_path / "t", tiny_llama_config())
    rewrite_config(folder, lambda d: d.update(model_type="mistral", architectures=["MistralForCausalLM"]))
    with pytest.raises(Incompatible) as err:
        setup.load(str(folder), None)
    _one_line(err.value, "model_type", "'mistral'", "llama or qwen2", f"--target {folder}")


def test_drafter_for_another_vocab_refused_before_weights(tmp_path, no_weights_load):
    folder = _target(tmp_path / "t", tiny_qwen2_config(vocab_size=256, hidden_size=32, num_attention_heads=4))
    drafter = write_drafter(tmp_path / "d")  # built for a 128-token target of hidden 32
    with pytest.raises(Incompatible) as err:
        setup.load(str(folder), str(drafter))
    _one_line(err.value, f"--drafter {drafter}", "256 tokens (the vocabulary of --target", "found 128 tokens")


def test_untied_config_without_lm_head_refused(tmp_path):
    folder = _target(tmp_path / "t", tiny_qwen2_config(tie_word_embeddings=True))  # no lm_head.weight stored
    check_model_folder(folder)
    rewrite_config(folder, lambda d: d.update(tie_word_embeddings=False))
    with pytest.raises(IntegrityError) as err:
        check_model_folder(folder)
    _one_line(err.value, "tie_word_embeddings", "lm_head.weight", "at random")
    rewrite_config(folder, lambda d: d.pop("tie_word_embeddings"))  # qwen2's default is untied too
    with pytest.raises(IntegrityError):
        check_model_folder(folder)


def test_tied_config_over_a_different_stored_head_refused(tmp_path):
    folder = _target(tmp_path / "t", tiny_qwen2_config(tie_word_embeddings=False))  # lm_head.weight stored
    check_model_folder(folder)
    rewrite_config(folder, lambda d: d.update(tie_word_embeddings=True))
    with pytest.raises(IntegrityError) as err:
        check_model_folder(folder)
    _one_line(err.value, "tie_word_embeddings", "differs", "drop")


def test_drafter_tied_to_embeddings_refused(tmp_path):
    drafter = write_drafter(tmp_path / "d")
    rewrite_config(drafter, lambda d: d.update(tie_word_embeddings=True))
    with pytest.raises(Incompatible) as err:
        load_drafter(drafter)
    _one_line(err.value, "tie_word_embeddings", "SGLang", "embed_tokens")


def _counts(n: int, seed: int = 0) -> TokenCounts:
    return TokenCounts(torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(seed)), {"what": "test"})


def test_heldout_data_of_another_vocab_refused(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    vocab.save_counts(a, _counts(128))
    vocab.save_counts(b, _counts(256))
    with pytest.raises(Incompatible) as err:
        vocab.heldout_counts([str(a), str(b)])
    _one_line(err.value, f"--heldout {b}", "128", "256")
    res = run_cli(["vocab.build", "--counts", str(a), "--heldout", str(b), "--draft-vocab-size", "16",
                   "--out", str(tmp_path / "m.safetensors")])
    assert res.code == 2 and len(res.err_lines) == 1 and "128" in res.err and "256" in res.err
    assert not (tmp_path / "m.safetensors").exists()


def test_mappings_of_another_vocab_refused_by_compare(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_mapping(a, build_mapping(_counts(128), 16))
    save_mapping(b, build_mapping(_counts(256), 16))
    res = run_cli(["vocab.compare", str(a), str(b)])
    assert res.code == 2 and len(res.err_lines) == 1 and "128" in res.err and "256" in res.err


def test_probe_refuses_unsupported_target_with_one_line(tmp_path, no_weights_load):
    folder = _target(tmp_path / "t", tiny_llama_config())
    rewrite_config(folder, lambda d: d.update(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"]))
    res = run_cli(["probe", "--target", str(folder), "--drafter", "random", "--num-prompts", "1"])
    assert res.code == 2 and len(res.err_lines) == 1, res.err
    assert "gpt_neox" in res.err and "llama or qwen2" in res.err
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gpt_neox"


def test_probe_names_how_to_obtain_a_drafter_kept_outside_the_repository(tmp_path, monkeypatch, no_weights_load):
    from eaglekb.measure.setup import DRAFTERS, DrafterHome, default_drafter

    # every embedded target's own drafter is committed; a clone has it
    assert all(h.committed for h in DRAFTERS.values())
    assert default_drafter("qwen2.5-coder-0.5b") == DRAFTERS["qwen2.5-coder-0.5b"].path == "drafters/qwen2.5-coder-0.5b-r3"
    assert default_drafter("smollm2-135m") == default_drafter("some/folder") == "drafters/smollm2-135m-default"

    # a home kept outside the repository (a team's large drafter) and absent here: how to obtain it, by hash
    home = DrafterHome(f".eaglekb/drafters/absent-{tmp_path.name}", committed=False, sha256="ab" * 32,
                       obtain="train it as docs/howto/new-target.md shows, or pass --drafter PATH")
    monkeypatch.setitem(DRAFTERS, "qwen2.5-coder-0.5b", home)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EAGLEKB_ROOT", raising=False)
    res = run_cli(["probe", "--target", "qwen2.5-coder-0.5b", "--num-prompts", "1"])
    assert res.code == 2 and len(res.err_lines) == 1, res.err
    assert home.path in res.err and "docs/howto/new-target.md" in res.err
    assert home.sha256 and home.sha256 in res.err  # the drafter the baselines measured, by content
