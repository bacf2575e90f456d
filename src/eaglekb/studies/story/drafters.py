"""Drafters in 16 MiB pieces: export a run's drafters as one cut tar, and unpack it with every hash checked.

Owns the export format (``drafters.tar.partNN``: an uncompressed tar of ``NAME/file``, cut into pieces of at most
16 MiB, with a manifest of the tar's and each file's SHA-256 in story.json's ``drafters_export``
or in ``drafters-export.json``), the budget that picks which drafters fit, and the unpacking that refuses a
corrupt, missing or substituted piece. The manifest and the tar come from another machine: every drafter
name, piece name and member path is checked to stay inside its folder (one plain name, no ``..``, no
link), the files of each drafter must make a drafter (a drafter config.json, safetensors weights that read,
no pickle), nothing is written before every check passed (``check_drafters`` runs them all without
writing), and an unpack writes only ``DEST/NAME`` folders of the drafters it brings under the one rule for
outputs (``eaglekb.io.files.guard_output``): an existing ``DEST/NAME`` is replaced only with ``force``, only
when it is a drafter folder, never when git tracks a file in it, and through a rename that keeps the old
folder until the new one is in place. Knows nothing about how the drafters were trained.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from eaglekb.formats.drafter import CONFIG_FILE, config_from_doc, is_drafter_folder
from eaglekb.io.errors import EaglekbError, IntegrityError, MissingFile
from eaglekb.io.files import atomic_write_bytes, atomic_write_json, guard_output, read_json, replace_folder
from eaglekb.io.pieces import sha256_files
from eaglekb.studies.story.config import DRAFTERS_TAR, EXPORT_FILE, PART_BYTES
from eaglekb.studies.story.document import load


def _files(folder: Path) -> dict[str, Path]:
    """The plain files under ``folder``, by relative POSIX path, sorted."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def file_hashes(folder: Path) -> dict[str, str]:
    """The SHA-256 of each file under ``folder``, by relative path."""
    return {rel: sha256_files([p]) for rel, p in _files(folder).items()}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder).values())


def fit_budget(sizes: dict[str, int], budget: int, overhead: int = 64 << 10) -> list[str]:
    """The names, in order, whose sizes (plus tar overhead each) fit the budget; later ones are skipped."""
    keep, used = [], 0
    for name, size in sizes.items():
        if used + size + overhead <= budget:
            keep.append(name)
            used += size + overhead
    return keep


def export_drafters(folders: dict[str, Path], out: Path, part_bytes: int = PART_BYTES) -> dict[str, Any]:
    """One uncompressed tar of the drafter folders (``NAME/file``), cut into ``part_bytes`` pieces."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, folder in folders.items():
            for rel, p in _files(folder).items():
                tar.add(p, arcname=f"{name}/{rel}", recursive=False)
    data = buf.getvalue()
    parts = []
    for i in range(0, len(data), part_bytes):
        path = atomic_write_bytes(out / f"{DRAFTERS_TAR}.part{i // part_bytes:02d}", data[i:i + part_bytes])
        parts.append(path.name)
    return {"parts": parts, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "drafters": {name: file_hashes(folder) for name, folder in folders.items()}}


def export_from_work(work: str | Path, names: list[str], out: str | Path) -> dict[str, Any]:
    """Export drafters of a finished run from its work folder (``run-NAME/drafter``), with a manifest.

    For when the run's own export left drafters out (``export_max_mib``): pick the drafters wanted.
    """
    work, out = Path(work), Path(out)
    folders = {n: work / f"run-{n}" / "drafter" for n in names}
    missing = [n for n, f in folders.items() if not (f / "config.json").is_file()]
    if missing:
        raise MissingFile("no such drafter in the work folder", where=str(work),
                          expected="run-NAME/drafter/config.json for " + ", ".join(names),
                          found=f"missing {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    doc = export_drafters(folders, out)
    atomic_write_json(out / EXPORT_FILE, doc)
    return doc


#: A drafter name or a piece name from a manifest: one plain file name (no folder, no ``..``, no dot first).
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _plain(name: Any, what: str, where: Path) -> str:
    if not isinstance(name, str) or not _PLAIN.fullmatch(name) or ".." in name:
        raise IntegrityError(f"unsafe {what} in the drafters manifest", where=str(where),
                             expected="a plain name (letters, digits, . _ -; no folder, no ..)", found=repr(name)[:120])
    return name


def _checked_manifest(exp: Any, where: Path) -> dict[str, Any]:
    """The manifest's shape, and every name in it a plain name (it comes from another machine)."""
    ok = (isinstance(exp, dict) and isinstance(exp.get("parts"), list) and isinstance(exp.get("sha256"), str)
          and isinstance(exp.get("drafters"), dict) and all(isinstance(h, dict) for h in exp["drafters"].values()))
    if not ok:
        raise IntegrityError("drafters manifest is malformed", where=str(where),
                             expected='{"parts": [...], "sha256": "...", "drafters": {NAME: {FILE: SHA256}}}',
                             found=type(exp).__name__)
    for part in exp["parts"]:
        _plain(part, "piece name", where)
    for name, hashes in exp["drafters"].items():
        _plain(name, "drafter name", where)
        if not hashes:
            raise IntegrityError("drafter without files in the drafters manifest", where=f"{where}: {name}",
                                 expected="{FILE: SHA256} of its config and weights", found="no files")
        for rel in hashes:
            parts = Path(str(rel)).parts
            if not parts or str(rel).startswith("/") or any(p in ("..", ".") for p in parts):
                raise IntegrityError("unsafe file name in the drafters manifest", where=f"{where}: {name}",
                                     expected="a relative path inside the drafter", found=repr(rel)[:120])
    return exp


