"""Refusals that name the real cause (issue 44): another target's --init drafter said as such (not blamed on
--draft-vocab-size), a dataset resume's difference compared as JSON and printed readably (never ``[] != ()``),
a huge draft step count in --sweep refused as a step count naming the most."""

from __future__ import annotations

import pytest

from helpers.hostile import run_cli


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from eaglekb.data import datagen, generation
    from helpers.datagen import make_target, prompts, small_cfg

    root = tmp_path_factory.mktemp("msg")
    target = generation.load_target(make_target(root / "target"), dtype="float32")
    datagen.run(target, prompts(4), root / "data", small_cfg(), progress=False)
    return root / "data"


def test_an_init_drafter_of_another_target_is_said_to_be_one(dataset, tmp_path):
    from eaglekb.io.errors import Incompatible
    from eaglekb.models.drafter import save_drafter
    from eaglekb.training.config import TrainConfig
    from eaglekb.training.loop import prepare
    from helpers.models import tiny_drafter, tiny_llama_config

    other = save_drafter(tiny_drafter(tiny_llama_config(hidden_size=64, vocab_size=256), selected=list(range(200))),
                         tmp_path / "other")
    with pytest.raises(Incompatible) as refused:
        prepare(TrainConfig(data=str(dataset), out=str(tmp_path / "run"), init=str(other), steps=1, device="cpu"))
    line = refused.value.line()
    assert "another target" in line and "--init" in line and "--draft-vocab-size" not in line, line
    assert "hidden size 64" in line and "vocab 256" in line, line


def test_a_resume_difference_is_compared_and_shown_as_json(dataset):
    from eaglekb.data.datagen import _prepare_out, first_difference
    from eaglekb.formats.shards import read_manifest
    from eaglekb.io.errors import Incompatible

    assert first_difference({"c": {"t": [], "n": 1}}, {"c": {"t": (), "n": 2}}) == ("c.n", 1, 2)
    identity = read_manifest(dataset)["identity"]
    changed = {**identity, "config": {**identity["config"], "sample_temperatures": (), "max_len": 7}}
    with pytest.raises(Incompatible) as refused:
        _prepare_out(dataset, changed)
    line = refused.value.line()
    assert "config.max_len" in line and "[] != ()" not in line and "7 now" in line, line


def test_a_huge_sweep_step_count_is_refused_naming_the_most(ws):
    from runbooks._options import MAX_DRAFT_STEPS

    for argv in (["bench", "--sweep=100000,1"], ["bench", "--steps=100000"]):
        res = run_cli(argv)
        assert res.reached is None and res.code == 2 and len(res.err_lines) == 1, res
        assert str(MAX_DRAFT_STEPS) in res.err_lines[0] and "cache" not in res.err_lines[0], res.err_lines
    assert run_cli(["bench", f"--sweep={MAX_DRAFT_STEPS},1"]).reached
