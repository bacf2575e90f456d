"""`--per-source` as a cap that says so, and `--slice K/N`: disjoint, covering slices of one corpus mix by item,
recorded, and never mixed in one dataset folder (CPU, small corpora, a tiny target)."""

from __future__ import annotations

import json

import pytest

from eaglekb.data import corpora, datagen, generation
from eaglekb.data.corpora import PromptSet, prompts_hash
from eaglekb.data.prompts import item_key, parse_slice, slice_of, take_slice, training_prompts
from eaglekb.io.errors import BadInput, Incompatible
from helpers.datagen import make_target, prompts, small_cfg
from helpers.hostile import one_line_failure, run_cli, stub_work

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MIX = ["gsm8k-instruct:3", "gsm8k-code:2", "gsm8k", "gpqa", "aime"]


# ----------------------------------------------------------------------------- --per-source is a cap, said once


def test_per_source_beyond_a_corpus_takes_all_of_it_and_says_so():
    ps = corpora.mix(["aime", "gpqa", "gsm8k"], per_source=100, seed=0)
    counts = {m["source"]: m["count"] for m in ps.manifest["mix"]}
    assert counts == {"aime": 28, "gpqa": 100, "gsm8k": 100}
    assert ps.manifest["clamped"] == {"aime": 28} and ps.manifest["per_source"] == 100
    assert ps.manifest["notes"] == ["corpus aime has only 28 train prompts; taking all 28 of --per-source 100"]
    assert ps.manifest["mix"][0]["available"] == 28
    for per_source in (0, None, 28, 20):  # all, or not more than there is: nothing to say
        m = corpora.mix(["aime", "gpqa"], per_source=per_source).manifest
        assert m["clamped"] == {} and m["notes"] == []


# ----------------------------------------------------------------------------- parsing --slice


@pytest.mark.parametrize("spec, part", [("1/3", (1, 3)), ("3/3", (3, 3)), ("1/1", (1, 1)), (" 2/7 ", (2, 7)),
                                        (None, None), ("", None)])
def test_slice_parses(spec, part):
    assert parse_slice(spec) == part


@pytest.mark.parametrize("spec", ["0/3", "4/3", "x", "3", "1/0", "-1/3", "1/3/4", "1/", "/3", "a/b", "1.0/3",
                                  "\uff11/3", "1 / 3"])
def test_a_bad_slice_is_one_line(spec):
    with pytest.raises(BadInput) as exc:
        parse_slice(spec)
    line = exc.value.line()
    assert exc.value.where == "--slice" and "expected K/N with 1 <= K <= N" in line and "\n" not in line


# ----------------------------------------------------------------------------- the slices themselves


def test_item_keys_join_variants_and_the_derived_corpora_with_their_base():
    assert item_key("gsm8k-instruct:0201#7") == item_key("gsm8k-code:0201#0") == item_key("gsm8k:0201") == "gsm8k:0201"
    assert item_key("wiki-instruct:Ada #1 Lovelace#3") == "wiki:Ada #1 Lovelace" == item_key("wiki:Ada #1 Lovelace")
    assert item_key("chitchat-multi:abc#2") == "chitchat:abc" and item_key("prompts.txt:3") == "prompts.txt:3"


@pytest.fixture(scope="module")
def mixed():
    return corpora.mix(MIX, per_source=0, seed=0)


def test_slices_are_disjoint_cover_the_mix_and_keep_each_item_whole(mixed):
    parts = [take_slice(mixed, (k, 3)) for k in (1, 2, 3)]
    ids = [[p.id for p in s.prompts] for s in parts]
    assert sorted(sum(ids, [])) == sorted(p.id for p in mixed.prompts)  # covering, and no prompt twice
    order = {p.id: i for i, p in enumerate(mixed.prompts)}
    assert all(ix == sorted(ix, key=order.__getitem__) for ix in ids)  # each slice keeps the mix's order
    owner = {}
    for k, s in enumerate(parts, 1):
        for p in s.prompts:  # every variant of an item, in every corpus made from it, in one slice
            assert owner.setdefault(item_key(p.id), k) == k, p.id
    for s in parts:  # every corpus in every slice, in shares close to a third
        assert set(s.manifest["slice_counts"]) == {m["source"] for m in mixed.manifest["mix"]}
        assert 0.28 < len(s) / len(mixed) < 0.39
    assert [s.manifest["slice"] for s in parts] == ["1/3", "2/3", "3/3"]
    assert all(s.manifest["unsliced_count"] == len(mixed) and s.manifest["count"] == len(s) for s in parts)
    assert sum(s.manifest["slice_counts"]["aime"] for s in parts) == 28


def test_a_slice_does_not_depend_on_the_seed_or_the_selection(mixed):
    """By a stable hash of the item: sessions that differ in --seed or --per-source still never share an item."""
    other = corpora.mix(MIX, per_source=300, seed=5)
    one = {item_key(p.id) for p in take_slice(mixed, (1, 3)).prompts}
    two = {item_key(p.id) for p in take_slice(other, (2, 3)).prompts}
    assert one and two and not one & two
    assert [p.id for p in take_slice(mixed, (2, 3)).prompts] == [p.id for p in take_slice(mixed, (2, 3)).prompts]
    assert all(slice_of(p.id, 1) == 1 for p in mixed.prompts[:50])


def test_an_empty_slice_is_refused():
    one = corpora.mix(["aime"], per_source=1)
    k = 2 if slice_of(one.prompts[0].id, 2) == 1 else 1
    with pytest.raises(BadInput, match="the slice holds no prompts") as exc:
        take_slice(one, (k, 2))
    assert exc.value.where == "--slice"


