"""Baselines: the only code that writes ``baselines/``, and the one recorder.

Owns: where baseline files live (``find_root``, ``baselines_dir``, ``path_for``,
the ignored local ``history_dir``), building a validated ``Baseline`` with
provenance (``build``), canonical text (``dumps``: sorted keys, 2-space indent,
trailing newline), atomic and locked writes (``write``, ``save_history``),
loading with one-line errors (``load``, ``load_id``, ``load_all``), validation of a
whole tree (``check_all``), and finding the recorded baseline a run compares with
(``find_same_config``; the two-part comparison itself, ``compare``, is ``eaglekb.kb.reproduce``).

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
from eaglekb.io.errors import one_line as _one_line
from eaglekb.io.files import atomic_write_text, flatten, output_lock, stable_json
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
from eaglekb.measure.command import reproduce_command
from eaglekb.kb.reproduce import (  # noqa: F401  (re-exported: the comparison of a run with a baseline)
    Calibration,
    Comparison,
    MetricCheck,
    allowed_delta,
    compare,
    is_timing,
)

# --------------------------------------------------------------------------- paths


def find_root(start: Path | None = None) -> Path:
    """The project root: $EAGLEKB_ROOT (which must exist), else the nearest folder up with baselines/
    and mkdocs.yml."""
    env = os.environ.get("EAGLEKB_ROOT")
    if env:
        if not Path(env).is_dir():
            raise MissingFile("EAGLEKB_ROOT is not a folder", where=f"EAGLEKB_ROOT={env}",
                              expected="the eaglekb checkout (the folder with baselines/ and mkdocs.yml)",
                              found="no such folder", fix="unset EAGLEKB_ROOT or point it at the checkout")
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


#: A baseline file larger than this is refused (the largest real one is tens of KB; a curve of 10,000
#: points is well under 1 MiB): the site renders every baseline, and reviewers read them in diffs.
MAX_FILE_BYTES = 4 << 20


def read_text(path: Path) -> str:
    """A baseline file's text: refuses a dangling link, a file over ``MAX_FILE_BYTES`` and non-UTF-8 bytes."""
    if path.is_symlink() and not path.exists():
        raise SchemaError("baseline is a dangling symbolic link", where=str(path), expected="a JSON file",
                          found=f"a link to {os.readlink(path)}", fix="remove the link or restore its target")
    if not path.is_file():
        raise MissingFile("baseline file not found", where=str(path), fix="list them with `invoke baselines.check`")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SchemaError("baseline file too large", where=str(path), expected=f"at most {MAX_FILE_BYTES} bytes",
                          found=f"{size} bytes", fix="keep long curves short (resample the series)")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError("baseline file is not UTF-8 text", where=str(path), expected="UTF-8 JSON",
                          found=f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}") from None


def load(path: Path) -> Baseline:
    """One baseline file, validated; its kind and name must match its path."""
    path = Path(path)
    baseline = parse(read_text(path), str(path))
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
    """Every ``baselines/KIND/NAME.json``, sorted: files, and links (a dangling one fails to load)."""
    base = baselines_dir(root)
    return sorted(p for p in base.glob("*/*.json") if p.is_file() or p.is_symlink())


def load_all(root: Path | None = None, *, current: bool = False) -> dict[str, Baseline]:
    """Every baseline by id; the first invalid file raises SchemaError. With ``current`` (the site build),
    also a file that the tree may no longer hold (``tree_problem``: schema v1, a dangling superseded_by)."""
    files = iter_files(root)
    out = {b.id: b for b in (load(p) for p in files)}
    if current:
        for path in files:
            problem = tree_problem(out[f"{path.parent.name}/{path.stem}"], out, path)
            if problem:
                raise SchemaError(problem, where=str(path), fix="run `invoke baselines.identity`, then "
                                  "`invoke baselines.check`")
    return out


def tree_problem(baseline: Baseline, ids: Any, path: Path | str) -> str | None:
    """Why a valid file may not stay in the tree, or None: a schema v1 file (recorded before content
    identity: no sha256 of its inputs, no reproduce command) or a ``superseded_by`` naming no baseline."""
    if baseline.schema_version < SCHEMA_VERSION:
        return (f"schema v{baseline.schema_version} baseline: no sha256 of its inputs and no reproduce command "
                f"(schema v{SCHEMA_VERSION} requires both)")
    sup = baseline.superseded_by
    if sup and "/" in sup and " " not in sup and sup not in ids:
        return f"superseded_by names {sup!r}, which is not a baseline"
    return None


