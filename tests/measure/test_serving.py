"""The serving stack air-gapped: a tiny fake wheel set packed into pieces, then joined, checked and installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eaglekb.io.errors import BadInput, IntegrityError, MissingFile
from eaglekb.measure.sglang.stack import STAMP, install, pack, read_stack


def fake_wheel(folder: Path, name: str, version: str, payload: str) -> Path:
    """A minimal pure-Python wheel (module, METADATA, WHEEL, RECORD) pip installs with --no-index."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", f"VALUE = {payload!r}\n")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture()
def stack(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "fakeserve", "1.0", "served")
    fake_wheel(wheels, "fakekernel", "0.4.5", "k" * 3000)
    fake_wheel(wheels, "fakeserve", "0.9", "old")  # another version in the folder: not picked
    req = tmp_path / "fake-stack.txt"
    req.write_text("# a fake stack\nfakeserve==1.0\nfakekernel==0.4.5\n")
    return req, wheels


def test_pack_install_and_use_from_its_own_folder(tmp_path, stack):
    req, wheels = stack
    doc = pack(req, tmp_path / "pieces", wheels_dir=wheels, piece_bytes=2048, progress=False)
    assert doc["wheels_count"] == 2 and len(doc["pieces"]) >= 2
    again = pack(req, tmp_path / "pieces2", wheels_dir=wheels, piece_bytes=2048, progress=False)
    assert again["sha256"] == doc["sha256"]  # the same set gives the same bytes
    target = tmp_path / "site"
    res = install(tmp_path / "pieces", target, progress=False)
    assert res["wheels_count"] == 2 and (target / STAMP).is_file() and not res["already_installed"]
    out = subprocess.run([sys.executable, "-c", "import fakeserve; print(fakeserve.VALUE)"],
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.stdout.strip() == "served"
    assert install(tmp_path / "pieces", target, progress=False)["already_installed"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".site.")]  # the work folder is gone


def test_missing_corrupt_or_foreign_is_one_line(tmp_path, stack):
    req, wheels = stack
    pack(req, tmp_path / "pieces", wheels_dir=wheels, piece_bytes=2048, progress=False)
    part = sorted((tmp_path / "pieces").glob("*.part*"))[1]
    data = part.read_bytes()
    part.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    with pytest.raises(IntegrityError, match="corrupt"):
        install(tmp_path / "pieces", tmp_path / "site", progress=False)
    part.unlink()
    with pytest.raises(MissingFile, match="pieces missing"):
        install(tmp_path / "pieces", tmp_path / "site", progress=False)
    assert not (tmp_path / "site").exists()
    part.write_bytes(data)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(BadInput, match="exists"):
        install(tmp_path / "pieces", mine, force=True, progress=False)  # not ours: never replaced
    assert (mine / "notes.txt").read_text() == "keep me"


def test_stack_pins_and_missing_wheels(tmp_path, stack):
    req, wheels = stack
    assert ("sglang", "0.5.17") in read_stack("sglang-0.5.17")
    assert ("transformers", "5.12.1") in read_stack("sglang-0.5.17")
    bad = tmp_path / "bad.txt"
    bad.write_text("fakeserve>=1\n")
    with pytest.raises(BadInput, match="pinned"):
        read_stack(bad)
    with pytest.raises(BadInput, match="unknown serving stack"):
        read_stack("sglang-9.9")
    (wheels / "fakekernel-0.4.5-py3-none-any.whl").unlink()
    with pytest.raises(MissingFile, match="fakekernel==0.4.5"):
        pack(req, tmp_path / "p", wheels_dir=wheels, progress=False)
