"""The dataset format: safetensors shards of packed sequences, a manifest, the target's head.

A dataset folder holds ``manifest.json`` (format name and version, the identity of the
run that made it, one entry per shard: sequences, tokens, loss tokens, bytes, sha256),
``shard-NNNNN.safetensors`` files and, with stored features, ``target_head.safetensors``
(``embed_tokens.weight``, plus ``lm_head.weight`` when untied). A shard packs its
sequences end to end: ``input_ids`` (int32), ``loss_mask`` (uint8), optionally
``aux_hidden``, ``final_hidden`` and ``target_argmax``, one row per token, and
``offsets`` (int64, sequences + 1) where each sequence starts.

Owns: reading (``read_manifest``, ``read_shard_tensor``, ``open_dataset`` -> ``Dataset``
with per-sequence reads, checked against the manifest by size or sha256: token ids and
loss masks held in memory per shard, stored features memory-mapped, sequence ids read from
each shard's header once) and writing one shard file atomically (``write_shard``). Every read and write
goes through ``eaglekb.io.files`` (one error conversion for unreadable files).

Knows nothing about targets, generation, features or training: it stores tensors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from eaglekb.io.errors import IntegrityError, MissingFile, SchemaError
from eaglekb.io.files import atomic_save_safetensors, read_json, read_safetensors, safetensors_keys
from eaglekb.io.pieces import sha256_file

FORMAT = "eaglekb-eagle3-data"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HEAD_FILE = "target_head.safetensors"
SHARD_GLOB = "shard-*.safetensors"
SEQUENCE_IDS = "sequence_ids"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def read_manifest(folder: Path) -> dict | None:
    """The dataset manifest of ``folder`` (None when there is none); another format is one line."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    doc = read_json(path, what="dataset manifest")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SchemaError("not an eaglekb dataset manifest", where=str(path), expected=FORMAT,
                          found=repr(doc.get("format") if isinstance(doc, dict) else type(doc).__name__))
    return doc


def read_shard_tensor(file: Path, name: str):
    """One whole tensor of a shard; a truncated or corrupt shard is one IntegrityError line."""
    return read_safetensors(file, keys=[name])[name]


def write_shard(path: Path, tensors: dict, meta: dict, *, sequence_ids: list[str] | None = None) -> dict:
    """Atomically write one shard (``meta`` JSON-encoded in its header); returns its manifest entry.

    ``sequence_ids`` (one per sequence, in order) go into the header only, not the manifest."""
    header = {k: json.dumps(v) for k, v in meta.items()}
    if sequence_ids is not None:
        header[SEQUENCE_IDS] = json.dumps(sequence_ids)
    atomic_save_safetensors(path, tensors, metadata=header)
    return {
        "sequences": int(tensors["offsets"].numel() - 1),
        "tokens": int(tensors["input_ids"].numel()),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        **meta,
    }


#: Per-token tensors small enough to hold a whole shard of in memory (int32 ids, uint8 mask).
SMALL_KEYS = ("input_ids", "loss_mask")


@dataclass
class Dataset:
    """A datagen folder opened for training: its manifest, shard index and lazy per-sequence reads."""

    path: Path
    manifest: dict
    shard_files: list[Path]
    offsets: list[list[int]]  # per shard: sequence start offsets (len = sequences + 1)
    index: list[tuple[int, int]] = field(default_factory=list)  # global sequence -> (shard, local)
    _handles: dict = field(default_factory=dict, repr=False)  # open shard readers (memory-mapped)
    _small: dict = field(default_factory=dict, repr=False)  # per shard: its token ids and loss mask, read whole
    _ids: dict = field(default_factory=dict, repr=False)  # per shard: its sequence ids (None: none stored)

    @property
    def target(self) -> dict:
        return self.manifest["identity"]["target"]

    @property
    def capture_points(self) -> list[int]:
        return list(self.manifest["identity"]["capture_points"])

    @property
    def features(self) -> str:
        return self.manifest["identity"]["config"]["features"]

    @property
    def has_final_hidden(self) -> bool:
        cfg = self.manifest["identity"]["config"]
        return cfg["features"] == "stored" and bool(cfg["store_final_hidden"])

    def __len__(self) -> int:
        return len(self.index)

    def length(self, i: int) -> int:
        s, j = self.index[i]
        return self.offsets[s][j + 1] - self.offsets[s][j]

    def _handle(self, s: int):
        from safetensors import safe_open

        fh = self._handles.get(s)
        if fh is None:
            fh = self._handles[s] = safe_open(str(self.shard_files[s]), framework="pt")
        return fh

    def get(self, i: int, max_len: int | None = None) -> dict:
        """One sequence's tensors (``input_ids``, ``loss_mask``, and the stored features).

        A shard's token ids and loss mask (5 bytes a token) are read whole at its first use and sliced from memory
        after: a slice read through the file per key and sequence was most of a batch's assembly. The stored
        features (kilobytes a token) stay memory-mapped slices."""
        s, j = self.index[i]
        a, b = self.offsets[s][j], self.offsets[s][j + 1]
        if max_len is not None:
            b = min(b, a + max_len)
        try:
            small = self._small.get(s)
            if small is None:
                fh = self._handle(s)
                keys = [k for k in fh.keys() if k != "offsets"]
                small = self._small[s] = ({k: fh.get_tensor(k) for k in SMALL_KEYS if k in keys},
                                          [k for k in keys if k not in SMALL_KEYS])
            whole, mapped = small
            out = {k: v[a:b] for k, v in whole.items()}
            if mapped:
                fh = self._handle(s)
                out.update({k: fh.get_slice(k)[a:b] for k in mapped})
            return out
        except Exception:
            safetensors_keys(self.shard_files[s])  # a shard gone or corrupted since opening: one line
            raise

    def sequence_id(self, i: int) -> str | None:
        """Sequence ``i``'s id (each shard's header read once); None for shards written before ids were stored."""
        s, j = self.index[i]
        if s not in self._ids:
            self._ids[s] = shard_sequence_ids(self.shard_files[s])
        ids = self._ids[s]
        return ids[j] if ids is not None else None

    def token_ids_and_masks(self) -> Iterator[tuple[Any, Any]]:
        """(input_ids, loss_mask) per shard, for vocab statistics."""
        for file in self.shard_files:
            t = read_safetensors(file, keys=["input_ids", "loss_mask"])
            yield t["input_ids"], t["loss_mask"]

    def target_head(self) -> tuple[Any, Any]:
        """(embed_tokens, lm_head) of the target, as stored with the data."""
        file = self.path / HEAD_FILE
        if not file.is_file():
            raise MissingFile("dataset has no target head file", where=str(file),
                              fix="rerun invoke datagen with stored features")
        t = read_safetensors(file)
        return t["embed_tokens.weight"], t.get("lm_head.weight", t["embed_tokens.weight"])


