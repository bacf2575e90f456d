"""Every task's options, careless and hostile: exit 0 or 2, one stderr line on failure, no traceback, and
nothing outside the output folder touched. Options are checked before any work starts.

Two properties over every task (``invoke --list``): any combination of option values (numbers out of range
or not numbers at all, empty, NUL bytes, newlines, ``--help``, paths that do not exist or are not what they
should be, very long text); and each numeric option alone with a bad value, which must be refused before
the work starts with the option named as the user typed it.
"""

from __future__ import annotations

import inspect
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.hostile import SCALE, all_tasks, examples, flag, names_what_was_typed, one_line_failure, options, run_cli

TASKS = all_tasks()
#: Tasks whose exit 1 is a verdict, not an error: findings in a checkpoint, invalid baselines, a CI gate.
VERDICT_TASKS = {"inspect", "baselines.check", "baselines.diff"}
#: Options that name something a task writes: given only paths under out/ or paths that cannot be created.
OUTPUTS = {"out", "save_counts", "site_dir", "drafters", "work"}
#: Tasks that write baselines/ when they succeed (their output folder).
WRITES_BASELINES = {"baselines.record-investigation", "baselines.check"}

WORDS = ["", " ", "0", "1", "2", "-1", "3.5", "1e9", "1e400", "nan", "inf", "-inf", "0x10", "1_000", "\u0663",
         "abc", "a\nb", "a\x00b", "--help", "-h", "../..", "/", "/proc/self/mem", "/dev/null", "/nonexistent/x",
         "<script>", "random", "random:0", "random:abc", "http://127.0.0.1:1", "cuda", "cuda:99", "cpu", "auto",
         "float32", "bfloat16", "greedy", "wiki", "gsm8k-eval", "builtin", "x" * 3000, "run-1", "k25-investigation"]
INPUTS = ["in/drafter", "in/drafter2", "in/target", "in/mapping.safetensors", "in/counts.safetensors",
          "in/prompts.txt", "in/prompts.jsonl", "in", "in/nothing"]
OUT_PATHS = ["out/new", "out/a/b", "out", "/proc/eaglekb/x", "/dev/null/x", "", "a\x00b", "out/\n"]

VALUE = st.one_of(st.sampled_from(WORDS + INPUTS), st.integers(-2**70, 2**70).map(str),
                  st.floats().map(repr), st.text(max_size=30))
OUT_VALUE = st.sampled_from(OUT_PATHS)


def _argv(draw, name: str) -> list[str]:
    task = TASKS[name]
    argv = [name]
    for opt, default in options(task).items():
        if default is inspect.Parameter.empty:  # positional: always given
            argv.append(draw(OUT_VALUE if opt in OUTPUTS else VALUE))
            continue
        if not draw(st.booleans()):
            continue
        if isinstance(default, bool):
            argv.append(flag(opt) if not default else "--no-" + opt.replace("_", "-"))
        elif opt in getattr(task, "iterable", []):
            argv += [f"{flag(opt)}={draw(VALUE)}" for _ in range(draw(st.integers(1, 2)))]
        else:
            argv.append(f"{flag(opt)}={draw(OUT_VALUE if opt in OUTPUTS else VALUE)}")
    # positionals go after the options they may follow; invoke reads them in order
    return argv


def _any_options(ws, name: str, n: int) -> None:
    @examples(n)
    @given(st.data())
    def check(data):
        argv = _argv(data.draw, name)
        before = ws.state()
        res = run_cli(argv)
        assert one_line_failure(res) is None, (argv, res)
        allowed = {0, 1, 2} if name in VERDICT_TASKS else {0, 2}
        assert res.reached or res.code in allowed, (argv, res)
        if res.code == 2 and not res.reached:
            assert names_what_was_typed(res.err_lines[0], argv, TASKS[name]), (argv, res.err)
        writes = name in WRITES_BASELINES or any(a.startswith("--record=") for a in argv)
        after = ws.state()
        if writes:
            before = {k: v for k, v in before.items() if not k.startswith("baselines")}
            after = {k: v for k, v in after.items() if not k.startswith("baselines")}
        assert before == after, (argv, sorted(set(before) ^ set(after))[:5])

    check()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_any_options_give_a_result_or_one_line(ws, name):
    _any_options(ws, name, 15)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TASKS))
def test_any_options_give_a_result_or_one_line_deeply(ws, name):
    """The same property with 40 times the examples (``-m slow``; ``EAGLEKB_HOSTILE_SCALE`` multiplies both)."""
    _any_options(ws, name, 400)


def _numeric(name: str) -> dict[str, type]:
    """The task's numeric options and their kind (by the project's parser table or an int/float default)."""
    from runbooks._common import OPTIONS, Opt

    task = TASKS[name]
    out = {}
    for opt, default in options(task).items():
        parser = getattr(task, "options", {}).get(opt, OPTIONS.get(opt))
        if isinstance(parser, Opt) and parser.kind in (int, float):
            out[opt] = parser.kind
        elif parser is None and type(default) in (int, float):
            out[opt] = type(default)
    return out


def _sample(values: list[str], key: str) -> list[str]:
    """Every bad value for a deeper run (``EAGLEKB_HOSTILE_SCALE`` > 1), else a fixed 5 of them per option,
    chosen by the option's name so that over all options each value is tried many times."""
    if SCALE > 1:
        return values
    start = zlib.crc32(key.encode()) % len(values)
    return [values[(start + 3 * i) % len(values)] for i in range(5)]


NUMERIC = [(name, opt, kind) for name in sorted(TASKS) for opt, kind in _numeric(name).items()]
BAD_NUMBERS = ["abc", "", "nan", "1e400", "-1e400", "0x1f", "1\n2", "-99999999999", " ", "1,5"]
BAD_WHOLE = ["1.5", "1e3", "9" * 40, "\u0663"]


@pytest.mark.parametrize("name, opt, kind", NUMERIC, ids=[f"{n}:{o}" for n, o, _ in NUMERIC])
def test_bad_numbers_are_refused_before_work_naming_the_option(ws, name, opt, kind):
    numeric = _numeric(name)
    positional = ["4" if o in numeric else "in/nothing" for o, d in options(TASKS[name]).items()
                  if d is inspect.Parameter.empty and o != opt]
    for bad in _sample(BAD_NUMBERS + (BAD_WHOLE if kind is int else []), f"{name}:{opt}"):
        res = run_cli([name, *positional, f"{flag(opt)}={bad}"])
        assert res.reached is None, (name, opt, bad, res)
        assert res.code == 2 and one_line_failure(res) is None, (name, opt, bad, res)
        assert flag(opt) in res.err_lines[0], (name, opt, bad, res.err)


def test_every_task_has_help_that_runs_nothing(ws):
    for name, task in sorted(TASKS.items()):
        pos = [o for o, d in options(task).items() if d is inspect.Parameter.empty]
        for argv in ([name, "--help"], [name, *(["--help"] * len(pos))] if pos else [name, "-h"]):
            res = run_cli(argv)
            assert res.reached is None and res.code == 0 and not res.err, (argv, res)
            assert "Usage" in res.out or "Docstring" in res.out, (argv, res.out[:200])
