"""Baselines: the only code that writes ``baselines/``, and the one recorder.

Owns: where baseline files live (``find_root``, ``baselines_dir``, ``path_for``,
the ignored local ``history_dir``), building a validated ``Baseline`` with
provenance (``build``), canonical text (``dumps``: sorted keys, 2-space indent,
trailing newline), atomic and locked writes (``write``, ``save_history``),
loading with one-line errors (``load``, ``load_id``, ``load_all``), validation of a
whole tree (``check_all``), and comparison of a new result with a recorded one
within the recorded noise (``compare``, ``find_same_config``).

The schema itself lives in ``eaglekb.kb.schema``; its public names are re-exported
here so callers need one import. Knows nothing about the task runner or the docs
tool: runbooks call ``build`` / ``write`` / ``save_history``; docs hooks call ``load_all``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from eaglekb.io.errors import BadInput, MissingFile, SchemaError
from eaglekb.io.files import atomic_write_text, flatten, stable_json
from eaglekb.kb.schema import (  # noqa: F401  (the schema's public names, re-exported for one-import callers)
    KINDS,
    NAME_RE,
    NAME_RULES,
    SCHEMA_VERSION,
    UNITS,
    Baseline,
    Citation,
    Noise,
    StrictModel,
    direction,
    json_schema,
    one_line,
    parse,
    unit_of,
)
from eaglekb.measure import provenance as _prov

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
    """``ROOT/baselines``: the recorded results, one folder per kind."""
    return (root or find_root()) / "baselines"


def history_dir(root: Path | None = None) -> Path:
    """``ROOT/.eaglekb/history``: unrecorded runs (git-ignored)."""
    return (root or find_root()) / ".eaglekb" / "history"


def split_id(baseline_id: str) -> tuple[str, str]:
    """``KIND/NAME`` -> (kind, name); a malformed id is ``BadInput``."""
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
    """``ROOT/baselines/KIND/NAME.json`` for a baseline id."""
    kind, name = split_id(baseline_id)
    return baselines_dir(root) / kind / f"{name}.json"


# --------------------------------------------------------------------------- reading


def load(path: Path) -> Baseline:
    """One baseline file, validated; its kind and name must match its path."""
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
    """The baseline ``KIND/NAME`` under ``root``."""
    return load(path_for(baseline_id, root))


def exists(baseline_id: str, root: Path | None = None) -> bool:
    """Whether ``KIND/NAME`` is recorded (False for a malformed id)."""
    try:
        return path_for(baseline_id, root).is_file()
    except BadInput:
        return False


def iter_files(root: Path | None = None) -> list[Path]:
    """Every ``baselines/KIND/NAME.json``, sorted."""
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
    return stable_json(baseline.model_dump(mode="json"))


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder/.lock`` (concurrent writers take turns)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def now_utc() -> str:
    """The current UTC time, ISO 8601 to the second, with a ``Z``."""
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
        raise SchemaError("result does not match schema v1", where=f"{kind}/{name}", found=one_line(exc)) from None


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


class MetricCheck(StrictModel):
    path: str
    recorded: float
    new: float | None
    delta: float | None
    allowed: float
    within: bool


class Comparison(StrictModel):
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
    """How far a metric may move: the largest of its absolute tolerance, relative tolerance and spread."""
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
