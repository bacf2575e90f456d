"""Baseline diffs between two git revisions, for review and CI gates.

Owns: reading ``baselines/**/*.json`` at a git revision (or the working tree),
pairing files across the two revisions (added, removed, changed, renamed), the
per-metric comparison against the recorded noise (or a relative threshold) with
the metric's better direction, and config / environment / series differences, as
one ``DiffReport``. Its Markdown, text and JSON renderings live in
``eaglekb.kb.diff_render``.

Unlike ``dvc metrics diff``: lists in config are compared element by element
(``path.0``, ``path.1`` ...), each change is judged against the noise the
baseline records, a change in the bad direction is a regression, and
``DiffReport.should_fail`` gives CI a gate.

Knows nothing about the task runner or the docs tool; reads git through the
``git`` command only, and never writes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Literal

from eaglekb.io.errors import BadInput, EaglekbError, Unavailable, one_line
from eaglekb.io.files import flatten
from eaglekb.kb.baselines import MAX_FILE_BYTES, allowed_delta, find_root
from eaglekb.kb.baselines import read_text as read_baseline_text
from eaglekb.kb.schema import Baseline, Direction, Series, StrictModel, direction, parse

#: The revision value meaning "the files on disk now" (the default for REV_B).
WORKTREE = "WORKTREE"
#: What ``should_fail`` accepts.
FAIL_ON = ("regression", "change", "none")

Flag = Literal["regression", "improvement", "changed", "within-noise"]
_EPS = 1e-12
_MISSING = object()


class MetricChange(StrictModel):
    path: str  # dotted path within metrics
    old: float
    new: float
    delta: float  # new - old, in the metric's unit
    rel: float | None  # delta / |old|; None when old is 0
    allowed: float  # |delta| above this is flagged
    basis: Literal["noise", "threshold"]  # where `allowed` came from
    direction: Direction  # which way is better
    flag: Flag


class ValueChange(StrictModel):
    path: str  # dotted path; list items as path.0, path.1 ...
    change: Literal["added", "removed", "changed"]
    old: Any = None
    new: Any = None


class SeriesChange(StrictModel):
    name: str
    x: str  # what the keys count, at REV_B (REV_A when removed)
    change: Literal["added", "removed", "changed"]
    points_old: int
    points_new: int
    points_changed: int = 0  # same x, different y
    points_added: int = 0
    points_removed: int = 0
    max_abs_change: float | None = None
    max_at: str | None = None  # the x value of the largest change
    notes: list[str] = []  # x label or unit changed


class BaselineChange(StrictModel):
    id: str  # KIND/NAME at REV_B (at REV_A when removed)
    status: Literal["added", "removed", "changed", "renamed"]
    old_path: str | None
    new_path: str | None
    metrics: list[MetricChange] = []
    metrics_added: dict[str, float] = {}
    metrics_removed: dict[str, float] = {}
    metrics_unchanged: int = 0
    series: list[SeriesChange] = []
    config: list[ValueChange] = []
    environment: list[ValueChange] = []  # provenance and created_at
    other: list[ValueChange] = []  # noise, better, source, summary, citation

    def count(self, flag: Flag) -> int:
        return sum(m.flag == flag for m in self.metrics)


class Problem(StrictModel):
    revision: str
    path: str
    error: str  # one line

    def line(self) -> str:
        return one_line(f"{self.revision}: {self.path}: {self.error}")


class DiffReport(StrictModel):
    rev_a: str  # as given, or "merge-base of main" / "HEAD" when defaulted
    rev_b: str
    commit_a: str | None  # None for the working tree
    commit_b: str | None
    threshold_rel: float | None
    changes: list[BaselineChange]
    problems: list[Problem]
    unchanged: int  # baselines identical at both revisions

    def count(self, flag: Flag) -> int:
        return sum(c.count(flag) for c in self.changes)

    def should_fail(self, fail_on: str) -> bool:
        """The CI gate: 'regression' (any flagged regression, a baseline removed, or a file unreadable
        at REV_B), 'change' (any flagged metric change, a baseline added, removed or renamed, or a file
        unreadable at REV_B), or 'none'. A gate never passes what it could not read."""
        if fail_on not in FAIL_ON:
            raise BadInput("unknown --fail-on value", where="--fail-on",
                           expected=" | ".join(FAIL_ON), found=repr(fail_on))
        if fail_on == "none":
            return False
        unreadable = any(p.revision == self.label("b") for p in self.problems)
        if fail_on == "regression":
            return unreadable or self.count("regression") > 0 or any(c.status == "removed" for c in self.changes)
        flagged = any(m.flag != "within-noise" for c in self.changes for m in c.metrics)
        return unreadable or flagged or any(c.status != "changed" for c in self.changes)

    def label(self, which: str) -> str:
        return _label(*((self.rev_a, self.commit_a) if which == "a" else (self.rev_b, self.commit_b)))

    def tally(self) -> str:
        """'2 changed, 1 added (5 unchanged)'."""
        by = {s: sum(c.status == s for c in self.changes) for s in ("changed", "added", "removed", "renamed")}
        parts = [f"{n} {s}" for s, n in by.items() if n] or ["no baseline changed"]
        tail = f"; {len(self.problems)} unreadable file(s)" if self.problems else ""
        return ", ".join(parts) + f" ({self.unchanged} unchanged)" + tail

    def summary(self) -> str:
        flags = [f"{self.count('regression')} regression(s)", f"{self.count('improvement')} improvement(s)"]
        if self.count("changed"):
            flags.append(f"{self.count('changed')} other change(s) beyond noise")
        return f"baselines {self.label('a')} → {self.label('b')}: " + ", ".join(flags) + "; " + self.tally()


# --------------------------------------------------------------------------- git


def _label(rev: str, commit: str | None) -> str:
    if commit is None:
        return "working tree"
    return commit[:10] if rev.startswith(commit[:7]) else f"{rev} ({commit[:10]})"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        raise Unavailable("git is not installed", expected="git on PATH", fix="install git") from None


def _commit_of(root: Path, rev: str, where: str) -> str:
    if _git(root, "rev-parse", "--git-dir").returncode != 0:
        raise BadInput("not a git repository", where=str(root), expected="a git checkout",
                       fix="run inside the eaglekb checkout or set EAGLEKB_ROOT")
    out = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if out.returncode != 0:
        no_commits = _git(root, "rev-parse", "--verify", "--quiet", "HEAD").returncode != 0
        raise BadInput("revision not found", where=where, expected=f"a git revision or {WORKTREE}",
                       found=repr(rev), fix="the repository has no commits yet; commit first" if no_commits
                       else "check `git log --oneline`; fetch the branch if it is remote")
    return out.stdout.decode().strip()


def default_rev_a(root: Path) -> tuple[str, str]:
    """(revision, how to name it): the merge-base of main and HEAD, else HEAD."""
    out = _git(root, "merge-base", "main", "HEAD")
    if out.returncode == 0:
        return out.stdout.decode().strip(), "merge-base of main"
    return "HEAD", "HEAD"


def _read_git(root: Path, commit: str, label: str) -> tuple[dict[str, str], list[Problem]]:
    out = _git(root, "ls-tree", "-r", "--name-only", commit, "--", "baselines/")
    if out.returncode != 0:
        raise Unavailable("git ls-tree failed", where=label, found=out.stderr.decode().strip()[:200])
    texts: dict[str, str] = {}
    problems: list[Problem] = []
    for path in out.stdout.decode().splitlines():
        if not path.endswith(".json"):
            continue
        shown = _git(root, "show", f"{commit}:./{path}")
        if shown.returncode != 0:
            error = (shown.stderr.decode(errors="replace").strip().splitlines() or ["git show failed"])[0]
            problems.append(Problem(revision=label, path=path, error=f"cannot read: {error}"))
            continue
        if len(shown.stdout) > MAX_FILE_BYTES:  # the same limit as a file in the working tree
            problems.append(Problem(revision=label, path=path, error=f"baseline file too large: "
                                    f"{len(shown.stdout)} bytes, expected at most {MAX_FILE_BYTES}"))
            continue
        try:
            texts[path] = shown.stdout.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(Problem(revision=label, path=path, error=f"not UTF-8: {exc.reason} at byte {exc.start}"))
    return texts, problems


def _read_worktree(root: Path) -> tuple[dict[str, str], list[Problem]]:
    texts: dict[str, str] = {}
    problems: list[Problem] = []
    for file in sorted((root / "baselines").rglob("*.json")):
        if file.name.startswith(".") or (file.is_dir() and not file.is_symlink()):
            continue  # temporary files of an atomic write
        path = file.relative_to(root).as_posix()
        try:
            texts[path] = read_baseline_text(file)
        except (EaglekbError, OSError) as exc:
            error = exc.line() if isinstance(exc, EaglekbError) else f"cannot read: {exc}"
            problems.append(Problem(revision="working tree", path=path, error=one_line(error)))
    return texts, problems


def _parse_all(texts: dict[str, str], label: str) -> tuple[dict[str, Baseline], list[Problem]]:
    parsed: dict[str, Baseline] = {}
    problems: list[Problem] = []
    for path, text in texts.items():
        parts = path.split("/")
        try:
            baseline = parse(text, path)
        except EaglekbError as exc:
            problems.append(Problem(revision=label, path=path, error=exc.line()))
            continue
        if len(parts) != 3 or (baseline.kind, baseline.name) != (parts[1], parts[2][: -len(".json")]):
            problems.append(Problem(revision=label, path=path,
                                    error=f"holds {baseline.id}; expected baselines/KIND/NAME.json to match"))
            continue
        parsed[path] = baseline
    return parsed, problems


def read_revision(root: Path, rev: str, where: str = "REV") -> tuple[str | None, dict[str, Baseline], list[Problem]]:
    """(commit or None for the working tree, baselines by path, problems) at one revision."""
    if rev == WORKTREE:
        texts, problems = _read_worktree(root)
        commit, label = None, "working tree"
    else:
        commit = _commit_of(root, rev, where)
        label = _label(rev, commit)
        texts, problems = _read_git(root, commit, label)
    parsed, bad = _parse_all(texts, label)
    return commit, parsed, problems + bad


# --------------------------------------------------------------------------- comparing


def flatten_values(value: Any, prefix: str = "") -> dict[str, Any]:
    """Any JSON value -> {dotted.path: leaf}; list items as path.0, path.1 ...; empty containers are leaves."""
    if isinstance(value, dict) and value:
        items = sorted(value.items())
    elif isinstance(value, list) and value:
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix.rstrip("."): value}
    out: dict[str, Any] = {}
    for key, item in items:
        out.update(flatten_values(item, f"{prefix}{key}."))
    return out


def value_changes(old: Any, new: Any, prefix: str = "") -> list[ValueChange]:
    """Leaf-by-leaf differences of two JSON values (lists compared item by item)."""
    a, b = _leaves(old, prefix), _leaves(new, prefix)
    out = []
    for path in sorted(set(a) | set(b)):
        va, vb = a.get(path, _MISSING), b.get(path, _MISSING)
        if va is _MISSING:
            out.append(ValueChange(path=path, change="added", new=vb))
        elif vb is _MISSING:
            out.append(ValueChange(path=path, change="removed", old=va))
        elif va != vb or type(va) is not type(vb):
            out.append(ValueChange(path=path, change="changed", old=va, new=vb))
    # An empty container that gained or lost items is told by those items alone.
    paths = set(a) | set(b)
    return [c for c in out if c.change == "changed" or (c.old if c.change == "removed" else c.new) not in ({}, [])
            or not any(p.startswith(c.path + ".") for p in paths)]


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    flat = flatten_values(value)
    if flat == {"": value} and value in ({}, []):
        return {}  # an empty config is no leaf at all
    return {(prefix + p).rstrip("."): v for p, v in flat.items()}


def metric_change(path: str, a: float, b: float, new: Baseline, threshold_rel: float | None) -> MetricChange:
    """One metric, ``a`` at REV_A and ``b`` at REV_B, judged against the noise the REV_B
    baseline records (or the threshold), in the direction it declares."""
    delta = b - a
    if threshold_rel is None:
        allowed, basis = allowed_delta(new, path), "noise"
    else:
        allowed, basis = threshold_rel * abs(a), "threshold"
    way = direction(new, path)
    if abs(delta) <= allowed + _EPS * max(1.0, abs(a)):
        flag: Flag = "within-noise"
    elif way == "none":
        flag = "changed"
    else:
        flag = "improvement" if (delta > 0) == (way == "higher") else "regression"
    return MetricChange(path=path, old=a, new=b, delta=delta, rel=delta / abs(a) if a else None,
                        allowed=allowed, basis=basis, direction=way, flag=flag)


def series_change(name: str, old: Series | None, new: Series | None) -> SeriesChange | None:
    if old is None or new is None:
        return SeriesChange(name=name, x=(new or old).x, change="added" if old is None else "removed",
                            points_old=len(old.points) if old else 0, points_new=len(new.points) if new else 0)
    if old == new:
        return None
    common = sorted(set(old.points) & set(new.points), key=_x_order)
    diffs = {x: new.points[x] - old.points[x] for x in common if new.points[x] != old.points[x]}
    worst = max(diffs, key=lambda x: abs(diffs[x]), default=None)
    notes = [f"{field} {getattr(old, field)!r} → {getattr(new, field)!r}"
             for field in ("x", "unit") if getattr(old, field) != getattr(new, field)]
    return SeriesChange(
        name=name, x=new.x, change="changed", points_old=len(old.points), points_new=len(new.points),
        points_changed=len(diffs), points_added=len(set(new.points) - set(old.points)),
        points_removed=len(set(old.points) - set(new.points)),
        max_abs_change=abs(diffs[worst]) if worst is not None else None, max_at=worst, notes=notes,
    )


def _x_order(x: str) -> tuple[int, float, str]:
    try:
        return (0, float(x), x)
    except ValueError:
        return (1, 0.0, x)


_ENV_FIELDS = ("provenance", "created_at")
_OTHER_FIELDS = ("noise", "better", "source", "summary", "citation")


def compare_baselines(old: Baseline | None, new: Baseline | None, *, old_path: str | None = None,
                      new_path: str | None = None, threshold_rel: float | None = None,
                      renamed: bool = False) -> BaselineChange | None:
    """What changed in one baseline between two revisions; None when nothing did."""
    if old is None and new is None:
        raise ValueError("compare_baselines needs at least one baseline")
    if old is None or new is None:
        one = new or old
        metrics = flatten(one.metrics)
        return BaselineChange(
            id=one.id, status="added" if old is None else "removed", old_path=old_path, new_path=new_path,
            metrics_added=metrics if old is None else {}, metrics_removed=metrics if new is None else {},
            config=value_changes({} if old is None else one.config, {} if new is None else one.config, "config."),
        )
    if not renamed and old == new:
        return None
    a, b = flatten(old.metrics), flatten(new.metrics)
    both = [p for p in b if p in a]
    dump_a, dump_b = old.model_dump(mode="json"), new.model_dump(mode="json")
    names = sorted(set(old.series) | set(new.series))
    return BaselineChange(
        id=new.id, status="renamed" if renamed else "changed", old_path=old_path, new_path=new_path,
        metrics=[metric_change(p, a[p], b[p], new, threshold_rel) for p in both if a[p] != b[p]],
        metrics_added={p: v for p, v in b.items() if p not in a},
        metrics_removed={p: v for p, v in a.items() if p not in b},
        metrics_unchanged=sum(a[p] == b[p] for p in both),
        series=[s for n in names if (s := series_change(n, old.series.get(n), new.series.get(n)))],
        config=value_changes(old.config, new.config, "config."),
        environment=[c for f in _ENV_FIELDS for c in value_changes(dump_a[f], dump_b[f], f"{f}.")],
        other=[c for f in _OTHER_FIELDS for c in value_changes(dump_a[f], dump_b[f], f"{f}.")],
    )


def _same_apart_from_name(a: Baseline, b: Baseline) -> bool:
    return a.model_dump(exclude={"name"}) == b.model_dump(exclude={"name"})


def _pair_renames(removed: dict[str, Baseline], added: dict[str, Baseline]) -> list[tuple[str, str]]:
    """(old path, new path) for removed+added files of one kind with identical content apart
    from the name (preferred) or an identical config."""
    pairs: list[tuple[str, str]] = []
    free = dict(added)
    for same in (_same_apart_from_name, lambda a, b: a.config == b.config):
        for old_path, old in removed.items():
            if old_path in {p for p, _ in pairs}:
                continue
            match = next((p for p, new in free.items() if new.kind == old.kind and same(old, new)), None)
            if match:
                pairs.append((old_path, match))
                del free[match]
    return pairs


def diff(rev_a: str | None = None, rev_b: str | None = None, *, root: Path | None = None,
         threshold_rel: float | None = None) -> DiffReport:
    """Every baseline added, removed, renamed or changed from ``rev_a`` to ``rev_b``.

    ``rev_a`` defaults to the merge-base of main and HEAD (HEAD where that fails);
    ``rev_b`` to the working tree (``WORKTREE``). ``threshold_rel`` (0.05 = 5%)
    replaces the recorded noise as the allowance for every metric. Files that fail
    the schema at a revision become ``problems``; the rest is still compared.
    """
    root = Path(root) if root else find_root()
    if threshold_rel is not None and not threshold_rel >= 0:
        raise BadInput("threshold must be >= 0", where="--threshold", expected="a percentage >= 0",
                       found=repr(threshold_rel))
    rev_a, name_a = (rev_a, rev_a) if rev_a else default_rev_a(root)
    rev_b = rev_b or WORKTREE
    commit_a, old, problems_a = read_revision(root, rev_a, "REV_A")
    commit_b, new, problems_b = read_revision(root, rev_b, "REV_B")
    problems = problems_a + problems_b
    skip = {p.path for p in problems}  # unreadable on one side: neither added nor removed
    old = {p: b for p, b in old.items() if p not in skip}
    new = {p: b for p, b in new.items() if p not in skip}

    removed = {p: b for p, b in old.items() if p not in new}
    added = {p: b for p, b in new.items() if p not in old}
    renames = _pair_renames(removed, added)
    changes: list[BaselineChange] = []
    unchanged = 0
    for path in sorted(set(old) & set(new)):
        change = compare_baselines(old[path], new[path], old_path=path, new_path=path, threshold_rel=threshold_rel)
        if change is None:
            unchanged += 1
        else:
            changes.append(change)
    for old_path, new_path in renames:
        changes.append(compare_baselines(old.pop(old_path), new[new_path], old_path=old_path,
                                         new_path=new_path, threshold_rel=threshold_rel, renamed=True))
        removed.pop(old_path)
        added.pop(new_path)
    changes += [compare_baselines(None, b, new_path=p) for p, b in sorted(added.items())]
    changes += [compare_baselines(b, None, old_path=p) for p, b in sorted(removed.items())]
    return DiffReport(rev_a=name_a, rev_b=rev_b, commit_a=commit_a, commit_b=commit_b,
                      threshold_rel=threshold_rel, changes=changes, problems=problems, unchanged=unchanged)


def last_commit(root: Path, path: str) -> str:
    """``HASH DATE`` of the last commit that touched PATH (plus a note for uncommitted changes), or "uncommitted"."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", path], cwd=root,
                             capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except OSError:
        out = ""
    if not out:
        return "uncommitted"
    try:  # a build from a working tree with edited baselines shows numbers no commit has
        dirty = subprocess.run(["git", "status", "--porcelain", "--", path], cwd=root,
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except OSError:
        dirty = ""
    return out + (" plus uncommitted changes" if dirty else "")
