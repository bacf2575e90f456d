"""The one parser of each option name (``OPTIONS``) and the parsers themselves, for ``runbooks._common``.

invoke hands every value over as text; ``parse_options`` turns each into a typed value in range before
the task body runs, with one shared parser per option name (``OPTIONS``; a task may override one with
``@task(options={...})``) or, for a name not listed, by the type of the option's default (a whole number
or a number, not negative). Every error names the option as the user typed it (``--num-prompts``).
"""

from __future__ import annotations

import inspect
import math
import re
import unicodedata
from typing import Any, Callable

from eaglekb.io.errors import BadInput
from eaglekb.kb import baselines



def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _found(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Opt:
    """One option's parser: ``Opt(int, lo=1)(value, "--steps")`` -> 3, or a one-line ``BadInput``."""

    def __init__(self, kind: type, *, lo: float | None = None, hi: float | None = None, above: float | None = None,
                 choices: tuple[str, ...] | None = None, pattern: str | None = None, expected: str | None = None,
                 label: str | None = None, limit: int | None = None):
        self.kind, self.lo, self.hi, self.above, self.choices = kind, lo, hi, above, choices
        self.limit = limit  # free text (``free_text``): at most this many characters, one printable line
        self.label = label  # how the help writes a value (PATH, NAME); None: from the kind
        self.pattern = re.compile(pattern) if pattern else None
        self.expected = expected or self._describe()

    def _describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return "text" if self.pattern is None else f"text matching {self.pattern.pattern}"
        bounds = [f"> {_num(self.above)}" if self.above is not None else "",
                  f">= {_num(self.lo)}" if self.lo is not None else "", f"<= {_num(self.hi)}" if self.hi is not None else ""]
        noun = "a whole number" if self.kind is int else "a number"
        return " ".join([noun, " and ".join(b for b in bounds if b)]).strip()

    def __call__(self, value: Any, option: str) -> Any:
        if value is None:
            return None
        if self.kind is int:
            out = self._int(value, option)
        elif self.kind is float:
            out = self._float(value, option)
        else:
            out = text(value, option) if self.limit is None else free_text_value(value, option, self.limit)
            if self.choices and out not in self.choices or self.pattern and not self.pattern.fullmatch(out):
                raise BadInput("not an accepted value", where=option, expected=self.expected, found=_found(value))
            return out
        if (self.lo is not None and out < self.lo) or (self.hi is not None and out > self.hi) or (
                self.above is not None and out <= self.above):
            raise BadInput("out of range", where=option, expected=self.expected, found=_found(value))
        return out

    def _int(self, value: Any, option: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", value):
            return int(value)
        raise BadInput("not a whole number", where=option, expected=self.expected, found=_found(value))

    def _float(self, value: Any, option: str) -> float:
        try:
            out = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        except ValueError:
            out = None
        if out is None or not math.isfinite(out):
            raise BadInput("not a number", where=option, expected=self.expected, found=_found(value))
        return out


def text(value: Any, option: str) -> str:
    """Any text without a NUL byte (a path, a name, a URL)."""
    value = str(value)
    if "\x00" in value:
        raise BadInput("option value holds a NUL byte", where=option, expected="text without NUL", found=_found(value))
    return value


def _unprintable(char: str) -> bool:
    """A control, format, surrogate or unassigned character, or a line or paragraph separator: what breaks a
    one-line record, a JSON reader's view, a terminal or a page's version list."""
    return unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp")


def free_text_value(value: Any, option: str, limit: int) -> str:
    """The one check of free text that ends up in a file or on the site (a commit, a command line, a docs
    version): at most ``limit`` characters, one line of printable characters (no control characters)."""
    value = str(value)
    if len(value) > limit:
        raise BadInput("text too long", where=option, expected=f"at most {limit} characters",
                       found=f"{len(value):,} characters ({_found(value[:40])}...)")
    bad = next((i for i, ch in enumerate(value) if _unprintable(ch)), None)
    if bad is not None:
        raise BadInput("text holds a control character", where=option,
                       expected="one line of printable characters", found=f"{value[bad]!r} at character {bad + 1}")
    return value


def free_text(limit: int, *, pattern: str | None = None, expected: str | None = None) -> Opt:
    """The parser of a free-text option (``free_text_value``), optionally also matching ``pattern``."""
    return Opt(str, pattern=pattern, limit=limit,
               expected=expected or f"text of at most {limit} printable characters on one line")


def whole(lo: int | None = None, hi: int | None = None) -> Opt:
    return Opt(int, lo=lo, hi=hi)


def real(lo: float | None = None, hi: float | None = None, above: float | None = None) -> Opt:
    return Opt(float, lo=lo, hi=hi, above=above)


def one_of(*choices: str) -> Opt:
    return Opt(str, choices=choices)


BASELINE_NAME = Opt(str, pattern=baselines.NAME_RE.pattern.strip("^$"),
                    expected="a baseline name: lower-case letters, digits, . _ - (at most 100, e.g. cpu-run-1)")
#: A path or a model given as empty text would quietly mean the current folder: refused instead.
PATH = Opt(str, pattern=r"(?s).*\S.*", expected="a path or a name (not empty)", label="PATH")
#: A docs version or alias: a folder of the published site and an entry of its version list.
DOCS_NAME = free_text(64, pattern=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
                      expected="letters, digits, . _ + - (at most 64 characters, e.g. 0.1)")
DOCS_ALIAS = free_text(64, pattern=r"(?:[A-Za-z0-9][A-Za-z0-9._+-]*)?",
                       expected="letters, digits, . _ + - (at most 64 characters, e.g. latest), or '' for none")
#: The most draft steps per cycle a run takes (bench, plan.sglang): more is refused as a step count, not left for
#: the static cache to refuse as a prompt that does not fit.
MAX_DRAFT_STEPS = 64
_MANY = 1 << 20  # a generous upper bound for counts and lengths: a typo, not a plan, beyond it

#: The one parser of each option name, for every task that has it (``@task(options=...)`` overrides).
OPTIONS: dict[str, Callable[[Any, str], Any]] = {
    "a_per_source": whole(1, 10**6), "b_per_source": whole(1, 10**6), "eval_count": whole(1, 10**6),
    "max_prompt_chars": whole(1, 10**7), "b_small": whole(0, 10**7), "soft_limit_s": real(above=0),
    "export_max_mib": real(lo=0, hi=1 << 20), "threads": whole(0, 4096), "cpu_step_threads": whole(0, 4096), "nproc": whole(1, 1024),
    "accept_len": real(above=0, hi=1e4), "baseline_tps": real(above=0, hi=1e9), "cycle_ms": real(lo=1e-6, hi=1e9),
    "target_tps": real(above=0, hi=1e12), "threshold": real(lo=0),
    "num_prompts": whole(1, _MANY), "max_new_tokens": whole(1, _MANY), "max_len": whole(2, _MANY),
    "steps": whole(1, _MANY), "topk": whole(1, 1024), "draft_tokens": whole(1, 1 << 16),
    "repeats": whole(1, 10_000), "warmup": whole(0, 10_000), "seed": whole(0, 2**63 - 1),
    "per_source": whole(0, 10**9), "batch_size": whole(1, _MANY), "shard_size": whole(1, _MANY),
    "draft_vocab_size": whole(1, _MANY), "intermediate_size": whole(1, _MANY), "ttt_steps": whole(1, 64),
    "epochs": real(above=0, hi=10**6), "lr": real(above=0, hi=10), "warmup_frac": real(lo=0, hi=1),
    "grad_clip": real(lo=0), "val_fraction": real(lo=0, hi=0.9), "eval_every": whole(0, _MANY),
    "save_every": whole(0, _MANY), "stop_after": whole(1, _MANY), "min_lr_frac": real(lo=0, hi=1),
    "temperature": real(lo=0, hi=100), "top_p": real(above=0, hi=1), "min_draft_prob": real(lo=0, hi=1), "eval_limit": whole(1, _MANY),
    "train_limit": whole(1, _MANY), "fit_steps": whole(0, _MANY),
    "dtype": one_of("float32", "bfloat16", "float16"), "mode": one_of("greedy", "sampled"),
    "features": one_of("stored", "online"), "generator": one_of("auto", "hf", "engine"),
    "positions": one_of("runtime", "specforge"), "graphs": one_of("auto", "on", "off", "both"),
    "compile": one_of("auto", "on", "off"), "amp": one_of("bfloat16", "none"),
    "fail_on": one_of("regression", "change", "none"),
    "record": BASELINE_NAME, "compare": BASELINE_NAME,
    **{name: PATH for name in ("target", "model", "drafter", "reference_drafter", "data", "prompts", "prompts_file",
                               "counts", "mapping", "init", "val_data", "online_target", "against", "source_counts",
                               "work", "pieces", "drafters", "site_dir", "save_counts", "run_dir")}, "time_budget_s": real(above=0, hi=10**9),
    "batching": one_of("random", "length"), "alias_type": one_of("symlink", "redirect", "copy"),
    "fused": one_of("auto", "on", "off"), "cpu_packed": one_of("auto", "on", "off"),
    "cpu_draft_fp16": one_of("auto", "on", "off"), "cpu_target_fp16": one_of("auto", "on", "off"),
    "cpu_draft_int8": one_of("auto", "on", "off"),
    # free text that ends up in a baseline, a manifest or the site: one printable line of bounded length
    "commit": free_text(100), "command": free_text(4000), "server_model": free_text(200), "names": free_text(1000),
    "version": DOCS_NAME, "alias": DOCS_ALIAS, "branch": free_text(200), "peers": free_text(1000),
    "device": free_text(64),
}


def parse_options(fn: Callable, values: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each option value parsed by its parser (``overrides``, then ``OPTIONS``, then the default's type)."""
    defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()}
    out = dict(values)
    for name, value in values.items():
        parser = (overrides or {}).get(name, OPTIONS.get(name))
        default = defaults.get(name)
        if parser is None and type(default) in (int, float):  # a count or a size: never negative
            parser = whole(0, 2**63 - 1) if type(default) is int else real(lo=0)
        if parser is None and isinstance(value, bool):
            continue
        parser = parser or text
        option = "--" + name.replace("_", "-")
        if isinstance(value, (list, tuple)):
            out[name] = [parser(v, option) for v in value]
        elif value is not None:
            out[name] = parser(value, option)
    return out


def parse_floats(values: Any, option: str) -> list[float]:
    """A repeatable numeric option (list or comma-separated string) as finite numbers."""
    if values is None:
        return []
    if isinstance(values, (str, int, float)):
        values = [values]
    return [real()(part.strip(), option) for v in values for part in str(v).split(",") if part.strip()]


def parse_int(value: Any, option: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """A whole-number option given as text or a number (None or empty: not given)."""
    if value in (None, ""):
        return None
    return whole(lo, hi)(value, option)


def env_pairs(values, option: str) -> dict:
    """KEY=VALUE options (repeatable) as a dict; one line for anything else."""
    from eaglekb.io.errors import BadInput

    out = {}
    for v in values or []:
        key, sep, val = str(v).partition("=")
        if not sep or not key or not key.replace("_", "").isalnum() or not key[0].isalpha():
            raise BadInput("not an environment setting", where=f"{option} {v}", expected="KEY=VALUE (e.g. "
                           "SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1)", found=repr(str(v))[:80])
        out[key] = val
    return out
