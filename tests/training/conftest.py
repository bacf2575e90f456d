"""Fixtures of the training tests: tiny datasets from one tiny random target (CPU)."""

from __future__ import annotations

import pytest

from eaglekb.data import datagen
from eaglekb.data.generation import load_target
from helpers.datagen import make_target, prompts, small_cfg


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """Datasets from the same random target: soft labels, hard (argmax-only) labels, online features."""
    root = tmp_path_factory.mktemp("train")
    target = load_target(make_target(root / "target"), dtype="float32")
    datagen.run(target, prompts(8), root / "soft", small_cfg(max_new_tokens=16), progress=False)
    datagen.run(target, prompts(8), root / "hard", small_cfg(max_new_tokens=16, store_final_hidden=False),
                progress=False)
    datagen.run(target, prompts(4), root / "online", small_cfg(max_new_tokens=16, features="online"), progress=False)
    return root
