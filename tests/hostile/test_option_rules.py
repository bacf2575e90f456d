"""Every row of docs/reference/options.md, run: an option that only takes effect beside another option or on
one device is refused where it would do nothing (one line, exit 2, naming the option), and its accepted form
gets past the checks (issue 44). The rows are read from the page, so the page and the tasks cannot drift."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers.hostile import ROOT, run_cli

PAGE = ROOT / "docs" / "reference" / "options.md"


def _rows() -> list[dict]:
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].startswith("`"):
            continue
        task, option, needs, otherwise, refused, accepted = cells
        rows.append({"task": task.strip("`"), "option": option.strip("`").split()[0], "otherwise": otherwise,
                     "refused": shlex.split(refused.strip("`")),
                     "accepted": None if accepted == "—" else shlex.split(accepted.strip("`"))})
    return rows


ROWS = _rows()


def test_the_page_has_its_table():
    assert len(ROWS) >= 20, "docs/reference/options.md lost its table rows"
    for row in ROWS:
        assert row["refused"][0] == row["task"], row
        assert row["option"] in row["refused"], row
        assert row["accepted"] is None or row["accepted"][0] == row["task"], row


def _message(row) -> str:
    found = re.fullmatch(r"refused: (.+)", row["otherwise"])
    assert found, row
    return found.group(1)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['task']}{r['option']}" for r in ROWS])
def test_each_rule_holds(ws, row):
    res = run_cli(row["refused"])
    assert res.reached is None and res.code == 2, (row["refused"], res)
    assert len(res.err_lines) == 1 and "Traceback" not in res.err, res.err
    line = res.err_lines[0]
    assert _message(row) in line and row["option"] in line, (row["refused"], line)
    if row["accepted"] is not None:
        res = run_cli(row["accepted"])
        said = " ".join(res.err_lines)
        assert not (_message(row) in said and row["option"] in said), (row["accepted"], said)
        assert "Traceback" not in res.err, res.err
