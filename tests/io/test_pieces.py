"""io.pieces: split into pieces with a manifest, joined back with every hash checked."""

from __future__ import annotations

import os

import pytest

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile
from eaglekb.io.pieces import check, join, manifest_path, sha256_file, split


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 1000])
def test_split_then_join_gives_the_same_bytes(tmp_path, size):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(size))
    doc = split(src, tmp_path / "p", 100)
    assert sum(p["size"] for p in doc["pieces"]) == size
    assert all(p["size"] <= 100 for p in doc["pieces"]) and len(doc["pieces"]) == max(1, -(-size // 100))
    out = join(manifest_path(tmp_path / "p", "blob.bin"), tmp_path / "back.bin")
    assert out.read_bytes() == src.read_bytes() and sha256_file(out) == doc["sha256"]


def test_missing_or_corrupt_piece_is_one_line_and_writes_nothing(tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(350))
    split(src, tmp_path / "p", 100)
    man = manifest_path(tmp_path / "p", "blob.bin")
    piece = tmp_path / "p" / "blob.bin.part002"
    good = piece.read_bytes()
    piece.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(IntegrityError, match="corrupt") as err:
        join(man, tmp_path / "out.bin")
    assert "blob.bin.part002" in str(err.value) and "\n" not in str(err.value)
    piece.write_bytes(good[:50])
    with pytest.raises(IntegrityError, match="wrong size"):
        check(man)
    piece.unlink()
    with pytest.raises(MissingFile, match="1 of 4 pieces missing") as err:
        join(man, tmp_path / "out.bin")
    assert "blob.bin.part002" in str(err.value)
    assert not (tmp_path / "out.bin").exists() and not list(tmp_path.glob(".out.bin*"))


def test_existing_piece_set_needs_force(tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(b"x" * 250)
    split(src, tmp_path / "p", 100)
    with pytest.raises(BadInput, match="exists"):
        split(src, tmp_path / "p", 100)
    (tmp_path / "p" / "other.txt").write_text("kept")
    doc = split(src, tmp_path / "p", 200, force=True)
    assert len(doc["pieces"]) == 2 and (tmp_path / "p" / "other.txt").read_text() == "kept"
    assert sorted(f.name for f in (tmp_path / "p").glob("blob.bin.part*")) == ["blob.bin.part000", "blob.bin.part001"]
    with pytest.raises(BadInput, match="piece size"):
        split(src, tmp_path / "q", 0)
