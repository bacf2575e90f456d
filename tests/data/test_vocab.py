"""Draft-vocab mappings and the remap: SpecForge-identical builds, rows moved by target id, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save, save_file

from eaglekb.data import vocab as V
from eaglekb.formats import mapping as FM
from eaglekb.formats import mapping_compare as MC
from eaglekb.measure import remap_check as RC
from eaglekb.training import remap as R
from eaglekb.io.errors import BadInput, EaglekbError, Incompatible

ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- independent references


def specforge_reference(counts: list[int], n: int, vocab: int):
    """SpecForge's process_token_dict_to_mappings, re-derived: Counter in id order, pad, most_common, sort."""
    token_dict = Counter()
    for tid, c in enumerate(counts):  # a per-id count vector: insertion order is id order
        if c:
            token_dict[tid] = c
    if len(token_dict) < n:
        for tid in sorted(set(range(n)) - set(token_dict)):
            token_dict[tid] = 0
            if len(token_dict) >= n:
                break
    used = sorted(k for k, _ in token_dict.most_common(n))
    d2t = torch.tensor([t - i for i, t in enumerate(used)], dtype=torch.int64)
    t2d = torch.tensor([i in set(used) for i in range(vocab)], dtype=torch.bool)
    return d2t, t2d


def speculators_reference(counts: list[int], n: int, vocab: int):
    """speculators' build_vocab_mappings_from_distribution, re-derived: sort on (-count, id), pad, sort."""
    ranked = sorted(((t, c) for t, c in enumerate(counts) if c), key=lambda x: (-x[1], x[0]))
    chosen = [t for t, _ in ranked[:n]]
    have = set(chosen)
    for t in range(n):
        if len(chosen) >= n:
            break
        if t not in have:
            chosen.append(t)
    chosen.sort()
    d2t = torch.tensor([t - i for i, t in enumerate(chosen)], dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.tensor(chosen, dtype=torch.int64)] = True
    return d2t, t2d


@st.composite
def counts_and_n(draw):
    vocab = draw(st.integers(1, 300))
    # small counts and many zeros: ties and padding are the cases that matter
    counts = draw(st.lists(st.integers(0, 6), min_size=vocab, max_size=vocab))
    n = draw(st.integers(1, vocab))
    return counts, n, vocab


@FAST
@given(counts_and_n())
def test_build_is_byte_identical_to_specforge_and_speculators(tmp_path_factory, args):
    counts, n, vocab = args
    tc = FM.TokenCounts(torch.tensor(counts, dtype=torch.int64))
    path = FM.save_mapping(tmp_path_factory.mktemp("m") / "m.safetensors", FM.build_mapping(tc, n))
    got = load_file(str(path))
    for ref in (specforge_reference(counts, n, vocab), speculators_reference(counts, n, vocab)):
        want = save({"d2t": ref[0], "t2d": ref[1]})
        assert save({"d2t": got["d2t"], "t2d": got["t2d"]}) == want
    assert torch.equal(got["counts"], tc.counts)


@FAST
@given(st.integers(1, 50).flatmap(lambda v: st.tuples(
    st.just(v), st.lists(st.tuples(st.integers(0, v - 1), st.integers(0, 1)), max_size=200))))
def test_counts_match_specforge_counting(args):
    vocab, pairs = args
    ids = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    mask = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    got = V.counts_from_token_ids(ids, mask, vocab)
    want = Counter()
    if ids.numel():
        u, c = ids[mask == 1].unique(return_counts=True)
        want.update(dict(zip(u.tolist(), c.tolist())))
    assert got.dtype == torch.int64 and got.tolist() == [want.get(i, 0) for i in range(vocab)]


def test_padding_takes_smallest_unseen_ids():
    counts = torch.zeros(100, dtype=torch.int64)
    counts[[50, 3, 70]] = torch.tensor([5, 9, 5])
    m = FM.build_mapping(FM.TokenCounts(counts), 6)
    assert m.selected.tolist() == [0, 1, 2, 3, 50, 70]
    assert m.meta["padded_tokens"] == 3 and m.meta["coverage_frac"] == 1.0


# ----------------------------------------------------------------------------- compare


