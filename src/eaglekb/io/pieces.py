"""Files hashed, split into pieces no larger than a size the caller picks, and joined back, checked.

Owns, once for the project:

* ``sha256_file`` / ``sha256_files``: SHA-256 of one file, or of several read in order (chunk packages).
* ``assemble``: concatenate files into one, returning the SHA-256 of the result.
* ``split``: one file into ``NAME.partNNN`` pieces of at most ``piece_bytes`` plus ``NAME.pieces.json``,
  a manifest with the size and SHA-256 of the whole and of every piece. Written into a folder the caller
  names; a piece set of the same name already there is refused unless ``force`` (then only that set is
  replaced: the manifest is written last, so a reader never sees a manifest without its pieces).
* ``check`` / ``join``: every piece present with its size and hash (a missing or corrupt piece is one
  line naming it), then the whole written atomically (temp file, rename) and its hash checked before
  the rename, so a bad join leaves nothing behind.

Used for the serving stack's wheel set (``eaglekb.measure.sglang.stack``), training checkpoints
written in pieces (``finetune --pieces-out``), and model chunk packages. Knows nothing about what the
files hold.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Iterable

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, SchemaError
from eaglekb.io.files import atomic_write_json, atomic_write_with, read_json

FORMAT = "eaglekb-pieces/1"
MANIFEST_SUFFIX = ".pieces.json"
_CHUNK = 1 << 22  # 4 MiB reads


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)


def _stream(paths: list[Path], out, desc: str, progress: bool) -> str:
    """Read ``paths`` in order (into the open file ``out`` when given); the SHA-256 of what was read."""
    digest = hashlib.sha256()
    with _progress(sum(p.stat().st_size for p in paths), desc, progress) as bar:
        for path in paths:
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path], *, progress: bool = False) -> str:
    """SHA-256 of the concatenation of ``paths`` (one file is the common case)."""
    return _stream([Path(p) for p in paths], None, "sha256", progress)


def sha256_file(path: str | Path) -> str:
    """SHA-256 of one file."""
    return sha256_files([Path(path)])


def assemble(paths: list[Path], dest: Path, *, progress: bool = False) -> str:
    """Concatenate ``paths`` into ``dest`` (created or replaced) and return the SHA-256 of the result."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        return _stream([Path(p) for p in paths], out, "assemble", progress)


def manifest_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}{MANIFEST_SUFFIX}"


def split(src: Path, out: Path, piece_bytes: int, *, name: str | None = None, force: bool = False,
          progress: bool = False, where: str = "--piece-mib") -> dict:
    """Split ``src`` into pieces of at most ``piece_bytes`` under ``out``; the manifest (also written there)."""
    src, out = Path(src), Path(out)
    if isinstance(piece_bytes, bool) or not isinstance(piece_bytes, int) or piece_bytes < 1:
        raise BadInput("piece size must be a whole number of bytes >= 1", where=where, found=repr(piece_bytes))
    if not src.is_file():
        raise MissingFile("no file to split", where=str(src))
    name = name or src.name
    man = manifest_path(out, name)
    existing = sorted(out.glob(f"{name}.part*")) if out.is_dir() else []
    if (man.exists() or existing) and not force:
        raise BadInput("a piece set of that name exists", where=str(man), expected="a new name or --force",
                       found=f"{len(existing)} pieces")
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        man.unlink()  # the old set is invalid from here on: no manifest describes half of it
    for old in existing:
        old.unlink()
    pieces, whole = [], hashlib.sha256()
    size = src.stat().st_size
    with open(src, "rb") as fh, _progress(size, f"split {name}", progress) as bar:
        index = 0
        while True:
            data = fh.read(piece_bytes)
            if not data and index:
                break
            whole.update(data)
            piece = out / f"{name}.part{index:03d}"
            piece.write_bytes(data)
            pieces.append({"file": piece.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            bar.update(len(data))
            index += 1
            if len(data) < piece_bytes:
                break
    doc = {"format": FORMAT, "name": name, "size": size, "sha256": whole.hexdigest(), "piece_bytes": piece_bytes,
           "pieces": pieces}
    atomic_write_json(man, doc)
    return doc


def read_manifest(path: Path) -> dict:
    """A piece-set manifest, its shape checked (one line on anything else)."""
    doc = read_json(path, what="piece manifest")
    ok = (isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("pieces"), list)
          and isinstance(doc.get("sha256"), str) and isinstance(doc.get("size"), int)
          and all(isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("size"), int)
                  and isinstance(p.get("sha256"), str) for p in doc["pieces"]))
    if not ok:
        raise SchemaError("not a piece manifest", where=str(path), expected=f"format {FORMAT} with pieces",
                          found=repr(doc.get("format")) if isinstance(doc, dict) else type(doc).__name__)
    for p in doc["pieces"]:
        if Path(p["file"]).name != p["file"] or p["file"] in (".", ".."):
            raise SchemaError("piece name is not a plain file name", where=str(path), found=repr(p["file"]))
    return doc


def check(path: Path, *, pieces_dir: Path | None = None, progress: bool = False) -> dict:
    """Every piece of the manifest at ``path`` present, of its size and hash; the manifest."""
    doc = read_manifest(Path(path))
    folder = Path(pieces_dir) if pieces_dir is not None else Path(path).parent
    missing = [p["file"] for p in doc["pieces"] if not (folder / p["file"]).is_file()]
    if missing:
        raise MissingFile(f"{len(missing)} of {len(doc['pieces'])} pieces missing", where=str(folder),
                          expected=", ".join(missing[:4]) + (" ..." if len(missing) > 4 else ""),
                          fix="copy every piece listed in the manifest into that folder")
    for p in doc["pieces"]:
        f = folder / p["file"]
        if f.stat().st_size != p["size"]:
            raise IntegrityError("piece has the wrong size", where=str(f), expected=f"{p['size']} bytes",
                                 found=f"{f.stat().st_size} bytes", fix="copy that piece again")
        if sha256_file(f) != p["sha256"]:
            raise IntegrityError("piece is corrupt (SHA-256 mismatch)", where=str(f), expected=p["sha256"][:16],
                                 fix="copy that piece again")
    return doc


def join(path: Path, dest: Path, *, pieces_dir: Path | None = None, progress: bool = False) -> Path:
    """Check the pieces, join them into ``dest`` atomically and check the whole's hash before the rename."""
    doc = check(path, pieces_dir=pieces_dir)
    folder = Path(pieces_dir) if pieces_dir is not None else Path(path).parent

    def write(out) -> None:
        found = _stream([folder / p["file"] for p in doc["pieces"]], out, "join", progress)
        if found != doc["sha256"]:
            raise IntegrityError("joined file does not match the manifest's SHA-256", where=str(path),
                                 expected=doc["sha256"][:16], found=found[:16])

    return atomic_write_with(dest, write)
