"""Safetensors headers: each tensor's dtype and shape, read without loading any data.

Owns: ``tensor_headers(file)`` (one file) and ``folder_headers(folder)`` (every
``*.safetensors`` of a drafter folder, a tensor stored twice refused). The file is
first opened through ``eaglekb.io.files.safetensors_keys``, so a missing, truncated or
corrupt file is the one ``MissingFile`` / ``IntegrityError`` line every reader gives.

Knows nothing about what the tensors mean (drafters, mappings) or the task runner.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from eaglekb.formats.drafter import weight_files
from eaglekb.io.errors import IntegrityError
from eaglekb.io.files import safetensors_keys


def tensor_headers(path: str | Path) -> dict[str, dict]:
    """``{name: {"shape": [...], "dtype": "BF16"}}`` of one safetensors file (header only)."""
    path = Path(path)
    keys, _ = safetensors_keys(path)  # validates the file: one error conversion for all readers
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return {k: {"shape": list(header[k]["shape"]), "dtype": header[k]["dtype"]} for k in keys}


def folder_headers(folder: str | Path) -> tuple[dict[str, dict], list[str]]:
    """Headers of every ``*.safetensors`` in ``folder`` (each entry also names its ``file``), and the file names."""
    files = weight_files(folder)
    tensors: dict[str, dict] = {}
    for file in files:
        for key, head in tensor_headers(file).items():
            if key in tensors:
                raise IntegrityError("tensor stored twice", where=str(file), found=key)
            tensors[key] = {**head, "file": file.name}
    return tensors, [f.name for f in files]