def _mapping(ids, vocab=64, counts=None):
    sel = torch.tensor(sorted(ids), dtype=torch.int64)
    m = FM.Mapping(sel - torch.arange(sel.numel()), vocab, source=f"m{len(ids)}")
    if counts is not None:
        m.counts = FM.TokenCounts(torch.tensor(counts, dtype=torch.int64))
    return m


def test_compare_explains_the_sorted_id_shift():
    a = _mapping(range(1, 11))  # 1..10
    b = _mapping(range(0, 10))  # 0..9: one smaller id shifts every row
    doc = MC.compare_mappings(a, b)
    assert doc["position_matches"] == 0 and doc["set_overlap"] == 9 and doc["jaccard"] == pytest.approx(9 / 11)
    assert doc["shared_shifted"] == 9 and doc["longest_matching_run"] == 0
    assert "sorted by target id" in doc["explanation"] and "\n" not in doc["explanation"]


def test_compare_longest_run_and_coverage():
    counts = [0] * 64
    for t, c in {1: 10, 2: 10, 3: 10, 40: 70}.items():
        counts[t] = c
    a = _mapping([1, 2, 3, 5, 9], counts=counts)
    b = _mapping([1, 2, 3, 6, 40])
    doc = MC.compare_mappings(a, b)
    assert doc["position_matches"] == 3 and doc["longest_matching_run"] == 3
    assert doc["coverage"]["a_counts"]["a"] == pytest.approx(0.3)
    assert doc["coverage"]["a_counts"]["b"] == pytest.approx(1.0)
    metrics = MC.comparison_metrics(doc)
    assert metrics["coverage"]["a_counts"]["b_pct"] == 100.0


def test_compare_refuses_different_vocab_sizes():
    with pytest.raises(Incompatible) as err:
        MC.compare_mappings(_mapping(range(4), vocab=64), _mapping(range(4), vocab=65))
    assert "different target vocab sizes" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- remap properties


@st.composite
def two_mappings_and_head(draw):
    vocab = draw(st.integers(2, 120))
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=min(vocab, 40), unique=True)
    a, b = draw(ids), draw(ids)
    hidden = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    return vocab, a, b, hidden, seed


@FAST
@given(two_mappings_and_head(), st.sampled_from(R.INITS))
def test_every_kept_row_lands_where_the_new_mapping_puts_it(args, init):
    vocab, a, b, hidden, seed = args
    gen = torch.Generator().manual_seed(seed)
    src, dst = _mapping(a, vocab), _mapping(b, vocab)
    head = torch.randn(len(a), hidden, generator=gen)
    target_rows = torch.randn(vocab, hidden, generator=gen)
    if init in ("target-fit", "target-scaled") and not set(a) & set(b):
        with pytest.raises(BadInput, match="no kept tokens"):  # nothing to calibrate the target rows on
            R.remap_lm_head(head, src, dst, init=init, target_rows=target_rows)
        return
    new, plan = R.remap_lm_head(head, src, dst, init=init, target_rows=target_rows)
    assert new.shape == (len(b), hidden)
    pos_a, pos_b = src.positions(), dst.positions()
    for t in set(a) & set(b):
        assert torch.equal(new[pos_b[t]], head[pos_a[t]])  # bit for bit, by target id
    counts = plan.counts()
    assert counts["kept"] == len(set(a) & set(b)) and counts["new"] == len(set(b) - set(a))
    assert counts["dropped"] == len(set(a) - set(b))
    assert counts["moved"] == sum(int(pos_a[t] != pos_b[t]) for t in set(a) & set(b))
    new_rows = new[plan.new_dst]
    if init == "zeros":
        assert not new_rows.any()
    elif init == "target":
        assert torch.equal(new_rows, target_rows[plan.new_ids])
    elif init == "mean" and counts["kept"]:
        assert torch.allclose(new_rows, head[plan.kept_src].mean(0).expand_as(new_rows))


