"""A datagen run refused before its first shard does not block the corrected rerun (issue 44): the manifest of
no data it leaves is started afresh, and a folder holding only what a run writes before its first shard (the
target head, a server's responses) is one the rerun takes up."""

from __future__ import annotations

import pytest

from eaglekb.data import datagen, generation
from eaglekb.formats import shards
from eaglekb.io.errors import BadInput
from helpers.datagen import make_target, prompts, small_cfg


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return generation.load_target(make_target(tmp_path_factory.mktemp("target") / "tiny"), dtype="float32")


def test_a_rerun_after_a_max_len_refusal_runs(target, tmp_path):
    out = tmp_path / "data"
    cfg = small_cfg()
    cfg.max_len = 2
    with pytest.raises(BadInput, match="no sequence fits"):
        datagen.run(target, prompts(2), out, cfg, progress=False)
    assert datagen.is_datagen_folder(out)
    datagen.check_slice(out, "1/2")  # a manifest of no data holds no slice either
    man = datagen.run(target, prompts(2), out, small_cfg(), progress=False)
    assert man["totals"]["sequences"] == 2 and len(shards.open_dataset(out)) == 2


def test_a_folder_of_another_kind_is_not_a_datagen_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert not datagen.is_datagen_folder(tmp_path)
    (tmp_path / shards.HEAD_FILE).write_bytes(b"")
    assert datagen.is_datagen_folder(tmp_path)
