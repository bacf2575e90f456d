"""The serving stack for a GPU host without registry access: a pinned wheel set packed into pieces, then installed.

Owns:

* ``STACKS``: the pinned wheel sets we know to serve our drafters (``stacks/NAME.txt`` beside this
  module: one ``name==version`` a line, every wheel installed with ``--no-deps``);
* ``pack``: fetch the set where a registry is reachable (``pip download --no-deps --only-binary=:all:``
  for the GPU host's Python and platform) or take it from a folder, check that every pin has exactly
  one wheel, write ``wheels.json`` (file and SHA-256 of each), tar them (uncompressed: wheels are zip
  files already; fixed order and times, so the same set gives the same bytes) and split the tar into
  pieces of at most a size the caller chooses (``eaglekb.io.pieces``), each with its checksum. The
  pieces go to a folder of their own, built beside the old one and swapped in when complete
  (``eaglekb.io.files.replace_folder``): a pack stopped midway leaves the old set whole;
* ``install``: check every piece, join them, check that the archive holds exactly the wheels
  ``wheels.json`` lists (anything else is refused, never installed), each of its recorded hash,
  ``pip install --no-index --no-deps --target`` into a new folder, renamed into place when complete,
  with a stamp (``eaglekb-stack.json``). The serving stack lives in its own folder, used through
  ``PYTHONPATH`` by the server process only: its pins (an older transformers, say) never touch the
  environment our own tasks use.

Every output follows the one rule of ``eaglekb.io.files.guard_output``: never through a link, never a
tracked file, an existing folder replaced only with ``force`` and only when it is what this module
writes (a piece folder, a stack holding our stamp). Knows nothing about SGLang's flags
(``eaglekb.measure.sglang.config``) or the task runner.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, Unavailable, first_line
from eaglekb.io.files import atomic_write_json, guard_output, new_sibling, output_lock, read_json, replace_folder
from eaglekb.io.pieces import MANIFEST_SUFFIX, check, join, sha256_file, split

STACK_DIR = Path(__file__).with_name("stacks")
STACKS = ("sglang-0.5.17",)
STAMP = "eaglekb-stack.json"
WHEELS_JSON = "wheels.json"
#: the GPU host the pinned set is for: CPython 3.12 on x86-64 Linux with glibc 2.39 (pip matches manylinux_2_N
#: exactly)
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any")
DEFAULT_PIECE_BYTES = 1 << 30
_PART = re.compile(r".+\.part\d{3,}$")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def read_stack(stack: str | Path) -> list[tuple[str, str]]:
    """The pins of a stack: a known name (``sglang-0.5.17``) or a requirements file of ``name==version`` lines."""
    path = STACK_DIR / f"{stack}.txt" if str(stack) in STACKS else Path(stack)
    if not path.is_file():
        raise BadInput("unknown serving stack", where="--stack", expected=f"{', '.join(STACKS)} or a file of "
                       "name==version lines", found=repr(str(stack)))
    pins = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise BadInput("not a pinned requirement", where=f"{path}:{n}", expected="name==version",
                           found=repr(line[:80]))
        pins.append((m.group(1), m.group(2)))
    if not pins:
        raise BadInput("stack file has no pins", where=str(path), expected="name==version lines", found="none")
    return pins


def _wheel_for(pin: tuple[str, str], wheels: list[Path]) -> list[Path]:
    name, version = _norm(pin[0]), pin[1]
    return [w for w in wheels if _norm(w.name.split("-")[0]) == name and w.name.split("-")[1] == version]


def match_wheels(pins: list[tuple[str, str]], folder: Path) -> list[Path]:
    """One wheel per pin in ``folder`` (one line naming the first pin with none, or with several)."""
    wheels = sorted(Path(folder).glob("*.whl"))
    chosen = []
    for pin in pins:
        found = _wheel_for(pin, wheels)
        if len(found) != 1:
            raise MissingFile("wheel for a pin missing" if not found else "several wheels for one pin",
                              where=str(folder), expected=f"one wheel of {pin[0]}=={pin[1]}",
                              found=", ".join(w.name for w in found) or "none",
                              fix="download it (invoke sglang.pack without --wheels) or remove the extra one")
        chosen.append(found[0])
    return chosen


def download(pins: list[tuple[str, str]], dest: Path, *, python_version: str = "3.12") -> None:
    """``pip download`` the pins for the GPU host (no dependencies resolved: the set is complete)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += [f"{n}=={v}" for n, v in pins]
    res = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise Unavailable("pip download of the serving stack failed", where="pip download",
                          found=first_line(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else
                                           f"exit {res.returncode}"),
                          fix="run where a package registry is reachable, or pass --wheels DIR")