def _export_manifest(run_dir: Path, pieces: Path) -> dict[str, Any]:
    """The export's manifest (``drafters-export.json`` in ``pieces``, else story.json's), checked against
    the file hashes the run recorded when it trained each drafter."""
    doc = load(run_dir)
    exp, where = doc.get("drafters_export"), run_dir / "story.json"
    if (pieces / EXPORT_FILE).is_file():
        exp, where = read_json(pieces / EXPORT_FILE, what="drafters export manifest"), pieces / EXPORT_FILE
    if not exp:
        raise MissingFile("no exported drafters", where=str(pieces),
                          expected=f"story.json's drafters_export or {EXPORT_FILE}", found="neither")
    exp = _checked_manifest(exp, where)
    for name, hashes in exp["drafters"].items():
        trained = ((doc.get("runs") or {}).get(name) or {}).get("drafter_files")
        if trained is not None and trained != hashes:
            raise IntegrityError("exported drafter is not the one the run trained", where=name,
                                 expected="the file hashes recorded in story.json", found="different hashes")
    return exp


def _joined(exp: dict[str, Any], pieces: Path) -> bytes:
    """The tar, joined from its pieces; refuses a missing piece or a wrong SHA-256."""
    missing = [p for p in exp["parts"] if not (pieces / p).is_file()]
    if missing:
        raise MissingFile("drafter pieces missing", where=str(pieces), expected=", ".join(exp["parts"]),
                          found=f"missing {', '.join(missing)}")
    data = b"".join((pieces / p).read_bytes() for p in exp["parts"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != exp["sha256"]:
        raise IntegrityError("drafter pieces corrupt", where=str(pieces), expected=f"sha256 {exp['sha256']}",
                             found=f"sha256 {digest}")
    return data


def _members(data: bytes, exp: dict[str, Any]) -> dict[str, bytes]:
    """The tar's files by ``NAME/file``, read into memory: plain files under an exported NAME/ only (no
    links, absolute or parent paths), and every drafter's files exactly the hashed ones."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if (not m.isfile() or m.name.startswith("/") or not parts or any(p in ("..", ".") for p in parts)
                    or len(parts) < 2 or parts[0] not in exp["drafters"]):
                raise IntegrityError("unexpected entry in drafters tar", where=m.name,
                                     expected="NAME/file of an exported drafter", found=m.name)
            with tar.extractfile(m) as src:
                files[Path(m.name).as_posix()] = src.read()
    for name, hashes in exp["drafters"].items():
        got = {k[len(name) + 1:]: hashlib.sha256(v).hexdigest() for k, v in files.items()
               if k.startswith(name + "/")}
        if got != hashes:
            raise IntegrityError("extracted drafter differs from the exported one", where=name,
                                 expected="the sha256 of each file in story.json", found="different hashes")
    return files


#: Files a drafter never holds: pickles (never loaded here, and a runtime that did would run their code).
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _check_is_drafter(name: str, files: dict[str, bytes]) -> None:
    """The exported files of drafter NAME make a drafter: a drafter config.json, safetensors weights that
    read, no pickle. Checked in memory, before anything is written."""
    from safetensors.torch import load as read_weights

    mine = {k[len(name) + 1:]: v for k, v in files.items() if k.startswith(name + "/")}
    weights = [k for k in mine if k.endswith(".safetensors")]
    pickles = [k for k in mine if k.lower().endswith(_PICKLE_SUFFIXES)]
    if CONFIG_FILE not in mine or not weights or pickles:
        raise IntegrityError("exported files are not a drafter", where=name,
                             expected=f"{CONFIG_FILE} and *.safetensors weights, no pickle",
                             found=", ".join(sorted(mine))[:160] or "no files")
    try:
        config_from_doc(json.loads(mine[CONFIG_FILE].decode("utf-8")), f"{name}/{CONFIG_FILE}")
        for k in weights:
            read_weights(mine[k])
    except EaglekbError as exc:
        raise IntegrityError("exported files are not a drafter", where=name, expected="a drafter config.json",
                             found=exc.line()[:160]) from None
    except Exception as exc:  # JSON or safetensors that do not parse
        raise IntegrityError("exported files are not a drafter", where=name,
                             expected="a JSON config.json and safetensors weights that read",
                             found=f"{type(exc).__name__}: {exc}".splitlines()[0][:160]) from None


def _check_destinations(names: list[str], dest: Path, force: bool) -> None:
    """Every ``DEST/NAME`` may be written: new, or (with ``force``) an untracked drafter folder."""
    for name in names:
        guard_output(dest / name, where=f"--drafters {dest / name}", force=force, folder=True,
                     ours=is_drafter_folder, what="drafter folder", within=dest)


def check_drafters(run_dir: str | Path, pieces: str | Path | None = None, dest: str | Path | None = None, *,
                   force: bool = False) -> list[str]:
    """Everything ``unpack_drafters`` checks (manifest, names, pieces, hashes, that each is a drafter, and with
    ``dest`` that it may be written there), writing nothing: the names."""
    run_dir = Path(run_dir)
    exp = _export_manifest(run_dir, Path(pieces) if pieces else run_dir)
    files = _members(_joined(exp, Path(pieces) if pieces else run_dir), exp)
    for name in exp["drafters"]:
        _check_is_drafter(name, files)
    if dest is not None:
        _check_destinations(list(exp["drafters"]), Path(dest), force)
    return list(exp["drafters"])


def unpack_drafters(run_dir: str | Path, dest: str | Path, pieces: str | Path | None = None, *,
                    force: bool = False) -> dict[str, Path]:
    """Join ``drafters.tar.partNN``, check every hash, extract to ``dest/NAME``.

    The pieces and their manifest are the run's own export (``story.json``'s ``drafters_export``) or, in
    ``pieces`` (default: the run folder), a later ``export_from_work`` (``drafters-export.json``). Each
    drafter must also match the file hashes the run recorded when it trained it, and its files must make a
    drafter. Nothing is written before every check passed (an existing ``dest/NAME`` needs ``force`` and
    must be an untracked drafter folder); each drafter is written to a new temporary folder inside ``dest``
    and renamed into place, the old folder kept until the new one is there.
    """
    run_dir, dest = Path(run_dir), Path(dest)
    pieces = Path(pieces) if pieces else run_dir
    exp = _export_manifest(run_dir, pieces)
    files = _members(_joined(exp, pieces), exp)
    for name in exp["drafters"]:
        _check_is_drafter(name, files)
    _check_destinations(list(exp["drafters"]), dest, force)
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
    try:
        for rel, blob in files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob)
        return {name: replace_folder(staging / name, dest / name) for name in exp["drafters"]}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