def test_training_prompts_records_the_slice_and_refuses_one_of_a_prompts_file(tmp_path):
    ps = training_prompts(["aime", "gpqa"], per_source=0, slice_spec="2/2")
    assert ps.manifest["slice"] == "2/2" and ps.manifest["eval_sets_excluded"] == list(corpora.EVAL_SETS)
    assert training_prompts(["aime"], per_source=0).manifest["slice"] is None
    f = tmp_path / "p.txt"
    f.write_text("one\ntwo\n")
    with pytest.raises(BadInput, match="a slice is taken of corpora only") as exc:
        training_prompts(prompts_file=str(f), slice_spec="1/2")
    assert exc.value.where == "--slice"


# ----------------------------------------------------------------------------- one slice per dataset folder


def _sliced(n: int, part: str | None) -> PromptSet:
    ps = prompts(n)
    return PromptSet(ps.name, ps.prompts, manifest={**ps.manifest, "slice": part})


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return generation.load_target(make_target(tmp_path_factory.mktemp("target") / "tiny"), dtype="float32")


def test_a_dataset_folder_holds_one_slice(target, tmp_path):
    cfg = dict(max_new_tokens=3, shard_size=2)
    plain = datagen.run(target, _sliced(2, None), tmp_path / "plain", small_cfg(**cfg), progress=False)
    assert "slice" not in plain["identity"]  # an unsliced dataset's identity (and hash) is what it always was
    out = tmp_path / "s1"
    man = datagen.run(target, _sliced(4, "1/2"), out, small_cfg(**cfg), progress=False, stop_after_shards=1)
    assert man["identity"]["slice"] == "1/2" and man["prompts"]["slice"] == "1/2"
    before = (out / "manifest.json").read_text()
    for part, found in (("2/2", "found --slice 2/2"), (None, "found no --slice")):
        with pytest.raises(Incompatible, match="holds another slice of the prompts") as exc:
            datagen.run(target, _sliced(4, part), out, small_cfg(**cfg), progress=False)
        assert f"expected --slice 1/2; {found}; fix: give each slice its own --out" in exc.value.line()
    with pytest.raises(Incompatible, match="expected no --slice .it holds the whole mix.; found --slice 1/2"):
        datagen.run(target, _sliced(2, "1/2"), tmp_path / "plain", small_cfg(**cfg), progress=False)
    datagen.check_slice(tmp_path / "empty", "2/2")  # no dataset there yet: any slice may start it
    assert (out / "manifest.json").read_text() == before
    resumed = datagen.run(target, _sliced(4, "1/2"), out, small_cfg(**cfg), progress=False)
    assert resumed["last_run"]["shards_skipped_count"] == 1 and resumed["totals"]["sequences"] == 4


# ----------------------------------------------------------------------------- the task


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "mkdocs.yml").write_text("site_name: t\n")
    monkeypatch.setenv("EAGLEKB_ROOT", str(tmp_path))
    monkeypatch.delenv("EAGLEKB_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("spec", ["0/3", "4/3", "x"])
def test_the_task_refuses_a_bad_slice_in_one_line(project, monkeypatch, tmp_path, spec):
    make_target(tmp_path / "target")
    with stub_work(monkeypatch):
        res = run_cli(["datagen", "--target=target", "--corpus=aime", f"--slice={spec}"])
    assert res.reached is None and res.code == 2 and one_line_failure(res) is None, res
    assert len(res.err_lines) == 1 and "--slice" in res.err_lines[0] and repr(spec) in res.err_lines[0], res


def test_the_task_notes_each_clamped_corpus_and_records_the_slice(project, tmp_path):
    make_target(tmp_path / "target")
    argv = ["datagen", "--target=target", "--corpus=aime", "--per-source=100", "--slice=1/2", "--max-new-tokens=2",
            "--max-len=1100", "--batch-size=16", "--shard-size=64", "--features=online", "--threads=1",
            "--out=data", "--record=sliced", "--json"]
    res = run_cli(argv)
    assert res.code == 0, res
    notes = [ln for ln in res.err_lines if ln.startswith("note: ")]
    assert notes == ["note: corpus aime has only 28 train prompts; taking all 28 of --per-source 100"], res.err
    doc = json.loads(res.out.splitlines()[-1])
    rec = json.loads((project / "baselines" / "datagen" / "sliced.json").read_text())
    man = rec["config"]["prompts_manifest"]
    assert rec["config"]["slice"] == "1/2" and man["slice"] == "1/2" and man["clamped"] == {"aime": 28}
    assert man["notes"] == [notes[0][len("note: "):]] and man["slice_counts"]["aime"] == doc["totals"]["sequences"]
    assert 0 < doc["totals"]["sequences"] < 28
    stored = json.loads((project / "data" / "manifest.json").read_text())
    assert stored["identity"]["slice"] == "1/2" and stored["prompts"]["sha256"] == prompts_hash(
        take_slice(corpora.mix(["aime"], per_source=100), (1, 2)).prompts)
    again = run_cli([*argv[:4], "--slice=2/2", *argv[5:-2]])  # the same folder, the other slice: refused at once
    assert again.code == 2 and len(again.err_lines) == 2 and again.err_lines[0].startswith("note: "), again
    assert "holds another slice" in again.err_lines[1] and "found --slice 2/2" in again.err_lines[1], again
