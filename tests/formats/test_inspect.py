"""`inspect_checkpoint` / `compare_checkpoints`: one test per planted defect, plus verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.models import DRAFT_VOCAB, rewrite_config, rewrite_tensors, write_drafter  # noqa: E402

from eaglekb.io.errors import IntegrityError, MissingFile, SchemaError  # noqa: E402
from eaglekb.formats.compare import compare_checkpoints, render_comparison  # noqa: E402
from eaglekb.formats.inspect import inspect_checkpoint, render_inspection  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def codes(report, severity=None):
    return {f["code"] for f in report["findings"] if severity is None or f["severity"] == severity}


@pytest.fixture
def clean(tmp_path):
    return write_drafter(tmp_path / "clean")


def test_clean_drafter_has_no_findings(clean):
    r = inspect_checkpoint(clean)
    assert r["ok"] and r["errors"] == 0 and r["warnings"] == 0
    assert r["findings"] == []
    assert any("embed_tokens" in n for n in r["notes"])
    assert r["format"] == "sglang"
    assert r["tensors"]["fc.weight"] == {"shape": [32, 96], "dtype": "F32"}
    assert r["params"]["total"] > 0
    assert r["aux_layers"]["sglang_capture_points"] == [2, 4, 5]
    assert "SpecForge's default ids for a 8-layer target" in r["aux_layers"]["summary"]
    text = render_inspection(r)
    assert "OK: no errors" in text and "midlayer.self_attn.q_proj.weight" in text
    json.dumps(r)  # JSON-serialisable


def test_a_p_eagle_drafter_is_reported_as_one_sglang_cannot_serve(tmp_path):
    """A P-EAGLE drafter (eaglekb_method p-eagle): one error that says why SGLang cannot serve it, in place of
    warnings about the fields and tensors SGLang ignores."""
    from eaglekb.models.drafter import save_drafter
    from eaglekb.models.parallel_drafter import to_parallel
    from helpers.models import tiny_drafter

    r = inspect_checkpoint(save_drafter(to_parallel(tiny_drafter(), 3), tmp_path / "p-eagle"))
    assert "parallel-drafter" in codes(r, "error") and "config-unknown-field" not in codes(r)
    assert "ignored-key" not in codes(r)  # its mask tensors are named once, in the parallel-drafter error
    msg = next(f["message"] for f in r["findings"] if f["code"] == "parallel-drafter")
    assert "'p-eagle' (3 tokens in one drafter pass)" in msg and "invoke bench" in msg
    assert "parallel-drafter" not in codes(inspect_checkpoint(save_drafter(tiny_drafter(), tmp_path / "eagle3")))


def test_speculators_format_inspects_clean(tmp_path):
    r = inspect_checkpoint(write_drafter(tmp_path / "spec", fmt="speculators"))
    assert r["ok"] and r["format"] == "speculators"
    assert r["aux_layers"]["config_ids"] == [1, 3, 4]


def test_misspelt_key_is_reported_with_suggestion(clean):
    rewrite_tensors(clean, lambda t: t.__setitem__("midlayer.self_atn.q_proj.weight",
                                                   t.pop("midlayer.self_attn.q_proj.weight")))
    r = inspect_checkpoint(clean)
    assert {"ignored-key", "missing-key"} <= codes(r, "error")
    msg = next(f["message"] for f in r["findings"] if f["code"] == "ignored-key")
    assert "self_atn" in msg and "did you mean 'midlayer.self_attn.q_proj.weight'" in msg


def test_missing_required_key(clean):
    rewrite_tensors(clean, lambda t: t.pop("norm.weight"))
    r = inspect_checkpoint(clean)
    assert "missing-key" in codes(r, "error") and not r["ok"]


def test_d2t_wrong_length(clean):
    rewrite_tensors(clean, lambda t: t.__setitem__("d2t", t["d2t"][:-1].clone()))
    assert "d2t-length" in codes(inspect_checkpoint(clean), "error")


def test_d2t_duplicates(clean):
    def edit(t):
        d2t = t["d2t"].clone()
        d2t[5] = d2t[4] - 1  # draft id 5 maps to the same target token as draft id 4
        t["d2t"] = d2t
    rewrite_tensors(clean, edit)
    r = inspect_checkpoint(clean)
    assert {"d2t-order", "d2t-duplicates"} <= codes(r, "error")


def test_d2t_not_sorted(clean):
    def edit(t):
        sel = torch.arange(DRAFT_VOCAB) + t["d2t"]
        sel[[3, 4]] = sel[[4, 3]]
        t["d2t"] = sel - torch.arange(DRAFT_VOCAB)
    rewrite_tensors(clean, edit)
    r = inspect_checkpoint(clean)
    assert "d2t-order" in codes(r, "error") and "d2t-duplicates" not in codes(r)


def test_d2t_out_of_range(clean):
    def edit(t):
        d2t = t["d2t"].clone()
        d2t[-1] = 10_000
        t["d2t"] = d2t
    rewrite_tensors(clean, edit)
    assert "d2t-range" in codes(inspect_checkpoint(clean), "error")


def test_t2d_wrong_count(clean):
    def edit(t):
        t2d = t["t2d"].clone()
        t2d[1] = True  # one extra marked token (selected ids are even)
        t["t2d"] = t2d
    rewrite_tensors(clean, edit)
    assert {"t2d-count", "t2d-mismatch"} <= codes(inspect_checkpoint(clean), "error")


def test_t2d_disagrees_with_d2t(clean):
    def edit(t):
        t2d = t["t2d"].clone()
        t2d[0], t2d[1] = False, True  # same count, different token
        t["t2d"] = t2d
    rewrite_tensors(clean, edit)
    r = inspect_checkpoint(clean)
    assert "t2d-mismatch" in codes(r, "error") and "t2d-count" not in codes(r)


def test_fc_not_three_times_target_hidden(clean):
    rewrite_config(clean, lambda d: d.update(target_hidden_size=64))
    r = inspect_checkpoint(clean)
    assert "fc-shape" in codes(r, "error")


def test_fc_not_matching_target_hidden(clean, tmp_path):
    from helpers.models import tiny_llama_config

    ok = tmp_path / "target-ok"
    tiny_llama_config().save_pretrained(ok)
    r = inspect_checkpoint(clean, target=ok)
    assert r["ok"] and r["target"]["hidden_size"] == 32
    other = tmp_path / "target-wide"
    tiny_llama_config(hidden_size=64, vocab_size=256, num_hidden_layers=4).save_pretrained(other)
    r = inspect_checkpoint(clean, target=other)
    assert {"target-hidden", "target-vocab", "target-layers"} <= codes(r, "error")


def test_dtype_mix(clean):
    rewrite_tensors(clean, lambda t: t.__setitem__("norm.weight", t["norm.weight"].to(torch.bfloat16)))
    r = inspect_checkpoint(clean)
    assert "dtype-mix" in codes(r, "warning") and r["ok"]


def test_unknown_architecture(clean):
    rewrite_config(clean, lambda d: d.update(architectures=["LlamaForCausalLM"]))
    assert "unknown-architecture" in codes(inspect_checkpoint(clean), "error")


def test_unknown_config_field(clean):
    rewrite_config(clean, lambda d: d.update(draft_vocab=40))
    r = inspect_checkpoint(clean)
    assert "config-unknown-field" in codes(r, "warning")


def test_tied_embeddings_flagged(clean):
    rewrite_config(clean, lambda d: d.update(tie_word_embeddings=True))
    assert "tied-embeddings" in codes(inspect_checkpoint(clean), "error")


def test_missing_draft_vocab_size(clean):
    rewrite_config(clean, lambda d: d.pop("draft_vocab_size"))
    assert "config-missing-field" in codes(inspect_checkpoint(clean), "error")


def test_layer_ids_written_as_capture_points_are_flagged(clean):
    rewrite_config(clean, lambda d: d["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 5]))
    r = inspect_checkpoint(clean)
    assert "one layer higher" in r["aux_layers"]["summary"]


def test_truncated_and_corrupt_files_are_one_line_errors(clean):
    f = clean / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="unreadable safetensors file"):
        inspect_checkpoint(clean)
    f.write_bytes(b"not a safetensors file at all")
    with pytest.raises(IntegrityError):
        inspect_checkpoint(clean)
    (clean / "config.json").write_text("{broken")
    with pytest.raises(SchemaError):
        inspect_checkpoint(clean)
    with pytest.raises(MissingFile):
        inspect_checkpoint(clean / "nope")


# ----------------------------------------------------------------------------- compare


def test_compare_same_is_drop_in(tmp_path):
    a = write_drafter(tmp_path / "a", seed=1)
    b = write_drafter(tmp_path / "b", seed=2, fmt="speculators")
    r = compare_checkpoints(a, b)
    assert r["verdict"] == "drop-in compatible"
    assert r["mapping"]["jaccard"] == 1.0 and r["mapping"]["position_matches"] == DRAFT_VOCAB
    assert "verdict: drop-in compatible" in render_comparison(r)


def test_compare_different_mapping_needs_remap(tmp_path):
    a = write_drafter(tmp_path / "a", selected=list(range(0, 80, 2)))
    b = write_drafter(tmp_path / "b", selected=list(range(1, 40)) + [100])
    r = compare_checkpoints(a, b)
    assert r["verdict"].startswith("compatible after remap")
    m = r["mapping"]
    assert m["set_overlap"] == 19 and 0 < m["jaccard"] < 1 and m["position_matches"] < DRAFT_VOCAB


def test_compare_draft_vocab_resize_is_compatible_after_remap(tmp_path):
    """Only the mapping-sized tensors differ: `invoke remap` moves rows into a mapping of any size."""
    a = write_drafter(tmp_path / "a")
    b = write_drafter(tmp_path / "b", selected=list(range(20)))
    r = compare_checkpoints(a, b)
    assert r["compatible"] and r["verdict"].startswith("compatible after remap:")
    assert "draft vocab 40 vs 20" in r["verdict"]
    assert "sorted by target id" in r["mapping"]["explanation"]


def test_compare_other_shape_difference_is_incompatible(tmp_path):
    a = write_drafter(tmp_path / "a")
    b = write_drafter(tmp_path / "b")

    def widen(t):
        t["midlayer.mlp.up_proj.weight"] = torch.zeros(t["midlayer.mlp.up_proj.weight"].shape[0] + 8,
                                                       t["midlayer.mlp.up_proj.weight"].shape[1])
    rewrite_tensors(b, widen)
    r = compare_checkpoints(a, b)
    assert not r["compatible"] and "tensor shapes differ (midlayer.mlp.up_proj.weight)" in r["verdict"]


def test_compare_reports_embed_tokens_presence(tmp_path):
    from eaglekb.models.drafter import build_drafter_for_target, save_drafter
    from helpers.models import tiny_llama_config

    d = build_drafter_for_target(tiny_llama_config(), DRAFT_VOCAB, mapping=list(range(0, 80, 2)),
                                 with_embeddings=True, torch_dtype="float32")
    save_drafter(d, tmp_path / "emb", include_embeddings=True)
    a = write_drafter(tmp_path / "a")
    r = compare_checkpoints(a, tmp_path / "emb")
    assert r["only_b"] == ["embed_tokens.weight"]
    assert r["verdict"] == "drop-in compatible"


# ----------------------------------------------------------------------------- CLI


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif(not (ROOT / "tasks.py").exists(), reason="tasks.py not present")
def test_cli_exit_codes(tmp_path):
    clean = write_drafter(tmp_path / "clean")
    ok = _invoke("inspect", str(clean), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["ok"] is True
    rewrite_tensors(clean, lambda t: t.pop("fc.weight"))
    bad = _invoke("inspect", str(clean))
    assert bad.returncode != 0 and "missing-key" in bad.stdout
    (clean / "model.safetensors").write_bytes(b"junk")
    broken = _invoke("inspect", str(clean))
    assert broken.returncode != 0 and "Traceback" not in broken.stderr
    assert broken.stderr.strip().startswith("error:") and len(broken.stderr.strip().splitlines()) == 1
