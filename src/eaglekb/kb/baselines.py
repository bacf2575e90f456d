"""Baselines: the schema, and the only code that writes ``baselines/``.

Owns: the versioned result schema (pydantic, ``extra="forbid"``), metric naming
rules (every metric name ends in a unit), stable formatting (sorted keys,
2-space indent, trailing newline), atomic and locked writes, local run history,
loading with one-line errors, validation of a whole tree, and comparison of a
new result with a recorded one within the recorded noise.

Knows nothing about the task runner or the docs tool: runbooks call ``record``
or ``save_history``; docs hooks call ``load_all``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eaglekb.measure import provenance as _prov
from eaglekb.io.errors import BadInput, MissingFile, SchemaError

SCHEMA_VERSION = 1

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
MetricTree = dict[str, Union[float, int, "MetricTree"]]


def unit_of(name: str) -> str | None:
    """The unit suffix a metric name ends with, or None."""
    for suffix in _UNIT_ORDER:
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Citation(_Strict):
    """Where a recorded (not measured) number comes from."""

    document: str = Field(description="the report, paper or model card")
    section: str | None = Field(None, description="section, table or line within it")
    url: str | None = Field(None, description="address, where public")
    note: str | None = Field(None, description="how the number was read from it")


class Host(_Strict):
    hostname: str | None = None
    os: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    gpu_driver: str | None = None
    cuda: str | None = None


class Provenance(_Strict):
    command: str = Field(description="the exact command that produced this file")
    git_commit: str | None = Field(description="commit the command ran at (None outside git)")
    git_dirty: bool | None = Field(description="uncommitted changes to tracked files at the time")
    host: Host
    versions: dict[str, str | None] = Field(description="python and package versions")
    env: dict[str, str] = Field(default_factory=dict, description="selected environment variables")


class Noise(_Strict):
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


class Series(_Strict):
    """A curve keyed by its x value (for example training step), for plots."""

    x: str = Field(description="what the keys count, e.g. 'step'")
    unit: str = Field(description="unit suffix of the y values, one of UNITS")
    points: dict[str, float] = Field(description="x value (as a string) -> y value")

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, v: str) -> str:
        if v not in UNITS:
            raise ValueError(f"unknown unit {v!r}; expected one of {sorted(UNITS)}")
        return v


class Baseline(_Strict):
    """One result under review: stable, diffable, carrying what is needed to rerun it."""

    schema_version: Literal[1] = Field(description="version of this schema")
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

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in KINDS:
            raise ValueError(f"unknown kind {v!r}; expected one of {sorted(KINDS)}")
        return v

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
        return self

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def _check_metric_tree(tree: Any, where: str) -> None:
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


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested metric tree -> {dotted.path: value}, in sorted order."""
    out: dict[str, float] = {}
    for key in sorted(tree):
        value = tree[key]
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


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


# --------------------------------------------------------------------------- paths


def find_root(start: Path | None = None) -> Path:
    """The project root: $EAGLEKB_ROOT, else the nearest folder up with baselines/ and mkdocs.yml."""
    env = os.environ.get("EAGLEKB_ROOT")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "baselines").is_dir() and (folder / "mkdocs.yml").is_file():
            return folder
    return here


def baselines_dir(root: Path | None = None) -> Path:
    return (root or find_root()) / "baselines"


def history_dir(root: Path | None = None) -> Path:
    return (root or find_root()) / ".eaglekb" / "history"


def split_id(baseline_id: str) -> tuple[str, str]:
    kind, sep, name = baseline_id.partition("/")
    if not sep or kind not in KINDS or not NAME_RE.match(name):
        raise BadInput(
            "not a baseline id",
            where=repr(baseline_id),
            expected="KIND/NAME with KIND in " + ", ".join(sorted(KINDS)),
            found=baseline_id,
        )
    return kind, name


def path_for(baseline_id: str, root: Path | None = None) -> Path:
    kind, name = split_id(baseline_id)
    return baselines_dir(root) / kind / f"{name}.json"


# --------------------------------------------------------------------------- reading


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def parse(text: str, where: str) -> Baseline:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(
            "baseline is not valid JSON",
            where=f"{where}:{exc.lineno}:{exc.colno}",
            expected="a JSON object",
            found=exc.msg,
        ) from None
    if not isinstance(data, dict):
        raise SchemaError("baseline is not a JSON object", where=where, found=type(data).__name__)
    try:
        return Baseline.model_validate(data)
    except ValidationError as exc:
        raise SchemaError("baseline does not match schema v1", where=where, found=_one_line(exc)) from None


def load(path: Path) -> Baseline:
    path = Path(path)
    if not path.is_file():
        raise MissingFile("baseline file not found", where=str(path), fix="list them with `invoke baselines.check`")
    baseline = parse(path.read_text(encoding="utf-8"), str(path))
    expected = (path.parent.name, path.stem)
    if (baseline.kind, baseline.name) != expected:
        raise SchemaError(
            "baseline kind/name do not match its path",
            where=str(path),
            expected="/".join(expected),
            found=baseline.id,
        )
    return baseline


def load_id(baseline_id: str, root: Path | None = None) -> Baseline:
    return load(path_for(baseline_id, root))


def exists(baseline_id: str, root: Path | None = None) -> bool:
    try:
        return path_for(baseline_id, root).is_file()
    except BadInput:
        return False


def iter_files(root: Path | None = None) -> list[Path]:
    base = baselines_dir(root)
    return sorted(p for p in base.glob("*/*.json") if p.is_file())


def load_all(root: Path | None = None) -> dict[str, Baseline]:
    """Every baseline by id; the first invalid file raises SchemaError."""
    return {b.id: b for b in (load(p) for p in iter_files(root))}


