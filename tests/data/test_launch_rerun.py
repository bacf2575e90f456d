"""A several-process datagen rerun with another config is refused before it writes anything in the folder."""

from __future__ import annotations

import pytest

from eaglekb.data import datagen, launch
from eaglekb.io.errors import Incompatible
from helpers.datagen import prompts


@pytest.fixture
def no_processes(monkeypatch):
    monkeypatch.setattr(launch, "_start", lambda *a, **k: [])
    monkeypatch.setattr(launch, "_watch", lambda *a, **k: None)
    monkeypatch.setattr(launch, "merge", lambda *a, **k: {})


def test_a_rerun_with_another_config_or_prompts_changes_nothing(tmp_path, no_processes):
    out = tmp_path / "ds"
    ps = prompts()
    launch.launch("some-target", ps, out, datagen.DatagenConfig(max_new_tokens=8), nproc=2, device="cpu")
    (out / "part-0-of-2").mkdir()
    (out / "part-0-of-2" / "shard-00000.safetensors").write_bytes(b"data a process wrote")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    launch.launch("some-target", ps, out, datagen.DatagenConfig(max_new_tokens=8), nproc=2, device="cpu")  # resumes
    with pytest.raises(Incompatible) as e:
        launch.launch("some-target", ps, out, datagen.DatagenConfig(max_new_tokens=9), nproc=2, device="cpu")
    assert "config.max_new_tokens" in str(e.value) and "8" in str(e.value) and "9" in str(e.value)
    fewer = type(ps)(ps.name, ps.prompts[:-1], manifest=ps.manifest)
    with pytest.raises(Incompatible, match="prompts_sha256"):
        launch.launch("some-target", fewer, out, datagen.DatagenConfig(max_new_tokens=8), nproc=2, device="cpu")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_run_refused_before_its_first_shard_reruns_with_other_options(tmp_path, no_processes):
    """Its run file holds no data: a rerun with corrected options starts afresh instead of being refused."""
    out = tmp_path / "ds"
    launch.launch("some-target", prompts(), out, datagen.DatagenConfig(max_new_tokens=8), nproc=2, device="cpu")
    launch.launch("some-target", prompts(), out, datagen.DatagenConfig(max_new_tokens=9), nproc=2, device="cpu")
    assert '"max_new_tokens": 9' in (out / launch.RUN_FILE).read_text()