@FAST
@given(two_mappings_and_head())
def test_kept_tokens_keep_their_predictions(args):
    vocab, a, b, hidden, seed = args
    gen = torch.Generator().manual_seed(seed)
    src, dst = _mapping(a, vocab), _mapping(b, vocab)
    head = torch.randn(len(a), hidden, generator=gen)
    new, plan = R.remap_lm_head(head, src, dst, init="zeros")
    feats = torch.randn(50, hidden, generator=gen)
    data = RC.Features(feats, torch.randint(0, vocab, (50,), generator=gen), 1, 50)
    check = RC.check_remap(data, head, src, new, dst, plan)
    assert check["kept_rows_agree_frac"] == 1.0 and check["bound_holds"]


def test_target_fit_recovers_a_linear_map():
    gen = torch.Generator().manual_seed(0)
    vocab, hidden = 200, 6
    target_rows = torch.randn(vocab, hidden, generator=gen)
    w = torch.randn(hidden, hidden, generator=gen) * 3
    src, dst = _mapping(range(0, 120), vocab), _mapping(range(60, 180), vocab)
    head = target_rows[src.selected] @ w  # a drafter whose rows are the target's, rotated and scaled
    new, plan = R.remap_lm_head(head, src, dst, init="target-fit", target_rows=target_rows)
    assert torch.allclose(new[plan.new_dst], target_rows[plan.new_ids] @ w, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- drafter files


def _tiny_drafter(path, selected, seed=0):
    from helpers.models import tiny_drafter

    from eaglekb.models.drafter import save_drafter

    return save_drafter(tiny_drafter(selected=selected, seed=seed), path)


def _save_map(path, ids, vocab=128):
    return FM.save_mapping(path, _mapping(ids, vocab))


def test_remap_drafter_moves_rows_and_keeps_everything_else(tmp_path):
    from eaglekb.models.drafter import load_drafter

    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    new_ids = list(range(1, 30)) + list(range(30, 80, 2))[:11]  # 40 tokens, half shared
    mapping = FM.load_mapping(_save_map(tmp_path / "new.safetensors", new_ids))
    report = R.remap_drafter(src, mapping, tmp_path / "out", init="mean")
    files = RC.check_files(src, tmp_path / "out")
    assert files["changed_tensors"] == ["d2t", "lm_head.weight", "t2d"]
    assert files["changed_config"] == []  # same draft vocab size: config.json untouched
    a, b = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    pos_a, pos_b = FM.Mapping(a["d2t"], 128).positions(), mapping.positions()
    shared = sorted(set(range(0, 80, 2)) & set(new_ids))
    assert report["kept"] == len(shared) and report["new"] == 40 - len(shared)
    for t in shared:
        assert torch.equal(b["lm_head.weight"][pos_b[t]], a["lm_head.weight"][pos_a[t]])
    model = load_drafter(tmp_path / "out")
    assert model.draft_to_target(torch.arange(40)).tolist() == sorted(new_ids)


def test_remap_to_a_smaller_vocab_changes_config_only_there(tmp_path):
    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", list(range(0, 40, 2))))
    R.remap_drafter(src, mapping, tmp_path / "out", init="zeros")
    files = RC.check_files(src, tmp_path / "out")
    assert files["changed_config"] == ["draft_vocab_size"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["draft_vocab_size"] == 20


def test_remap_keeps_the_speculators_format(tmp_path):
    from helpers.models import write_drafter

    from eaglekb.formats.drafter import read_config
    from eaglekb.models.drafter import load_drafter

    src = write_drafter(tmp_path / "src", selected=list(range(0, 80, 2)), fmt="speculators")
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", list(range(1, 81, 2))))
    report = R.remap_drafter(src, mapping, tmp_path / "out", init="zeros")
    assert report["format"] == "speculators" and report["kept"] == 0 and report["new"] == 40
    assert read_config(tmp_path / "out")[1] == "speculators"
    assert "layers.0.mlp.up_proj.weight" in load_file(str(tmp_path / "out" / "model.safetensors"))
    assert load_drafter(tmp_path / "out").draft_to_target(torch.arange(3)).tolist() == [1, 3, 5]


def test_mapping_readers_agree(tmp_path):
    import numpy as np

    ids = [3, 5, 8, 13, 21]
    m = _mapping(ids, 32)
    torch.save({"d2t": m.d2t, "t2d": m.t2d}, tmp_path / "vocab_mapping.pt")
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "d2t.npy", m.d2t.numpy())
    np.save(tmp_path / "npy" / "t2d.npy", m.t2d.numpy())
    FM.save_mapping(tmp_path / "m.safetensors", m)
    for p in (tmp_path / "vocab_mapping.pt", tmp_path / "npy", tmp_path / "m.safetensors"):
        got = FM.load_mapping(p)
        assert got.selected.tolist() == ids and got.vocab_size == 32


def test_counts_from_a_datagen_dataset(tmp_path):
    from helpers.datagen import make_target, prompts, small_cfg

    from eaglekb.data import datagen
    from eaglekb.data.generation import load_target
    from eaglekb.formats.shards import open_dataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model on a shared CPU: one thread is faster
    try:
        target = load_target(make_target(tmp_path / "t"), dtype="float32")
        datagen.run(target, prompts(3), tmp_path / "d", small_cfg(features="online", max_new_tokens=6),
                    progress=False)
    finally:
        torch.set_num_threads(threads)
    tc = V.counts_from_dataset(tmp_path / "d")
    want = Counter()
    for ids, mask in open_dataset(tmp_path / "d").token_ids_and_masks():
        want.update(ids[mask.bool()].tolist())
    assert tc.total == sum(want.values()) > 0 and all(tc.counts[t] == c for t, c in want.items())
    assert tc.vocab_size == target.vocab_size


# ----------------------------------------------------------------------------- bad input: one line, nothing written


def _write_raw_mapping(path, d2t, t2d):
    save_file({"d2t": torch.tensor(d2t, dtype=torch.int64), "t2d": torch.tensor(t2d, dtype=torch.bool)}, str(path))
    return path


@pytest.mark.parametrize(
    "d2t, t2d_ids, fragment",
    [
        ([0, 1, 0, 0], [0, 2, 3], "repeats a target token"),  # selected 0, 2, 2, 3
        ([2, 2, -1, 0], [2, 3, 1, 3], "not sorted"),
        ([0, 0, 0, 0], [0, 1, 2, 5], "t2d does not match d2t"),
        ([0, 0, 0, 9], [0, 1, 2, 12], "outside the target vocab"),
    ],
)
def test_bad_mappings_fail_in_one_line(tmp_path, d2t, t2d_ids, fragment):
    t2d = [i in t2d_ids for i in range(10)]
    path = _write_raw_mapping(tmp_path / "bad.safetensors", d2t, t2d)
    with pytest.raises(EaglekbError) as err:
        FM.load_mapping(path)
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg


def test_duplicate_d2t_is_named():
    d2t = torch.tensor([0, 1, 1, 1])  # selected 0, 2, 3, 4: fine
    with pytest.raises(BadInput, match="repeats a target token"):
        FM.check_mapping(torch.tensor([0, 0, -1]), 10, None, None, "x")
    assert FM.check_mapping(d2t, 10, None, None, "x").tolist() == [0, 2, 3, 4]


def test_remap_refuses_other_vocab_and_writes_nothing(tmp_path):
    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", list(range(40)), vocab=129))
    with pytest.raises(Incompatible, match="different target vocab sizes"):
        R.remap_drafter(src, mapping, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_remap_refuses_lm_head_rows_that_do_not_match_d2t(tmp_path):
    from helpers.models import rewrite_tensors

    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    rewrite_tensors(src, lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:30].clone()}))
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", list(range(40))))
    with pytest.raises(Incompatible, match="lm_head rows do not match d2t length"):
        R.remap_drafter(src, mapping, tmp_path / "out")
    with pytest.raises(Incompatible, match="lm_head rows do not match d2t length"):
        FM.load_mapping(src)
    assert not (tmp_path / "out").exists()