def _check_shard(file: Path, entry: dict, verify: str) -> None:
    if not file.is_file():
        raise MissingFile("shard listed in the manifest is missing", where=str(file))
    size = file.stat().st_size
    if size != entry["bytes"]:
        raise IntegrityError("shard size differs from the manifest (truncated or replaced)", where=str(file),
                             expected=f"{entry['bytes']} bytes", found=f"{size} bytes")
    if verify == "sha256" and sha256_file(file) != entry["sha256"]:
        raise IntegrityError("shard hash differs from the manifest", where=str(file),
                             expected=entry["sha256"][:16], found="another hash")


def open_dataset(path: str | Path, *, verify: str = "size") -> Dataset:
    """Open a datagen folder; ``verify``: "size" (cheap: sizes and headers) or "sha256" (full hash)."""
    path = Path(path)
    if not path.is_dir():
        raise MissingFile("dataset folder not found", where=str(path), fix="run invoke datagen first")
    manifest = read_manifest(path)
    if manifest is None:
        raise MissingFile("dataset folder has no manifest.json", where=str(path), fix="run invoke datagen first")
    files, offsets, index = [], [], []
    for name in sorted(manifest.get("shards", {})):
        file = path / name
        _check_shard(file, manifest["shards"][name], verify)
        off = read_shard_tensor(file, "offsets").tolist()
        s = len(files)
        files.append(file)
        offsets.append(off)
        index.extend((s, j) for j in range(len(off) - 1))
    return Dataset(path, manifest, files, offsets, index)


def shard_sequence_ids(file: Path) -> list[str] | None:
    """The sequence ids a shard's header holds (None for shards written before ids were stored)."""
    _, meta = safetensors_keys(file)
    raw = meta.get(SEQUENCE_IDS)
    return json.loads(raw) if raw else None


def content_index(path: str | Path) -> dict[str, str]:
    """sequence id -> sha256 of its token ids and loss mask, over every shard of a dataset."""
    ds = open_dataset(path)
    out: dict[str, str] = {}
    for s, file in enumerate(ds.shard_files):
        ids = shard_sequence_ids(file)
        if ids is None:
            raise SchemaError("shard has no sequence ids (written by an older datagen)", where=str(file),
                              fix="regenerate the dataset to compare it")
        t = read_safetensors(file, keys=["input_ids", "loss_mask"])
        off = ds.offsets[s]
        for j, sid in enumerate(ids):
            a, b = off[j], off[j + 1]
            h = hashlib.sha256(t["input_ids"][a:b].numpy().tobytes())
            h.update(t["loss_mask"][a:b].numpy().tobytes())
            out[sid] = h.hexdigest()
    return out


def compare_datasets(a: str | Path, b: str | Path) -> dict:
    """Sequence by sequence (by id, in any shard order): how many are identical, differ, or exist on one side."""
    ia, ib = content_index(a), content_index(b)
    both = sorted(set(ia) & set(ib))
    differ = [k for k in both if ia[k] != ib[k]]
    return {"sequences_a_count": len(ia), "sequences_b_count": len(ib), "common_count": len(both),
            "equal_count": len(both) - len(differ), "different_count": len(differ),
            "only_a_count": len(set(ia) - set(ib)), "only_b_count": len(set(ib) - set(ia)),
            "equal_frac": (len(both) - len(differ)) / len(both) if both else 0.0,
            "first_different": differ[:5]}
