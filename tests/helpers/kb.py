"""Baseline files edited by hand: the one-line schema refusal they must give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglekb.io.errors import SchemaError
from eaglekb.kb import baselines as bl


def assert_edit_refused(path: Path, edit, fragment: str) -> None:
    """Apply ``edit`` to the baseline JSON at ``path``; loading it must fail with one line naming the file and
    holding ``fragment``."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError) as exc:
        bl.load(path)
    line = exc.value.line()
    assert "\n" not in line and str(path) in line and fragment in line, line
