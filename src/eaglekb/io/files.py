"""File I/O, once: atomic writes, stable JSON, safetensors reads with one error conversion.

Owns:

* ``atomic_write_bytes`` / ``atomic_write_text`` / ``atomic_write_json``: a temp file in
  the destination folder (``.NAME.<random>.tmp``), flushed and fsynced, then
  ``os.replace``: readers see the old file or the new one, never a half-written one;
  the temp file is removed when anything fails (also on KeyboardInterrupt); the file gets the mode a plain
  ``open`` gives (0666 less the umask), not mkstemp's 0600.
* ``atomic_save_safetensors``: the same for a tensor dict (safetensors only, no pickle).
* ``stable_json``: sorted keys, 2-space indent, trailing newline (diffable files).
* ``read_safetensors`` / ``safetensors_keys``: a missing file raises ``MissingFile``, an
  unreadable or truncated one ``IntegrityError``, each one line naming the file.
* ``read_text`` / ``read_json``: a missing file, bytes that are not UTF-8, or bad JSON as one line.
* ``flatten``: a nested dict to ``{dotted.path: value}`` (metric trees, configs).
* the one rule for every output a command writes (``guard_output``, ``output_lock``, ``replace_folder``):
  a command replaces only what it created in this run, or a path the user named together with
  ``--force``, and never a file git tracks; a folder is replaced by writing the new one beside it and
  renaming (the old copy stays until the new one is in place); two runs writing one output at once are
  refused (a lock file beside it), not merged. Links are followed before the rule is applied: the rule
  judges the real path a write lands on (every link of every parent followed), so a parent that is a link
  into the checkout cannot carry ``--force`` onto a tracked file; a link as the output itself, a link that
  leads nowhere or round in a loop, and a real path outside the folder the user named are refused. Files
  are created with ``O_EXCL | O_NOFOLLOW`` (temp files, lock files): never through a link planted meanwhile.

Knows nothing about what the files mean (baselines, drafters, shards): their owners
call these (and say, through ``ours``, what an output of theirs looks like). Never loads pickle.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, SchemaError

#: Open flag that refuses a link as the last part of a path (0 where the system has none).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The process's umask (read once): the mode of a file written here is 0666 less these bits, as with ``open``.
_UMASK = _read_umask()


def check_readable(path: Path, what: str = "file") -> None:
    """A file that exists but that this user may not read: one line naming it (before a reader says
    something less exact, such as a safetensors reader's "No such file")."""
    if path.exists() and not os.access(path, os.R_OK):
        raise BadInput(f"{what} cannot be read", where=str(path), expected="a file this user may read",
                       found="permission denied", fix="fix its permissions, or run as a user who may read it")


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW; the rename replaces a link at ``path``, never its target
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600: the output gets the mode a plain open would give
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


def atomic_write_with(path: str | Path, write: Callable[[Any], None], *, binary: bool = True) -> Path:
    """Write through ``write(fh)`` atomically (temp file + fsync + rename); an exception from ``write`` leaves
    the old file, or none, and no temp file."""
    return _atomic(path, write, "wb" if binary else "w")


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


def _safetensors_file(path: str | Path) -> Path:
    """PATH as a safetensors file to open: a missing file, a folder or an unreadable file is one line."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, "file", "a safetensors file")
    check_readable(path, "safetensors file")
    return path


def read_safetensors(path: str | Path, *, keys: list[str] | None = None, device: str = "cpu") -> dict:
    """All tensors (or ``keys``) of a safetensors file; one-line errors for missing or corrupt files."""
    from safetensors import safe_open

    path = _safetensors_file(path)
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


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Each tensor of a safetensors file as (name, tensor), one in memory at a time, from one open of the file;
    the same one-line errors as ``read_safetensors``."""
    from safetensors import safe_open

    path = _safetensors_file(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            for name in list(fh.keys()):
                yield name, fh.get_tensor(name)
    except Exception as exc:  # safetensors raises SafetensorError, OSError, ValueError or RuntimeError
        raise _unreadable(path, exc) from None


def safetensors_keys(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """Tensor names and the metadata of a safetensors file (header only)."""
    from safetensors import safe_open

    path = _safetensors_file(path)
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


class DuplicateKey(ValueError):
    """A JSON object gives one key twice (``args[0]`` is the key)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook`` for ``json.loads``: an object's pairs as a dict; a key given twice (which a plain
    load keeps silently, the last one winning) raises ``DuplicateKey``."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def not_a_file(path: Path, what: str, expected: str | None = None) -> MissingFile:
    """A missing file, or a folder where a file belongs, said as what it is."""
    if path.is_dir():
        return MissingFile(f"{what} is a folder", where=str(path), expected=expected or "a file", found="a folder")
    return MissingFile(f"{what} not found", where=str(path), expected=expected)


def read_json(path: str | Path, *, what: str = "JSON file") -> Any:
    """Parse a JSON file; a missing file, bad JSON or a key given twice in one object is one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, what)
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise SchemaError(f"{what} gives a key twice", where=str(path), expected="each key once in an object",
                          found=f"{exc.args[0]!r} twice") from None
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


# --------------------------------------------------------------------------- outputs: the one rule


def tracked_files(path: str | Path) -> list[str]:
    """The files git tracks at or under ``path`` (repository-relative; none outside a work tree or without git).
    Links in its parents are followed first (git does not look through them): ``LINK/x`` with LINK pointing
    into a checkout is judged where it really is; a link at ``path`` itself is judged as the link."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    path = Path(os.path.realpath(path.parent)) / path.name
    anchor = path if path.is_dir() and not path.is_symlink() else path.parent
    try:
        proc = subprocess.run(["git", "-C", str(anchor), "ls-files", "-z", "--full-name", "--",
                               str(path.absolute())], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [p for p in proc.stdout.decode(errors="replace").split("\0") if p]


def _overlaps(a: Path, b: Path) -> bool:
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents


def _link_trouble(link: Path) -> str:
    """'' for a link that leads to something, else what is wrong with it."""
    try:
        os.stat(link)
    except (FileNotFoundError, NotADirectoryError):
        return "leads nowhere"
    except OSError as exc:
        return "goes round in a loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    return ""


def real_output(path: str | Path, *, where: str, what: str = "output", folder: bool = False) -> Path:
    """The real path a write to ``path`` lands on (every link in every parent followed), after checking each
    step of the way as typed: the output itself a link (pointing anywhere, or nowhere), a parent that is a
    link leading nowhere or round in a loop, or a file where a folder belongs: refused, one line naming ``where``."""
    path = Path(path)
    noun, cur = ("folder" if folder else "file"), Path(path.anchor or ".")
    parts = path.parts[1:] if path.anchor else path.parts
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break  # from here on the path is new
        except NotADirectoryError:
            raise BadInput(f"a folder on the {what}'s path is a file", where=where, expected="folders on the way",
                           found=f"{cur.parent} is a file", fix="give a path through folders") from None
        except OSError as exc:
            raise BadInput(f"cannot reach the {what}'s path", where=where, expected="a path that can be followed",
                           found=f"{cur}: {exc.strerror or exc}", fix="give another path") from None
        if not stat.S_ISLNK(st.st_mode):
            continue
        trouble, target = _link_trouble(cur), os.readlink(cur)
        if i == len(parts) - 1:
            raise BadInput(f"will not write {what} through a link", where=where, expected=f"a new {noun}",
                           found=f"a link to {target}" + (f" that {trouble}" if trouble else ""),
                           fix="give the real path, or another one")
        if trouble:
            raise BadInput(f"will not write {what} through a link that {trouble}", where=where,
                           expected="folders that exist or can be made", found=f"{cur} -> {target}",
                           fix="fix or remove the link, or give the real path")
    return Path(os.path.realpath(path))


def guard_output(path: str | Path, *, where: str, force: bool = False, folder: bool = False,
                 ours: Callable[[Path], bool] | None = None, reuse: bool = False, what: str = "output",
                 inputs: Iterable[str | Path] = (), within: str | Path | None = None) -> bool:
    """Check that a command may write ``path`` (one line naming ``where`` otherwise); True when something
    is there that the write will replace or add to. Judged on the real path (``real_output``: a parent may
    be a link; every rule below applies where it leads).

    * a link as the output itself, a parent link that leads nowhere or loops: refused;
    * a real path outside ``within`` (the folder the user named, when the command picks the name inside it): refused;
    * a path that is, holds or is inside one of the command's ``inputs``: refused;
    * nothing there, or an empty folder: fine;
    * a file where a folder belongs or the reverse: refused;
    * anything git tracks at or under it: refused, ``--force`` or not;
    * ``reuse`` and ``ours(path)``: fine (a dataset a rerun resumes, a run ``--resume`` continues);
    * otherwise only with ``--force``, and only where ``ours`` (when given) says it is what this command
      writes (a drafter folder, a built site): ``--force`` never replaces something else.
    """
    path = Path(path)
    noun = "folder" if folder else "file"
    real = real_output(path, where=where, what=what, folder=folder)
    if within is not None:
        root = Path(os.path.realpath(within))
        if real != root and root not in real.parents:
            raise BadInput(f"{what} lands outside the folder named", where=where, expected=f"a path inside {within}",
                           found=f"{path} is {real}", fix="remove the link that leads out, or name another folder")
    for source in inputs:
        if source and _overlaps(path, Path(source)):
            raise BadInput(f"{what} is, holds or is inside an input of this command", where=where,
                           expected="a path apart from the inputs", found=f"input {source}",
                           fix="choose another output path (writing there would replace the input)")
    if not path.exists():
        return False
    if folder != path.is_dir():
        raise BadInput(f"{what} is a {'file' if folder else 'folder'}", where=where, expected=f"a {noun}",
                       found="a folder" if path.is_dir() else "a file", fix=f"choose another {noun}")
    if folder and not any(path.iterdir()):
        return False
    tracked = tracked_files(real)
    if tracked:
        through = "" if real == Path(os.path.abspath(path)) else f" (through a link: {real})"
        raise BadInput(f"{what} is a file the repository tracks" if not folder else
                       f"{what} holds files the repository tracks", where=where,
                       expected=f"a new {noun} or an untracked one",
                       found=f"{len(tracked)} tracked, e.g. {tracked[0]}{through}",
                       fix="choose another path (a tracked file is never replaced, --force or not)")
    is_ours = ours is None or ours(path)
    if reuse and ours is not None and is_ours:
        return True
    if not force:
        raise BadInput(f"{what} already exists", where=where, expected=f"a new {noun}",
                       found=f"an existing {noun}" + ("" if is_ours else " of another kind"),
                       fix=f"choose another path{' or pass --force to replace it' if is_ours else ''}")
    if not is_ours:
        article = "an" if what[:1] in "aeiou" else "a"
        raise BadInput(f"--force replaces only {article} {what}", where=where,
                       expected=f"{article} {what} (what this command writes)", found=f"another kind of {noun}",
                       fix="choose another path; nothing was replaced")
    return True


def _lock_owner(lock: Path) -> tuple[str, int, str]:
    try:
        host, pid, since = lock.read_text(encoding="utf-8").split("\n")[:3]
        return host, int(pid), since
    except (OSError, ValueError):
        return "", 0, "unknown"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


@contextlib.contextmanager
def output_lock(path: str | Path, *, where: str) -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``path`` while a command writes it: a second run writing the same output
    is refused in one line (not merged). A lock left by a process that is gone is taken over."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / f".{path.name}.lock"
    me = f"{socket.gethostname()}\n{os.getpid()}\n{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o644)
        except FileExistsError:
            host, pid, since = _lock_owner(lock)
            if host == socket.gethostname() and not process_alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)  # its process is gone: a stale lock
                continue
            raise BadInput("another run is writing this output", where=where, expected="one run per output",
                           found=f"process {pid} on {host or 'an unknown host'} since {since} ({lock.name})",
                           fix=f"wait for it or choose another output; if that run is gone, remove {lock}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(me)
        break
    else:  # pragma: no cover - a third process took the stale lock between our two tries
        raise BadInput("another run is writing this output", where=where, found=lock.name)
    try:
        yield lock
    finally:
        with contextlib.suppress(OSError):
            if lock.read_text(encoding="utf-8") == me:
                os.unlink(lock)


def new_sibling(path: str | Path, tag: str = "new") -> Path:
    """A new empty hidden folder beside ``path`` (``.NAME.TAG-XXXX``) to write a replacement into."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.{tag}-", dir=path.parent))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def replace_folder(new: str | Path, dest: str | Path) -> Path:
    """Put the finished folder ``new`` at ``dest``. An existing ``dest`` is swapped out in one step where the
    system can (else moved aside to ``.NAME.old-*`` first) and removed only once ``new`` is in place: a
    kill at any moment leaves the old folder or the new one, never neither."""
    new, dest = Path(new), Path(dest)
    if dest.is_symlink():  # the rename would swap the link, not what it points to: never meant, refused
        raise BadInput("will not replace a folder through a link", where=str(dest), expected="a real folder",
                       found=f"a link to {os.readlink(dest)}", fix="give the real path, or another one")
    if not dest.exists():
        os.replace(new, dest)
        return dest
    if _exchange(new, dest):
        shutil.rmtree(new, ignore_errors=True)  # now the old copy
        return dest
    aside = new_sibling(dest, "old")
    os.rmdir(aside)
    os.replace(dest, aside)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(aside, dest)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return dest
