"""File I/O, once: atomic writes, stable JSON, safetensors reads with one error conversion.

Owns:

* ``atomic_write_bytes`` / ``atomic_write_text`` / ``atomic_write_json``: a temp file in
  the destination folder (``.NAME.<random>.tmp``), flushed and fsynced, then
  ``os.replace``: readers see the old file or the new one, never a half-written one;
  the temp file is removed when anything fails (also on KeyboardInterrupt).
* ``atomic_save_safetensors``: the same for a tensor dict (safetensors only, no pickle).
* ``stable_json``: sorted keys, 2-space indent, trailing newline (diffable files).
* ``read_safetensors`` / ``safetensors_keys``: a missing file raises ``MissingFile``, an
  unreadable or truncated one ``IntegrityError``, each one line naming the file.
* ``read_text`` / ``read_json``: a missing file, bytes that are not UTF-8, or bad JSON as one line.
* ``flatten``: a nested dict to ``{dotted.path: value}`` (metric trees, configs).

Knows nothing about what the files mean (baselines, drafters, shards): their owners
call these. Never loads pickle.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from eaglekb.io.errors import IntegrityError, MissingFile, SchemaError


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write bytes atomically (temp file + fsync + rename)."""
    return _atomic(path, lambda fh: fh.write(data), "wb")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 text atomically (temp file + fsync + rename)."""
    return _atomic(path, lambda fh: fh.write(text), "w")


def stable_json(obj: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Sorted keys, 2-space indent, non-ASCII kept, trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=default) + "\n"


def atomic_write_json(path: str | Path, obj: Any, *, default: Callable[[Any], Any] | None = None) -> Path:
    """``stable_json(obj)`` written atomically."""
    return atomic_write_text(path, stable_json(obj, default=default))


def atomic_save_safetensors(path: str | Path, tensors: dict, metadata: dict[str, str] | None = None) -> Path:
    """Save a tensor dict as safetensors atomically (contiguous copies where needed)."""
    from safetensors.torch import save

    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    return atomic_write_bytes(path, data)


def _unreadable(path: Path, exc: BaseException) -> IntegrityError:
    return IntegrityError("unreadable safetensors file", where=str(path),
                          expected="a complete safetensors file", found=f"{type(exc).__name__}: {exc}".splitlines()[0],
                          fix="re-create or re-download the file")


def read_safetensors(path: str | Path, *, keys: list[str] | None = None, device: str = "cpu") -> dict:
    """All tensors (or ``keys``) of a safetensors file; one-line errors for missing or corrupt files."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise MissingFile("file not found", where=str(path), expected="a safetensors file")
    try:
        with safe_open(str(path), framework="pt", device=device) as fh:
            names = list(fh.keys()) if keys is None else keys
            missing = [k for k in names if k not in fh.keys()]
            if missing:
                raise SchemaError("tensor missing", where=str(path), expected=", ".join(missing[:5]),
                                  found=f"{len(list(fh.keys()))} other tensors")
            return {k: fh.get_tensor(k) for k in names}
    except SchemaError:
        raise
    except Exception as exc:  # safetensors raises SafetensorError, OSError, ValueError or RuntimeError
        raise _unreadable(path, exc) from None


def safetensors_keys(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """Tensor names and the metadata of a safetensors file (header only)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise MissingFile("file not found", where=str(path), expected="a safetensors file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            return list(fh.keys()), dict(fh.metadata() or {})
    except Exception as exc:
        raise _unreadable(path, exc) from None


def read_text(path: str | Path, *, what: str = "text file") -> str:
    """A UTF-8 text file; a missing file or bytes that are not UTF-8 are one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{what} not found", where=str(path))
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{what} is not UTF-8 text", where=str(path), expected="UTF-8 text",
                          found=f"byte 0x{data[exc.start]:02x} at offset {exc.start}") from None


def read_json(path: str | Path, *, what: str = "JSON file") -> Any:
    """Parse a JSON file; a missing file or bad JSON is one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{what} not found", where=str(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{what} is not valid JSON", where=str(path), found=str(exc).splitlines()[0]) from None
    except RecursionError:
        raise SchemaError(f"{what} is nested too deeply", where=str(path), expected="JSON nested at most ~1000 levels",
                          found="deeper") from None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{dotted.path: value}``, in sorted order."""
    out: dict[str, Any] = {}
    for key in sorted(tree):
        value = tree[key]
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out