def _tar(wheels: list[Path], index: dict, dest: Path) -> None:
    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
        return info

    with tempfile.TemporaryDirectory() as tmp:
        idx = Path(tmp) / WHEELS_JSON
        atomic_write_json(idx, index)
        with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(idx, arcname=WHEELS_JSON, filter=fixed)
            for w in wheels:
                tar.add(w, arcname=w.name, filter=fixed)


def is_piece_folder(path: Path) -> bool:
    """Whether ``path`` holds only piece sets (``*.partNNN`` and ``*.pieces.json``): what ``pack`` writes."""
    return all(p.is_file() and not p.is_symlink() and (p.name.endswith(MANIFEST_SUFFIX) or _PART.match(p.name))
               for p in Path(path).iterdir())


def pack(stack: str | Path, out: Path, *, wheels_dir: Path | None = None, piece_bytes: int = DEFAULT_PIECE_BYTES,
         force: bool = False, progress: bool = True) -> dict:
    """Pieces of the stack's wheel set in the folder ``out`` (``STACK.tar.partNNN`` and ``STACK.tar.pieces.json``);
    an existing piece folder is replaced (``force``) only once the new set is complete beside it."""
    pins = read_stack(stack)
    name = str(stack) if str(stack) in STACKS else Path(str(stack)).stem
    out, where = Path(out), f"--out {out}"
    guard_output(out, where=where, force=force, folder=True, ours=is_piece_folder, what="piece folder",
                 inputs=[wheels_dir] if wheels_dir is not None else ())
    with output_lock(out, where=where), tempfile.TemporaryDirectory(prefix="eaglekb-pack-") as tmp:
        folder = Path(wheels_dir) if wheels_dir is not None else Path(tmp) / "wheels"
        if wheels_dir is None:
            download(pins, folder)
        elif not folder.is_dir():
            raise MissingFile("wheel folder not found", where=f"--wheels {folder}")
        wheels = match_wheels(pins, folder)
        index = {"stack": name, "format": "eaglekb-wheels/1",
                 "wheels": {w.name: {"sha256": sha256_file(w), "bytes": w.stat().st_size} for w in wheels}}
        tar = Path(tmp) / f"{name}.tar"
        _tar(wheels, index, tar)
        new = new_sibling(out)
        try:
            doc = split(tar, new, piece_bytes, name=f"{name}.tar", progress=progress)
            replace_folder(new, out)  # the old set stays whole until the new one is complete
        finally:
            shutil.rmtree(new, ignore_errors=True)
    doc["wheels_count"] = len(wheels)
    doc["wheels_bytes"] = sum(v["bytes"] for v in index["wheels"].values())
    return doc


def find_manifest(pieces_dir: Path) -> Path:
    """The one piece manifest in ``pieces_dir`` (one line when there is none or several)."""
    found = sorted(Path(pieces_dir).glob(f"*{MANIFEST_SUFFIX}")) if Path(pieces_dir).is_dir() else []
    if len(found) != 1:
        raise MissingFile("no piece manifest" if not found else "several piece manifests", where=str(pieces_dir),
                          expected=f"one *{MANIFEST_SUFFIX} (from invoke sglang.pack)",
                          found=", ".join(f.name for f in found) or "none")
    return found[0]


def _stamp(target: Path) -> dict | None:
    path = target / STAMP
    return read_json(path, what="stack stamp") if path.is_file() else None


