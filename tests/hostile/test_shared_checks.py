"""``invoke inspect`` checks what every loader checks (probe, bench, finetune --init), with the same functions
(``eaglekb.formats.drafter``): nothing passes one and fails the other (issue 26)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.hostile import examples, run_cli
from helpers.models import rewrite_tensors, tiny_drafter


def _poison(value: float):
    def edit(tensors):
        key = next(k for k in sorted(tensors) if k.endswith("q_proj.weight"))
        tensors[key][0, 0] = value
    return edit


@pytest.mark.parametrize("damage, code", [("nan", "nonfinite-weights"), ("inf", "nonfinite-weights"),
                                          ("kv-heads", "heads-layout"), ("act", "activation")])
def test_what_a_probe_refuses_inspect_reports_as_an_error(ws, tmp_path, damage, code):
    from eaglekb.io.errors import EaglekbError
    from eaglekb.models.drafter import load_drafter

    folder = tmp_path / "d"
    shutil.copytree(ws.inputs / "drafter", folder)
    if damage in ("nan", "inf"):
        rewrite_tensors(folder, _poison(float(damage)))
    else:
        doc = json.loads((folder / "config.json").read_text())
        doc.update({"num_key_value_heads": 3} if damage == "kv-heads" else {"hidden_act": "gelu"})
        (folder / "config.json").write_text(json.dumps(doc))
    with pytest.raises(EaglekbError) as refused:
        load_drafter(folder)
    res = run_cli(["inspect", str(folder), "--json"])
    assert res.code == 1, res
    report = json.loads(res.out.splitlines()[-1])
    found = [f for f in report["findings"] if f["code"] == code]
    assert found and found[0]["severity"] == "error", report["findings"]
    assert refused.value.what in found[0]["message"], (refused.value.line(), found[0]["message"])
    probe = run_cli(["probe", f"--drafter={folder}", "--target=in/target", "--prompts=builtin", "--num-prompts=1"])
    assert probe.reached or probe.code == 2  # the probe's own load is the loader above (stubbed here)


def test_the_shapes_inspect_expects_are_the_modules():
    from eaglekb.formats.drafter import expected_shapes

    for with_embeddings in (False, True):
        model = tiny_drafter()
        if with_embeddings:
            from eaglekb.models.drafter import Eagle3Drafter

            model = Eagle3Drafter(model.config, with_embeddings=True)
        got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        assert expected_shapes(model.config, with_embeddings=with_embeddings) == got


FIELDS = st.sampled_from(["num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                          "intermediate_size", "draft_vocab_size", "hidden_act", "target_hidden_size"])
VALUES = st.sampled_from([1, 2, 3, 4, 6, 8, 16, 24, 32, 48, 64, "silu", "gelu", None])
TENSOR_DAMAGE = st.sampled_from(["none", "nan", "inf", "-inf"])


@examples(25)
@given(st.lists(st.tuples(FIELDS, VALUES), max_size=2), TENSOR_DAMAGE)
def test_nothing_passes_inspect_and_fails_a_loader(ws, tmp_path_factory, edits, damage):
    from eaglekb.io.errors import EaglekbError
    from eaglekb.models.drafter import load_drafter

    folder = tmp_path_factory.mktemp("shared") / "d"
    shutil.copytree(ws.inputs / "drafter", folder)
    doc = json.loads((folder / "config.json").read_text())
    for key, value in edits:
        doc[key] = value
    (folder / "config.json").write_text(json.dumps(doc))
    if damage != "none":
        rewrite_tensors(folder, _poison(float(damage)))
    res = run_cli(["inspect", str(folder), "--json"])
    assert res.code in (0, 1, 2), res
    if res.code != 0:
        return
    try:
        load_drafter(folder)
    except EaglekbError as exc:
        pytest.fail(f"inspect passed {edits} {damage}, the loader refused it: {exc.line()}")
    assert damage == "none"
    assert torch.isfinite(load_drafter(folder).lm_head.weight).all()
