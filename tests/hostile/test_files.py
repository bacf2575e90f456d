"""Files the project did not write, careless and hostile: baselines, prompts files, drafter and target folders,
mappings, story manifests and archives. For any content: exit 0 or 2 (1 for a verdict), one stderr line on
failure, no traceback, never classified as a bug, and nothing outside the output folder touched."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.hostile import examples, one_line_failure, run_cli

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
NASTY_TEXT = st.sampled_from(["<script>alert(1)</script>", "a\nb", "\x00", "{{ commands }}", "../../x", "é" * 50,
                              "[x](javascript:alert(1))", ""])
FILE_BYTES = st.one_of(st.binary(max_size=300), st.sampled_from([b"\xff\xfe\x00bad", b"\x80" * 10, b"", b"{",
                                                                 b"[" * 5000 + b"]" * 5000]))


def _mutate(doc: dict, path: list[str], value) -> dict:
    """``doc`` with the value at ``path`` (keys, created as needed) replaced."""
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return doc


def _ok(res, *, verdict: bool = False) -> None:
    assert one_line_failure(res) is None, res
    assert res.reached or res.code in ({0, 1, 2} if verdict else {0, 2}), res


# --------------------------------------------------------------------------- baselines


BASELINE_PATHS = st.sampled_from([["summary"], ["config", "steps"], ["metrics", "breakeven_len"], ["noise"],
                                  ["provenance", "command"], ["created_at"], ["series", "x"], ["kind"],
                                  ["metrics", "x_ms"], ["noise", "spread", "breakeven_len"], ["schema_version"]])


@examples(30)
@given(st.one_of(FILE_BYTES.map(lambda b: ("bytes", b)),
                 st.tuples(BASELINE_PATHS, st.one_of(JSON, NASTY_TEXT)).map(lambda t: ("edit", t)),
                 st.just(("dangling", None))))
def test_any_baseline_file_is_a_problem_line_or_valid(ws, case):
    kind, payload = case
    target = ws.root / "baselines/plan/hx.json"
    good = json.loads((ws.root / "baselines/plan/k25-investigation.json").read_text())
    if kind == "bytes":
        target.write_bytes(payload)
    elif kind == "edit":
        good["name"] = "hx"
        target.write_text(json.dumps(_mutate(good, *payload), allow_nan=True))
    else:
        target.symlink_to(ws.root / "nowhere.json")
    try:
        before = ws.state()
        check = run_cli(["baselines.check"])
        assert check.code in (0, 1) and not check.err and "Traceback" not in check.out, check
        if check.code == 1:  # each problem is one line, and names the file
            assert any("hx.json" in line for line in check.out.splitlines()), check.out
        _ok(run_cli(["plan", "--baseline-tps=82", "--cycle-ms=30", "--json"]))
        assert ws.state() == before
    finally:
        target.unlink()


# --------------------------------------------------------------------------- prompts files


MESSAGES = st.lists(st.one_of(JSON, st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "x"]), JSON),
                                                           "content": st.one_of(st.text(max_size=10), JSON)})),
                    max_size=3)
PROMPT_LINES = st.lists(st.one_of(st.text(max_size=30), MESSAGES.map(lambda m: json.dumps({"messages": m})),
                                  JSON.map(json.dumps)), min_size=0, max_size=4)


@examples(30)
@given(st.one_of(FILE_BYTES, PROMPT_LINES.map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))))
def test_any_prompts_file_is_read_or_refused_in_one_line(ws, content):
    f = ws.root / "in-prompts.txt"
    f.write_bytes(content)
    try:
        before = ws.state()
        res = run_cli(["datagen", "--target=in/target", f"--prompts-file={f}", "--out=out/ds"])
        _ok(res)
        assert res.reached or res.code == 2, res  # the work (stubbed) begins only with prompts read
        _ok(run_cli(["bench.sglang", f"--prompts={f}", "--url=http://127.0.0.1:1"]))
        assert ws.state() == before
    finally:
        f.unlink()


# --------------------------------------------------------------------------- drafter and target folders


DRAFTER_KEYS = st.sampled_from(["hidden_size", "vocab_size", "draft_vocab_size", "num_attention_heads",
                                "rope_theta", "rms_norm_eps", "eagle_config", "architectures", "intermediate_size",
                                "num_key_value_heads", "head_dim", "max_position_embeddings", "target_hidden_size"])
TARGET_KEYS = st.sampled_from(["hidden_size", "vocab_size", "num_hidden_layers", "rope_theta", "rms_norm_eps",
                               "num_attention_heads", "intermediate_size", "rope_scaling", "model_type",
                               "max_position_embeddings", "tie_word_embeddings", "torch_dtype"])
VALUES = st.one_of(JSON, st.sampled_from(["abc", 1e7, 10**7, -1, 0, 1.5, None, [], {}, "1e7", 2**64]))
DAMAGE = st.sampled_from(["none", "truncate", "garbage", "pickle", "config-garbage", "no-weights"])


def _damaged(src: Path, dst: Path, edits, damage: str) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / "config.json").read_text())
    for key, value in edits:
        if value == "<delete>":
            doc.pop(key, None)
        else:
            doc[key] = value
    (dst / "config.json").write_text(json.dumps(doc, allow_nan=True))
    weights = dst / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 64)
    elif damage in ("pickle", "no-weights"):
        weights.unlink()
        if damage == "pickle":
            (dst / "pytorch_model.bin").write_bytes(_evil_pickle(dst.parent / "PWNED"))
    elif damage == "config-garbage":
        (dst / "config.json").write_bytes(b"\xff{not json")
    return dst


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil_pickle(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when it is loaded: loading it would prove a pickle was executed."""
    import pickle

    return pickle.dumps(_Evil(marker))