def drafter_moved(baseline: Baseline, root: Path, hashes: dict[str, str | None] | None = None) -> str | None:
    """Why a record's drafter is no longer where it says, or None: a drafter input whose path is in this
    tree (``drafters/NAME``) but whose files there hash to another sha256 than the one recorded (the path
    was given to another drafter). HASHES caches path -> sha256 across records."""
    hashes = {} if hashes is None else hashes
    for key, entry in sorted((baseline.provenance.inputs or {}).items()):
        if entry.role != "drafter" or not entry.sha256 or Path(entry.path).is_absolute():
            continue
        folder = (root / entry.path).resolve()
        if not folder.is_relative_to(root.resolve()) or not folder.exists():
            continue  # a run folder or a path on the recording machine: nothing here to compare
        if entry.path not in hashes:
            hashes[entry.path] = _prov.input_identity("drafter", str(folder), root).get("sha256")
        if hashes[entry.path] != entry.sha256:
            return (f"provenance.inputs.{key}: {entry.path} now holds other files (sha256 "
                    f"{(hashes[entry.path] or 'unreadable')[:12]}...) than the recorded {entry.sha256[:12]}...; "
                    "fix: name the path that holds the recorded files, or set sha256 null with `unknown` saying "
                    "where they went")
    return None


def check_all(root: Path | None = None) -> tuple[list[str], list[str]]:
    """Validate every file: (ids that passed, one-line problems). Also checks formatting."""
    ok: list[str] = []
    problems: list[str] = []
    base = baselines_dir(root)
    if not base.is_dir():
        raise MissingFile("no baselines folder", where=str(base), expected="baselines/KIND/NAME.json files",
                          found="no such folder", fix="run in the eaglekb checkout or set EAGLEKB_ROOT to it")
    for stray in sorted(base.glob("*.json")) + sorted(base.glob("*/*/*.json")):
        problems.append(_one_line(f"{stray}: not at baselines/KIND/NAME.json"))
    for path in iter_files(root):
        try:
            baseline = load(path)
        except (SchemaError, MissingFile) as exc:
            problems.append(exc.line())
            continue
        if read_text(path) != dumps(baseline):
            problems.append(_one_line(f"{path}: not in canonical format (sorted keys, 2-space indent); rewrite with `invoke baselines.check --fix`"))
            continue
        ok.append(baseline.id)
    ids = {f"{p.parent.name}/{p.stem}" for p in iter_files(root)}
    hashes: dict[str, str | None] = {}
    for bid in list(ok):
        path = path_for(bid, root)
        baseline = load(path)
        problem = tree_problem(baseline, ids, path)
        if problem:
            ok.remove(bid)
            problems.append(_one_line(f"{path}: {problem}; fix: run `invoke baselines.identity`"))
            continue
        moved = drafter_moved(baseline, find_root() if root is None else root, hashes)
        if moved:
            ok.remove(bid)
            problems.append(_one_line(f"{path}: {moved}"))
    return ok, problems


# --------------------------------------------------------------------------- writing


