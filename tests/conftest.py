"""Fixtures shared across the test packages (plain helpers live in tests/helpers/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import tiny_drafter, tiny_llama_config, write_tiny_target
from helpers.site import built_site


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread: several times faster on a shared, loaded CPU; restored afterwards.
    A module uses it for all its tests with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``
    by name."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from eaglekb.models.drafter import save_drafter

    base = tmp_path_factory.mktemp("probe")
    target = write_tiny_target(base / "target")
    drafter = save_drafter(tiny_drafter(tiny_llama_config(), dtype="float32"), base / "drafter")
    return target, drafter


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site folder (one strict build per test session)."""
    return built_site(tmp_path_factory)