@examples(25)
@given(st.lists(st.tuples(DRAFTER_KEYS, st.one_of(VALUES, st.just("<delete>"))), max_size=3), DAMAGE)
def test_any_drafter_folder_is_inspected_or_refused(ws, tmp_path_factory, edits, damage):
    folder = _damaged(ws.inputs / "drafter", tmp_path_factory.mktemp("d") / "drafter", edits, damage)
    before = ws.state()
    _ok(run_cli(["inspect", str(folder)]), verdict=True)
    _ok(run_cli(["inspect", "in/drafter", f"--against={folder}"]), verdict=True)
    _ok(run_cli(["vocab.compare", "in/mapping.safetensors", str(folder)]))
    _ok(run_cli(["remap", str(folder), "in/mapping.safetensors", str(ws.out / "remapped"), "--force"]))
    assert not (folder.parent / "PWNED").exists(), "a pickle was executed"
    assert ws.state() == before


@examples(15)
@given(st.lists(st.tuples(TARGET_KEYS, st.one_of(VALUES, st.just("<delete>"))), max_size=3), DAMAGE)
def test_any_target_folder_is_loaded_or_refused(ws, tmp_path_factory, edits, damage):
    from eaglekb.io.errors import EaglekbError
    from eaglekb.models.target import Target

    folder = _damaged(ws.inputs / "target", tmp_path_factory.mktemp("t") / "target", edits, damage)
    _ok(run_cli(["inspect", "in/drafter", f"--target={folder}"]), verdict=True)
    _ok(run_cli(["datagen", f"--target={folder}", "--prompts-file=in/prompts.txt", "--out=out/ds"]))
    try:
        Target.load(folder)
    except EaglekbError as exc:
        assert "\n" not in exc.line()
    assert not (folder.parent / "PWNED").exists(), "a pickle was executed"


# --------------------------------------------------------------------------- story manifests and archives


NAMES = st.one_of(st.sampled_from(["a", "b-remap", "../../drafters/x", "..", ".", "/abs", "a/b", "", ".hidden",
                                   "x" * 200, "a\nb", "ok.1"]), st.text(max_size=12))


