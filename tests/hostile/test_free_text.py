"""Free text that ends up in a file or on the site is checked at the boundary by one validator
(``runbooks._options.free_text``): bounded length, one line of printable characters (issue 44)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.hostile import examples, run_cli

#: (argv before the value, the option as the message names it), one per free-text option.
CASES = [
    (["story.record", "run", "story-x", "--commit"], "--commit"),
    (["story.record", "run", "story-x", "--command"], "--command"),
    (["docs.deploy", "--version"], "--version"),
    (["docs.deploy", "0.1", "--alias"], "--alias"),
    (["docs.deploy", "0.1", "--branch"], "--branch"),
    (["datagen", "--server", "http://127.0.0.1:9", "--server-model"], "--server-model"),
    (["story.export", "--names"], "--names"),
]
CONTROL = ["\x1b[31m", "a\nb", "a\rb", "\x07", "a\x7fb", "\u2028", "\u202e", "\x85"]


def _refused(res, option: str, what: str) -> None:
    assert res.reached is None and res.code == 2, res
    assert len(res.err_lines) == 1 and "Traceback" not in res.err, res.err
    assert option in res.err_lines[0] and what in res.err_lines[0], res.err_lines[0]
    assert len(res.err_lines[0]) < 400, res.err_lines[0]


@pytest.mark.parametrize("argv, option", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("bad", CONTROL, ids=[repr(c) for c in CONTROL])
def test_control_characters_are_refused(ws, argv, option, bad):
    _refused(run_cli([*argv, f"x{bad}y"]), option, "control character")


@pytest.mark.parametrize("argv, option", CASES, ids=[c[1] for c in CASES])
def test_a_huge_value_is_refused_naming_the_limit(ws, argv, option):
    _refused(run_cli([*argv, "1" * 5000]), option, "too long")


@examples(30)
@given(st.text(min_size=1, max_size=80))
def test_any_commit_is_refused_in_one_line_or_is_printable(ws, value):
    from runbooks._options import free_text_value
    from eaglekb.io.errors import BadInput

    try:
        out = free_text_value(value, "--commit", 100)
    except BadInput as exc:
        assert "\n" not in exc.line() and "\r" not in exc.line()
    else:
        assert not any(unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029" for ch in out), repr(out)


def test_ordinary_values_pass(ws):
    from runbooks._options import OPTIONS

    assert OPTIONS["commit"]("9344050 (dirty)", "--commit") == "9344050 (dirty)"
    assert OPTIONS["version"]("1.2.3", "--version") == "1.2.3"
    assert OPTIONS["alias"]("", "--alias") == ""
    assert OPTIONS["command"]("invoke story.run --out 'a b' --device cuda", "--command")
    res = run_cli(["docs.deploy", "0.1", "--alias", "x/y"])
    assert res.code == 2 and "--alias" in res.err