def test_remap_refuses_target_of_another_hidden_size(tmp_path):
    from helpers.models import tiny_causal_lm, tiny_llama_config

    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    tiny_causal_lm(tiny_llama_config(hidden_size=48)).save_pretrained(tmp_path / "target")
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", list(range(40))))
    with pytest.raises(Incompatible, match="another hidden size"):
        R.remap_drafter(src, mapping, tmp_path / "out", target=tmp_path / "target")
    assert not (tmp_path / "out").exists()


def test_remap_target_init_uses_target_rows(tmp_path):
    from helpers.models import tiny_causal_lm, tiny_llama_config

    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    model = tiny_causal_lm(tiny_llama_config())
    model.save_pretrained(tmp_path / "target")
    new_ids = list(range(40))
    mapping = FM.load_mapping(_save_map(tmp_path / "n.safetensors", new_ids))
    R.remap_drafter(src, mapping, tmp_path / "out", init="target", target=tmp_path / "target")
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    head = model.lm_head.weight.detach()
    for t in (1, 3, 39):  # odd ids are new to the mapping
        assert torch.allclose(out["lm_head.weight"][t].float(), head[t], atol=1e-2)


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ}, timeout=300)


def _task_json(capsys, task, *args, **kwargs):
    from invoke import Context

    task(Context(), *args, json=True, **kwargs)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_tasks_build_compare_remap(tmp_path, capsys, monkeypatch):
    from runbooks import remap as remap_tasks
    from runbooks import vocab as vocab_tasks

    monkeypatch.setenv("EAGLEKB_ROOT", str(tmp_path))  # history goes to tmp, not the repo
    counts = torch.zeros(128, dtype=torch.int64)
    counts[torch.arange(0, 128, 3)] = torch.arange(43, 0, -1)
    V.save_counts(tmp_path / "c.safetensors", FM.TokenCounts(counts, {"what": "test"}))
    doc = _task_json(capsys, vocab_tasks.build, out=str(tmp_path / "a.safetensors"), draft_vocab_size="40",
                     counts=str(tmp_path / "c.safetensors"))
    assert doc["draft_vocab_size"] == 40 and doc["coverage_frac"] < 1.0
    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    doc = _task_json(capsys, vocab_tasks.compare, str(src), str(tmp_path / "a.safetensors"))
    assert doc["set_overlap"] > doc["position_matches"]
    doc = _task_json(capsys, remap_tasks.remap, drafter=str(src), mapping=str(tmp_path / "a.safetensors"),
                     out=str(tmp_path / "out"))
    assert doc["init"] == "mean" and doc["kept"] + doc["new"] == 40