def dumps(baseline: Baseline) -> str:
    """Canonical text: sorted keys, 2-space indent, trailing newline; the optional fields that schema v2 added
    are left out where empty (a v1 file reads back as it was written)."""
    data = baseline.model_dump(mode="json")
    for holder, key in ((data, "superseded_by"), (data["provenance"], "reproduce"), (data["provenance"], "inputs"),
                        (data["provenance"]["host"], "load_avg")):
        if holder.get(key) is None:
            holder.pop(key, None)
    return stable_json(data)


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
    """A validated Baseline with provenance captured now (or given, for a run made on another machine).

    A measured result also gets its content identity (``provenance.inputs``: the sha256 of the drafter,
    target and dataset its config names, hashed here unless the given provenance carries them) and its
    reproduce command (``provenance.reproduce``: the command with ``--compare`` for ``--record``)."""
    root = root or find_root()
    provenance = dict(provenance) if provenance is not None else _prov.capture(command, root)
    if source == "measured":
        provenance.setdefault("inputs", _prov.content_identity(config, root))
        provenance.setdefault("reproduce", reproduce_command(provenance["command"]))
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "name": name,
        "created_at": created_at or now_utc(),
        "source": source,
        "summary": summary,
        "citation": citation.model_dump() if isinstance(citation, Citation) else citation,
        "provenance": provenance,
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
        raise SchemaError(f"result does not match schema v{SCHEMA_VERSION}", where=f"{kind}/{name}",
                          found=one_line(exc)) from None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def check_can_record(baseline_id: str, *, force: bool = False, source: str = "measured",
                     root: Path | None = None, where: str | None = None) -> None:
    """Refuse to record ``KIND/NAME`` over an existing baseline unless ``force``, and over a cited
    record (source "recorded") by anything but another record, ``force`` or not."""
    path = path_for(baseline_id, root)
    if not (path.exists() or path.is_symlink()):
        return
    try:
        old_source = json.loads(read_text(path)).get("source")
    except (ValueError, AttributeError, SchemaError):
        old_source = None  # an unreadable file is replaced only with force, below
    where = where or str(path)
    if old_source == "recorded" and source != "recorded":
        raise BadInput("a cited record cannot be replaced by a run", where=where,
                       expected="a new baseline name", found=f"{baseline_id} (source recorded: a cited report)",
                       fix="record under another name")
    if not force:
        raise BadInput("baseline already recorded", where=where, expected="a new baseline name",
                       found=f"{baseline_id} exists", fix="choose another name, or pass --force to replace it")


def write(baseline: Baseline, root: Path | None = None, *, force: bool = False) -> Path:
    """Write baselines/KIND/NAME.json atomically under a lock; replacing one needs ``force`` and a cited
    record is never replaced by a measured result (``check_can_record``, under the same lock)."""
    base = baselines_dir(root)
    if not base.parent.is_dir():
        raise MissingFile("no project folder", where=str(base.parent), expected="the eaglekb checkout",
                          found="no such folder", fix="run in the eaglekb checkout or set EAGLEKB_ROOT to it")
    path = base / baseline.kind / f"{baseline.name}.json"
    text = dumps(baseline)
    parse(text, str(path))  # never write what we could not read back
    with _locked(base):
        check_can_record(baseline.id, force=force, source=baseline.source, root=root)
        atomic_write_text(path, text)
    return path


@contextlib.contextmanager
def record_lock(baseline_id: str, *, where: str, root: Path | None = None) -> Iterator[Path]:
    """Hold baselines/KIND/.NAME.json.lock while a run that will record KIND/NAME works: a second run recording
    the same name at the same time is refused at once in one line (``output_lock``), not after its work."""
    with output_lock(path_for(baseline_id, root), where=where) as lock:
        yield lock


def save_history(baseline: Baseline, root: Path | None = None) -> Path:
    """Write an unrecorded run to the ignored local history folder (the project root must exist)."""
    folder = history_dir(root) / baseline.kind
    stamp = baseline.created_at.replace(":", "").replace("-", "")
    path = folder / f"{stamp}-{baseline.name}-{os.getpid()}.json"
    atomic_write_text(path, dumps(baseline))
    return path


# --------------------------------------------------------------------------- comparing


# ``compare`` and its rules (deterministic metrics within tolerance, timings normalised by the run's
# calibration) live in eaglekb.kb.reproduce; re-exported above for one-import callers.


def _same_inputs(config: Any) -> Any:
    """A config as compared between runs: a manifest (a mapping with a ``sha256``) by its hash alone, so a
    manifest that gained a descriptive field still names the same prompts or data."""
    if isinstance(config, dict):
        if isinstance(config.get("sha256"), str):
            return {"sha256": config["sha256"]}
        return {k: _same_inputs(v) for k, v in config.items()}
    if isinstance(config, list):
        return [_same_inputs(v) for v in config]
    return config


def find_same_config(kind: str, config: dict[str, Any], root: Path | None = None) -> Baseline | None:
    """A measured baseline of this kind whose config equals ``config`` (manifests by their hash; first by
    name), or None."""
    want = _same_inputs(json.loads(json.dumps(config, default=_jsonable)))
    for path in iter_files(root):
        if path.parent.name != kind:
            continue
        baseline = load(path)
        if baseline.source == "measured" and _same_inputs(baseline.config) == want:
            return baseline
    return None
