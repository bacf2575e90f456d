"""Datagen through the engine: extra samples, per-source counts, sharded over processes == one process."""

from __future__ import annotations

import pytest

from helpers.datagen import make_target, prompts, small_cfg

from eaglekb.data import datagen
from eaglekb.data.launch import generate_dataset
from eaglekb.formats.shards import compare_datasets, open_dataset, shard_sequence_ids
from eaglekb.io.errors import BadInput

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("target") / "tiny")


def _cfg(**over):
    return small_cfg(**{"generator": "engine", "features": "online", "batch_size": 4, "shard_size": 3, **over})


def test_engine_generator_with_samples_and_sources(target_dir, tmp_path):
    ps = prompts(5)
    man = datagen.build(target_dir, ps, tmp_path / "d", _cfg(sample_temperatures=(0.8, 1.0)))
    assert man["totals"]["sequences"] == 15
    ds = open_dataset(tmp_path / "d")
    ids = [i for f in ds.shard_files for i in shard_sequence_ids(f)]
    assert len(set(ids)) == 15 and sum("@t0.8#1" in i for i in ids) == 5
    assert man["totals"]["by_source"]["t"]["sequences"] == 15
    rep = datagen.storage_report(man)
    assert rep["responses_per_prompt_count"] == 3 and rep["by_source"]["t"]["sequences_count"] == 15
    again = datagen.build(target_dir, ps, tmp_path / "e", _cfg(sample_temperatures=(0.8, 1.0)))
    assert again["totals"] == man["totals"]


def test_two_processes_equal_one_for_greedy(target_dir, tmp_path):
    ps = prompts(7)
    one = generate_dataset(target_dir, ps, tmp_path / "one", _cfg())
    two = generate_dataset(target_dir, ps, tmp_path / "two", _cfg(), nproc=2)
    assert two["last_run"]["processes_count"] == 2 and len(open_dataset(tmp_path / "two")) == 7
    cmp = compare_datasets(tmp_path / "one", tmp_path / "two")
    assert cmp["equal_count"] == 7 and cmp["different_count"] == cmp["only_a_count"] == cmp["only_b_count"] == 0
    assert one["totals"]["tokens"] == two["totals"]["tokens"]


def test_bad_sampling_settings_are_one_line(target_dir, tmp_path):
    for over in ({"sample_temperatures": (0.0,)}, {"sample_temperatures": (2.5,)}, {"generator": "nope"}):
        with pytest.raises(BadInput):
            datagen.build(target_dir, prompts(2), tmp_path / "x", _cfg(**over))
    with pytest.raises(BadInput):
        datagen.build(target_dir, prompts(2), tmp_path / "y", small_cfg(sample_temperatures=(0.7,)))
    with pytest.raises(BadInput):
        generate_dataset(target_dir, prompts(2), tmp_path / "z", _cfg(), nproc=0)
    with pytest.raises(BadInput, match="time budget stops one process only"):
        generate_dataset(target_dir, prompts(2), tmp_path / "b", _cfg(), nproc=2, time_budget_s=60)
    assert not (tmp_path / "b").exists()