def test_cli_bad_mapping_is_one_line_and_writes_nothing(tmp_path):
    src = _tiny_drafter(tmp_path / "src", list(range(0, 80, 2)))
    _write_raw_mapping(tmp_path / "bad.safetensors", [0] * 40, [True] * 40 + [False] * 60)
    out = _invoke("remap", "--drafter", str(src), "--mapping", str(tmp_path / "bad.safetensors"),
                  "--out", str(tmp_path / "out2"))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "different target vocab sizes" in out.stderr and not (tmp_path / "out2").exists()


# ----------------------------------------------------------------------------- real tokenizer / model


def _smollm2():
    from eaglekb.models import sources

    try:
        return sources.resolve("smollm2-135m")
    except EaglekbError:
        pytest.skip("smollm2-135m not prepared (invoke models.prepare smollm2-135m)")


def test_prompt_counting_skips_template_markers():
    from transformers import AutoTokenizer

    from eaglekb.data.corpora import Prompt

    tok = AutoTokenizer.from_pretrained(str(_smollm2()))
    p = Prompt("x:1", "x", ({"role": "user", "content": "What is the capital of France?"},))
    tc = V.counts_from_prompts([p], tok)
    want = tok("What is the capital of France?", add_special_tokens=False)["input_ids"]
    assert tc.total == len(want) and sorted(tc.counts.nonzero().reshape(-1).tolist()) == sorted(set(want))
    assert tc.counts[tok.convert_tokens_to_ids("<|im_start|>")] == 0


@pytest.mark.slow
def test_real_remap_keeps_every_kept_prediction(tmp_path):
    from eaglekb.data import corpora
    from eaglekb.models.target import Target

    path = _smollm2()
    target = Target.load(path)
    tok = target.tokenizer
    a = FM.build_mapping(V.counts_from_prompts(corpora.load("chitchat", limit=300), tok), 2048)
    b = FM.build_mapping(V.counts_from_prompts(corpora.load("gsm8k", limit=300), tok), 2048)
    head, _ = R.read_target_head(path)
    data = RC.content_features(target, corpora.load("gsm8k-eval", split="eval", limit=20))
    results = RC.compare_inits(data, head[a.selected], a, b, head)
    for method, check in results.items():
        assert check["kept_rows_agree_frac"] == 1.0, method
        assert check["bound_holds"], method
    assert results["target"]["new_acc"] >= results["zeros"]["new_acc"]


