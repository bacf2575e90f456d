"""eaglekb.kb.baselines: building, canonical format, atomic and locked writes, loading, comparison."""

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from eaglekb.kb import baselines as bl
from eaglekb.io.errors import BadInput, MissingFile, SchemaError
from helpers.kb import assert_edit_refused

NOISE = {"repeats": 3, "spread_kind": "range", "spread": {"spec_tok_s": 2.0}, "tolerance_rel": 0.05}


def make(root, name="demo", value=100.0, **kw):
    fields = dict(kind="bench", name=name, config={"steps": 2, "prompts": ["a", "b"]},
                  metrics={"spec_tok_s": value, "cycle": {"verify_ms": 12.5}}, noise=NOISE, root=root,
                  command="invoke bench --record demo")
    fields.update(kw)
    return bl.build(**fields)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    return tmp_path


def test_round_trip_is_canonical(root):
    b = make(root)
    path = bl.write(b, root)
    assert path == root / "baselines/bench/demo.json"
    text = path.read_text()
    assert text.endswith("}\n") and text == bl.dumps(bl.load(path))
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert data["provenance"]["command"] == "invoke bench --record demo"
    assert set(data["provenance"]["versions"]) >= {"python", "torch", "transformers", "eaglekb", "sglang"}
    assert bl.check_all(root) == (["bench/demo"], [])


def test_the_host_load_is_recorded_and_older_results_without_it_stay_canonical(root, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.504, 1.0, 0.25))
    data = json.loads(bl.write(make(root), root).read_text())
    assert data["provenance"]["host"]["load_avg"] == [2.5, 1.0, 0.25]
    older = make(root, name="older")
    data = older.model_dump(mode="json")
    data["provenance"]["host"].pop("load_avg")
    again = bl.dumps(bl.Baseline.model_validate(data))
    assert "load_avg" not in again and again == bl.dumps(bl.Baseline.model_validate(json.loads(again)))


def test_provenance_records_selected_env(root, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = make(root).provenance.env
    assert env.get("NCCL_P2P_DISABLE") == "1" and "UNRELATED_SECRET" not in env


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda d: d.pop("noise"), "noise"),
        (lambda d: d.update(schema_version="1"), "schema_version"),
        (lambda d: d["metrics"].update(speed=3.0), "unit"),
        (lambda d: d["metrics"].update(x_ms="fast"), "number"),
        (lambda d: d.update(extra_field=1), "extra_field"),
        (lambda d: d.update(source="recorded"), "citation"),
        (lambda d: d.update(kind="nonsense"), "kind"),
        (lambda d: d["noise"]["spread"].update(missing_ms=1.0), "missing_ms"),
    ],
)
def test_schema_violations_are_one_line(root, mutate, fragment):
    assert_edit_refused(bl.write(make(root), root), mutate, fragment)


def test_invalid_json_names_line(root):
    path = root / "baselines/bench/broken.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "bench",\n  oops}')
    with pytest.raises(SchemaError, match=r"broken.json:2:"):
        bl.load(path)
    ok, problems = bl.check_all(root)
    assert ok == [] and len(problems) == 1


def test_path_must_match_kind_and_name(root):
    path = bl.write(make(root), root)
    other = path.with_name("other.json")
    other.write_text(path.read_text())
    with pytest.raises(SchemaError, match="do not match its path"):
        bl.load(other)


def test_missing_file_and_bad_id(root):
    with pytest.raises(MissingFile):
        bl.load_id("bench/nothing", root)
    with pytest.raises(BadInput):
        bl.split_id("no-slash")


def test_interrupted_write_leaves_previous_intact(root, monkeypatch):
    path = bl.write(make(root, value=100.0), root)
    before = path.read_text()

    def boom(*a, **k):
        raise KeyboardInterrupt  # the run is interrupted between writing the temp file and renaming it

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        bl.write(make(root, value=50.0), root, force=True)
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == ["demo.json"]  # no temp file left


def test_failure_while_writing_leaves_previous_intact(root, monkeypatch):
    path = bl.write(make(root, value=100.0), root)
    before = path.read_text()
    real_fsync = os.fsync

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        bl.write(make(root, value=50.0), root, force=True)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["demo.json"]


def _writer(args):
    root, i = args
    for j in range(15):
        bl.write(make(Path(root), value=float(i * 100 + j)), Path(root), force=True)
    return i


def test_concurrent_writers_never_corrupt(root):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_writer, [(str(root), i) for i in range(4)])
    ok, problems = bl.check_all(root)
    assert problems == [] and ok == ["bench/demo"]


def test_compare_within_noise(root):
    old = make(root, value=100.0)
    assert bl.compare(make(root, value=104.0), old).reproduced  # 5% relative tolerance
    cmp = bl.compare(make(root, value=90.0), old)
    assert not cmp.reproduced and "spec_tok_s" in cmp.text()
    missing = bl.compare(make(root, metrics={"spec_tok_s": 100.0}), old)
    assert not missing.reproduced


def test_repository_baselines_are_valid():
    ok, problems = bl.check_all(Path(__file__).resolve().parents[2])
    assert problems == []
    assert "plan/k25-investigation" in ok
