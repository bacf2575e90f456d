"""Fixtures of the site tests (the checkout's own build is the session fixture ``site``, tests/conftest.py)."""

from __future__ import annotations

import pytest

from helpers.planted import Planted, planted_build


@pytest.fixture(scope="session")
def planted_site(tmp_path_factory) -> Planted:
    """One strict build of a copy of the checkout holding a new finding and the hostile and huge baselines
    (helpers/planted.py: what each test plants, and why one build serves both)."""
    return planted_build(tmp_path_factory)
