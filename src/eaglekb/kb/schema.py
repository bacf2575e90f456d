"""The baselines schema: what a file under ``baselines/`` may hold, and how its metrics are read.

Owns: the versioned result schema (pydantic, ``extra="forbid"``): ``Citation``,
``Host``, ``InputIdentity``, ``Provenance``, ``Noise``, ``Series`` and ``Baseline``; what schema
v2 requires of a measured result (the sha256 of every input its config names, and a reproduce
command that overwrites nothing; v1 files stay readable for diffs against old revisions); the result kinds;
metric naming rules (every metric name ends in a unit, ``UNITS``); the better
direction of a metric (``NAME_RULES``, ``direction``); parsing a file's text into a
``Baseline`` with one-line errors; and the JSON Schema export.

Knows nothing about where files live, writing, history or comparison (``eaglekb.kb.baselines``
owns those), nor about the task runner or the docs tool.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eaglekb.io.errors import SchemaError
from eaglekb.io.files import DuplicateKey, flatten, unique_keys
from eaglekb.measure.command import reproduce_command, writes_baselines
from eaglekb.measure.provenance import config_inputs

#: A reproduce command that reruns a recipe (``invoke recipe FILE``): for a result whose command read run state
#: (a checkpoint, a run folder) that a clone lacks, the recipe produces that state and reruns the steps.
RECIPE_PREFIX = "invoke recipe "
#: The version new baselines are written with. Version 1 (no content identity, no reproduce command) is
#: still read, for diffs against old revisions; ``invoke baselines.check`` refuses it in the tree.
SCHEMA_VERSION = 2
SHA256_RE = r"^[0-9a-f]{64}$"

#: Result kinds; one folder each under baselines/.
KINDS: dict[str, str] = {
    "plan": "viability arithmetic from `invoke plan`",
    "bench": "throughput: baseline versus speculative decoding, cycle split",
    "probe": "drafter acceptance against a target, offline and online",
    "finetune": "drafter training: losses, per-step accuracy, curves",
    "vocab": "draft-vocab mappings and their comparisons",
    "remap": "moving a drafter to a new mapping",
    "datagen": "data generation: throughput, storage cost, manifests",
    "models": "model preparation: conversion time, cache size",
    "reference": "published numbers from outside (papers, model cards)",
}

#: Metric name suffixes (units), longest match first, with the default better direction.
UNITS: dict[str, tuple[str, str]] = {
    "_tok_s": ("tokens per second", "higher"),
    "_tokens": ("tokens", "none"),
    "_samples": ("samples", "none"),
    "_params": ("parameters", "none"),
    "_steps": ("steps", "none"),
    "_count": ("count", "none"),
    "_bytes": ("bytes", "none"),
    "_mib": ("mebibytes", "none"),
    "_gb": ("gigabytes", "none"),
    "_pct": ("percent", "none"),
    "_frac": ("fraction in [0, 1]", "none"),
    "_len": ("tokens per draft/verify cycle (accept length)", "higher"),
    "_loss": ("training loss (nats)", "lower"),
    "_ms": ("milliseconds", "lower"),
    "_s": ("seconds", "lower"),
    "_x": ("ratio (speedup)", "higher"),
}
_UNIT_ORDER = sorted(UNITS, key=len, reverse=True)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")

Direction = Literal["higher", "lower", "none"]


def unit_of(name: str) -> str | None:
    """The unit suffix a metric name ends with, or None."""
    for suffix in _UNIT_ORDER:
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix
    return None


def _one_of(value: str, allowed: dict[str, Any], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(allowed)}")
    return value


class StrictModel(BaseModel):
    # No docstring: pydantic would copy it into the JSON Schema of every model.
    model_config = ConfigDict(extra="forbid")


class Citation(StrictModel):
    """Where a recorded (not measured) number comes from."""

    document: str = Field(description="the report, paper or model card")
    section: str | None = Field(None, description="section, table or line within it")
    url: str | None = Field(None, description="address, where public")
    note: str | None = Field(None, description="how the number was read from it")


class Host(StrictModel):
    hostname: str | None = None
    os: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    load_avg: list[float] | None = Field(None, min_length=3, max_length=3, description=(
        "the 1, 5 and 15-minute load averages when the result was recorded, the run's own threads included "
        "(absent in results recorded before it was captured)"))
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    gpu_driver: str | None = None
    cuda: str | None = None


class InputIdentity(StrictModel):
    """A file or folder a run read, by content: its sha256 beside the path the config names."""

    role: Literal["drafter", "target", "dataset", "file"] = Field(description="what the input is")
    path: str = Field(description="the path (or embedded model name) as the config records it")
    sha256: str | None = Field(None, pattern=SHA256_RE, description=(
        "sha256 of the identifying files read in order (drafter: config.json then *.safetensors; target: its "
        "weights, or an embedded model's pinned GGUF; dataset: manifest.json); None when unknown"))
    files: dict[str, str] = Field(default_factory=dict, description="file name -> its own sha256")
    basis: str | None = Field(None, description="how the hash was obtained (at run time, or from git history)")
    unknown: str | None = Field(None, description="why there is no hash (required when sha256 is None)")
    git: str | None = Field(None, description="COMMIT:PATH where these exact files are in git history")

    @model_validator(mode="after")
    def _hash_or_reason(self) -> "InputIdentity":
        if (self.sha256 is None) == (not self.unknown):
            raise ValueError("an input holds either sha256 (with its basis) or unknown (the reason), not both")
        if self.sha256 is not None and not self.basis:
            raise ValueError("an input's sha256 needs its basis (how it was obtained)")
        return self


class Provenance(StrictModel):
    command: str = Field(description="the exact command that produced this file")
    reproduce: str | None = Field(None, description=(
        "a command that reruns this result and compares with it, overwriting nothing (`--compare NAME`, no "
        "`--record` or `--force`); required for measured results from schema v2, None for a cited report"))
    inputs: dict[str, InputIdentity] | None = Field(None, description=(
        "config key -> content identity of the file it names (drafter, target, dataset); required for "
        "measured results from schema v2"))
    git_commit: str | None = Field(description="commit the command ran at (None outside git)")
    git_dirty: bool | None = Field(description="uncommitted changes to tracked files at the time")
    host: Host
    versions: dict[str, str | None] = Field(description="python and package versions")
    env: dict[str, str] = Field(default_factory=dict, description="selected environment variables")


class Noise(StrictModel):
    """How much a metric moves between runs, and the tolerance used to compare runs."""

    repeats: int = Field(ge=1, description="independent repeats behind each metric")
    spread_kind: Literal["range", "iqr", "std", "reported-range", "none"] = Field(
        description="what `spread` holds: max-min, interquartile range, standard deviation, "
        "a range as reported by the cited source, or none (exact / single value)"
    )
    spread: dict[str, float] = Field(
        default_factory=dict, description="dotted metric path (within metrics) -> spread, in the metric's unit"
    )
    tolerance_rel: float = Field(ge=0, description="relative tolerance for comparisons (0.05 = 5%)")
    tolerance_abs: dict[str, float] = Field(
        default_factory=dict, description="dotted metric path -> absolute tolerance, in the metric's unit"
    )


class Series(StrictModel):
    """A curve keyed by its x value (for example training step), for plots."""

    x: str = Field(description="what the keys count, e.g. 'step'")
    unit: str = Field(description="unit suffix of the y values, one of UNITS")
    points: dict[str, float] = Field(description="x value (as a string) -> y value")

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, v: str) -> str:
        return _one_of(v, UNITS, "unit")

    @field_validator("points")
    @classmethod
    def _numeric_x(cls, v: dict[str, float]) -> dict[str, float]:
        for x, y in v.items():
            try:
                ok = math.isfinite(float(x)) and math.isfinite(y)
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"point {x!r}: {y!r}: x must be a number (as a string) and y finite")
        return v


class Baseline(StrictModel):
    """One result under review: stable, diffable, carrying what is needed to rerun it."""

    schema_version: Literal[1, 2] = Field(description="version of this schema (new files: 2)")
    kind: str = Field(description="result kind; the folder under baselines/")
    name: str = Field(description="file name without .json; unique within the kind")
    created_at: str = Field(description="UTC time the result was produced, ISO 8601")
    source: Literal["measured", "recorded"] = Field(
        description="measured by a runbook here, or recorded from an external report (see citation)"
    )
    summary: str | None = Field(None, description="one line: what this result says")
    citation: Citation | None = Field(None, description="required when source is 'recorded'")
    provenance: Provenance
    config: dict[str, Any] = Field(description="everything needed to rerun")
    metrics: dict[str, Any] = Field(description="nested metric tree; every leaf name ends in a unit")
    better: dict[str, Direction] = Field(
        default_factory=dict, description="dotted metric path -> better direction, overriding the unit's default"
    )
    series: dict[str, Series] = Field(default_factory=dict, description="curves for plots")
    noise: Noise
    superseded_by: str | None = Field(None, description=(
        "the baseline id (KIND/NAME) that replaces this result, or why it no longer holds; a superseded "
        "result is never the current one"))

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _one_of(v, KINDS, "kind")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"name {v!r} must match {NAME_RE.pattern}")
        return v

    @field_validator("created_at")
    @classmethod
    def _created(cls, v: str) -> str:
        try:
            _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"created_at {v!r} is not ISO 8601") from None
        return v

    @field_validator("series")
    @classmethod
    def _series_names(cls, v: dict[str, Series]) -> dict[str, Series]:
        for key in v:  # a series name becomes part of a plot's file name on the site
            if not KEY_RE.match(key):
                raise ValueError(f"series {key!r}: name must match {KEY_RE.pattern}")
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        _check_metric_tree(v, "metrics")
        if not v:
            raise ValueError("metrics is empty; a baseline holds at least one metric")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "Baseline":
        if self.source == "recorded" and self.citation is None:
            raise ValueError("source 'recorded' needs a citation")
        paths = set(flatten(self.metrics))
        for field_name, mapping in (
            ("better", self.better),
            ("noise.spread", self.noise.spread),
            ("noise.tolerance_abs", self.noise.tolerance_abs),
        ):
            for path in mapping:
                if path not in paths:
                    raise ValueError(f"{field_name} names metric {path!r}, which is not in metrics")
        if self.schema_version >= 2 and self.source == "measured":
            _check_identity(self)
        return self

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def _check_identity(b: "Baseline") -> None:
    """Schema v2, measured: every input the config names has its content identity, and the reproduce
    command reruns the result without recording (``--compare NAME`` for the ``--record NAME`` it ran with)."""
    p = b.provenance
    if p.inputs is None:
        raise ValueError("provenance.inputs is missing: schema v2 records the sha256 of every input the config "
                         "names (run `invoke baselines.identity`)")
    for key, (role, value) in config_inputs(b.config).items():
        entry = p.inputs.get(key)
        if entry is None or entry.path != value:
            raise ValueError(f"provenance.inputs lacks {key!r} ({role} {value!r} in config): no sha256 for it "
                             "(run `invoke baselines.identity`)")
    if not p.reproduce:
        raise ValueError("provenance.reproduce is missing: a measured result carries a command that reruns it "
                         "and overwrites nothing (run `invoke baselines.identity`)")
    writes = writes_baselines(p.reproduce)
    if writes:
        raise ValueError(f"provenance.reproduce carries {', '.join(writes)}: it must rerun and compare, "
                         f"overwriting nothing (expected {reproduce_command(p.command)!r})")
    want = reproduce_command(p.command)
    if p.reproduce.startswith(RECIPE_PREFIX):
        return  # the run state the command read is not in a clone: the recipe that produces it reruns it
    if want and "--compare" in want and "--compare" not in p.reproduce:
        raise ValueError(f"provenance.reproduce does not compare with the recorded result (expected {want!r})")


def _check_metric_tree(tree: Any, where: str) -> None:
    """Every key matches KEY_RE; every leaf is a finite number whose name ends in a unit."""
    if not isinstance(tree, dict):
        raise ValueError(f"{where} must be an object")
    for key, value in tree.items():
        path = f"{where}.{key}"
        if not KEY_RE.match(key):
            raise ValueError(f"{path}: key must match {KEY_RE.pattern}")
        if isinstance(value, dict):
            _check_metric_tree(value, path)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: metric must be a number, found {type(value).__name__}")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path}: metric must be finite, found {value}")
        elif unit_of(key) is None:
            raise ValueError(f"{path}: metric name must end in a unit, one of {sorted(UNITS)}")


#: Words in a metric's dotted path that decide its better direction where the unit cannot
#: (a percent of what?), checked in order, before the unit's default. A baseline's own
#: ``better`` map overrides both.
NAME_RULES: tuple[tuple[str, Direction], ...] = (
    ("breakeven", "lower"),  # a lower break-even accept length is easier to beat
    ("required", "none"),  # what a target needs: arithmetic, not a result
    ("lost", "lower"),
    ("dropped", "lower"),
    ("divergen", "lower"),
    ("mismatch", "lower"),
    ("acc", "higher"),  # accuracy, accept length
    ("coverage", "higher"),
    ("agree", "higher"),
    ("exact", "higher"),
)


def direction(baseline: Baseline, path: str) -> Direction:
    """Whether higher or lower is better for a metric: declared in ``better``, else by the
    first matching word of NAME_RULES, else by its unit's default."""
    if path in baseline.better:
        return baseline.better[path]
    lowered = path.lower()
    for word, rule in NAME_RULES:
        if word in lowered:
            return rule
    unit = unit_of(path.rsplit(".", 1)[-1])
    return UNITS[unit][1] if unit else "none"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a baseline file (for the docs and external validators)."""
    return Baseline.model_json_schema()


# --------------------------------------------------------------------------- reading


def one_line(err: ValidationError) -> str:
    """The first validation error as ``loc: message (+N more)``."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def parse(text: str, where: str) -> Baseline:
    """A file's text as a validated ``Baseline``; bad JSON or a schema violation is one ``SchemaError`` line."""
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise SchemaError("baseline gives a key twice", where=where, expected="each key once in an object",
                          found=f"{exc.args[0]!r} twice") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(
            "baseline is not valid JSON",
            where=f"{where}:{exc.lineno}:{exc.colno}",
            expected="a JSON object",
            found=exc.msg,
        ) from None
    except RecursionError:
        raise SchemaError("baseline is nested too deeply", where=where, expected="JSON nested a few levels",
                          found="deeper than Python's JSON reader goes") from None
    if not isinstance(data, dict):
        raise SchemaError("baseline is not a JSON object", where=where, found=type(data).__name__)
    try:
        return Baseline.model_validate(data)
    except ValidationError as exc:
        version = data.get("schema_version") if data.get("schema_version") in (1, 2) else SCHEMA_VERSION
        raise SchemaError(f"baseline does not match schema v{version}", where=where, found=one_line(exc)) from None
    except RecursionError:
        raise SchemaError("baseline is nested too deeply", where=where, expected="JSON nested a few levels",
                          found="deeper than the schema check goes") from None