# ----------------------------------------------------------------------------- held-out split by prompt


def test_prompt_of_strips_only_the_sample_suffix():
    assert V.prompt_of("gsm8k-code:0042") == "gsm8k-code:0042"
    assert V.prompt_of("gsm8k-code:0042@t0.8#1") == "gsm8k-code:0042"
    assert V.prompt_of("odd@tname:1") == "odd@tname:1"  # not a datagen suffix
    ids = [f"s:{i}" for i in range(400)]
    share = sum(V.held_out(i, 5) for i in ids) / len(ids)
    assert 0.12 < share < 0.28 and V.held_out("s:7@t0.8#1", 5) == V.held_out("s:7", 5)


@pytest.fixture(scope="module")
def sampled_dataset(tmp_path_factory):
    """A tiny datagen dataset with a greedy and a sampled response per prompt (ids in every shard)."""
    from helpers.datagen import make_target, prompts, small_cfg

    from eaglekb.data import datagen, generation

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("heldout")
    target = generation.load_target(make_target(root / "tiny"), dtype="float32")
    out = root / "data"
    datagen.run(target, prompts(8), out, small_cfg(generator="engine", sample_temperatures=(0.8,), features="online"),
                progress=False)
    return out


def test_holdout_partitions_by_prompt(sampled_dataset):
    from eaglekb.formats.shards import open_dataset, shard_sequence_ids

    full = V.counts_from_dataset(sampled_dataset)
    k = 3
    train = V.counts_from_dataset(sampled_dataset, holdout=k, part="train")
    held = V.counts_from_dataset(sampled_dataset, holdout=k, part="heldout")
    assert torch.equal(train.counts + held.counts, full.counts)
    ds = open_dataset(sampled_dataset)
    ids = [i for f in ds.shard_files for i in shard_sequence_ids(f)]
    assert len(ids) == 16 and sum("@t0.8#1" in i for i in ids) == 8
    n_held = sum(V.held_out(i, k) for i in ids)
    assert (train.meta["samples_count"], held.meta["samples_count"]) == (16 - n_held, n_held)
    assert n_held % 2 == 0 and held.meta["split"] == {"holdout_every": 3, "part": "heldout", "by": "sha256 of the prompt id"}
    two = V.counts_from_datasets([sampled_dataset, sampled_dataset], holdout=k)
    assert torch.equal(two.counts, 2 * train.counts) and two.meta["samples_count"] == 2 * (16 - n_held)
    with pytest.raises(BadInput):
        V.counts_from_dataset(sampled_dataset, holdout=1)


def test_vocab_build_reports_heldout_coverage(sampled_dataset, tmp_path):
    from helpers.hostile import run_cli

    out = tmp_path / "m.safetensors"
    res = run_cli(["vocab.build", "--dataset", str(sampled_dataset), "--holdout", "3", "--draft-vocab-size", "8",
                   "--out", str(out), "--json"])
    assert res.code == 0, res.err
    doc = json.loads(res.out.strip().splitlines()[-1])
    held = V.counts_from_dataset(sampled_dataset, holdout=3, part="heldout")
    mapping = FM.load_mapping(out)
    assert torch.equal(mapping.counts.counts, V.counts_from_dataset(sampled_dataset, holdout=3).counts)
    assert doc["heldout_coverage_pct"] == round(100 * MC.coverage(mapping, held), 4)
    assert doc["heldout_tokens_count"] == held.total > 0
    text = run_cli(["vocab.build", "--counts", str(out), "--heldout", str(sampled_dataset), "--holdout", "3",
                    "--draft-vocab-size", "8", "--out", str(tmp_path / "again.safetensors")]).out
    assert f"held-out: top 8 cover {doc['heldout_coverage_pct']:.2f}% of {held.total:,} loss tokens" in text
