"""Backfill of schema v2 into recorded baselines: content identity from git history, reproduce commands.

Owns: upgrading a baseline file recorded before content identity (schema v1, or a v2 file that lacks a
part) to schema v2 (``upgrade``, ``backfill``): ``provenance.reproduce`` from its command,
``superseded_by`` from a summary that says so, and ``provenance.inputs``: for each input its config
names (``eaglekb.measure.provenance.INPUT_KEYS``), the sha256 of the files as git holds them, or
``unknown`` with the reason. Which commit's files a run read:

* an embedded target: the pinned GGUF its conversion verifies (no git needed);
* a path tracked in git at the recorded commit whose files did not change up to the commit that first
  holds this result (same ``created_at``), or whose run's tree was clean: the files at the recorded
  commit;
* one that changed in between while the run's tree was dirty or a copy (a working tree copied to another machine,
  where ``EAGLEKB_GIT_COMMIT`` names the commit): the files as committed together with the result
  (the tree the run read was the one that was then committed; F12's r4 runs are the case);
* a result not committed yet: the working tree's files now;
* anything else (a local run output under .eaglekb/, a /tmp path of another machine): unknown.

Reading and hashing git's files is ``eaglekb.kb.history``. Knows nothing about the task runner:
``invoke baselines.identity`` calls ``backfill``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from eaglekb.kb import baselines as bl
from eaglekb.kb.history import Git
from eaglekb.kb.schema import SCHEMA_VERSION, Baseline
from eaglekb.measure import provenance as prov
from eaglekb.measure.command import reproduce_command
from eaglekb.models import sources

_SUPERSEDED = re.compile(r"^\s*Superseded\b(?: by [^:;]*?(?=[:;]|\. |$)|[^.;]*)", re.I)


def holding(git: Git, baseline: Baseline) -> list[tuple[str, str]]:
        """(commit, text) of every commit whose copy of this baseline file (followed through renames) has its
        created_at, oldest first: the commits that hold this result (later ones may have edited its text)."""
        log = git.text("log", "--follow", "--name-only", "--format=%x00%H", "--",
                        f"baselines/{baseline.kind}/{baseline.name}.json")
        found: list[tuple[str, str]] = []
        for chunk in (log or "").split("\x00")[1:]:
            lines = [l for l in chunk.splitlines() if l.strip()]
            if len(lines) < 2:
                continue
            shown = git.text("show", f"{lines[0]}:{lines[1]}")
            if shown is not None and f'"created_at": "{baseline.created_at}"' in shown:
                found.append((lines[0], shown))
            elif found:
                break
        return found[::-1]


def _tree_was_copied(b: Baseline) -> bool:
    """Whether the run read a tree other than its recorded commit: dirty, or a copy named by EAGLEKB_GIT_COMMIT."""
    return bool(b.provenance.git_dirty) or "EAGLEKB_GIT_COMMIT" in b.provenance.env or b.provenance.git_dirty is None


def _from_git(git: Git, b: Baseline, role: str, value: str, root: Path) -> dict[str, Any]:
    commit = b.provenance.git_commit
    short = (commit or "")[:10]
    held = holding(git, b) if git.ok else []
    at_run = git.blobs(commit, value, role) if commit and git.ok else None
    if not held and (root / value).exists():  # recorded in this working tree, not committed yet
        found = prov.input_identity(role, value, root)
        if found.get("sha256"):
            found["basis"] = "the working tree's files at backfill time (the result is not committed yet)"
            return found
        if at_run is None:
            return found
        sha, files = git.sha(at_run)  # the run's files are elsewhere (a copied tree): the recorded commit's
        return {"sha256": sha, "files": files, "git": f"{commit}:{value}",
                "basis": f"from git at the recorded commit {short} (the result is not committed yet and the "
                "working tree's files are away)"}
    if at_run is None:  # renamed since: the first commit where this result names the path, and git holds it
        named = next(((c, blobs) for c, text in held if f'"{value}"' in text
                      and (blobs := git.blobs(c, value, role))), None)
        if named is None:
            where = f"not in git at the recorded commit {short}" if commit else "no recorded commit"
            return {"sha256": None, "unknown": f"{value}: {where} (a local run output or a path on the machine "
                    "that recorded it); its files were not kept"}
        sha, files = git.sha(named[1])
        return {"sha256": sha, "files": files, "git": f"{named[0]}:{value}",
                "basis": f"from git at {named[0][:10]}, the first commit where this result names {value} (the "
                f"path did not exist at the recorded commit {short}: its files were moved there)"}
    first = held[0][0] if held else None
    at_first = git.blobs(first, value, role) if first else None
    if at_first and at_first != at_run and _tree_was_copied(b):
        sha, files = git.sha(at_first)
        other, _ = git.sha(at_run)
        return {"sha256": sha, "files": files, "git": f"{first}:{value}",
                "basis": f"from git, as committed with this result ({first[:10]}): the run's tree was "
                f"{'a copy' if 'EAGLEKB_GIT_COMMIT' in b.provenance.env else 'dirty'} at {short}, whose "
                f"{value} held other files (sha256 {other[:12]}...)"}
    sha, files = git.sha(at_run)
    why = "the run's tree was clean" if not _tree_was_copied(b) else (
        f"unchanged up to {first[:10]}, which committed this result" if first else "the result's commit is unknown")
    return {"sha256": sha, "files": files, "git": f"{commit}:{value}",
            "basis": f"from git at the recorded commit {short} ({why})"}


def inputs_from_history(b: Baseline, root: Path, git: Git | None = None) -> dict[str, dict[str, Any]]:
    """``provenance.inputs`` for a result recorded without it: each input by its files in git history."""
    git = git or Git(root)
    out: dict[str, dict[str, Any]] = {}
    for key, (role, value) in prov.config_inputs(b.config).items():
        entry: dict[str, Any] = {"role": role, "path": value}
        name = prov.embedded_name(value) if role == "target" else None
        if name:
            entry |= {"sha256": sources.SOURCES[name].sha256, "files": {},
                      "basis": prov.EMBEDDED_BASIS.format(name=name)}
        else:
            entry |= _from_git(git, b, role, value, root)
        out[key] = entry
    return out


def upgrade(b: Baseline, root: Path, git: Git | None = None) -> Baseline | None:
    """B at schema v2 with what it lacks filled in, or None when it needs nothing."""
    data = b.model_dump(mode="json")
    p = data["provenance"]
    measured = b.source == "measured"
    if measured and p.get("inputs") is None:
        p["inputs"] = inputs_from_history(b, root, git)
    if measured and not p.get("reproduce"):
        p["reproduce"] = reproduce_command(p["command"])
    if not data.get("superseded_by") and b.summary and _SUPERSEDED.match(b.summary):
        data["superseded_by"] = _SUPERSEDED.match(b.summary).group(0).strip()
    data["schema_version"] = SCHEMA_VERSION
    new = Baseline.model_validate(data)
    return None if bl.dumps(new) == bl.dumps(b) else new


def backfill(root: Path, *, dry_run: bool = False) -> list[tuple[str, str]]:
    """Upgrade every baseline under ROOT that lacks schema v2's parts: (id, what it now says) per file changed.
    Rerun it whenever baselines were recorded by older code; a file already complete is left as it is."""
    git = Git(root)
    changed = []
    for path in bl.iter_files(root):
        b = bl.load(path)
        new = upgrade(b, root, git)
        if new is None:
            continue
        if not dry_run:
            bl.write(new, root, force=True)
        changed.append((new.id, summary_of(new)))
    return changed


def summary_of(b: Baseline) -> str:
    """One line: each input's sha256 (or unknown), as the backfill reports it."""
    parts = []
    for key, entry in sorted((b.provenance.inputs or {}).items()):
        parts.append(f"{key} {entry.sha256[:12]}" if entry.sha256 else f"{key} unknown")
    return ", ".join(parts) or ("no inputs" if b.source == "measured" else "cited report")