def _story(run: Path, names: list[str], members: list[str]) -> None:
    """A finished story run dir whose export holds ``members`` (tar paths) under drafter ``names``."""
    run.mkdir(parents=True)
    buf = io.BytesIO()
    hashes: dict = {n: {} for n in names}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            data = b"weights"
            info = tarfile.TarInfo(m)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            head, _, rest = m.partition("/")
            if head in hashes:
                hashes[head][rest] = hashlib.sha256(data).hexdigest()
    blob = buf.getvalue()
    (run / "drafters.tar.part00").write_bytes(blob)
    doc = {"kind": "story", "complete": True, "env": {"time": "2026-01-01T00:00:00Z"}, "datagen": {}, "runs": {},
           "verdicts": {}, "drafters_export": {"parts": ["drafters.tar.part00"], "bytes": len(blob),
                                               "sha256": hashlib.sha256(blob).hexdigest(), "drafters": hashes}}
    (run / "story.json").write_text(json.dumps(doc))


def _files_outside(base: Path, dest: Path) -> dict:
    """Every file and link under ``base`` but outside ``dest``, with its size and modification time."""
    return {p: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in base.rglob("*")
            if dest not in p.parents and p != dest and not (p.is_dir() and not p.is_symlink())}


@examples(30)
@given(st.lists(NAMES, min_size=1, max_size=2, unique=True), st.lists(st.tuples(NAMES, NAMES), max_size=3))
def test_no_name_from_a_manifest_or_archive_leaves_its_folder(ws, tmp_path_factory, names, pairs):
    base = tmp_path_factory.mktemp("story")
    (base / "drafters" / "x").mkdir(parents=True)
    (base / "drafters" / "x" / "keep.txt").write_text("committed drafter")
    run, dest = base / "a" / "b" / "run", base / "a" / "b" / "dest"
    _story(run, names, [f"{d}/{f}" for d, f in pairs])
    outside = _files_outside(base, dest)
    res = run_cli(["story.record", str(run), "hx", "--drafters", str(dest), "--dry-run"])
    _ok(res)
    assert not dest.exists(), "--dry-run wrote something"
    res = run_cli(["story.record", str(run), "hx", "--drafters", str(dest)])
    _ok(res)
    now = _files_outside(base, dest)
    assert now == outside, sorted(set(outside) ^ set(now))[:5]
    assert (base / "drafters" / "x" / "keep.txt").read_text() == "committed drafter"


# --------------------------------------------------------------------------- mappings and counts


@examples(25)
@given(FILE_BYTES, st.sampled_from(["m.safetensors", "m.pt", "m.npy", "m"]))
def test_any_mapping_file_is_read_or_refused(ws, tmp_path_factory, content, name):
    folder = tmp_path_factory.mktemp("m")
    f = folder / name
    f.write_bytes(content)
    _ok(run_cli(["vocab.compare", "in/mapping.safetensors", str(f)]))
    _ok(run_cli(["vocab.build", "--out=out/m.safetensors", "--draft-vocab-size=8", f"--counts={f}", "--force"]))
    _ok(run_cli(["remap", "in/drafter", str(f), str(ws.out / "r"), "--force"]))
    pkl = folder / "evil.pt"
    pkl.write_bytes(_evil_pickle(folder / "PWNED"))
    _ok(run_cli(["vocab.compare", "in/mapping.safetensors", str(pkl)]))
    assert not (folder / "PWNED").exists(), "a pickle was executed"


@pytest.mark.parametrize("content", [b"", b"{}", b'{"shards": 5}', b"\xff\xfe", b'{"sequences": [1, 2]}'])
def test_any_dataset_folder_is_read_or_refused(ws, tmp_path, content):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "manifest.json").write_bytes(content)
    (ds / "shard-00000.safetensors").write_bytes(b"\x00" * 32)
    _ok(run_cli(["vocab.build", "--out=out/m.safetensors", "--draft-vocab-size=8", f"--dataset={ds}", "--force"]))
    _ok(run_cli(["datagen.compare", str(ds), str(ds)]))
    _ok(run_cli(["finetune", f"--data={ds}", "--out=out/run"]))
