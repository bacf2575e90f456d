"""The serving stack for an air-gapped GPU machine: a pinned wheel set packed into pieces, then installed.

Owns:

* ``STACKS``: the pinned wheel sets we know to serve our drafters (``stacks/NAME.txt`` beside this
  module: one ``name==version`` a line, every wheel installed with ``--no-deps``);
* ``pack``: fetch the set where a registry is reachable (``pip download --no-deps --only-binary=:all:``
  for the GPU machine's Python and platform) or take it from a folder, check that every pin has
  exactly one wheel, write ``wheels.json`` (file and SHA-256 of each), tar them (uncompressed: wheels
  are zip files already; fixed order and times, so the same set gives the same bytes) and split the tar
  into pieces that fit a transfer (``eaglekb.io.pieces``);
* ``install``: check every piece, join them, unpack, check each wheel's hash against ``wheels.json``,
  ``pip install --no-index --no-deps --target`` into a new folder, renamed into place when complete,
  with a stamp (``eaglekb-stack.json``). The serving stack lives in its own folder, used through
  ``PYTHONPATH`` by the server process only: its pins (an older transformers, say) never touch the
  environment our own tasks use.

Nothing is deleted that this module did not create: an existing target folder is kept unless it holds
our stamp and ``force`` is given. Knows nothing about SGLang's flags (``eaglekb.measure.sglang.config``) or
the task runner.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, Unavailable, first_line
from eaglekb.io.files import atomic_write_json, read_json, replace_folder
from eaglekb.io.pieces import MANIFEST_SUFFIX, check, join, sha256_file, split

STACK_DIR = Path(__file__).with_name("stacks")
STACKS = ("sglang-0.5.17",)
STAMP = "eaglekb-stack.json"
WHEELS_JSON = "wheels.json"
#: the GPU machine: CPython 3.12 on x86-64 Linux with glibc 2.39 (pip matches manylinux_2_N exactly)
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any")
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
    """``pip download`` the pins for the GPU machine (no dependencies resolved: the set is complete)."""
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


def pack(stack: str | Path, out: Path, *, wheels_dir: Path | None = None, piece_bytes: int = 56 << 20,
         force: bool = False, progress: bool = True) -> dict:
    """Pieces of the stack's wheel set in ``out`` (``STACK.tar.partNNN`` and ``STACK.tar.pieces.json``)."""
    pins = read_stack(stack)
    name = str(stack) if str(stack) in STACKS else Path(str(stack)).stem
    with tempfile.TemporaryDirectory(prefix="eaglekb-pack-") as tmp:
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
        doc = split(tar, Path(out), piece_bytes, name=f"{name}.tar", force=force, progress=progress)
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


def _extract(tar_path: Path, dest: Path) -> dict:
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            if not m.isfile() or Path(m.name).name != m.name:
                raise IntegrityError("unexpected entry in the wheel archive", where=str(tar_path), found=repr(m.name))
        tar.extractall(dest, filter="data")
    index = read_json(dest / WHEELS_JSON, what="wheel index")
    for fname, meta in index.get("wheels", {}).items():
        w = dest / fname
        if not w.is_file() or sha256_file(w) != meta.get("sha256"):
            raise IntegrityError("wheel does not match its recorded SHA-256", where=fname,
                                 expected=str(meta.get("sha256"))[:16], fix="pack the set again")
    return index


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
        index = _extract(tar, wheels_dir)
        tar.unlink()
        new = work / "site"
        _pip_install(sorted(wheels_dir.glob("*.whl")), new)
        stamp = {"stack": index.get("stack"), "sha256": man["sha256"], "wheels_count": len(index.get("wheels", {})),
                 "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "install_s": round(time.perf_counter() - t0, 1), "python": sys.version.split()[0]}
        atomic_write_json(new / STAMP, stamp)
        replace_folder(new, target)  # ours (stamped) and --force: the old copy goes once the new one is in place
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return dict(stamp, target=str(target), already_installed=False)
