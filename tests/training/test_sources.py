"""Validation per source (eaglekb.training.sources): from the same forward as the mixed numbers (CPU, tiny)."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors import safe_open

from eaglekb.data import datagen
from eaglekb.data.corpora import Prompt, PromptSet, prompts_hash
from eaglekb.data.generation import load_target
from eaglekb.formats.shards import MANIFEST, SEQUENCE_IDS, open_dataset, write_shard
from eaglekb.kb.schema import KEY_RE
from eaglekb.training.loop import train
from eaglekb.training.report import baseline_fields, render_text, source_curve
from helpers.datagen import prompts, small_cfg
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def two_sources(data, tmp_path_factory):
    """A dataset of 8 prompts from two sources (``wiki:`` and ``gsm8k:`` ids), one extra sample each."""
    items = [Prompt(id=f"{'wiki' if i % 2 else 'gsm8k'}:{i}", source="wiki" if i % 2 else "gsm8k",
                    messages=p.messages) for i, p in enumerate(prompts(8).prompts)]
    ps = PromptSet("two", items, manifest={"source": "two", "count": 8, "sha256": prompts_hash(items)})
    out = tmp_path_factory.mktemp("two") / "data"
    datagen.run(load_target(data / "target", dtype="float32"), ps, out,
                small_cfg(max_new_tokens=16, generator="engine", sample_temperatures=(0.8,)), progress=False)
    return out


def _without_ids(src, dst):
    """A copy of a dataset whose shards hold no sequence ids (as an older datagen wrote them)."""
    shutil.copytree(src, dst)
    man = json.loads((dst / MANIFEST).read_text())
    for name in man["shards"]:
        with safe_open(str(dst / name), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
            meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items() if k not in (SEQUENCE_IDS, "format")}
        man["shards"][name] = write_shard(dst / name, tensors, meta)
    (dst / MANIFEST).write_text(json.dumps(man))
    return dst


def test_two_sources_split_the_mixed_validation(two_sources, data, tmp_path):
    ds = open_dataset(two_sources)
    assert {ds.sequence_id(i).split(":")[0] for i in range(len(ds))} == {"wiki", "gsm8k"} and len(ds) == 16
    rep = train(cfg_for(data, tmp_path / "run", data=str(two_sources), steps=4, eval_every=2, val_fraction=0.5),
                progress=False)
    val = rep["val"]
    assert sorted(val["by_source"]) == ["gsm8k", "wiki"]
    assert sum(m["positions"] for m in val["by_source"].values()) == val["positions"]
    for k, m in val["by_source"].items():
        assert m["positions"] > 0 and 0 <= m["acc0"] <= 1 and m["simulated_acc_len"] >= 0
        assert set(rep["history"][source_curve(k)]) == {"2", "4"}
    fields = baseline_fields(rep)
    for k in val["by_source"]:
        curve = fields["series"][source_curve(k)]
        assert KEY_RE.match(source_curve(k)) and curve["unit"] == "_len" and set(curve["points"]) == {"2", "4"}
        assert fields["metrics"]["val"]["by_source"][k]["positions_count"] == val["by_source"][k]["positions"]
    lines = [x for x in render_text(rep).splitlines() if x.startswith("val source ")]
    ordered = sorted(val["by_source"], key=lambda k: -val["by_source"][k]["positions"])
    assert [x.split()[2].rstrip(":") for x in lines] == ordered


def test_one_source_gives_the_mixed_numbers(data, tmp_path):
    rep = train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    val, only = rep["val"], rep["val"]["by_source"]["t"]
    assert list(val["by_source"]) == ["t"] and only["positions"] == val["positions"]
    assert only["acc0"] == pytest.approx(val["acc"][0]) and only["simulated_acc_len"] == pytest.approx(
        val["simulated_acc_len"])


def test_shards_without_ids_train_without_by_source(data, tmp_path):
    old = _without_ids(data / "soft", tmp_path / "old")
    assert open_dataset(old).sequence_id(0) is None
    rep = train(cfg_for(data, tmp_path / "run", data=str(old), steps=2), progress=False)
    assert rep["step"] == 2 and "by_source" not in rep["val"]
    assert any("no validation per source" in n for n in rep["notes"])
    assert not any(k.startswith("val_by_source_") for k in rep["history"])
    assert "by_source" not in baseline_fields(rep)["metrics"]["val"]
    assert "val source " not in render_text(rep)