def check_all(root: Path | None = None) -> tuple[list[str], list[str]]:
    """Validate every file: (ids that passed, one-line problems). Also checks formatting."""
    ok: list[str] = []
    problems: list[str] = []
    base = baselines_dir(root)
    for stray in sorted(base.glob("*.json")) + sorted(base.glob("*/*/*.json")):
        problems.append(f"{stray}: not at baselines/KIND/NAME.json")
    for path in iter_files(root):
        try:
            baseline = load(path)
        except SchemaError as exc:
            problems.append(exc.line())
            continue
        if path.read_text(encoding="utf-8") != dumps(baseline):
            problems.append(f"{path}: not in canonical format (sorted keys, 2-space indent); rewrite with `invoke baselines.check --fix`")
            continue
        ok.append(baseline.id)
    return ok, problems


# --------------------------------------------------------------------------- writing


def dumps(baseline: Baseline) -> str:
    """Canonical text: sorted keys, 2-space indent, trailing newline."""
    data = baseline.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    """Write text so that readers see the old file or the new one, never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build(
    *,
    kind: str,
    name: str,
    config: dict[str, Any],
    metrics: dict[str, Any],
    noise: dict[str, Any] | Noise,
    source: str = "measured",
    summary: str | None = None,
    citation: dict[str, Any] | Citation | None = None,
    better: dict[str, str] | None = None,
    series: dict[str, Any] | None = None,
    command: str | None = None,
    root: Path | None = None,
    created_at: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> Baseline:
    """A validated Baseline with provenance captured now (or given, for a run made on another machine)."""
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "name": name,
        "created_at": created_at or now_utc(),
        "source": source,
        "summary": summary,
        "citation": citation.model_dump() if isinstance(citation, Citation) else citation,
        "provenance": provenance if provenance is not None else _prov.capture(command, root or find_root()),
        "config": config,
        "metrics": metrics,
        "better": better or {},
        "series": series or {},
        "noise": noise.model_dump() if isinstance(noise, Noise) else noise,
    }
    # Round-trip through JSON so that tuples, numpy scalars and paths become plain JSON values.
    data = json.loads(json.dumps(data, default=_jsonable))
    try:
        return Baseline.model_validate(data)
    except ValidationError as exc:
        raise SchemaError("result does not match schema v1", where=f"{kind}/{name}", found=_one_line(exc)) from None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write(baseline: Baseline, root: Path | None = None) -> Path:
    """Write (or replace) baselines/KIND/NAME.json atomically under a lock."""
    base = baselines_dir(root)
    path = base / baseline.kind / f"{baseline.name}.json"
    text = dumps(baseline)
    parse(text, str(path))  # never write what we could not read back
    with _locked(base):
        atomic_write_text(path, text)
    return path


def save_history(baseline: Baseline, root: Path | None = None) -> Path:
    """Write an unrecorded run to the ignored local history folder."""
    folder = history_dir(root) / baseline.kind
    stamp = baseline.created_at.replace(":", "").replace("-", "")
    path = folder / f"{stamp}-{baseline.name}-{os.getpid()}.json"
    atomic_write_text(path, dumps(baseline))
    return path


# --------------------------------------------------------------------------- comparing


class MetricCheck(_Strict):
    path: str
    recorded: float
    new: float | None
    delta: float | None
    allowed: float
    within: bool


class Comparison(_Strict):
    baseline_id: str
    reproduced: bool
    checks: list[MetricCheck]

    def text(self) -> str:
        bad = [c for c in self.checks if not c.within]
        head = (
            f"reproduced {self.baseline_id}: {len(self.checks)} metrics within tolerance"
            if self.reproduced
            else f"NOT reproduced {self.baseline_id}: {len(bad)} of {len(self.checks)} metrics outside tolerance"
        )
        lines = [head]
        for c in bad:
            new = "missing" if c.new is None else f"{c.new:.6g}"
            lines.append(f"  {c.path}: recorded {c.recorded:.6g}, now {new}, allowed +/-{c.allowed:.6g}")
        return "\n".join(lines)


def allowed_delta(recorded: Baseline, path: str) -> float:
    value = flatten(recorded.metrics)[path]
    return max(
        recorded.noise.tolerance_abs.get(path, 0.0),
        recorded.noise.tolerance_rel * abs(value),
        recorded.noise.spread.get(path, 0.0),
    )


def compare(new: Baseline, recorded: Baseline) -> Comparison:
    """Each recorded metric against the new run, within the recorded tolerance."""
    old_m, new_m = flatten(recorded.metrics), flatten(new.metrics)
    checks = []
    for path, old in old_m.items():
        allowed = allowed_delta(recorded, path)
        value = new_m.get(path)
        delta = None if value is None else value - old
        within = delta is not None and abs(delta) <= allowed + 1e-12 * max(1.0, abs(old))
        checks.append(MetricCheck(path=path, recorded=old, new=value, delta=delta, allowed=allowed, within=within))
    return Comparison(baseline_id=recorded.id, reproduced=all(c.within for c in checks), checks=checks)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a baseline file (for the docs and external validators)."""
    return Baseline.model_json_schema()


def find_same_config(kind: str, config: dict[str, Any], root: Path | None = None) -> Baseline | None:
    """A measured baseline of this kind whose config equals ``config`` (first by name), or None."""
    want = json.loads(json.dumps(config, default=_jsonable))
    for path in iter_files(root):
        if path.parent.name != kind:
            continue
        baseline = load(path)
        if baseline.source == "measured" and baseline.config == want:
            return baseline
    return None