def _listed(tar: tarfile.TarFile, tar_path: Path) -> dict:
    """The archive's ``wheels.json``, after checking that the archive holds exactly it and the wheels it lists
    (plain files with plain names): a file it does not list is refused, never installed."""
    members = {}
    for m in tar.getmembers():
        if not m.isfile() or Path(m.name).name != m.name or m.name in members:
            raise IntegrityError("unexpected entry in the wheel archive", where=str(tar_path), found=repr(m.name))
        members[m.name] = m
    if WHEELS_JSON not in members or members[WHEELS_JSON].size > 16 << 20:
        raise IntegrityError("wheel archive has no wheel list", where=str(tar_path), expected=WHEELS_JSON,
                             fix="pack the set again")
    try:
        index = json.loads(tar.extractfile(members[WHEELS_JSON]).read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        index = None
    listed = index.get("wheels") if isinstance(index, dict) else None
    if not isinstance(listed, dict) or not listed or not all(
            isinstance(k, str) and k.endswith(".whl") and isinstance(v, dict) and isinstance(v.get("sha256"), str)
            for k, v in listed.items()):
        raise IntegrityError("not a wheel list", where=f"{tar_path}:{WHEELS_JSON}",
                             expected="{\"wheels\": {\"NAME.whl\": {\"sha256\": ...}}}", fix="pack the set again")
    extra = sorted(set(members) - set(listed) - {WHEELS_JSON})
    if extra:
        raise IntegrityError("wheel archive holds a file its wheel list does not name", where=str(tar_path),
                             expected=f"only the {len(listed)} listed wheels", found=repr(extra[0])
                             + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""), fix="nothing was installed")
    missing = sorted(set(listed) - set(members))
    if missing:
        raise IntegrityError("listed wheel missing from the archive", where=str(tar_path), expected=missing[0],
                             fix="pack the set again")
    return index


def _extract(tar_path: Path, dest: Path) -> tuple[dict, list[Path]]:
    """The wheel list and the listed wheels, unpacked into ``dest``, each checked against its SHA-256."""
    with tarfile.open(tar_path) as tar:
        index = _listed(tar, tar_path)
        tar.extractall(dest, filter="data")
    wheels = []
    for fname, meta in sorted(index["wheels"].items()):
        w = dest / fname
        if not w.is_file() or sha256_file(w) != meta["sha256"]:
            raise IntegrityError("wheel does not match its recorded SHA-256", where=fname,
                                 expected=meta["sha256"][:16], fix="pack the set again")
        wheels.append(w)
    return index, wheels


def _pip_install(wheels: list[Path], target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--target", str(target), *map(str, wheels)]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
        raise Unavailable("pip install of the serving stack failed", where=f"--target {target}",
                          found=first_line(lines[-1] if lines else f"exit {res.returncode}"))


def install(pieces_dir: Path, target: Path, *, force: bool = False, progress: bool = True) -> dict:
    """Check and join the pieces in ``pieces_dir``, install the wheels into ``target``; the stamp."""
    man_path = find_manifest(Path(pieces_dir))
    man = check(man_path, progress=progress)
    target = Path(target)
    # the shared rule's part that holds whatever is there (no link, no input, no tracked file); what may be
    # replaced is ours to say: a folder holding our stamp, with force
    guard_output(target, where=f"--target {target}", folder=True, force=True, what="stack folder", inputs=[pieces_dir])
    old = _stamp(target) if target.is_dir() else None
    if old is not None and old.get("sha256") == man["sha256"]:
        return dict(old, already_installed=True)
    if target.exists() and (old is None or not force):
        raise BadInput("install folder exists", where=f"--target {target}",
                       expected="a new folder" + (" or --force (it holds another stack we installed)" if old else ""),
                       found="another stack" if old else "a folder this command did not create")
    t0 = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tar = join(man_path, work / man["name"], progress=progress)
        wheels_dir = work / "wheels"
        index, wheels = _extract(tar, wheels_dir)
        tar.unlink()
        new = work / "site"
        _pip_install(wheels, new)  # the listed wheels only
        stamp = {"stack": index.get("stack"), "sha256": man["sha256"], "wheels_count": len(index.get("wheels", {})),
                 "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "install_s": round(time.perf_counter() - t0, 1), "python": sys.version.split()[0]}
        atomic_write_json(new / STAMP, stamp)
        replace_folder(new, target)  # ours (stamped) and --force: the old copy goes once the new one is in place
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return dict(stamp, target=str(target), already_installed=False)
